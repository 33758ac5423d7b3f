#!/usr/bin/env bash
# moe_upcycling.sh MEGATRON [MPIRUN...]: --moe-use-upcycling end to end on the CPU.
#   - a dense SwiGLU model trains 4 iterations (of 6) and is saved;
#   - upcycled into 4 experts of the same FFN (granularity 1, top-2, post-softmax router:
#     the two weights sum to 1 and every expert is the dense MLP), the MoE model's
#     validation loss at its iteration 1 equals the dense model's at iteration 4;
#   - upcycling again into the same --save is refused; training on from the upcycled
#     model runs iterations 2-6, and a later run resumes its iteration 3 without the flag;
#   - with MPIRUN: the same upcycled evaluation under expert parallelism 2 (each rank loads
#     its experts of the checkpoint rank 0 wrote): the serial loss.
set -euo pipefail
M=$1; shift
MPIRUN=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 1 --log-interval 1 --threads 1 --swiglu
  --disable-bias-linear --position-embedding-type rope --normalization RMSNorm
  --ffn-hidden-size 64 --eval-iters 2 --eval-interval 100 --train-iters 6)
MOE=(--num-experts 4 --moe-router-topk 2 --moe-use-upcycling --load "$W/dense")
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run LOG ARGS...
  local log=$1; shift
  "$M" train "${ARGS[@]}" "$@" > "$log" 2>&1 || { tail -20 "$log"; fail "train $*"; }
}
final_vloss() {  # the lm loss of the after-training validation line
  grep -Eo "on validation set \| lm loss value: [0-9.E+-]+" "$1" | awk '{print $NF}' | tail -1
}
same() {  # same A B RTOL: |A - B| <= RTOL |A|
  python3 -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(abs(a - b) > t * abs(a))" \
    "$@"
}
run "$W/dense.log" --exit-interval 4 --save "$W/dense"
run "$W/dense_eval.log" --load "$W/dense" --skip-train
run "$W/up_eval.log" "${MOE[@]}" --save "$W/up_eval" --skip-train
grep -q "upcycled checkpoint saved to" "$W/up_eval.log" || fail "no upcycling line"
[ -d "$W/up_eval/iter_0000001" ] || fail "no iteration 1 in --save"
d=$(final_vloss "$W/dense_eval.log") u=$(final_vloss "$W/up_eval.log")
[ -n "$d" ] && [ -n "$u" ] || fail "missing validation lines: '$d' '$u'"
same "$d" "$u" 1e-5 || fail "upcycled validation loss $u, dense $d"
# The destination must be new.
"$M" train "${ARGS[@]}" "${MOE[@]}" --save "$W/up_eval" --skip-train > "$W/again.log" 2>&1 &&
  fail "upcycled into a --save that holds a checkpoint"
grep -q "holds a checkpoint already" "$W/again.log" || { tail "$W/again.log"; fail "message"; }
# Training on: iterations 2..6, then a resume of --save without the flag.
run "$W/up_train.log" "${MOE[@]}" --save "$W/up_train" --save-interval 3
grep -qE "iteration +2/ +6" "$W/up_train.log" || fail "training did not go on from iteration 1"
grep -qE "iteration +6/ +6" "$W/up_train.log" || fail "training did not reach 6"
run "$W/resume.log" --num-experts 4 --moe-router-topk 2 --load "$W/up_train" --ckpt-step 3
grep -q "successfully loaded checkpoint from $W/up_train \[ iteration 3 \]" "$W/resume.log" ||
  fail "resume of the upcycled run"
grep -qE "iteration +6/ +6" "$W/resume.log" || fail "the resume did not reach 6"
if [ ${#MPIRUN[@]} -gt 0 ]; then
  "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" "${MOE[@]}" --save "$W/up_ep2" --skip-train \
    --expert-model-parallel-size 2 > "$W/ep2.log" 2>&1 || { tail -20 "$W/ep2.log"; fail "EP2"; }
  e=$(final_vloss "$W/ep2.log")
  same "$u" "$e" 1e-5 || fail "EP 2 validation loss $e, serial $u"
fi
echo "ok: dense $d, upcycled $u"
