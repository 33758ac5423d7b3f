#!/usr/bin/env bash
# script_flags.sh MEGATRON: the checkpoint flags of Megatron's example scripts, end to end:
#   * --save-retain-interval 3 with --save-interval 1: of 7 saves, iterations 3, 6 and the
#     latest (7) remain, synchronously and with --async-save; on a resumed run the previous
#     checkpoint is the tracker's, and a symlinked one is never deleted;
#   * --exit-on-missing-checkpoint: an empty --load exits non-zero naming the flag (without
#     it the run starts from random weights); a --load that holds a checkpoint resumes;
#   * --pretrained-checkpoint: with an empty --load, training is the --finetune run from that
#     checkpoint, line for line (weights only, from iteration 0); once --load holds a
#     checkpoint the run resumes from it instead; an empty one is an error;
#   * --padded-vocab-size 1000: the args block shows it, the checkpoint's embedding has 1000
#     rows, the Hugging Face export's vocab_size is 1000, and `megatron plan` counts the same
#     parameters as the trainer;
#   * --no-check-for-nan-in-loss-and-grad (accepted by design): weights initialised with
#     std 1e38 make every loss NaN; the run goes on, counts a nan iteration in each log line
#     and exits 0, and
#     its weights after 3 steps are byte for byte those after 1: no update reached them.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 3e-3 --min-lr 3e-4 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0 --override-opt_param-scheduler)  # resumes: any length
fail() { echo "FAIL: $*"; exit 1; }
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { tail -20 "$log"; fail "$*"; }; }
lines() {  # the iteration lines without time stamps and timings
  grep -E "iteration +[0-9]+/" "$1" |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//'
}
iters() { (cd "$1" && echo iter_*); }
expect_fail() {  # log regex cmd...: exits non-zero (not by a signal), output matches
  local log=$1 regex=$2 rc=0; shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 128 ] || { tail -5 "$log"; fail "exit $rc: $*"; }
  grep -Eq -- "$regex" "$log" || { tail -5 "$log"; fail "no /$regex/ from: $*"; }
}

# ---- --save-retain-interval --------------------------------------------------------------
for mode in sync async; do
  extra=(); [ $mode = async ] && extra=(--async-save)
  run "$W/r_$mode.log" "$M" train "${T[@]}" --train-iters 7 --save "$W/r_$mode" \
      --save-interval 1 --save-retain-interval 3 "${extra[@]}"
  got=$(iters "$W/r_$mode")
  [ "$got" = "iter_0000003 iter_0000006 iter_0000007" ] || fail "$mode: kept $got"
  [ "$(cat "$W/r_$mode/latest_checkpointed_iteration.txt")" = 7 ] || fail "$mode: tracker"
  [ "$(grep -c "successfully deleted checkpoint from iteration" "$W/r_$mode.log")" = 4 ] ||
    fail "$mode: not 4 deletions"
done
# A resumed run: the previous checkpoint is the tracker's (2, here a symbolic link: kept).
run "$W/s1.log" "$M" train "${T[@]}" --train-iters 2 --save "$W/s" --save-interval 1
mv "$W/s/iter_0000002" "$W/s/real2" && ln -s real2 "$W/s/iter_0000002"
run "$W/s2.log" "$M" train "${T[@]}" --train-iters 5 --load "$W/s" --save "$W/s" \
    --save-interval 1 --save-retain-interval 3
got=$(iters "$W/s")
[ "$got" = "iter_0000001 iter_0000002 iter_0000003 iter_0000005" ] || fail "resumed: kept $got"
[ -L "$W/s/iter_0000002" ] && [ -f "$W/s/real2/metadata.json" ] || fail "the link went"
grep -q "skipping deleting checkpoint from iteration       2 .* since it is a symbolic link" \
  "$W/s2.log" || fail "no symlink message"
echo "ok --save-retain-interval: kept 3, 6, 7 (sync and async); a symlinked checkpoint stays"

# ---- --exit-on-missing-checkpoint --------------------------------------------------------
expect_fail "$W/e1.log" "--exit-on-missing-checkpoint: no checkpoint found in --load .*/nothing" \
  "$M" train "${T[@]}" --train-iters 2 --load "$W/nothing" --exit-on-missing-checkpoint
grep -q "HINT: check the --load path" "$W/e1.log" || fail "no hint"
run "$W/e2.log" "$M" train "${T[@]}" --train-iters 2 --load "$W/nothing"
grep -q "could not find a checkpoint in --load" "$W/e2.log" || fail "no warning without the flag"
run "$W/e3.log" "$M" train "${T[@]}" --train-iters 8 --load "$W/r_sync" --exit-on-missing-checkpoint
grep -q "successfully loaded checkpoint from .*r_sync \[ iteration 7 \]" "$W/e3.log" ||
  fail "--exit-on-missing-checkpoint did not resume"
echo "ok --exit-on-missing-checkpoint"

# ---- --pretrained-checkpoint -------------------------------------------------------------
F=(--train-iters 4)
run "$W/pt.log" "$M" train "${T[@]}" "${F[@]}" --load "$W/ft" --save "$W/ft" --save-interval 2 \
    --pretrained-checkpoint "$W/r_sync"
run "$W/fine.log" "$M" train "${T[@]}" "${F[@]}" --load "$W/r_sync" --finetune
run "$W/rand.log" "$M" train "${T[@]}" "${F[@]}"
grep -q "finetuning from --pretrained-checkpoint .*r_sync" "$W/pt.log" || fail "no finetune line"
first() { lines "$1" | sed -n 1p; }
[ "$(lines "$W/pt.log" | wc -l)" = 4 ] && grep -Eq "iteration +1/" <<<"$(first "$W/pt.log")" ||
  fail "--pretrained-checkpoint did not start at iteration 0"
diff <(lines "$W/pt.log") <(lines "$W/fine.log") || fail "--pretrained-checkpoint != --finetune"
[ "$(first "$W/pt.log")" != "$(first "$W/rand.log")" ] ||
  fail "--pretrained-checkpoint trained from random weights"
# --load holds a checkpoint now: the run resumes from it, not from the pretrained one.
run "$W/pt2.log" "$M" train "${T[@]}" --train-iters 6 --load "$W/ft" \
    --pretrained-checkpoint "$W/r_sync"
grep -q "successfully loaded checkpoint from .*ft \[ iteration 4 \]$" "$W/pt2.log" &&
  grep -Eq "iteration +5/" <<<"$(first "$W/pt2.log")" || fail "did not resume from --load"
expect_fail "$W/pt3.log" "no checkpoint found in --pretrained-checkpoint .*/nothing2 \(nor in" \
  "$M" train "${T[@]}" --train-iters 2 --load "$W/nothing" --pretrained-checkpoint "$W/nothing2"
echo "ok --pretrained-checkpoint: the --finetune run, then resumes from --load"

# ---- --padded-vocab-size -----------------------------------------------------------------
run "$W/pv.log" "$M" train "${T[@]}" --train-iters 2 --padded-vocab-size 1000 --save "$W/pv"
grep -Eq "^  padded_vocab_size \.+ 1000$" "$W/pv.log" || fail "args block"
grep -q "new size: 1000, --padded-vocab-size" "$W/pv.log" || fail "no padded vocab line"
grep -Eq "^ +embedding.word_embeddings.weight +\[1000, 32\]" <<<"$("$M" inspect "$W/pv")" ||
  fail "the checkpoint's embedding is not [1000, 32]"
run "$W/hf.log" "$M" convert --load "$W/pv" --to-hf "$W/hf"
python3 -c "import json,sys; v=json.load(open(sys.argv[1]))['vocab_size']; assert v == 1000, v" \
  "$W/hf/config.json" || fail "HF vocab_size"
n=$(sed -nE 's/.*number of parameters on .*model parallel rank \(0, 0\): ([0-9]+)/\1/p' "$W/pv.log")
p=$("$M" plan "${T[@]}" --train-iters 2 --padded-vocab-size 1000 | awk '/^  rank +parameters/ {
      getline; print $2 }')
[ -n "$n" ] && [ "$n" = "$p" ] || fail "train counts $n parameters, plan $p"
# 1000 - 640 (the default padding of 513 ids) rows of 32 more than without the flag.
p0=$("$M" plan "${T[@]}" --train-iters 2 | awk '/^  rank +parameters/ { getline; print $2 }')
[ $((p - p0)) = $(((1000 - 640) * 32)) ] || fail "plan: $p vs $p0 parameters"
echo "ok --padded-vocab-size: 1000 rows in the checkpoint, HF config and plan ($n parameters)"

# ---- --no-check-for-nan-in-loss-and-grad: a NaN never stops the run nor reaches the weights
N=(--train-iters 3 --init-method-std 1e38 --no-check-for-nan-in-loss-and-grad --no-save-optim)
run "$W/nan3.log" "$M" train "${T[@]}" "${N[@]}" --save "$W/nan3"
run "$W/nan1.log" "$M" train "${T[@]}" "${N[@]}" --save "$W/nan1" --exit-interval 1
grep -q "accepted by design: a non-finite loss" "$W/nan3.log" || fail "no by-design line"
# Counted per log interval (one iteration here), as Megatron's line: 1, 1, 1.
[ "$(grep -Ec "iteration +[123]/.*skipped iterations: +1 \| number of nan iterations: +1 \|" \
    "$W/nan3.log")" = 3 ] || fail "nan not counted once per interval"
cmp "$W/nan1/iter_0000001/model_tp00_pp00.safetensors" \
    "$W/nan3/iter_0000003/model_tp00_pp00.safetensors" || fail "a NaN step changed the weights"
echo "ok --no-check-for-nan-in-loss-and-grad: 3 NaN steps skipped, weights untouched"
