#!/usr/bin/env bash
# compat_flags.sh MEGATRON MPIRUN...: issue 23 A.1 end to end, each against an oracle:
#   * --rampup-batch-size: every log line's global batch size and consumed samples follow
#     Megatron's formula (restated in Python below), and the learning rate is the linear
#     schedule at those consumed samples (Megatron steps the scheduler by the actual batch);
#   * --step-batch-size-schedule: every line's batch size and consumed samples follow the
#     schedule (thresholds in tokens) until --train-samples; with --global-batch-size or
#     --rampup-batch-size it is Megatron's error;
#   * --decoupled-lr: the logged decoupled rate is the schedule with its own max/min; with
#     --decoupled-lr = --lr and --decoupled-min-lr = --min-lr training is bit-identical to
#     a run without the flags; with another rate it is not;
#   * --apply-layernorm-1p: losses equal the plain model's (1 + 0 = 1; the same gradients)
#     to 1e-4, and its checkpoint refuses to load without the flag;
#   * --no-mmap-bin-files: bit-identical log lines to the memory-mapped run on real data;
#   * --use-checkpoint-args: a run with only --load's checkpoint's arguments resumes;
#   * --log-params-norm / --log-num-zeros-in-grad: the same values at TP2 (mpirun) as at TP1
#     (each element counted once).
set -euo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --lr 3e-3 --min-lr 3e-4 --log-interval 1 --threads 1 --hidden-dropout 0 --attention-dropout 0)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
lines() { grep -E "iteration +[0-9]+/" "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//'; }

# ---- ramp-up: batch sizes, consumed samples and the LR against the formula ----------------
run "$W/ramp.log" "$M" train "${T[@]}" --global-batch-size 16 --rampup-batch-size 4 4 40 \
    --train-iters 12 --lr-decay-style linear --decoupled-lr 1e-2 --decoupled-min-lr 1e-4
python3 - "$W/ramp.log" <<'PY'
import re, sys
gbs, start, inc, samples, iters = 16, 4, 4, 40, 12
per_inc = samples / ((gbs - start) / inc)          # Megatron: a Python float
decay = iters * gbs                                # --lr-decay-iters = train_iters, x final GBS
def lr(n, mx, mn): return mn + (1 - n / decay) * (mx - mn) if n <= decay else mn
consumed, want = 0, []
for it in range(1, iters + 1):
    b = gbs if consumed > samples else start + int(consumed / per_inc) * inc
    consumed += b
    want.append((it, b, consumed, lr(consumed, 3e-3, 3e-4), lr(consumed, 1e-2, 1e-4)))
got = []
for line in open(sys.argv[1]):
    m = re.search(r"iteration +(\d+)/.*consumed samples: +(\d+) .*learning rate: (\S+) \| "
                  r"decoupled learning rate: (\S+) \| global batch size: +(\d+)", line)
    if m: got.append((int(m[1]), int(m[5]), int(m[2]), float(m[3]), float(m[4])))
assert len(got) == iters, f"{len(got)} iteration lines, want {iters}"
for g, w in zip(got, want):
    assert g[:3] == w[:3], f"iteration {w[0]}: got (gbs, consumed) {g[1:3]}, want {w[1:3]}"
    for k in (3, 4):
        assert abs(g[k] - w[k]) <= 1e-6 * w[k], f"iteration {w[0]}: rate {g[k]} != {w[k]:.6E}"
print("ramp-up: batch sizes", [w[1] for w in want], "consumed", want[-1][2], "LRs match")
PY
grep -q "ramping up batch size from 4 to 8" "$W/ramp.log" || { echo "no ramp-up log line"; exit 1; }

# ---- --step-batch-size-schedule: batch sizes by consumed tokens, sample-based run ---------
# Thresholds in tokens (seq 32): 4 until 512 tokens (16 samples), 8 until 2K (64), then 16;
# --train-samples 120: Megatron's update_train_iters runs while fewer are consumed.
run "$W/steps.log" "$M" train "${T[@]}" --step-batch-size-schedule "0:4 512:8 2K:16" \
    --train-samples 120 --lr-decay-style linear
python3 - "$W/steps.log" <<'PY'
import re, sys
def bs(c): return 16 if c >= 2048 // 32 else 8 if c >= 512 // 32 else 4
want, consumed = [], 0
while consumed < 120:
    b = bs(consumed); consumed += b; want.append((b, consumed))
got = [(int(m[2]), int(m[1])) for m in re.finditer(
    r"consumed samples: +(\d+) .*?global batch size: +(\d+)", open(sys.argv[1]).read())]
assert got == want, f"got {got}\nwant {want}"
print("step schedule: batch sizes", [w[0] for w in want], "consumed", want[-1][1])
PY
grep -q "> using step batch size schedule: 0:4 512:8 2K:16" "$W/steps.log" ||
  { echo "no schedule line"; exit 1; }
for bad in "--global-batch-size 8" "--rampup-batch-size 4 4 40"; do
  if out=$("$M" train "${T[@]}" --step-batch-size-schedule "0:4" --train-iters 2 $bad 2>&1); then
    echo "accepted --step-batch-size-schedule with $bad"; exit 1
  fi
  grep -q "Cannot specify both --step-batch-size-schedule" <<<"$out" ||
    { echo "wrong error for $bad: $(grep -m1 ERROR <<<"$out")"; exit 1; }
done

# ---- decoupled LR equal to the main LR: bit-identical; different: not -------------------
run "$W/plain.log" "$M" train "${T[@]}" --global-batch-size 8 --train-iters 8
run "$W/dec_same.log" "$M" train "${T[@]}" --global-batch-size 8 --train-iters 8 \
    --decoupled-lr 3e-3 --decoupled-min-lr 3e-4
run "$W/dec_diff.log" "$M" train "${T[@]}" --global-batch-size 8 --train-iters 8 \
    --decoupled-lr 3e-2
strip_dec() { lines "$1" | sed -E 's/ decoupled learning rate: [^|]*\|//'; }
diff <(lines "$W/plain.log") <(strip_dec "$W/dec_same.log") ||
  { echo "--decoupled-lr = --lr changed training"; exit 1; }
if diff -q <(lines "$W/plain.log") <(strip_dec "$W/dec_diff.log") > /dev/null; then
  echo "--decoupled-lr 3e-2 did not change training"; exit 1
fi

# ---- --apply-layernorm-1p: the same function, stored as w - 1 --------------------------
for norm in LayerNorm RMSNorm; do
  run "$W/n0.log" "$M" train "${T[@]}" --global-batch-size 8 --train-iters 8 --normalization $norm \
      --save "$W/ck_$norm"
  run "$W/n1.log" "$M" train "${T[@]}" --global-batch-size 8 --train-iters 8 --normalization $norm \
      --apply-layernorm-1p --save "$W/ck1p_$norm"
  python3 - "$W/n0.log" "$W/n1.log" "$norm" <<'PY'
import re, sys
def losses(p): return [float(m[1]) for m in re.finditer(r"lm loss: (\S+)", open(p).read())]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 8, (len(a), len(b))
worst = max(abs(x - y) / x for x, y in zip(a, b))
assert worst < 1e-4, f"{sys.argv[3]}: 1p losses differ by {worst:.2e}: {a} vs {b}"
print(f"{sys.argv[3]} --apply-layernorm-1p: losses agree to {worst:.1e}")
PY
done
# Exported to Hugging Face (GPT-2: LayerNorm), the 1p model's norm weights are w = 1 + stored:
# the plain model's, to fp32 rounding.
for c in ck_LayerNorm ck1p_LayerNorm; do
  run "$W/$c.conv.log" "$M" convert --load "$W/$c" --to-hf "$W/hf_$c"
done
python3 - "$W/hf_ck_LayerNorm/model.safetensors" "$W/hf_ck1p_LayerNorm/model.safetensors" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        assert v["dtype"] == "F32", v["dtype"]
        out[k] = struct.unpack(f"<{len(raw) // 4}f", raw)
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys()
norms = [k for k in a if k.endswith((".ln_1.weight", ".ln_2.weight", "ln_f.weight"))]
assert len(norms) == 5, norms
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
mean_ln = sum(sum(a[k]) / len(a[k]) for k in norms) / len(norms)
assert worst < 1e-5 and abs(mean_ln - 1) < 0.05, (worst, mean_ln)
print(f"HF export of the 1p model equals the plain model's to {worst:.1e} (norm weights ~{mean_ln:.3f})")
PY
out=$("$M" train "${T[@]}" --global-batch-size 8 --train-iters 10 --load "$W/ck1p_RMSNorm" \
      --normalization RMSNorm 2>&1) && { echo "a 1p checkpoint loaded without the flag"; exit 1; }
grep -q "zero_centered_gamma (--apply-layernorm-1p): checkpoint true vs this run false" <<<"$out" ||
  { echo "unexpected error: $out"; exit 1; }

# ---- --use-checkpoint-args: the model's flags from the checkpoint ------------------------
run "$W/uca.log" "$M" train --mock-data --tokenizer-type NullTokenizer --vocab-size 512 \
    --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --train-iters 10 \
    --log-interval 1 --threads 1 --hidden-dropout 0 --attention-dropout 0 \
    --use-checkpoint-opt_param-scheduler --use-checkpoint-args --load "$W/ck1p_RMSNorm"
grep -q "successfully loaded checkpoint" "$W/uca.log" && grep -Eq "iteration +9/ +10" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not resume"; tail -20 "$W/uca.log"; exit 1; }
grep -Eq "^  layernorm_zero_centered_gamma \.+ True" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take --apply-layernorm-1p"; exit 1; }

# ---- --no-mmap-bin-files on real .bin/.idx data -------------------------------------------
python3 - "$W" <<'PY'
import json, random, sys
random.seed(3)
with open(f"{sys.argv[1]}/d.jsonl", "w") as f:
    for _ in range(200):
        s = random.randrange(500)
        f.write(json.dumps({"text": " ".join(str((s + i) % 500) for i in range(random.randrange(10, 90)))}) + "\n")
PY
"$M" preprocess --input "$W/d.jsonl" --output-prefix "$W/d" --tokenizer-type NullTokenizer \
  --vocab-size 512 --append-eod --workers 1 > /dev/null
D=(--data-path "$W/d_text_document" --split 98,2,0 "${T[@]:1}" --global-batch-size 8 --train-iters 6)
run "$W/mm.log" "$M" train "${D[@]}"
run "$W/nomm.log" "$M" train "${D[@]}" --no-mmap-bin-files
diff <(lines "$W/mm.log") <(lines "$W/nomm.log") || { echo "--no-mmap-bin-files changed the data"; exit 1; }

# ---- params norm and zeros: TP2 counts every element once, as TP1 -------------------------
if [ ${#MPI[@]} -gt 0 ]; then
  # --vocab-size 500 (+ EOD): padded to 512 at TP1 and TP2 alike (padding rows are
  # parameters too); untied, the embedding's padding rows get exactly zero gradients.
  L=(--global-batch-size 8 --train-iters 4 --log-params-norm --log-num-zeros-in-grad
     --vocab-size 500 --untie-embeddings-and-output-weights)
  run "$W/tp1.log" "$M" train "${T[@]}" "${L[@]}"
  run "$W/tp2.log" "${MPI[@]}" -np 2 "$M" train "${T[@]}" "${L[@]}" --tensor-model-parallel-size 2
  python3 - "$W/tp1.log" "$W/tp2.log" <<'PY'
import re, sys
def f(p): return [(float(m[1]), float(m[2])) for m in
                  re.finditer(r"num zeros: (\S+) \| params norm: (\S+) \|", open(p).read())]
a, b = f(sys.argv[1]), f(sys.argv[2])
assert len(a) == len(b) == 4, (a, b)
assert all(z >= 11 * 32 for z, _ in a), f"the 11 padding rows x 32 should be zeros: {a}"
for (z1, n1), (z2, n2) in zip(a, b):
    assert z1 == z2, f"num zeros TP1 {z1} vs TP2 {z2}"
    assert abs(n1 - n2) <= 0.0015, f"params norm TP1 {n1} vs TP2 {n2}"
print("params norm / num zeros: TP1 == TP2", a)
PY
fi
echo "compat flags: all checks passed"
