#!/usr/bin/env bash
# gpt_oss.sh MEGATRON: gpt-oss's MLP end to end on the CPU -- a tiny MoE model with
# --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0, Megatron's default
# linear biases (the router's, the experts' fc1 and fc2), learnable attention sinks:
#   * it trains and the loss falls; the arguments block shows the three flags;
#   * the checkpoint records them (model.quick_geglu, glu_linear_offset,
#     activation_func_clamp_value) and holds the biases by Megatron-Core's names (experts by
#     global index); a resume continues the uninterrupted run exactly;
#   * loading it with another activation, offset or clamp is an error naming the field;
#     --use-checkpoint-args takes all three;
#   * generate samples from it;
#   * a dense quick-GEGLU model in Megatron's legacy layout keeps the three through
#     convert --from-megatron, and training resumed from that round trip continues exactly;
#     convert --to-hf refuses it (no Hugging Face architecture) before writing anything.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 64
   --max-position-embeddings 64 --position-embedding-type rope --normalization RMSNorm
   --untie-embeddings-and-output-weights --softmax-type learnable
   --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-3
   --moe-grouped-gemm --no-bias-dropout-fusion --micro-batch-size 2 --global-batch-size 8
   --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 2 --log-interval 1 --threads 1)
A=(--quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line
losses() { grep -oE "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }

run "$W/full.log" "$M" train "${T[@]}" "${A[@]}" --train-iters 40
args_line "$W/full.log" quick_geglu True
args_line "$W/full.log" glu_linear_offset 1.0
args_line "$W/full.log" activation_func_clamp_value 7.0
args_line "$W/full.log" add_bias_linear True
first=$(losses "$W/full.log" | head -1); last=$(losses "$W/full.log" | tail -1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.5) }' ||
  { echo "loss $first -> $last did not fall"; exit 1; }
echo "loss $first -> $last"

run "$W/first.log" "$M" train "${T[@]}" "${A[@]}" --train-iters 40 --save "$W/ck" \
    --save-interval 20 --exit-interval 20
python3 - "$W/ck" <<'PY'
import json, sys
md = json.load(open(f"{sys.argv[1]}/iter_0000020/metadata.json"))
m = md["model"]
assert m.get("quick_geglu") is True, m
assert m.get("glu_linear_offset") == 1.0 and m.get("activation_func_clamp_value") == 7.0, m
keys = set(md["tensors"])
for k in ["decoder.layers.1.mlp.router.bias", "decoder.layers.1.mlp.experts.linear_fc1.bias3",
          "decoder.layers.0.mlp.experts.linear_fc2.bias0"]:
    assert k in keys, k
print("metadata.json records the activation and the MoE biases")
PY
cp -r "$W/ck" "$W/ck_copy"
run "$W/resume.log" "$M" train "${T[@]}" "${A[@]}" --train-iters 40 --load "$W/ck"
diff <(lines "$W/full.log" 21 40) <(lines "$W/resume.log" 21 40) ||
  { echo "the resumed run differs from the uninterrupted one"; exit 1; }
echo "resume: iterations 21-40 as the uninterrupted run"

# Another activation, offset or clamp: the checkpoint is another model.
refused() {  # refused FIELD FLAGS...: loading the checkpoint with FLAGS fails naming FIELD
  local field=$1; shift
  if "$M" train "${T[@]}" "$@" --train-iters 40 --load "$W/ck_copy" >"$W/bad.log" 2>&1; then
    echo "loaded with $*"; exit 1
  fi
  grep -qF -- "$field" "$W/bad.log" ||
    { echo "unexpected error for $*:"; tail -5 "$W/bad.log"; exit 1; }
}
refused "quick_geglu (--quick-geglu): checkpoint true vs this run false" --swiglu
refused "glu_linear_offset (--glu-linear-offset)" --quick-geglu --activation-func-clamp-value 7
clamp="activation_func_clamp_value (--activation-func-clamp-value): checkpoint 7.0 vs this run"
refused "$clamp 5.0" --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 5
run "$W/uca.log" "$M" train "${T[@]}" --train-iters 40 --load "$W/ck_copy" --use-checkpoint-args
args_line "$W/uca.log" quick_geglu True
args_line "$W/uca.log" activation_func_clamp_value 7.0
diff <(lines "$W/full.log" 21 40) <(lines "$W/uca.log" 21 40) ||
  { echo "the --use-checkpoint-args run differs from the uninterrupted one"; exit 1; }

run "$W/gen.log" "$M" generate --load "$W/ck_copy" --prompt "5 6 7 8" \
    --num-tokens-to-generate 8 --threads 1 --greedy
grep -q "8 generated" "$W/gen.log" || { echo "generate did not sample"; cat "$W/gen.log"; exit 1; }

# Megatron's legacy layout (a dense model: it holds no experts): its args carry quick_geglu,
# glu_linear_offset and activation_func_clamp_value; --from-megatron reads them back, and the
# run resumed from that round trip continues the uninterrupted one exactly.
G=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --train-iters 8 --log-interval 1 --threads 1 "${A[@]}")
run "$W/dense.log" "$M" train "${G[@]}"
run "$W/torch.log" "$M" train "${G[@]}" --ckpt-format torch --save "$W/U" --save-interval 4 \
    --exit-interval 4
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
python3 - "$W/C" <<'PY'
import glob, json, sys
m = json.load(open(glob.glob(f"{sys.argv[1]}/iter_*/metadata.json")[0]))["model"]
assert m.get("quick_geglu") is True, m
assert m.get("glu_linear_offset") == 1.0 and m.get("activation_func_clamp_value") == 7.0, m
print("--from-megatron kept the activation")
PY
run "$W/torch_resume.log" "$M" train "${G[@]}" --load "$W/C"
diff <(lines "$W/dense.log" 5 8) <(lines "$W/torch_resume.log" 5 8) ||
  { echo "the run resumed from the Megatron round trip differs"; exit 1; }
# A dense quick-GEGLU model has no Hugging Face architecture (gpt-oss's has experts): refused
# before anything is written.
if "$M" convert --load "$W/C" --to-hf "$W/hf" >"$W/to_hf.log" 2>&1; then
  echo "--to-hf accepted a dense quick-GEGLU model"; exit 1
fi
grep -q -- "--quick-geglu has no Hugging Face" "$W/to_hf.log" && grep -q "HINT:" "$W/to_hf.log" ||
  { echo "unexpected error:"; cat "$W/to_hf.log"; exit 1; }
[ ! -e "$W/hf/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }
echo "all checks passed"
