#!/usr/bin/env bash
# rope_interpolation.sh MEGATRON: linear RoPE position interpolation
# (--rotary-seq-len-interpolation-factor) and --rope-type end to end.
#   * a tiny RoPE model trains with --rotary-seq-len-interpolation-factor 4 (alone, and with
#     --use-rope-scaling: both apply); the arguments block shows it as Python's int; its log
#     lines differ from the plain model's; --rope-type rope changes nothing;
#   * without --position-embedding-type rope it is refused, and so is --rope-type yarn, each
#     with a HINT;
#   * the checkpoint records the factor: --use-checkpoint-args (no model switches) resumes
#     with it, iterations 5-8 identical to the uninterrupted run;
#   * convert --to-hf writes rope_type linear; convert --from-hf of that folder gives the same
#     factor back; a model with both scaling and interpolation is refused by --to-hf.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --train-iters 8 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0)
R=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear)
I=(--rotary-seq-len-interpolation-factor 4)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line
refused() {  # refused "what" "error text" "hint text" args...: exits non-zero with both
  local what=$1 want=$2 hint=$3; shift 3
  local out; out=$("$M" train "$@" 2>&1) && { echo "$what was accepted"; exit 1; }
  grep -qF -- "$want" <<<"$out" && grep -qF -- "HINT: $hint" <<<"$out" ||
    { echo "unexpected error for $what: $out"; exit 1; }
}

# ---- training with interpolation; the flag in the arguments block; not the plain model ----
run "$W/interp.log" "$M" train "${T[@]}" "${R[@]}" "${I[@]}"
args_line "$W/interp.log" rotary_seq_len_interpolation_factor 4
[ "$(lines "$W/interp.log" | wc -l)" -eq 8 ] || { echo "expected 8 iteration lines"; exit 1; }
run "$W/plain.log" "$M" train "${T[@]}" "${R[@]}" --rope-type rope
args_line "$W/plain.log" rotary_seq_len_interpolation_factor None
args_line "$W/plain.log" rope_type rope
if diff -q <(lines "$W/plain.log") <(lines "$W/interp.log") > /dev/null; then
  echo "--rotary-seq-len-interpolation-factor did not change training"; exit 1
fi
run "$W/plain2.log" "$M" train "${T[@]}" "${R[@]}"
diff <(lines "$W/plain.log") <(lines "$W/plain2.log") ||
  { echo "--rope-type rope changed training"; exit 1; }
run "$W/both.log" "$M" train "${T[@]}" "${R[@]}" "${I[@]}" --use-rope-scaling \
    --rope-scaling-factor 32 --rotary-base 1000000
run "$W/scaled.log" "$M" train "${T[@]}" "${R[@]}" --use-rope-scaling --rope-scaling-factor 32 \
    --rotary-base 1000000
if diff -q <(lines "$W/both.log") <(lines "$W/scaled.log") > /dev/null; then
  echo "interpolation on top of --use-rope-scaling did not change training"; exit 1
fi

# ---- refusals, with a HINT ------------------------------------------------------------------
want="divides RoPE's positions, but --position-embedding-type is learned_absolute"
refused "interpolation without RoPE" "--rotary-seq-len-interpolation-factor $want" \
  "add --position-embedding-type rope" "${T[@]}" "${I[@]}"
refused "a factor of 0" "--rotary-seq-len-interpolation-factor 0 must be a positive integer" \
  "give --rotary-seq-len-interpolation-factor N >= 1" "${T[@]}" "${R[@]}" \
  --rotary-seq-len-interpolation-factor 0
refused "--rope-type yarn" "--rope-type yarn is multi-latent attention's" \
  "drop --rope-type, or add --multi-latent-attention" "${T[@]}" "${R[@]}" --rope-type yarn

# ---- checkpoint: --use-checkpoint-args resumes with the factor ------------------------------
run "$W/first.log" "$M" train "${T[@]}" "${R[@]}" "${I[@]}" --save "$W/ck" --save-interval 4 \
    --exit-interval 4
python3 - "$W/ck" <<'PY'
import glob, json, sys
md = json.load(open(glob.glob(f"{sys.argv[1]}/iter_0000004/metadata.json")[0]))
f = md["model"].get("rotary_seq_len_interpolation_factor")
assert f == 4.0, f
print("metadata.json records rotary_seq_len_interpolation_factor", f)
PY
cp -r "$W/ck" "$W/ck_copy"
run "$W/resume.log" "$M" train "${T[@]}" --use-checkpoint-args --load "$W/ck"
grep -q "successfully loaded checkpoint" "$W/resume.log" || { echo "no resume"; exit 1; }
args_line "$W/resume.log" rotary_seq_len_interpolation_factor 4
diff <(lines "$W/interp.log" 5 8) <(lines "$W/resume.log" 5 8) ||
  { echo "--use-checkpoint-args resume differs from the uninterrupted run"; exit 1; }
[ "$(lines "$W/resume.log" 5 8 | wc -l)" -eq 4 ] ||
  { echo "expected 4 resumed iterations"; exit 1; }

# ---- Hugging Face: export writes rope_type linear; import reads it back ---------------------
run "$W/to_hf.log" "$M" convert --load "$W/ck_copy" --to-hf "$W/hf"
python3 - "$W/hf/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}, j["rope_scaling"]
assert j["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}, \
    j["rope_parameters"]
print("config.json: rope_scaling and rope_parameters of rope_type linear")
PY
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/ck_hf" \
    --make-vocab-size-divisible-by 1
python3 - "$W/ck_hf" <<'PY'
import glob, json, sys
md = json.load(open(sorted(glob.glob(f"{sys.argv[1]}/iter_*/metadata.json"))[-1]))
assert md["model"].get("rotary_seq_len_interpolation_factor") == 4.0, md["model"]
print("convert --from-hf: rotary_seq_len_interpolation_factor 4.0")
PY
run "$W/both_ck.log" "$M" train "${T[@]}" "${R[@]}" "${I[@]}" --use-rope-scaling \
    --save "$W/ck_both" --train-iters 2
out=$("$M" convert --load "$W/ck_both" --to-hf "$W/hf_both" 2>&1) &&
  { echo "--to-hf of a model with scaling and interpolation was accepted"; exit 1; }
grep -qF "both Llama 3.x RoPE scaling (--use-rope-scaling, factor 8)" <<<"$out" &&
  grep -qF "linear position interpolation (--rotary-seq-len-interpolation-factor 4)" <<<"$out" ||
  { echo "unexpected error: $out"; exit 1; }
[ ! -e "$W/hf_both" ] || { echo "--to-hf left files behind"; exit 1; }
echo "RoPE interpolation and --rope-type: flags, training, checkpoint resume, Hugging Face ok"
