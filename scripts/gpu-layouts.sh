#!/usr/bin/env bash
# Parallel layouts of one model on the GPUs of one host (issue 8: "TP2/TP4/TP8 against DP
# for the same model", "the best layout for each"): `megatron train` with mock data, bf16,
# --timing-log-level 1, one run per layout, and one table: tokens/s per GPU, TFLOP/s per GPU
# (Megatron's formula) and MFU against 989 TFLOP/s, forward-backward and exposed DP
# communication per step, peak memory. Before each run `megatron plan` computes the rank's
# memory; a layout that would not fit (MAX_MIB, default 130000 of the H200's ~141000)
# is listed with the plan's number instead of being run into an out-of-memory error.
#
# Usage: scripts/gpu-layouts.sh BUILD_DIR MODEL "LAYOUT ..."
#   MODEL: llama8b (32 layers, hidden 4096, 32 heads, 8 KV groups, SwiGLU 14336, seq 4096,
#          vocab 128256) | llama1b (the benchmark's Llama-style 1B, seq 2048 or SEQ) | gpt1.3b
#          (GPT-3 XL, seq 2048) | mixtral | finegrained (the MoE benchmark's two models,
#          docs/moe.md: the Llama-style 1B's attention, 8 experts top-2 of FFN 4096 with the
#          aux loss, or 32 experts top-6 of FFN 1024 plus a shared expert of 2048 with the
#          sigmoid router and expert bias; seq 2048)
#   LAYOUT: dash-separated parts tp<T>, pp<P>, cp<C>, dp<D>, ep<E>, etp<E> and the words
#          distopt (--use-distributed-optimizer --overlap-param-gather), recompute
#          (--recompute-activations), full (full recomputation of every layer), a2a
#          (--cp-comm-type a2a; p2p otherwise), allgather (the MoE all-gather dispatcher;
#          alltoall otherwise), fp8 (--fp8-format hybrid --fp8-recipe delayed) and fp8cs
#          (hybrid, tensorwise); e.g. dp8-distopt, tp2-dp4-distopt, tp8, tp2-pp2-dp2,
#          dp4-ep4, cp4-a2a, tp2-dp4-fp8. GPUs = TP x PP x CP x DP (EP folds over DP x CP x
#          TP as in Megatron). TP > 1 adds --sequence-parallel, DP > 1
#          --overlap-grad-reduce, PP > 1 runs 4*PP micro-batches per step (1F1B).
#   env: MB (micro-batch, default 1 for llama8b and SEQ > 8192, 8 otherwise), SEQ (llama1b's
#        sequence length), ITERS (default 10), MAX_MIB, OUT (log folder), DRY=1 (print the
#        plan check and the commands, run nothing), PLAN_ONLY=1 (no GPU: check every
#        layout's flags with `megatron plan`, exit non-zero if any is refused)
set -uo pipefail
BUILD=${1:?usage: gpu-layouts.sh BUILD_DIR MODEL \"LAYOUT ...\"}
MODEL=${2:?model: llama8b | llama1b | gpt1.3b}
LAYOUTS=${3:?layouts, e.g. \"dp8-distopt tp2-dp4-distopt tp8\"}
M=$BUILD/megatron
ITERS=${ITERS:-10}
MAX_MIB=${MAX_MIB:-130000}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
LLAMA=(--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
  --num-query-groups 8 --untie-embeddings-and-output-weights --disable-bias-linear)
case $MODEL in
  llama8b) SHAPE=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336
                  --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 "${LLAMA[@]}")
           MB=${MB:-1} ;;
  llama1b) SEQ=${SEQ:-2048}
           SHAPE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192
                  --seq-length "$SEQ" --max-position-embeddings "$SEQ" --vocab-size 32000 "${LLAMA[@]}")
           if ((SEQ > 8192)); then MB=${MB:-1}; else MB=${MB:-8}; fi ;;
  mixtral|finegrained)
           SHAPE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192
                  --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 "${LLAMA[@]}"
                  --moe-grouped-gemm)
           if [[ $MODEL == mixtral ]]; then
             SHAPE+=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 4096
                     --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2)
             MB=${MB:-16}
           else
             SHAPE+=(--num-experts 32 --moe-router-topk 6 --moe-ffn-hidden-size 1024
                     --moe-shared-expert-intermediate-size 2048 --moe-router-score-function sigmoid
                     --moe-router-enable-expert-bias --moe-router-load-balancing-type none)
             MB=${MB:-8}
           fi ;;
  gpt1.3b) SHAPE=(--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048
                  --max-position-embeddings 2048 --vocab-size 50257)
           MB=${MB:-8} ;;
  *) echo "gpu-layouts: unknown model $MODEL (llama8b, llama1b, gpt1.3b, mixtral, finegrained)"; exit 2 ;;
esac
COMMON=("${SHAPE[@]}" --bf16 --micro-batch-size "$MB" --hidden-dropout 0 --attention-dropout 0)
LOG=${OUT:-/tmp}/gpu-layouts-$MODEL
mkdir -p "$LOG"

# Layout word -> flags and GPU count (sets FLAGS, NP, GBS; returns 1 on a bad word).
parse() {
  local tp=1 pp=1 cp=1 dp=1 ep=1 etp=0 distopt=0 recompute=0 full=0 a2a=0 allgather=0 fp8= part
  for part in ${1//-/ }; do
    case $part in
      tp[0-9]*) tp=${part#tp} ;;
      pp[0-9]*) pp=${part#pp} ;;
      cp[0-9]*) cp=${part#cp} ;;
      dp[0-9]*) dp=${part#dp} ;;
      ep[0-9]*) ep=${part#ep} ;;
      etp[0-9]*) etp=${part#etp} ;;
      distopt) distopt=1 ;;
      recompute) recompute=1 ;;
      full) full=1 ;;
      a2a) a2a=1 ;;
      allgather) allgather=1 ;;
      fp8) fp8=delayed ;;
      fp8cs) fp8=tensorwise ;;
      *) echo "gpu-layouts: '$part' in layout '$1' is not tp<N>, pp<N>, cp<N>, dp<N>, ep<N>, etp<N>, distopt, recompute, full, a2a, allgather, fp8 or fp8cs"
         return 1 ;;
    esac
  done
  NP=$((tp * pp * cp * dp))
  local micro=1
  ((pp > 1)) && micro=$((4 * pp))
  GBS=$((MB * dp * micro))
  FLAGS=(--tensor-model-parallel-size "$tp" --pipeline-model-parallel-size "$pp")
  ((tp > 1)) && FLAGS+=(--sequence-parallel)
  ((dp > 1)) && FLAGS+=(--overlap-grad-reduce)
  ((distopt)) && FLAGS+=(--use-distributed-optimizer --overlap-param-gather)
  ((recompute)) && FLAGS+=(--recompute-activations)
  ((full)) && FLAGS+=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
  ((cp > 1)) && FLAGS+=(--context-parallel-size "$cp")
  ((a2a)) && FLAGS+=(--cp-comm-type a2a)
  ((ep > 1)) && FLAGS+=(--expert-model-parallel-size "$ep")
  ((etp > 0)) && FLAGS+=(--expert-tensor-parallel-size "$etp")
  if [[ $MODEL == mixtral || $MODEL == finegrained ]]; then
    if ((allgather)); then FLAGS+=(--moe-token-dispatcher-type allgather)
    else FLAGS+=(--moe-token-dispatcher-type alltoall); fi
  fi
  [[ -n $fp8 ]] && FLAGS+=(--fp8-format hybrid --fp8-recipe "$fp8")
  return 0
}
tps() { grep -oE "tokens per second per GPU: [0-9.]+" "$1" | tail -1 | awk '{print $6}'; }
tflops() { grep -oE "throughput per GPU \(TFLOP/s/GPU\): [0-9.]+" "$1" | tail -1 | awk '{print $NF}'; }
timer() {  # ms per iteration of timer $2 in the last interval of log $1 ("-" if absent)
  local v
  v=$(grep -E "^.* $2 \.+: \(" "$1" | tail -1 | sed -E 's/.*\(([0-9.]+),.*/\1/')
  echo "${v:--}"
}
# The last "exposed communication" line's shares (TP/SP/PP/DP/CP/EP, max over ranks).
exposed() {
  local v
  v=$(grep -oE "exposed communication \(.*\): .*" "$1" | tail -1 | sed -E 's/^[^:]*: //; s/ \|$//; s/ \| /, /g')
  echo "${v:--}"
}
# The busiest rank's peak: the largest "max allocated" of any rank's memory line (the plan's
# number it is set against is the busiest rank's too).
peak() { grep -oE "max allocated: [0-9.]+" "$1" | awk '$3 > m {m = $3} END {printf "%.0f", m}'; }

for L in $LAYOUTS; do parse "$L" > /dev/null || { parse "$L"; exit 2; }; done  # all valid first
rows=()
plan_failed=0
for L in $LAYOUTS; do
  parse "$L" || exit 2
  # The busiest rank's memory from the same model and layout flags (`megatron plan`).
  "$M" plan "${COMMON[@]}" "${FLAGS[@]}" --world-size "$NP" --global-batch-size "$GBS" \
    > "$LOG/$L.plan" 2>&1
  plan_mib=$(awk '/^  *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+$/ {
      if ($NF > m) m = $NF } END { printf "%.0f", m }' "$LOG/$L.plan")
  CMD=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -np "$NP" "$M"
    train "${COMMON[@]}" "${FLAGS[@]}" --global-batch-size "$GBS" --mock-data
    --tokenizer-type NullTokenizer --lr 1e-4 --train-iters "$ITERS" --log-interval $((ITERS / 2)) --log-throughput
    --device cuda --timing-log-level 1)
  if [[ -z $plan_mib || $plan_mib == 0 ]]; then
    rows+=("| $L | $NP | - | - | - | - | - | - | - | plan failed: $(grep -m1 -i "error" "$LOG/$L.plan" | cut -c1-160) |")
    plan_failed=1
    continue
  fi
  if [[ -n ${PLAN_ONLY:-} ]]; then
    rows+=("| $L | $NP | - | - | - | - | - | - | $plan_mib (plan) | flags accepted |")
    continue
  fi
  # The MoE models' plan holds the dropless bound of the dispatch buffers (every token of the
  # expert-parallel group routed to this rank's experts): a worst case, so they are run anyway
  # and the measured peak stands beside it.
  if ((plan_mib > MAX_MIB)) && [[ $MODEL != mixtral && $MODEL != finegrained ]]; then
    rows+=("| $L | $NP | - | - | - | - | - | - | $plan_mib (plan) | does not fit: plan > $MAX_MIB MiB |")
    continue
  fi
  if [[ -n ${DRY:-} ]]; then
    echo "${CMD[*]}"
    rows+=("| $L | $NP | - | - | - | - | - | - | $plan_mib (plan) | dry run |")
    continue
  fi
  "${CMD[@]}" > "$LOG/$L.log" 2>&1 || { tail -20 "$LOG/$L.log"; rows+=("| $L | $NP | failed | | | | | | | see $LOG/$L.log |"); continue; }
  t=$(tflops "$LOG/$L.log")
  rows+=("| $L | $NP | $(tps "$LOG/$L.log") | $t | $(awk -v t="$t" 'BEGIN{printf "%.1f%%", 100 * t / 989}') | $(timer "$LOG/$L.log" forward-backward) | $(timer "$LOG/$L.log" grads-reduce) | $(exposed "$LOG/$L.log") | $(peak "$LOG/$L.log") / $plan_mib (plan) | |")
done
echo "## Layouts of $MODEL${SEQ:+ at seq $SEQ}, bf16 (fp8: FP8 GEMMs), micro-batch $MB ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null), $(date -u +%F))"
echo "| layout | GPUs | tokens/s per GPU | TFLOP/s per GPU | MFU (989) | forward-backward ms | grads-reduce ms (exposed) | exposed communication, share of the step | peak MiB, measured / plan | note |"
echo "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
printf '%s\n' "${rows[@]}"
[[ -n ${PLAN_ONLY:-} ]] && exit $plan_failed
exit 0
