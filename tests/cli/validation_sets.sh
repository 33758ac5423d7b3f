#!/usr/bin/env bash
# validation_sets.sh MEGATRON [MPIRUN...]: --full-validation, --multiple-validation-sets and
# --validation-set-names, end to end on the CPU.
#   - full validation of set b (211 samples of 32 tokens) at the default evaluation batch
#     (global batch 8 = 4 one-sample micro-batches an iteration: Megatron's cyclic sampler
#     reads each sample 4 times) equals an ordinary evaluation that reads b's one epoch once
#     (micro-batch 1, --eval-global-batch-size 211), to the log line's digits;
#   - sets b and c, named: every validation line (and TensorBoard tag) carries its set's
#     name, and each set's losses (iterations 5 and 10, and after training) equal those of a
#     run validating that set alone with the same training;
#   - errors naming the cause: --multiple-validation-sets without --full-validation, names
#     without several sets, three names for two sets, weights in the list, and fewer samples
#     than data-parallel ranks (a fake rank of a 512-rank job);
#   - with MPIRUN: full validation at DP 2 and at PP 2 (stages exchanging the one-sample
#     micro-batches while training's are of 2) equal to the serial one.
# With MPIRUN: full validation of c (274 samples) at DP 2 equals the serial one.
set -euo pipefail
M=$1; shift
MPIRUN=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "$0")/train_log_lib.sh"  # abc_datasets
abc_datasets "$M" "$W"
A=$W/a_text_document B=$W/b_text_document C=$W/c_text_document
COMMON=(--tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --global-batch-size 8
  --lr 1e-3 --log-interval 5 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run LOG ARGS...
  local log=$1; shift
  "$M" train "${COMMON[@]}" "$@" > "$log" 2>&1 || { tail -20 "$log"; fail "train $*"; }
}
vloss() {  # vloss LOG SUFFIX WHERE: the lm loss value of " validation<SUFFIX> loss at <WHERE> |"
  grep -F " validation$2 loss at $3 |" "$1" | sed -E 's/.*lm loss value: ([^ ]+).*/\1/'
}
ZERO=(--train-iters 1 --skip-train --eval-interval 5)
run "$W/full.log" "${ZERO[@]}" --micro-batch-size 2 --valid-data-path "$B" --full-validation
grep -q "211 samples, 1 epochs | full validation: 211 iterations of 4 one-sample" "$W/full.log" ||
  { grep -F "validation:" "$W/full.log"; fail "full validation's plan"; }
run "$W/once.log" "${ZERO[@]}" --micro-batch-size 1 --valid-data-path "$B" --eval-iters 1 \
  --eval-global-batch-size 211
f=$(vloss "$W/full.log" "" "iteration 0 on validation set")
o=$(vloss "$W/once.log" "" "iteration 0 on validation set")
[ -n "$f" ] && [ "$f" = "$o" ] || fail "full validation $f, the epoch read once $o"

TRAIN=(--train-iters 10 --micro-batch-size 2 --train-data-path "$A" --eval-interval 5
  --full-validation)
run "$W/two.log" "${TRAIN[@]}" --valid-data-path "$B" "$C" --multiple-validation-sets \
  --validation-set-names bset cset --tensorboard-dir "$W/tb"
for tag in "lm loss validation-bset" "lm loss validation-cset vs samples"; do
  cat "$W"/tb/* | grep -aqF "$tag" || fail "no TensorBoard tag '$tag'"
done
run "$W/b.log" "${TRAIN[@]}" --valid-data-path "$B"
run "$W/c.log" "${TRAIN[@]}" --valid-data-path "$C"
n=0
for where in "iteration 5" "iteration 10" "iteration 10 on validation set"; do
  for s in b c; do
    two=$(vloss "$W/two.log" "-${s}set" "$where") one=$(vloss "$W/$s.log" "" "$where")
    [ -n "$two" ] && [ "$two" = "$one" ] || fail "set $s at '$where': $two with two sets, $one alone"
    n=$((n + 1))
  done
done
grep -q " validation loss at" "$W/two.log" && fail "an unnamed validation line with two sets"

expect_error() {  # expect_error MESSAGE ARGS...
  local msg=$1; shift
  if "$M" train "${COMMON[@]}" "$@" > "$W/e.log" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$msg" "$W/e.log" || { cat "$W/e.log"; fail "no '$msg'"; }
}
V=(--train-iters 10 --micro-batch-size 2 --train-data-path "$A" --eval-interval 5)
expect_error "--multiple-validation-sets needs --full-validation" "${V[@]}" \
  --valid-data-path "$B" "$C" --multiple-validation-sets
expect_error "--validation-set-names requires --multiple-validation-sets" "${V[@]}" \
  --valid-data-path "$B" --full-validation --validation-set-names bset
expect_error "--validation-set-names gives 3 names for 2 validation sets" "${V[@]}" \
  --valid-data-path "$B" "$C" --full-validation --multiple-validation-sets \
  --validation-set-names x y z
expect_error "--multiple-validation-sets with weights in --valid-data-path" "${V[@]}" \
  --valid-data-path 0.5 "$B" 0.5 "$C" --full-validation --multiple-validation-sets
WORLD_SIZE=512 RANK=0 expect_error "has 211 samples, fewer than the 512 data-parallel ranks" \
  --fake-process-group "${V[@]}" --global-batch-size 1024 --lr-warmup-iters 0 \
  --valid-data-path "$B" --full-validation

if [ ${#MPIRUN[@]} -gt 0 ]; then
  run "$W/c1.log" "${ZERO[@]}" --micro-batch-size 2 --valid-data-path "$C" --full-validation
  "${MPIRUN[@]}" -np 2 "$M" train "${COMMON[@]}" "${ZERO[@]}" --micro-batch-size 2 \
    --valid-data-path "$C" --full-validation > "$W/c2.log" 2>&1 ||
    { tail -20 "$W/c2.log"; fail "DP 2"; }
  s=$(vloss "$W/c1.log" "" "iteration 0 on validation set")
  d=$(vloss "$W/c2.log" "" "iteration 0 on validation set")
  [ -n "$s" ] && [ "$s" = "$d" ] || fail "full validation of c: serial $s, DP 2 $d"
  # pipeline stages exchange the one-sample micro-batches' activations (training's are 2)
  "${MPIRUN[@]}" -np 2 "$M" train "${COMMON[@]}" "${ZERO[@]}" --micro-batch-size 2 \
    --valid-data-path "$C" --full-validation --pipeline-model-parallel-size 2 \
    > "$W/c_pp.log" 2>&1 || { tail -20 "$W/c_pp.log"; fail "PP 2"; }
  p=$(vloss "$W/c_pp.log" "" "iteration 0 on validation set")
  python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(a))" \
    "$s" "$p" || fail "full validation of c: serial $s, PP 2 $p"
fi
echo "ok: full validation = the epoch once ($f); $n named-set losses = their sets alone" \
  "${MPIRUN:+; DP 2 = serial}"
