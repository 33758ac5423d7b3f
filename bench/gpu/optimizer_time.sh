#!/usr/bin/env bash
# The optimizer's share of a training iteration, as a user runs it: `megatron train` on
# --mock-data with --optimizer adam, muon (Megatron's default bf16 Newton-Schulz) and muon
# with --muon-fp32-matmul-prec high, on one model shape; prints one table of ms per
# iteration (Megatron's "elapsed time per iteration" of the last log interval) and the lm
# loss at the last iteration. Other binaries (e.g. an older build's megatron, to compare
# two trees in one call) are given as extra arguments and run the same rows.
# Usage: bench/gpu/optimizer_time.sh MEGATRON [MEGATRON...]
#        env MODEL 124m (default) | 350m | tiny, MB micro-batch (16), GBS global batch (16),
#        ITERS (12), DEVICE (cuda; cpu with MODEL=tiny for a smoke test), OUT logs (/tmp)
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 MEGATRON [MEGATRON...]"; exit 2; }
MODEL=${MODEL:-124m} MB=${MB:-16} GBS=${GBS:-16} ITERS=${ITERS:-12} DEVICE=${DEVICE:-cuda}
LOG=${OUT:-/tmp}/optimizer-time-$MODEL
mkdir -p "$LOG"
case $MODEL in
  124m) SHAPE=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
               --max-position-embeddings 1024) ;;
  350m) SHAPE=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
               --max-position-embeddings 1024) ;;
  tiny) SHAPE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
               --max-position-embeddings 64) ;;
  *) echo "optimizer_time.sh: unknown model '$MODEL' (124m, 350m, tiny)"; exit 2 ;;
esac
PREC=(--bf16)
[[ $DEVICE == cpu ]] && PREC=()
COMMON=("${SHAPE[@]}" --tokenizer-type NullTokenizer --vocab-size 50257 --mock-data
  --micro-batch-size "$MB" --global-batch-size "$GBS" --lr 6e-4 --min-lr 6e-5
  --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 --train-iters "$ITERS"
  --attention-dropout 0 --hidden-dropout 0 --log-interval $((ITERS / 2)) --eval-iters 0
  --device "$DEVICE" "${PREC[@]}")
ms() { grep -oE "elapsed time per iteration \(ms\): [0-9.]+" "$1" | tail -1 | awk '{print $NF}'; }
loss() { grep -oE "lm loss: [0-9.E+-]+" "$1" | tail -1 | awk '{print $NF}'; }
echo "| binary | --optimizer | ms per iteration | lm loss at iteration $ITERS |"
echo "|---|---|---:|---:|"
n=0 rc=0
for M in "$@"; do
  n=$((n + 1))
  for opt in "adam" "muon" "muon --muon-fp32-matmul-prec high"; do
    log="$LOG/run$n-${opt// /_}.log"
    # shellcheck disable=SC2086  # opt carries its own flags
    if ! "$M" train "${COMMON[@]}" --optimizer $opt > "$log" 2>&1; then
      echo "| $M | $opt | failed: $(tail -1 "$log") | |"
      rc=1
      continue
    fi
    echo "| $M | $opt | $(ms "$log") | $(loss "$log") |"
  done
done
exit $rc
