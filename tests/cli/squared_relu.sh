#!/usr/bin/env bash
# squared_relu.sh MEGATRON: Megatron's --squared-relu end to end on the CPU.
#   * a GPT-style and a Llama-style model train with it and the loss falls;
#   * the checkpoint records it: resuming with it continues, loading without it (GELU) is an
#     error naming squared_relu, --use-checkpoint-args takes it; generate runs the model;
#   * with --swiglu it is refused as Megatron refuses it;
#   * with --fp8-format it is planned and trains (dense and MoE), the loss falling;
#   * --to-hf writes GPT2LMHeadModel with activation_function relu2 (and --from-hf gives the
#     flag back); a Llama-style squared-ReLU model has no Hugging Face equivalent (refused).
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20
   --log-interval 10 --threads 1 --device cpu)
L=(--position-embedding-type rope --normalization RMSNorm --group-query-attention
   --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
losses() { grep -oE "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }
falls() {  # the last logged loss below $2 and below the first
  local first last; first=$(losses "$1" | head -1); last=$(losses "$1" | tail -1)
  awk -v f="$first" -v l="$last" -v t="$2" 'BEGIN { exit !(l < t && l < f) }' ||
    { echo "$1: loss $first -> $last, expected below $2"; exit 1; }
  echo "$(basename "$1"): loss $first -> $last"
}

run "$W/gpt.log" "$M" train "${T[@]}" --squared-relu --train-iters 150 --save "$W/ck" \
    --save-interval 150
grep -Eq "^  squared_relu \.+ True$" "$W/gpt.log" || { echo "squared_relu not True"; exit 1; }
falls "$W/gpt.log" 3.0
run "$W/llama.log" "$M" train "${T[@]}" "${L[@]}" --squared-relu --train-iters 150
falls "$W/llama.log" 3.0
grep -q '"squared_relu": true' "$W/ck/iter_0000150/metadata.json" ||
  { echo "the checkpoint does not record squared_relu"; exit 1; }

# Resume with the flag; without it the checkpoint is another model; --use-checkpoint-args.
R=(--train-iters 160 --load "$W/ck" --use-checkpoint-opt_param-scheduler)
run "$W/resume.log" "$M" train "${T[@]}" --squared-relu "${R[@]}"
grep -q "successfully loaded checkpoint" "$W/resume.log" &&
  grep -Eq "iteration +160/ +160" "$W/resume.log" || { echo "did not resume"; exit 1; }
out=$("$M" train "${T[@]}" "${R[@]}" 2>&1) &&
  { echo "a --squared-relu checkpoint loaded as a GELU model"; exit 1; }
grep -q "squared_relu (--squared-relu): checkpoint true vs this run false" <<<"$out" ||
  { echo "unexpected: $out"; exit 1; }
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
grep -Eq "^  squared_relu \.+ True$" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take --squared-relu"; exit 1; }
run "$W/gen.log" "$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate 8 \
    --threads 1
echo "generate: $(tail -1 "$W/gen.log")"

# Refused with --swiglu, as Megatron refuses it.
out=$("$M" train "${T[@]}" --squared-relu --swiglu --train-iters 100 2>&1) &&
  { echo "--squared-relu --swiglu accepted"; exit 1; }
grep -q -- "--squared-relu and --swiglu both choose the MLP's activation" <<<"$out" ||
  { echo "unexpected: $out"; exit 1; }

# FP8 (the GEMMs in FP8, squared ReLU between them in the model precision): planned, and
# trained, dense and MoE (routed and shared experts), with the loss falling.
run "$W/fp8_plan.log" "$M" plan "${T[@]}" --device cuda --attention-dropout 0 --squared-relu \
    --fp8-format hybrid --bf16 --train-iters 100
run "$W/fp8.log" "$M" train "${T[@]}" --squared-relu --fp8-format hybrid --train-iters 80
grep -Eq "^  fp8 \.+ hybrid$" "$W/fp8.log" || { echo "FP8 not on"; exit 1; }
falls "$W/fp8.log" 3.5
run "$W/fp8_moe.log" "$M" train "${T[@]}" "${L[@]}" --squared-relu --fp8-format hybrid \
    --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 \
    --moe-shared-expert-intermediate-size 64 --train-iters 80
falls "$W/fp8_moe.log" 3.5

# Hugging Face: GPT-2 with relu2, and back; the Llama-style one refused.
run "$W/to_hf.log" "$M" convert --load "$W/ck" --to-hf "$W/hf"
grep -q '"activation_function": "relu2"' "$W/hf/config.json" ||
  { echo "config.json lacks relu2"; cat "$W/hf/config.json"; exit 1; }
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/back"
grep -q '"squared_relu": true' "$W/back/iter_0000000/metadata.json" ||
  { echo "--from-hf of relu2 lost squared_relu"; exit 1; }
run "$W/llama_ck.log" "$M" train "${T[@]}" "${L[@]}" --squared-relu --train-iters 30 \
    --save "$W/ck_llama"
out=$("$M" convert --load "$W/ck_llama" --to-hf "$W/hf_bad" 2>&1) &&
  { echo "a Llama-style squared-ReLU model exported"; exit 1; }
grep -q "no Hugging Face architecture matches" <<<"$out" && [ ! -e "$W/hf_bad/config.json" ] ||
  { echo "unexpected: $out"; exit 1; }
echo "all checks passed"
