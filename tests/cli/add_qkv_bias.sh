#!/usr/bin/env bash
# add_qkv_bias.sh MEGATRON: Megatron's --add-qkv-bias end to end.
#   * without --disable-bias-linear it is redundant, as in Megatron (arguments.py sets
#     add_qkv_bias whenever add_bias_linear): no error, args show add_qkv_bias True either way,
#     and the runs are bit-identical (same parameter count, same log lines);
#   * with --disable-bias-linear it adds linear_qkv.bias alone: 2 layers x (NG*(NH/NG+2)*HD)
#     = 2 x 128 parameters more than the plain Llama-style model, in `megatron plan` and in
#     training's count;
#   * its checkpoint records it: loading without the flag is an error naming add_qkv_bias,
#     --use-checkpoint-args takes it; --to-hf writes Qwen2ForCausalLM with q/k/v_proj biases,
#     and --from-hf of that folder gives the flag back; --hf-model-type mistral exports the
#     plain Llama-style model as MistralForCausalLM and refuses the Qwen2 one.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --log-interval 1 --threads 1 --device cpu)
L=(--position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
   --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
lines() {  # the log lines without their time stamps and timings
  grep -E "iteration +[0-9]+/" "$1" |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//'
}
params() { grep -oE "number of parameters on .*: [0-9]+" "$1" | grep -oE "[0-9]+$"; }
plan_params() { "$M" plan "$@" | awk '$1 == "0" && NF >= 8 {print $2; exit}'; }

# ---- redundant with the linear biases ------------------------------------------------------
run "$W/gpt.log" "$M" train "${T[@]}" --train-iters 4
run "$W/gpt_qkv.log" "$M" train "${T[@]}" --train-iters 4 --add-qkv-bias
for f in gpt gpt_qkv; do
  grep -Eq "^  add_qkv_bias \.+ True$" "$W/$f.log" || { echo "$f: add_qkv_bias not True"; exit 1; }
done
[ "$(params "$W/gpt.log")" = "$(params "$W/gpt_qkv.log")" ] ||
  { echo "GPT parameter counts differ"; exit 1; }
diff <(lines "$W/gpt.log") <(lines "$W/gpt_qkv.log") ||
  { echo "--add-qkv-bias changed a model that has every linear bias"; exit 1; }

# ---- alone: linear_qkv.bias ---------------------------------------------------------------
run "$W/llama.log" "$M" train "${T[@]}" "${L[@]}" --train-iters 4 --save "$W/ck_llama"
run "$W/qwen2.log" "$M" train "${T[@]}" "${L[@]}" --add-qkv-bias --train-iters 4 --save "$W/ck"
grep -Eq "^  add_qkv_bias \.+ False$" "$W/llama.log" ||
  { echo "llama: add_qkv_bias not False"; exit 1; }
a=$(params "$W/llama.log"); b=$(params "$W/qwen2.log")
[ $((b - a)) -eq 256 ] ||
  { echo "parameters $a -> $b, expected +256 (2 x linear_qkv.bias [128])"; exit 1; }
pa=$(plan_params "${T[@]}" "${L[@]}" --train-iters 4)
pb=$(plan_params "${T[@]}" "${L[@]}" --add-qkv-bias --train-iters 4)
[ $((pb - pa)) -eq 256 ] || { echo "megatron plan: parameters $pa -> $pb, expected +256"; exit 1; }
echo "parameters: $a -> $b (train), $pa -> $pb (plan)"

# The checkpoint: without the flag it is another model; --use-checkpoint-args takes it.
out=$("$M" train "${T[@]}" "${L[@]}" --train-iters 8 --load "$W/ck" 2>&1) &&
  { echo "a --add-qkv-bias checkpoint loaded without the flag"; exit 1; }
grep -q "add_qkv_bias: checkpoint true vs this run false" <<<"$out" ||
  { echo "unexpected: $out"; exit 1; }
run "$W/uca.log" "$M" train "${T[@]}" --train-iters 8 --load "$W/ck" --use-checkpoint-args \
    --use-checkpoint-opt_param-scheduler
grep -q "successfully loaded checkpoint" "$W/uca.log" && grep -Eq "iteration +8/ +8" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not resume"; tail -20 "$W/uca.log"; exit 1; }
grep -Eq "^  add_qkv_bias \.+ True$" "$W/uca.log" &&
  grep -Eq "^  add_bias_linear \.+ False$" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take the bias switches"; exit 1; }

# Hugging Face: Qwen2ForCausalLM, and back.
run "$W/to_hf.log" "$M" convert --load "$W/ck" --to-hf "$W/hf"
python3 - "$W/hf" <<'PY'
import json, struct, sys
cfg = json.load(open(f"{sys.argv[1]}/config.json"))
assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2", cfg
b = open(f"{sys.argv[1]}/model.safetensors", "rb").read()
names = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
biases = sorted(k for k in names if k.endswith(".bias"))
want = sorted(f"model.layers.{l}.self_attn.{p}_proj.bias" for l in range(2) for p in "qkv")
assert biases == want, biases
print("exported Qwen2ForCausalLM with", len(biases), "q/k/v biases")
PY
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/back"
grep -q '"add_qkv_bias": true' "$W/back/iter_0000000/metadata.json" ||
  { echo "--from-hf of Qwen2 lost add_qkv_bias"; exit 1; }
# --hf-model-type: Mistral is the Llama layout without biases; Qwen2's biases are not Mistral's.
run "$W/mistral.log" "$M" convert --load "$W/ck_llama" --to-hf "$W/hf_mistral" \
    --hf-model-type mistral
grep -q '"model_type": "mistral"' "$W/hf_mistral/config.json" &&
  grep -q '"sliding_window": null' "$W/hf_mistral/config.json" ||
  { echo "--hf-model-type mistral: wrong config.json"; cat "$W/hf_mistral/config.json"; exit 1; }
out=$("$M" convert --load "$W/ck" --to-hf "$W/hf_bad" --hf-model-type mistral 2>&1) &&
  { echo "a Qwen2 model exported as Mistral"; exit 1; }
grep -q "maps to Hugging Face model_type 'qwen2'" <<<"$out" && [ ! -e "$W/hf_bad" ] ||
  { echo "unexpected: $out"; exit 1; }
echo "all checks passed"
