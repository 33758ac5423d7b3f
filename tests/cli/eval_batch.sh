#!/usr/bin/env bash
# eval_batch.sh MEGATRON [MPIRUN]: --eval-global-batch-size, --eval-micro-batch-size and
# --start-eval-at-iter.
#   A: global batch 4, evaluation every 4 iterations over 2 x 4 samples;
#   B: the same training, --eval-global-batch-size 8 --eval-iters 1, evaluation every 2
#      iterations from --start-eval-at-iter 4.
# Both train the same model, and both first evaluate at iteration 4 on validation samples
# 0-7 (B skipped iteration 2, so its dataset starts there too): the same validation loss
# (to rounding); B prints no evaluation at 2 and one at 4 and 6. With MPIRUN, B again at
# pipeline-parallel size 2 (the evaluation's own forward-only schedule of 4 micro-batches
# against training's 2): the serial B's validation losses.
# C: B with --eval-micro-batch-size 1 and 4 (the training micro-batch is 2): the same
# samples in micro-batches of another size, so B's validation losses (to rounding); with
# MPIRUN too at PP 2 (the stages exchange the evaluation's micro-batch shape) and DP 2.
set -euo pipefail
M=$1; shift
MPIRUN=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style cosine --train-iters 6
  --log-interval 1 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }
"$M" train "${ARGS[@]}" --eval-interval 4 --eval-iters 2 > "$W/a.log" 2>&1 ||
  { tail "$W/a.log"; fail "run A"; }
B=(--eval-interval 2 --eval-iters 1 --eval-global-batch-size 8 --start-eval-at-iter 4)
"$M" train "${ARGS[@]}" "${B[@]}" > "$W/b.log" 2>&1 || { tail "$W/b.log"; fail "run B"; }
vloss() {  # vloss LOG ITERATION: the lm loss value of that iteration's validation line
  grep -A1 "validation loss at iteration $2 " "$1" | grep -Eo "lm loss value: [0-9.E+-]+" |
    head -1 | awk '{print $4}'
}
grep -q "validation loss at iteration 2 " "$W/b.log" && fail "B evaluated before iteration 4"
a4=$(vloss "$W/a.log" 4) b4=$(vloss "$W/b.log" 4) b6=$(vloss "$W/b.log" 6)
[ -n "$a4" ] && [ -n "$b4" ] && [ -n "$b6" ] || fail "missing validation lines: '$a4' '$b4' '$b6'"
python3 - "$a4" "$b4" <<'PY' || fail "iteration 4: A $a4, B $b4"
import sys
a, b = map(float, sys.argv[1:])
sys.exit(0 if abs(a - b) <= 1e-6 * abs(a) else 1)
PY
grep -q "validation: GPTDataset valid split of mock" "$W/b.log" || fail "no validation dataset"
same_as_b() {  # same_as_b LOG WHAT: its validation losses at 4 and 6 are B's (1e-5)
  for it in 4 6; do
    python3 - "$(vloss "$W/b.log" $it)" "$(vloss "$1" $it)" <<'PY' ||
import sys
a, b = map(float, sys.argv[1:])
sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)
PY
      fail "$2: validation at $it: $(vloss "$1" $it) vs B's $(vloss "$W/b.log" $it)"
  done
}
for emb in 1 4; do
  "$M" train "${ARGS[@]}" "${B[@]}" --eval-micro-batch-size $emb > "$W/c$emb.log" 2>&1 ||
    { tail "$W/c$emb.log"; fail "run C, eval micro-batch $emb"; }
  same_as_b "$W/c$emb.log" "eval micro-batch $emb"
  grep -q "evaluation: $((8 / emb)) micro-batches a data-parallel rank, micro-batch size $emb" \
    "$W/c$emb.log" ||
    fail "eval micro-batch $emb: $(grep 'evaluation:' "$W/c$emb.log")"
done
if [ ${#MPIRUN[@]} -gt 0 ]; then
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" "${B[@]}" --pipeline-model-parallel-size 2 \
    --eval-micro-batch-size 4 > "$W/c_pp.log" 2>&1 || { tail -20 "$W/c_pp.log"; fail "C at PP 2"; }
  same_as_b "$W/c_pp.log" "eval micro-batch 4 at PP 2"
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" "${B[@]}" --eval-micro-batch-size 1 \
    > "$W/c_dp.log" 2>&1 || { tail -20 "$W/c_dp.log"; fail "C at DP 2"; }
  same_as_b "$W/c_dp.log" "eval micro-batch 1 at DP 2"
  grep -q "evaluation: 4 micro-batches a data-parallel rank, micro-batch size 1" "$W/c_dp.log" ||
    fail "eval micro-batch 1 at DP 2: $(grep 'evaluation:' "$W/c_dp.log")"
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" "${B[@]}" --pipeline-model-parallel-size 2 \
    > "$W/pp.log" 2>&1 || { tail -20 "$W/pp.log"; fail "run B at PP 2"; }
  for it in 4 6; do
    python3 - "$(vloss "$W/b.log" $it)" "$(vloss "$W/pp.log" $it)" <<'PY' ||
import sys
a, b = map(float, sys.argv[1:])
sys.exit(0 if abs(a - b) <= 1e-5 * abs(a) else 1)
PY
      fail "PP 2 validation at $it: $(vloss "$W/pp.log" $it) vs serial $(vloss "$W/b.log" $it)"
  done
fi
echo "ok: validation at 4: A $a4, B $b4; B at 6: $b6"
