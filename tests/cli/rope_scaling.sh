#!/usr/bin/env bash
# rope_scaling.sh MEGATRON: Llama 3.x RoPE scaling (--use-rope-scaling) end to end.
#   * a tiny RoPE model trains with --use-rope-scaling --rope-scaling-factor 32; the arguments
#     block shows both as Python would; its log lines differ from the plain model's;
#   * without --position-embedding-type rope it is refused, with a HINT;
#   * the checkpoint records the scaling: a run with --use-checkpoint-args (and no model
#     switches) resumes with it, iterations 5-8 identical to the uninterrupted run; loading it
#     with another factor warns, as a different --rotary-base does, and trains;
#   * convert --to-hf writes rope_scaling and rope_parameters of rope_type llama3, and
#     convert --from-hf of that folder gives a checkpoint with the same scaling.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --train-iters 8 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0)
# Head dim 16: 8 rotary pairs; at base 1e6 pair 4 is smoothed and pairs 5-7 are divided.
R=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
   --rotary-base 1000000)
S=(--use-rope-scaling --rope-scaling-factor 32)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line

# ---- training with scaling; the flags in the arguments block; not the plain model ---------
run "$W/scaled.log" "$M" train "${T[@]}" "${R[@]}" "${S[@]}"
args_line "$W/scaled.log" use_rope_scaling True
args_line "$W/scaled.log" rope_scaling_factor 32.0
[ "$(lines "$W/scaled.log" | wc -l)" -eq 8 ] || { echo "expected 8 iteration lines"; exit 1; }
run "$W/plain.log" "$M" train "${T[@]}" "${R[@]}"
args_line "$W/plain.log" use_rope_scaling False
args_line "$W/plain.log" rope_scaling_factor 8.0
if diff -q <(lines "$W/plain.log") <(lines "$W/scaled.log") > /dev/null; then
  echo "--use-rope-scaling did not change training"; exit 1
fi

# ---- without RoPE: refused, with a HINT ---------------------------------------------------
out=$("$M" train "${T[@]}" "${S[@]}" 2>&1) && { echo "scaling without RoPE was accepted"; exit 1; }
want="rescales RoPE's frequencies, but --position-embedding-type is learned_absolute"
grep -q -- "--use-rope-scaling $want" <<<"$out" &&
  grep -q "HINT: add --position-embedding-type rope" <<<"$out" ||
  { echo "unexpected error: $out"; exit 1; }

# ---- checkpoint: --use-checkpoint-args resumes with the scaling ---------------------------
run "$W/first.log" "$M" train "${T[@]}" "${R[@]}" "${S[@]}" --save "$W/ck" --save-interval 4 \
    --exit-interval 4
python3 - "$W/ck" <<'PY'
import glob, json, sys
md = json.load(open(glob.glob(f"{sys.argv[1]}/iter_0000004/metadata.json")[0]))
want = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}
assert md["model"].get("rope_scaling") == want, md["model"].get("rope_scaling")
print("metadata.json records rope_scaling", want)
PY
cp -r "$W/ck" "$W/ck_copy"  # for the loads below (the resume saves nothing: no --save)
run "$W/resume.log" "$M" train "${T[@]}" --use-checkpoint-args --load "$W/ck"
grep -q "successfully loaded checkpoint" "$W/resume.log" || { echo "no resume"; exit 1; }
args_line "$W/resume.log" use_rope_scaling True
args_line "$W/resume.log" rope_scaling_factor 32.0
diff <(lines "$W/scaled.log" 5 8) <(lines "$W/resume.log" 5 8) ||
  { echo "--use-checkpoint-args resume differs from the uninterrupted scaled run"; exit 1; }
[ "$(lines "$W/resume.log" 5 8 | wc -l)" -eq 4 ] ||
  { echo "expected 4 resumed iterations"; exit 1; }
# Another factor (or none): a warning naming both, as for --rotary-base; the run trains on.
run "$W/other.log" "$M" train "${T[@]}" "${R[@]}" --use-rope-scaling --rope-scaling-factor 8 \
    --load "$W/ck_copy"
grep -q 'rope_scaling differs (checkpoint {"factor":32.0,.*}, this run {"factor":8.0,' \
    "$W/other.log" ||
  { echo "no warning for a different factor"; grep -i rope "$W/other.log"; exit 1; }
run "$W/none.log" "$M" train "${T[@]}" "${R[@]}" --load "$W/ck_copy"
grep -q 'rope_scaling differs (checkpoint {"factor":32.0,.*}, this run off)' "$W/none.log" ||
  { echo "no warning for a run without scaling"; exit 1; }

# ---- Hugging Face: export writes llama3 in both spellings; import reads it back -----------
run "$W/to_hf.log" "$M" convert --load "$W/ck_copy" --to-hf "$W/hf"
python3 - "$W/hf/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192}
assert j["rope_scaling"] == s, j["rope_scaling"]
assert j["rope_parameters"] == dict(s, rope_theta=1000000.0), j["rope_parameters"]
assert j["rope_theta"] == 1000000.0
print("config.json: rope_scaling and rope_parameters of rope_type llama3")
PY
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/ck_hf" \
    --make-vocab-size-divisible-by 1
python3 - "$W/ck_copy" "$W/ck_hf" <<'PY'
import glob, json, sys
def model(d): return json.load(open(sorted(glob.glob(f"{d}/iter_*/metadata.json"))[-1]))["model"]
a, b = model(sys.argv[1]), model(sys.argv[2])
assert b.get("rope_scaling") == a["rope_scaling"] and b["rotary_base"] == a["rotary_base"], (a, b)
print("convert --from-hf: the same rope_scaling", b["rope_scaling"])
PY
echo "RoPE scaling: flags, training, checkpoint resume and Hugging Face exchange ok"
