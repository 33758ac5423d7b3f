#!/usr/bin/env bash
# Data-parallel scaling on the GPUs of one host: `megatron train` on a GPT-2 350M-shaped
# model (24 layers, hidden 1024, 16 heads, seq 1024, vocab 50257 -> 50304), bf16, mock data,
# micro-batch MB (default 32), one micro-batch per GPU per step (as PyTorch DDP measures it),
# on 1 GPU and on NGPU GPUs (default 2) without and with --overlap-grad-reduce. Prints one
# table: tokens/s per GPU of the last log interval and its ratio to one GPU.
# Usage: scripts/dp-scaling.sh BUILD_DIR [MODEL]   (MODEL: 350m | 1.3b; env MB, NGPU, ITERS)
set -uo pipefail
BUILD=${1:-build-gpu}
MODEL=${2:-350m}
M=$BUILD/megatron
NGPU=${NGPU:-2}
ITERS=${ITERS:-12}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case $MODEL in
  350m) SHAPE=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
               --max-position-embeddings 1024); MB=${MB:-32} ;;
  1.3b) SHAPE=(--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048
               --max-position-embeddings 2048); MB=${MB:-8} ;;
  *) echo "unknown model $MODEL"; exit 2 ;;
esac
COMMON=("${SHAPE[@]}" --mock-data --tokenizer-type NullTokenizer --vocab-size 50257
  --micro-batch-size "$MB" --lr 1e-4 --train-iters "$ITERS" --log-interval $((ITERS / 2))
  --hidden-dropout 0 --attention-dropout 0 --device cuda --bf16)
tps() { grep -oE "tokens per second per GPU: [0-9.]+" "$1" | tail -1 | awk '{print $6}'; }
LOG=${OUT:-/tmp}/dp-scaling-$MODEL
mkdir -p "$LOG"
"$M" train "${COMMON[@]}" --global-batch-size "$MB" > "$LOG/1gpu.log" 2>&1 ||
  { tail -20 "$LOG/1gpu.log"; exit 1; }
for ov in no yes; do
  X=()
  [[ $ov == yes ]] && X=(--overlap-grad-reduce)
  mpirun --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -np "$NGPU" "$M" train \
    "${COMMON[@]}" --global-batch-size $((MB * NGPU)) "${X[@]}" > "$LOG/dp$NGPU-overlap-$ov.log" 2>&1 ||
    { tail -20 "$LOG/dp$NGPU-overlap-$ov.log"; exit 1; }
done
one=$(tps "$LOG/1gpu.log")
echo "## DP scaling, GPT $MODEL bf16, micro-batch $MB, $NGPU GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F))"
echo "| run | tokens/s per GPU | vs 1 GPU |"
echo "|---|---:|---:|"
echo "| 1 GPU | $one | 1.000 |"
for ov in no yes; do
  t=$(tps "$LOG/dp$NGPU-overlap-$ov.log")
  echo "| DP$NGPU, --overlap-grad-reduce $ov | $t | $(awk -v a="$t" -v b="$one" 'BEGIN{printf "%.3f", a/b}') |"
done
grep -h "memory (MB)" "$LOG"/*.log | head -3
