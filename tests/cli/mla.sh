#!/usr/bin/env bash
# mla.sh MEGATRON: --multi-latent-attention end to end on the CPU, with the flags of
# Megatron-LM's DeepSeek-V3 proxy scripts (query and key/value latents, latent norms, YaRN):
#   * the model trains and the loss falls; the arguments block and the checkpoint record it;
#   * resuming continues; loading it without the flag is an error naming mla;
#     --use-checkpoint-args takes every MLA setting; generate samples from it;
#   * `megatron plan` predicts its memory; recomputation leaves the losses unchanged;
#   * refused: MLA flags without --multi-latent-attention, --group-query-attention with it,
#     --v-head-dim wider than the query/key heads, --rope-type yarn without MLA, --qk-layernorm
#     without --q-lora-rank, the Hugging Face export and the legacy --ckpt-format torch.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20
   --log-interval 10 --threads 1 --device cpu --position-embedding-type rope
   --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear)
MLA=(--multi-latent-attention --q-lora-rank 32 --kv-lora-rank 16 --qk-head-dim 16
     --qk-pos-emb-head-dim 8 --v-head-dim 16 --qk-layernorm --rotary-scaling-factor 40
     --mscale 1.0 --mscale-all-dim 1.0)
# shellcheck source=train_log_lib.sh
source "$(dirname "$0")/train_log_lib.sh"  # run, args_line
losses() { grep -oE "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }
refused() {  # refused MESSAGE ARGS...: the command fails and prints MESSAGE
  local msg=$1 out; shift
  out=$("$@" 2>&1) && { echo "accepted: $*"; exit 1; }
  grep -qF -- "$msg" <<<"$out" || { echo "unexpected for $*: $out"; exit 1; }
}

run "$W/train.log" "$M" train "${T[@]}" "${MLA[@]}" --train-iters 150 --save "$W/ck" \
    --save-interval 150
args_line "$W/train.log" multi_latent_attention True
args_line "$W/train.log" q_lora_rank 32
first=$(losses "$W/train.log" | head -1); last=$(losses "$W/train.log" | tail -1)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 3.0 && l < f) }' ||
  { echo "loss $first -> $last, expected below 3.0"; exit 1; }
echo "train: loss $first -> $last"
grep -q '"rope_type": "yarn"' "$W/ck/iter_0000150/metadata.json" &&
  grep -q 'self_attention.linear_kv_down_proj.weight' "$W/ck/iter_0000150/metadata.json" ||
  { echo "the checkpoint does not record MLA"; exit 1; }

R=(--train-iters 160 --load "$W/ck" --use-checkpoint-opt_param-scheduler)
run "$W/resume.log" "$M" train "${T[@]}" "${MLA[@]}" "${R[@]}"
grep -Eq "iteration +160/ +160" "$W/resume.log" || { echo "did not resume"; exit 1; }
refused "mla (--multi-latent-attention and its flags): checkpoint" \
  "$M" train "${T[@]}" "${R[@]}"
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
args_line "$W/uca.log" multi_latent_attention True  # --use-checkpoint-args took them
args_line "$W/uca.log" kv_lora_rank 16
args_line "$W/uca.log" rotary_scaling_factor 40.0
grep -Eq "iteration +160/ +160" "$W/uca.log" || { echo "--use-checkpoint-args: no resume"; exit 1; }
run "$W/gen.log" "$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate 8 \
    --threads 1
echo "generate: $(tail -1 "$W/gen.log")"
run "$W/plan.log" "$M" plan "${T[@]}" "${MLA[@]}" --train-iters 100 \
    --tensor-model-parallel-size 2 --sequence-parallel
grep -q "activation" "$W/plan.log" || { echo "plan printed no memory"; cat "$W/plan.log"; exit 1; }

# Recomputation (full, selective core_attn, selective norms and MLP) gives the same losses.
Q=("${T[@]}" "${MLA[@]}" --train-iters 10 --lr-warmup-iters 2 --log-interval 1
   --hidden-dropout 0.1 --attention-dropout 0.1)
run "$W/rc0.log" "$M" train "${Q[@]}"
for rc in "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" \
          "--recompute-granularity selective" \
          "--recompute-granularity selective --recompute-modules core_attn layernorm mlp"; do
  # shellcheck disable=SC2086
  run "$W/rc.log" "$M" train "${Q[@]}" $rc
  [ "$(losses "$W/rc.log")" = "$(losses "$W/rc0.log")" ] && [ -n "$(losses "$W/rc.log")" ] ||
    { echo "$rc changed the losses"; exit 1; }
done
echo "recomputation: the same 10 losses"

S=("${T[@]}" --train-iters 100)
refused "--kv-lora-rank configures multi-latent attention, which is off" \
  "$M" train "${S[@]}" --kv-lora-rank 16
refused "--multi-latent-attention with --group-query-attention" \
  "$M" train "${S[@]}" "${MLA[@]}" --group-query-attention --num-query-groups 2
refused "--v-head-dim 32 is wider than the query/key heads" \
  "$M" train "${S[@]}" "${MLA[@]}" --v-head-dim 32
refused "--rope-type yarn is multi-latent attention's" "$M" train "${S[@]}" --rope-type yarn
refused "--qk-layernorm with --multi-latent-attention and no --q-lora-rank" \
  "$M" train "${S[@]}" --multi-latent-attention --qk-layernorm
refused "multi-latent attention has no Hugging Face export yet" \
  "$M" convert --load "$W/ck" --to-hf "$W/hf"
[ ! -e "$W/hf/config.json" ] || { echo "a partial Hugging Face export was left"; exit 1; }
refused "--multi-latent-attention" "$M" train "${S[@]}" "${MLA[@]}" --ckpt-format torch \
  --save "$W/legacy"
echo "all checks passed"
