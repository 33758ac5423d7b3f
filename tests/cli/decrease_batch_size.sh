#!/usr/bin/env bash
# decrease_batch_size.sh MEGATRON: --decrease-batch-size-if-needed (Megatron's running global
# batch size), end to end on the CPU:
#   - --global-batch-size 5 at micro-batch 2 runs batches of 4: every iteration's loss,
#     learning rate and grad norm equal a run with --global-batch-size 4, the consumed
#     samples too, and each step adds the missing sample to "skipped samples";
#   - a resume keeps counting them; --train-samples counts steps by the batch as given;
#   - a fake rank of a DP 2 job rounds 10 down to 8; without the flag the error names it;
#     with --rampup-batch-size it is refused as not implemented.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 1 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --lr 1e-3 --lr-warmup-iters 1 --lr-decay-style cosine --log-interval 1 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }
run() { local log=$1; shift; "$M" train "${ARGS[@]}" "$@" > "$log" 2>&1 ||
  { tail -20 "$log"; fail "train $*"; }; }
field() {  # field LOG ITERATION NAME: the value of "NAME: v |" on that iteration's line
  grep -E "iteration +$2/" "$1" | sed -E "s/.*$3: *([^ |]+) *\|.*/\1/"
}
run "$W/four.log" --global-batch-size 4 --train-iters 6
run "$W/five.log" --global-batch-size 5 --train-iters 6 --decrease-batch-size-if-needed
grep -q "decreasing batch size from 5 to 4 to keep divisibility by micro_batch_size=2 \* \
data_parallel_size=1" "$W/five.log" || fail "no decrease line"
for it in 1 2 3 4 5 6; do
  for f in "lm loss" "learning rate" "grad norm" "consumed samples" "global batch size"; do
    a=$(field "$W/four.log" $it "$f") b=$(field "$W/five.log" $it "$f")
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "iteration $it $f: batch 4 '$a', 5 decreased '$b'"
  done
  [ "$(field "$W/five.log" $it "skipped samples")" = "$it" ] || fail "skipped at $it"
done
grep -q "skipped samples" "$W/four.log" && fail "skipped samples without a decrease"
# Resume from iteration 3: the count goes on.
run "$W/first.log" --global-batch-size 5 --train-iters 6 --decrease-batch-size-if-needed \
  --save "$W/ck" --exit-interval 3
run "$W/resume.log" --global-batch-size 5 --train-iters 6 --decrease-batch-size-if-needed \
  --load "$W/ck"
[ "$(field "$W/resume.log" 4 "skipped samples")" = 4 ] || fail "skipped after resume"
[ "$(field "$W/resume.log" 6 "lm loss")" = "$(field "$W/five.log" 6 "lm loss")" ] ||
  fail "resume changed iteration 6"
# --train-samples 20: 20 // 5 = 4 steps (Megatron's update_train_iters), not 20 // 4.
run "$W/samples.log" --global-batch-size 5 --train-samples 20 --decrease-batch-size-if-needed \
  --lr-warmup-iters 0 --lr-warmup-samples 4
[ "$(grep -cE "iteration +[0-9]+/ +4 \|" "$W/samples.log")" = 4 ] || fail "--train-samples steps"
WORLD_SIZE=2 RANK=0 "$M" train --fake-process-group "${ARGS[@]}" --global-batch-size 10 \
  --train-iters 2 --decrease-batch-size-if-needed > "$W/dp2.log" 2>&1 ||
  { tail "$W/dp2.log"; fail "fake DP 2"; }
grep -q "decreasing batch size from 10 to 8 .* data_parallel_size=2" "$W/dp2.log" ||
  fail "DP 2 decrease"
if "$M" train "${ARGS[@]}" --global-batch-size 5 --train-iters 1 > "$W/e.log" 2>&1; then
  fail "accepted batch 5 without the flag"; fi
grep -qF "(or add --decrease-batch-size-if-needed to round it down)" "$W/e.log" ||
  { cat "$W/e.log"; fail "the error does not name the flag"; }
if "$M" train "${ARGS[@]}" --global-batch-size 5 --train-iters 4 --decrease-batch-size-if-needed \
  --rampup-batch-size 2 2 8 > "$W/r.log" 2>&1; then fail "accepted with a ramp-up"; fi
grep -qF -- "--decrease-batch-size-if-needed with --rampup-batch-size is not implemented" \
  "$W/r.log" || { cat "$W/r.log"; fail "ramp-up message"; }
echo "ok: batch 5 decreased to 4 trains as batch 4, 1 skipped sample a step, resumes"
