#!/usr/bin/env bash
# precision_aware_optimizer.sh MEGATRON: --use-precision-aware-optimizer with bf16 Adam
# moments under the distributed optimizer, end to end on the CPU:
#   - the start-up line counts 2 + 2 bytes of state a parameter (two bf16 moments; the f32
#     model's own blocks are its main parameters) against 8 with fp32 moments;
#   - the loss falls, and the checkpoint holds the moments as BF16 tensors;
#   - Adam's default beta2 0.999 with a bf16 exp_avg_sq is warned about (it cannot decay);
#   - a checkpoint with bf16 moments loads into a run with fp32 moments and the other way
#     round, and each then trains on.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 3e-3 --lr-warmup-iters 2 --lr-decay-style cosine
  --log-interval 1 --threads 1 --use-distributed-optimizer --adam-beta2 0.95)
BF16=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run LOG ARGS...
  local log=$1; shift
  "$M" train "${ARGS[@]}" "$@" > "$log" 2>&1 || { tail -20 "$log"; fail "train $*"; }
}
state_bytes() { sed -nE 's/.*distributed optimizer: ([0-9]+) bytes.*/\1/p' "$1"; }
loss() { grep -E "iteration +$2/" "$1" | sed -E 's/.*lm loss: *([^ |]+).*/\1/'; }
run "$W/f32.log" --train-iters 12 --save "$W/f32" --save-interval 6
run "$W/b16.log" --train-iters 12 --save "$W/b16" --save-interval 6 "${BF16[@]}"
f=$(state_bytes "$W/f32.log") b=$(state_bytes "$W/b16.log")
[ -n "$f" ] && [ -n "$b" ] || fail "no distributed optimizer line"
# The f32 model keeps no main copy: the state is the two moments, 4 + 4 bytes against 2 + 2.
[ $((b * 2)) -eq "$f" ] || fail "state bytes: bf16 moments $b, fp32 moments $f (want 1/2)"
python3 - "$(loss "$W/b16.log" 1)" "$(loss "$W/b16.log" 12)" <<'PY' || fail "loss did not fall"
import sys
a, b = map(float, sys.argv[1:])
print(f"bf16 moments: loss {a} -> {b}")
sys.exit(0 if b < a - 0.3 else 1)
PY
python3 - "$W/b16/iter_0000012/metadata.json" <<'PY' || fail "moments not stored as BF16"
import json, sys
t = json.load(open(sys.argv[1]))["tensors"]
keys = [k for k in t if k.startswith("optimizer.exp_avg")]
assert keys and all(t[k]["dtype"] == "BF16" for k in keys), [(k, t[k]["dtype"]) for k in keys]
assert any(k.startswith("optimizer.exp_avg_sq.") for k in keys)
print(f"{len(keys)} moment tensors stored as BF16")
PY
grep -q "with a bf16" "$W/b16.log" && fail "warned with --adam-beta2 0.95"
"$M" train "${ARGS[@]/0.95/0.999}" --train-iters 1 --lr-warmup-iters 0 "${BF16[@]}" \
  > "$W/warn.log" 2>&1 || { tail "$W/warn.log"; fail "beta2 0.999 run"; }
grep -q -- "--adam-beta2 0.999 with a bf16 exp_avg_sq" "$W/warn.log" || fail "no beta2 warning"
# Across moment dtypes: the bf16 checkpoint into fp32 moments, the fp32 one into bf16.
# (From iteration 6 to 12.)
run "$W/x1.log" --train-iters 12 --load "$W/b16" --ckpt-step 6
run "$W/x2.log" --train-iters 12 --load "$W/f32" --ckpt-step 6 "${BF16[@]}"
for x in x1 x2; do
  grep -q "successfully loaded checkpoint" "$W/$x.log" || fail "$x did not load"
  [ -n "$(loss "$W/$x.log" 12)" ] || fail "$x did not train to 12"
done
echo "ok: state $b vs $f bytes; checkpoints load across moment dtypes"
