#!/usr/bin/env bash
# iterations_to_skip.sh MEGATRON: --iterations-to-skip 3 4 (Megatron's way past bad data):
# those iterations' global batches are consumed without a step. Dropout off, so that
#   - iterations 1-2 equal a run without skips, and no iteration line is printed for 3, 4;
#   - iteration 5 reports 5 global batches consumed and 2 skipped, and runs at the learning
#     rate of the plain run's iteration 3 (the scheduler stepped 3 times) on the same model
#     but other data: a loss that differs from the plain run's iteration 3 (it would equal
#     it if the batches had not been consumed);
#   - a checkpoint keeps the skipped count, and a resume goes on printing it.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 1 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style cosine --train-iters 8
  --log-interval 1 --threads 1 --hidden-dropout 0 --attention-dropout 0)
"$M" train "${ARGS[@]}" > "$W/plain.log" 2>&1 || { tail "$W/plain.log"; exit 1; }
"$M" train "${ARGS[@]}" --iterations-to-skip 3 4 --save "$W/ck" --save-interval 6 \
  --exit-interval 6 > "$W/skip.log" 2>&1 || { tail "$W/skip.log"; exit 1; }
field() {  # field LOG ITERATION NAME: the value of "NAME: v |" on that iteration's line
  grep -E "iteration +$2/" "$1" | sed -E "s/.*$3: *([^ |]+) *\|.*/\1/"
}
fail() { echo "FAIL: $*"; exit 1; }
for it in 1 2; do
  [ "$(field "$W/plain.log" $it "lm loss")" = "$(field "$W/skip.log" $it "lm loss")" ] ||
    fail "iteration $it differs before any skip"
done
grep -qE "iteration +[34]/" "$W/skip.log" && fail "skipped iterations printed a line"
[ "$(field "$W/skip.log" 5 "consumed samples")" = 20 ] || fail "consumed at 5: $(field "$W/skip.log" 5 "consumed samples")"
[ "$(field "$W/skip.log" 5 "skipped samples")" = 8 ] || fail "skipped at 5: $(field "$W/skip.log" 5 "skipped samples")"
[ "$(field "$W/skip.log" 5 "learning rate")" = "$(field "$W/plain.log" 3 "learning rate")" ] ||
  fail "the scheduler stepped on a skipped iteration"
[ "$(field "$W/skip.log" 5 "lm loss")" != "$(field "$W/plain.log" 3 "lm loss")" ] ||
  fail "iteration 5 saw iteration 3's data: the skipped batches were not consumed"
grep -q "skipping iteration 3 (--iterations-to-skip)" "$W/skip.log" || fail "no skip message"
"$M" train "${ARGS[@]}" --iterations-to-skip 3 4 --load "$W/ck" > "$W/resume.log" 2>&1 ||
  { tail "$W/resume.log"; exit 1; }
[ "$(field "$W/resume.log" 7 "skipped samples")" = 8 ] || fail "the resume lost the skipped count"
[ "$(field "$W/resume.log" 7 "consumed samples")" = 28 ] || fail "consumed after resume"
echo "iterations 3-4 skipped: 8 samples consumed without a step, kept across a resume"
