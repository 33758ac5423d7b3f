#!/usr/bin/env bash
# Data-parallel scaling on the GPUs of one host: `megatron train` on a GPT-2 350M-shaped
# model (24 layers, hidden 1024, 16 heads, seq 1024, vocab 50257 -> 50304), bf16, mock data,
# micro-batch MB (default 32), ACC micro-batches per GPU per step (default 1, as PyTorch DDP
# measures it; more amortise the reduction over more backward, as a large global batch does),
# on 1 GPU (the first and the last visible GPU: physical GPUs differ by a little) and on NGPU
# GPUs (default 2) without and with --overlap-grad-reduce, then tensor parallelism over the
# NGPU GPUs (with sequence parallelism) on the same model for comparison. All runs use
# --timing-log-level 1 (timers synchronise the device), so each row also carries the
# forward-backward time and the exposed data-parallel communication (`grads-reduce`: the
# part of the gradient reduction backward did not hide). Prints one table: tokens/s per
# GPU of the last log interval and its ratio to one GPU, and GPU 0's mean SM clock and power
# while it was busy (scripts/clock-probe.sh; PROBE=0 turns it off): the H200 runs these
# steps at its power cap, so a run that adds work (the reduction's traffic) lowers the clock.
# Usage: scripts/dp-scaling.sh BUILD_DIR [MODEL]   (MODEL: 350m | 1.3b | llama1b; env MB, ACC, NGPU, ITERS,
#        CTAS="4 8" for DP runs with those NCCL CTA limits, TP=0 to skip the TP run,
#        VARIANTS="bf16 distopt distopt-bf16" for overlapped DP runs with --grad-reduce-in-bf16,
#        with --use-distributed-optimizer (+ --overlap-param-gather), and both; BASE=0 skips the plain
#        DP runs without and with overlap)
set -uo pipefail
BUILD=${1:-build-gpu}
MODEL=${2:-350m}
M=$BUILD/megatron
NGPU=${NGPU:-2}
ACC=${ACC:-1}
ITERS=${ITERS:-12}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case $MODEL in
  350m) SHAPE=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
               --max-position-embeddings 1024 --vocab-size 50257); MB=${MB:-32} ;;
  1.3b) SHAPE=(--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048
               --max-position-embeddings 2048 --vocab-size 50257); MB=${MB:-8} ;;
  llama1b) SHAPE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192
               --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000
               --position-embedding-type rope --normalization RMSNorm --swiglu
               --group-query-attention --num-query-groups 8 --untie-embeddings-and-output-weights
               --disable-bias-linear); MB=${MB:-8} ;;
  *) echo "unknown model $MODEL (350m, 1.3b, llama1b)"; exit 2 ;;
esac
COMMON=("${SHAPE[@]}" --mock-data --tokenizer-type NullTokenizer
  --micro-batch-size "$MB" --lr 1e-4 --train-iters "$ITERS" --log-interval $((ITERS / 2)) --log-throughput
  --hidden-dropout 0 --attention-dropout 0 --device cuda --bf16 --timing-log-level 1)
launch() {  # a run, under the clock probe unless PROBE=0
  if [[ ${PROBE:-1} != 0 ]]; then "$(dirname "$0")/clock-probe.sh" probe "$@"; else "$@"; fi
}
tps() { grep -oE "tokens per second per GPU: [0-9.]+" "$1" | tail -1 | awk '{print $6}'; }
timer() {  # ms per iteration of timer $2 in the last interval of log $1 ("-" if absent)
  local v
  v=$(grep -E "^.* $2 \.+: \(" "$1" | tail -1 | sed -E 's/.*\(([0-9.]+),.*/\1/')
  echo "${v:--}"
}
LOG=${OUT:-/tmp}/dp-scaling-$MODEL
mkdir -p "$LOG"
# The GPUs this process sees (physical ids): CUDA_VISIBLE_DEVICES's list when set
# (nvidia-smi ignores it), else all of them.
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then read -ra VIS <<< "${CUDA_VISIBLE_DEVICES//,/ }"
else read -ra VIS <<< "$(seq -s ' ' 0 $(( $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l) - 1 )))"; fi
NVIS=${#VIS[@]}
export GPU=${VIS[0]}  # the GPU the clock probe samples during multi-GPU runs
ONE_GPUS=$( ((NVIS > 1)) && echo "${VIS[0]} ${VIS[NVIS - 1]}" || echo "${VIS[0]}")  # first and last: 2 runs at most
for g in $ONE_GPUS; do
  CUDA_VISIBLE_DEVICES=$g GPU=$g launch "$M" train "${COMMON[@]}" --global-batch-size $((MB * ACC)) > "$LOG/1gpu-$g.log" 2>&1 ||
    { tail -20 "$LOG/1gpu-$g.log"; exit 1; }
done
for ov in $([[ ${BASE:-1} != 0 ]] && echo no yes); do
  X=()
  [[ $ov == yes ]] && X=(--overlap-grad-reduce)
  launch mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -np "$NGPU" "$M" train \
    "${COMMON[@]}" --global-batch-size $((MB * ACC * NGPU)) "${X[@]}" > "$LOG/dp$NGPU-overlap-$ov.log" 2>&1 ||
    { tail -20 "$LOG/dp$NGPU-overlap-$ov.log"; exit 1; }
done
# The overlapped reduction with few NCCL CTAs on the data-parallel group (Megatron's
# --nccl-communicator-config-path), so that it takes fewer SMs from the backward's GEMMs:
# env CTAS="4 8" runs one DP job per value.
for n in ${CTAS:-}; do
  printf 'dp:\n  max_ctas: %s\n  min_ctas: 1\n' "$n" > "$LOG/nccl-dp-$n.yaml"
  launch mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -np "$NGPU" "$M" train \
    "${COMMON[@]}" --global-batch-size $((MB * ACC * NGPU)) --overlap-grad-reduce \
    --nccl-communicator-config-path "$LOG/nccl-dp-$n.yaml" > "$LOG/dp$NGPU-ctas-$n.log" 2>&1 ||
    { tail -20 "$LOG/dp$NGPU-ctas-$n.log"; exit 1; }
done
# Other ways to cut the reduction's cost, each overlapped: bf16 reduction (half the bytes),
# the distributed optimizer (reduce-scatter of the gradients, all-gather of bf16 params).
for v in ${VARIANTS:-}; do
  case $v in
    bf16) X=(--grad-reduce-in-bf16) ;;
    distopt) X=(--use-distributed-optimizer --overlap-param-gather) ;;
    distopt-bf16) X=(--use-distributed-optimizer --overlap-param-gather --grad-reduce-in-bf16) ;;
    *) echo "dp-scaling: unknown variant $v (bf16, distopt, distopt-bf16)"; exit 2 ;;
  esac
  launch mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -np "$NGPU" "$M" train \
    "${COMMON[@]}" --global-batch-size $((MB * ACC * NGPU)) --overlap-grad-reduce "${X[@]}" \
    > "$LOG/dp$NGPU-$v.log" 2>&1 || { tail -20 "$LOG/dp$NGPU-$v.log"; exit 1; }
done
if [[ ${TP:-1} != 0 ]]; then
  launch mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -np "$NGPU" "$M" train \
    "${COMMON[@]}" --global-batch-size $((MB * ACC)) --tensor-model-parallel-size "$NGPU" \
    --sequence-parallel > "$LOG/tp$NGPU.log" 2>&1 || { tail -20 "$LOG/tp$NGPU.log"; exit 1; }
fi
one=$(tps "$LOG/1gpu-${VIS[0]}.log")
row() {  # label, log
  local t
  t=$(tps "$2")
  local clk
  clk=$(grep "^| probe |" "$2" | awk -F'|' '{gsub(/^ +| +$/, "", $4); gsub(/ /, "", $5); print $4 " | " $5}')
  echo "| $1 | $t | $(awk -v a="$t" -v b="$one" 'BEGIN{printf "%.3f", a/b}') | $(timer "$2" forward-backward) | $(timer "$2" grads-reduce) | $(timer "$2" optimizer) | ${clk:-- | -} |"
}
echo "## DP scaling, GPT $MODEL bf16, micro-batch $MB x $ACC per GPU per step, $NGPU GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F))"
echo "| run | tokens/s per GPU | vs 1 GPU (GPU ${VIS[0]}) | forward-backward ms | grads-reduce ms (exposed) | optimizer ms (incl. grads-reduce) | SM MHz mean (min-max), 1st GPU of the run | W |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for g in $ONE_GPUS; do row "1 GPU (GPU $g)" "$LOG/1gpu-$g.log"; done
for ov in $([[ ${BASE:-1} != 0 ]] && echo no yes); do
  row "DP$NGPU, --overlap-grad-reduce $ov" "$LOG/dp$NGPU-overlap-$ov.log"
done
for n in ${CTAS:-}; do row "DP$NGPU, overlap, DP group max_ctas $n" "$LOG/dp$NGPU-ctas-$n.log"; done
for v in ${VARIANTS:-}; do row "DP$NGPU, overlap, $v" "$LOG/dp$NGPU-$v.log"; done
[[ ${TP:-1} != 0 ]] && row "TP$NGPU + SP (DP1; same micro-batch)" "$LOG/tp$NGPU.log"
grep -h "memory (MB)" "$LOG"/*.log | head -3
