#!/usr/bin/env bash
# yarn.sh MEGATRON: standard attention's YaRN (--position-embedding-type yarn) end to end.
#   * a tiny model trains with YaRN; the arguments block shows its flags as Python would; its
#     log lines differ from the plain RoPE model's;
#   * its flags without it, and --rotary-percent with it, are refused with a HINT;
#   * the checkpoint records it: --use-checkpoint-args resumes with it, iterations 5-8
#     identical to the uninterrupted run; another factor warns and trains;
#   * generate samples from the checkpoint;
#   * convert --to-hf writes rope type yarn, and --from-hf of that folder gives the same YaRN;
#   * Megatron's legacy format (--ckpt-format torch) keeps it in its args and
#     convert --from-megatron reads it back.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --train-iters 8 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0 --normalization RMSNorm --swiglu
   --disable-bias-linear)
# Head dim 16 over an original context of 16 tokens: positions up to 63 cross the ramp.
Y=(--position-embedding-type yarn --rotary-scaling-factor 4 --yarn-original-max-position-embeddings
   16 --yarn-beta-fast 8 --mscale 0.9)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line
refused() {  # refused LOG NEEDLE CMD...: CMD fails, its error has NEEDLE and a HINT
  local log=$1 needle=$2; shift 2
  if "$@" >"$log" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$needle" "$log" && grep -q "HINT:" "$log" ||
    { echo "unexpected error for $*:"; cat "$log"; exit 1; }
}

# ---- training; the flags in the arguments block; not the plain RoPE model -----------------
run "$W/yarn.log" "$M" train "${T[@]}" "${Y[@]}"
args_line "$W/yarn.log" position_embedding_type yarn
args_line "$W/yarn.log" rotary_scaling_factor 4.0
args_line "$W/yarn.log" yarn_original_max_position_embeddings 16
args_line "$W/yarn.log" yarn_beta_fast 8.0
args_line "$W/yarn.log" yarn_beta_slow None
[ "$(lines "$W/yarn.log" | wc -l)" -eq 8 ] || { echo "expected 8 iteration lines"; exit 1; }
run "$W/plain.log" "$M" train "${T[@]}" --position-embedding-type rope
if diff -q <(lines "$W/plain.log") <(lines "$W/yarn.log") > /dev/null; then
  echo "YaRN did not change training"; exit 1
fi

# ---- refusals ------------------------------------------------------------------------------
refused "$W/r1.log" "--yarn-beta-fast configures YaRN, but --position-embedding-type is rope" \
  "$M" train "${T[@]}" --position-embedding-type rope --yarn-beta-fast 8
refused "$W/r2.log" "--rotary-percent 0.5 with --position-embedding-type yarn" \
  "$M" train "${T[@]}" "${Y[@]}" --rotary-percent 0.5

# ---- checkpoint: --use-checkpoint-args resumes with YaRN ----------------------------------
run "$W/first.log" "$M" train "${T[@]}" "${Y[@]}" --save "$W/ck" --save-interval 4 \
    --exit-interval 4
python3 - "$W/ck" <<'PY'
import glob, json, sys
md = json.load(open(glob.glob(f"{sys.argv[1]}/iter_0000004/metadata.json")[0]))
want = {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0,
        "beta_slow": 1.0, "correction_range_round_to_int": True, "mscale": 0.9,
        "mscale_all_dim": 0.0}
assert md["model"].get("yarn") == want, md["model"].get("yarn")
assert md["model"]["rope"] is True
print("metadata.json records yarn", want)
PY
cp -r "$W/ck" "$W/ck_copy"
run "$W/resume.log" "$M" train "${T[@]}" --use-checkpoint-args --load "$W/ck"
grep -q "successfully loaded checkpoint" "$W/resume.log" || { echo "no resume"; exit 1; }
args_line "$W/resume.log" position_embedding_type yarn
args_line "$W/resume.log" mscale 0.9
diff <(lines "$W/yarn.log" 5 8) <(lines "$W/resume.log" 5 8) ||
  { echo "--use-checkpoint-args resume differs from the uninterrupted YaRN run"; exit 1; }
[ "$(lines "$W/resume.log" 5 8 | wc -l)" -eq 4 ] ||
  { echo "expected 4 resumed iterations"; exit 1; }
run "$W/other.log" "$M" train "${T[@]}" --position-embedding-type yarn \
    --rotary-scaling-factor 8 --load "$W/ck_copy"
grep -q 'yarn differs (checkpoint {.*"factor":4.0.*}, this run {.*"factor":8.0' "$W/other.log" ||
  { echo "no warning for another factor"; grep -i yarn "$W/other.log"; exit 1; }

# ---- generate from the checkpoint ----------------------------------------------------------
run "$W/gen.log" "$M" generate --load "$W/ck_copy" --prompt "5 6 7 8" \
    --num-tokens-to-generate 6 --threads 1
grep -Eq "[0-9]" "$W/gen.log" || { echo "generate printed nothing"; exit 1; }

# ---- Hugging Face: export writes rope type yarn; import reads the same YaRN back -----------
run "$W/to_hf.log" "$M" convert --load "$W/ck_copy" --to-hf "$W/hf"
python3 - "$W/hf/config.json" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1]))
s = j["rope_scaling"]
assert s["rope_type"] == "yarn" and s["factor"] == 4.0, s
assert s["original_max_position_embeddings"] == 16 and s["beta_fast"] == 8.0, s
assert abs(s["attention_factor"] - (0.1 * 0.9 * math.log(4) + 1)) < 1e-12, s
print("config.json: rope_scaling of rope_type yarn")
PY
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/ck_hf" \
    --make-vocab-size-divisible-by 1
python3 - "$W/ck_copy" "$W/ck_hf" <<'PY'
import glob, json, sys
def model(d): return json.load(open(sorted(glob.glob(f"{d}/iter_*/metadata.json"))[-1]))["model"]
a, b = model(sys.argv[1])["yarn"], model(sys.argv[2])["yarn"]
# --mscale 0.9 with --mscale-all-dim 0 travels as attention_factor (transformers' rule gives
# mscale(F) from that pair) and comes back as the mscale that gives it, to rounding.
assert abs(b.pop("mscale") - a.pop("mscale")) < 1e-12, (a, b)
assert b == a, (a, b)
print("convert --from-hf: the same yarn", b)
PY

# ---- Megatron's legacy format keeps YaRN in its args; --from-megatron reads it back --------
run "$W/torch.log" "$M" train "${T[@]}" "${Y[@]}" --train-iters 2 --ckpt-format torch \
    --save "$W/U" --save-interval 2
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
python3 - "$W/ck_copy" "$W/C" <<'PY'
import glob, json, sys
def model(d): return json.load(open(sorted(glob.glob(f"{d}/iter_*/metadata.json"))[-1]))["model"]
a, b = model(sys.argv[1]), model(sys.argv[2])
assert b.get("yarn") == a["yarn"], (a.get("yarn"), b.get("yarn"))
print("convert --from-megatron: the same yarn", b["yarn"])
PY
echo "YaRN: flags, training, checkpoint resume, generation, HF and Megatron exchange ok"
