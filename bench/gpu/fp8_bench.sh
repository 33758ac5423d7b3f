#!/usr/bin/env bash
# FP8 against bf16 on one GPU, after scripts/gpu-check.sh has built BUILD (default
# build-gpu): bench_gpu_train's base and FP8 variants of GPT-2 350M, GPT-3 XL 1.3B and the
# Llama-style 1B in one call (each model's bf16 and FP8 runs back to back, same micro-batch),
# then `megatron train --device cuda --bf16 --fp8-format hybrid` for a few iterations on mock
# data (the trainer's amax reduction and scale update). Usage: bench/gpu/fp8_bench.sh
# [BUILD] (env: VARIANTS, default base,fp8 -- fp8-tensorwise and fp8-blockwise are the other
# recipes, BLOCK=1 adds fp8-blockwise; MODELS, default "350M XL Llama"; STEPS;
# PROFILE=1: one more step of each run under the op profiler (GPU time per op), and for the
# FP8 runs the FP8 GEMM ceiling: each FP8 GEMM of a layer timed alone at the step's shapes,
# against the step's FP8 GEMM time; the FP8 GEMMs' tuning report follows each model;
# OPS=1: first bench_gpu_ops --only fp8, the casts and the fused casts against the passes
# they replace; PARITY=1: then scripts/fp8-parity.sh cuda with PARALLEL=1, its env passed
# on: DATA, GPT2_DIR, OUT; TORCH=1: before each model's runs, bench/gpu/torch_reference.py
# measures the same model in bf16, compiled (TORCH_TIMEOUT seconds a model, default 200), and
# bench_gpu_train's bf16 row carries its tokens/s and peak: our bf16 and FP8 steps against
# PyTorch's bf16 step in the same call).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu}
pyroot() { python3 -c "import importlib, os
m = importlib.import_module('$1')
print(m.__file__ and os.path.dirname(m.__file__) or list(m.__path__)[0])" 2>/dev/null; }
CUDNN_ROOT=$(pyroot nvidia.cudnn) NCCL_ROOT=$(pyroot nvidia.nccl)
export LD_LIBRARY_PATH="${CUDNN_ROOT:+$CUDNN_ROOT/lib:}${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
cmake --build "$B" -j "$(nproc)" --target bench_gpu_train bench_gpu_ops megatron > /dev/null 2>&1 ||
  { echo "fp8_bench: build failed"; exit 1; }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
if [ "${OPS:-0}" = 1 ]; then
  echo "== bench_gpu_ops --only fp8"
  timeout 120 "$B/bench/bench_gpu_ops" --only fp8 2>&1 | grep -E "fp8|op " | head -40
fi
VARIANTS=${VARIANTS:-base,fp8}
[ "${BLOCK:-0}" = 1 ] && VARIANTS="$VARIANTS,fp8-blockwise"  # ---- FP8 blockwise
PROF=()
[ "${PROFILE:-0}" = 1 ] && PROF=(--profile)
for m in ${MODELS:-350M XL Llama}; do
  echo "== $m"
  TJ=()
  if [ "${TORCH:-0}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-200}" python3 bench/gpu/torch_reference.py \
      --only "$m" --modes compiled --variants base --json "/tmp/fp8_bench_torch_$m.json" \
      > "/tmp/fp8_bench_torch_$m.out" 2>&1 || echo "torch_reference rc $?"
    grep -E "tok/s|rror" "/tmp/fp8_bench_torch_$m.out" | head -5
    [ -s "/tmp/fp8_bench_torch_$m.json" ] && TJ=(--torch "/tmp/fp8_bench_torch_$m.json")
  fi
  timeout 240 "$B/bench/bench_gpu_train" --only "$m" --variants "$VARIANTS" \
    --steps "${STEPS:-8}" --warmup 3 "${PROF[@]}" "${TJ[@]}" 2> "/tmp/fp8_bench_$m.err" ||
    { echo "rc $?"; tail -20 "/tmp/fp8_bench_$m.err"; }
  grep -E "losses|ms/step|memory" "/tmp/fp8_bench_$m.err"
  [ "${PROFILE:-0}" = 1 ] && sed -n '/^FP8 GEMM tuning:/,$p' "/tmp/fp8_bench_$m.err"
done
echo "== megatron train --fp8-format hybrid (delayed) on the GPU"
timeout 120 "$B/megatron" train --device cuda --bf16 --mock-data --tokenizer-type NullTokenizer \
  --vocab-size 1000 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
  --max-position-embeddings 256 --micro-batch-size 8 --global-batch-size 32 --lr 3e-4 \
  --train-iters 30 --log-interval 10 --fp8-format hybrid --fp8-amax-history-len 8 \
  --fp8-amax-compute-algo max 2>&1 | grep -E "lm loss|rror|HINT" | tail -5
if [[ $VARIANTS == *blockwise* ]]; then  # ---- FP8 blockwise: the trainer's path too
  echo "== megatron train --fp8-format hybrid --fp8-recipe blockwise on the GPU"
  timeout 120 "$B/megatron" train --device cuda --bf16 --mock-data --tokenizer-type NullTokenizer \
    --vocab-size 1000 --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
    --max-position-embeddings 256 --micro-batch-size 8 --global-batch-size 32 --lr 3e-4 \
    --train-iters 30 --log-interval 10 --fp8-format hybrid --fp8-recipe blockwise 2>&1 |
    grep -E "lm loss|rror|HINT" | tail -5
fi
if [ "${PARITY:-0}" = 1 ]; then
  echo "== scripts/fp8-parity.sh cuda (bf16, hybrid delayed, hybrid tensorwise at once)"
  PARALLEL=1 M="$B/megatron" timeout 420 scripts/fp8-parity.sh cuda
fi
