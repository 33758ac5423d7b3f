#!/usr/bin/env bash
# no_rope.sh MEGATRON: --no-rope-freq (NoPE layers; docs/model.md "Layers without RoPE") end
# to end on the CPU: trains, differs from RoPE in every layer; the checkpoint records the
# pattern (resume, refused without it, --use-checkpoint-args takes it); generate runs; the
# Hugging Face export is refused; Megatron's legacy format keeps it both ways.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 4 --hidden-size 64
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 3e-3 --lr-warmup-iters 2 --log-interval 1 --threads 1
   --device cpu --position-embedding-type rope --normalization RMSNorm --swiglu
   --untie-embeddings-and-output-weights --disable-bias-linear)
. "$(dirname "$0")/train_log_lib.sh"
run "$W/nope.log" "$M" train "${T[@]}" --no-rope-freq 4 --train-iters 10 --save "$W/ck" \
    --save-interval 10
run "$W/rope.log" "$M" train "${T[@]}" --train-iters 10
[ "$(losses "$W/nope.log" | tail -1)" != "$(losses "$W/rope.log" | tail -1)" ] ||
  { echo "--no-rope-freq changed nothing"; exit 1; }
pattern() {  # pattern METADATA: the model's no_rope list as Python prints it
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model'].get('no_rope'))" "$1"
}
[ "$(pattern "$W/ck/iter_0000010/metadata.json")" = "[0, 0, 0, 1]" ] ||
  { echo "the checkpoint does not record the pattern"; exit 1; }
R=(--train-iters 12 --load "$W/ck" --use-checkpoint-opt_param-scheduler)
run "$W/resume.log" "$M" train "${T[@]}" --no-rope-freq "([0]*3+[1])" "${R[@]}"
grep -Eq "iteration +12/ +12" "$W/resume.log" || { echo "did not resume"; exit 1; }
refused "$W/all.log" "no_rope (--no-rope-freq)" "$M" train "${T[@]}" "${R[@]}"
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
grep -Eq "^  no_rope_freq \.+ \[0, 0, 0, 1\]$" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take the pattern"; grep no_rope "$W/uca.log"; exit 1; }
"$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate 8 --ignore-eod \
    --threads 1 >"$W/gen.out" 2>"$W/gen.err" || { echo "generate failed"; tail "$W/gen.err"; exit 1; }
refused "$W/hf.log" "--no-rope-freq" "$M" convert --load "$W/ck" --to-hf "$W/hf"
run "$W/torch.log" "$M" train "${T[@]}" --no-rope-freq 2 --train-iters 4 --ckpt-format torch \
    --save "$W/U" --save-interval 4
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
[ "$(pattern "$W/C/iter_0000004/metadata.json")" = "[0, 1, 0, 1]" ] ||
  { echo "--from-megatron lost the pattern"; exit 1; }
# --qk-l2-norm (Llama 4's weightless q/k norm): recorded; resuming without it is refused; no HF.
run "$W/l2.log" "$M" train "${T[@]}" --no-rope-freq 4 --qk-l2-norm --train-iters 4 \
    --save "$W/ck_l2" --save-interval 4
refused "$W/l2_off.log" "qk_l2_norm (--qk-l2-norm)" \
  "$M" train "${T[@]}" --no-rope-freq 4 --train-iters 6 --load "$W/ck_l2"
refused "$W/l2_hf.log" "--qk-l2-norm" "$M" convert --load "$W/ck_l2" --to-hf "$W/hf_l2"
echo "all checks passed"
