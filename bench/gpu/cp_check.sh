#!/usr/bin/env bash
# The context-parallelism / document-masking / long-sequence part of the GPU check in one
# call (scripts/gpu-check.sh builds and runs everything; this builds only what issue 20
# needs): configure for the H200 as gpu-check.sh does, build megatron, test_cp_gpu and
# bench_cp_blocks, run the CP and document-mask GPU tests, the block-attention benchmark
# (bench_cp_blocks) and the long-sequence benchmark (long_seq.sh). The two tables
# (cp_blocks.md, long_seq.md) and one archive of every log (cp_logs.tgz) go to $OUT, also
# when a stage fails or the call is cut short (the device tool returns at most 8 files). Env: BUILD_DIR (build-gpu), JOBS (nproc), TESTS=0 / BLOCKS=0 / LONG=0 skip a stage,
# SEQS, TORCH, ITERS, TORCH_STEPS for long_seq.sh; DEADLINE (seconds after the start; the
# long-sequence stage is cut there, default 3600), BLOCK_ARGS for bench_cp_blocks.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
BUILD=${BUILD_DIR:-build-gpu}
DEST=${OUT:-$BUILD/logs}
LOGS=$(mktemp -d /tmp/cp_check.XXXXXX)
mkdir -p "$DEST"
pack() {
  cp "$LOGS"/cp_blocks.md "$LOGS"/long_seq.md "$DEST"/ 2>/dev/null
  tar czf "$DEST"/cp_logs.tgz -C "$LOGS" . 2>/dev/null
}
trap pack EXIT TERM
pyroot() {
  python3 -c "import importlib, os
m = importlib.import_module('$1')
print(m.__file__ and os.path.dirname(m.__file__) or list(m.__path__)[0])" 2>/dev/null
}
CUDNN_ROOT=${MCPP_CUDNN_ROOT:-$(pyroot nvidia.cudnn)}
NCCL_ROOT=${MCPP_NCCL_ROOT:-$(pyroot nvidia.nccl)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DMCPP_CUDNN_ROOT="$CUDNN_ROOT" -DMCPP_NCCL_ROOT="$NCCL_ROOT" > "$LOGS/configure.log" 2>&1
grep -E "megatron.cpp: (CUDA|cuDNN)" "$LOGS/configure.log"
SECONDS=0
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target megatron test_cp_gpu bench_cp_blocks \
  > "$LOGS/build.log" 2>&1 || { grep -E "error|FAILED" "$LOGS/build.log" | head -30; exit 1; }
echo "cp_check: build ${SECONDS} s"
export LD_LIBRARY_PATH="${CUDNN_ROOT:+$CUDNN_ROOT/lib:}${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
rc=0
if [[ ${TESTS:-1} != 0 ]]; then
  SECONDS=0
  ctest --test-dir "$BUILD" -L gpu -R "ContextParallelGpu|DocumentMaskGpu|AttentionGroupChunks" --output-on-failure \
    -j 4 --timeout 300 > "$LOGS/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$LOGS/ctest.log" | head -30
  grep -hE "^\[documents" "$BUILD"/Testing/Temporary/LastTest.log | sort -u
  echo "cp_check: tests ${SECONDS} s"
  pack
fi
if [[ ${BLOCKS:-1} != 0 ]]; then
  SECONDS=0
  # (word splitting of BLOCK_ARGS intended)
  # shellcheck disable=SC2086
  timeout 120 "$BUILD"/bench/bench_cp_blocks ${BLOCK_ARGS:-} > "$LOGS/cp_blocks.md" 2> "$LOGS/cp_blocks.err"
  cat "$LOGS/cp_blocks.md"; tail -3 "$LOGS/cp_blocks.err"
  echo "cp_check: blocks ${SECONDS} s"
  pack
fi
if [[ ${LONG:-1} != 0 ]]; then
  # Cut at DEADLINE: the table keeps the lengths measured.
  left=$(( ${DEADLINE:-3600} - ($(date +%s) - T0) ))
  echo "cp_check: long sequences, ${left} s left"
  OUT=$LOGS timeout "$left" bench/gpu/long_seq.sh "$BUILD"
  [[ -f $LOGS/long_seq.md ]] && cat "$LOGS/long_seq.md"
fi
exit $rc
