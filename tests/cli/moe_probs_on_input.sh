#!/usr/bin/env bash
# moe_probs_on_input.sh MEGATRON: --moe-apply-probs-on-input (Llama 4's top-1 experts) end to
# end on the CPU: a Llama-style MoE model trains with it (the loss falling, other losses than
# without it); the checkpoint records it and --use-checkpoint-args takes it back; generate
# runs the model; Hugging Face export refuses it, naming the flag, before writing anything;
# top-k 2 is refused at start-up.
set -euo pipefail
M=$1
D=$(cd "$(dirname "$0")" && pwd)
source "$D/train_log_lib.sh"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 10
   --log-interval 10 --threads 1 --device cpu --train-iters 60
   --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
   --untie-embeddings-and-output-weights --num-experts 4 --moe-router-topk 1
   --moe-router-score-function sigmoid --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2)

run "$W/on.log" "$M" train "${T[@]}" --moe-apply-probs-on-input --save "$W/ck" --save-interval 60
run "$W/off.log" "$M" train "${T[@]}"
args_line "$W/on.log" moe_apply_probs_on_input True
first=$(losses "$W/on.log" | head -1) last=$(losses "$W/on.log" | tail -1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 1.0) }' ||
  { echo "loss $first -> $last did not fall"; exit 1; }
[ "$(losses "$W/on.log" | tail -1)" != "$(losses "$W/off.log" | tail -1)" ] ||
  { echo "--moe-apply-probs-on-input changed nothing"; exit 1; }
grep -q '"apply_probs_on_input": true' "$W/ck/iter_0000060/metadata.json" ||
  { echo "the checkpoint does not record it"; exit 1; }

run "$W/uca.log" "$M" train "${T[@]}" --load "$W/ck" --use-checkpoint-args \
    --use-checkpoint-opt_param-scheduler --train-iters 70
args_line "$W/uca.log" moe_apply_probs_on_input True
grep -Eq "iteration +70/ +70" "$W/uca.log" || { echo "did not resume"; exit 1; }
run "$W/gen.log" "$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate 8 \
    --threads 1

refused "$W/hf.log" "--moe-apply-probs-on-input" "$M" convert --load "$W/ck" --to-hf "$W/hf"
[ ! -e "$W/hf/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }
refused "$W/k2.log" "--moe-router-topk 1 only" "$M" train "${T[@]}" --moe-apply-probs-on-input \
    --moe-router-topk 2
echo "all checks passed"
