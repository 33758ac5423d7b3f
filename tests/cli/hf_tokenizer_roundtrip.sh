#!/usr/bin/env bash
# hf_tokenizer_roundtrip.sh MEGATRON GPT2_DIR: issue 23 A.4. The tokenizer travels with the
# model through a checkpoint:
#   * HF -> checkpoint -> HF is byte-identical, tokenizer files included (same file list);
#   * generate, and training with --finetune, use the checkpoint's tokenizer without any
#     tokenizer flag, and the fine-tuned checkpoint carries it on;
#   * an altered tokenizer file in the checkpoint is an error naming it; flags override;
#   * a checkpoint without a tokenizer exports weights and config with a warning;
#   * Megatron's convert.py spellings are errors that name the equivalent.
set -euo pipefail
M=$1; G=$2
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -20 "$log"; exit 1; }; }
MODEL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --max-position-embeddings 16)
run "$W/t.log" "$M" train --mock-data --tokenizer-type GPT2BPETokenizer --vocab-file "$G/encoder.json" \
  --merge-file "$G/vocab.bpe" "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 --lr 1e-3 \
  --train-iters 2 --save "$W/ck0" --threads 1
# A checkpoint without tokenizer files: weights and config, and a warning.
run "$W/bare.log" "$M" convert --load "$W/ck0" --to-hf "$W/bare"
grep -q "no tokenizer files exported (the checkpoint carries none)" "$W/bare.log" ||
  { echo "no warning for a checkpoint without a tokenizer"; exit 1; }
test -s "$W/bare/model.safetensors" && test -s "$W/bare/config.json"
# HF1: a Hugging Face folder with the GPT-2 tokenizer files (flags name them).
run "$W/hf1.log" "$M" convert --load "$W/ck0" --to-hf "$W/hf1" --vocab-file "$G/encoder.json" \
  --merge-file "$G/vocab.bpe"
run "$W/in.log" "$M" convert --from-hf "$W/hf1" --save "$W/ck"
grep -q "storing the Hugging Face tokenizer files (3 -> GPT2BPETokenizer)" "$W/in.log" ||
  { echo "tokenizer files not stored"; cat "$W/in.log"; exit 1; }
run "$W/hf2.log" "$M" convert --load "$W/ck" --to-hf "$W/hf2"
diff <(cd "$W/hf1" && ls) <(cd "$W/hf2" && ls) || { echo "different file lists"; exit 1; }
for f in "$W"/hf1/*; do cmp "$f" "$W/hf2/$(basename "$f")" || { echo "$(basename "$f") differs"; exit 1; }; done
echo "HF -> checkpoint -> HF: $(cd "$W/hf2" && ls | tr '\n' ' ')byte-identical"
# generate with no tokenizer flag.
out=$("$M" generate --load "$W/ck" --prompt "the cat" --num-tokens-to-generate 4 --threads 1 2>&1) ||
  { echo "generate failed: $out"; exit 1; }
grep -q "using the GPT2BPETokenizer files the checkpoint carries" <<<"$out" ||
  { echo "generate did not use the checkpoint's tokenizer: $out"; exit 1; }
# --finetune with no tokenizer flag; its checkpoint carries the files on.
run "$W/ft.log" "$M" train --mock-data "${MODEL[@]}" --micro-batch-size 2 --global-batch-size 2 \
  --lr 1e-4 --train-iters 2 --finetune --load "$W/ck" --save "$W/ck2" --threads 1
grep -q "using the GPT2BPETokenizer files the checkpoint in $W/ck carries" "$W/ft.log" ||
  { echo "training did not use the checkpoint's tokenizer"; exit 1; }
run "$W/hf3.log" "$M" convert --load "$W/ck2" --to-hf "$W/hf3"
for f in vocab.json merges.txt tokenizer_config.json; do
  cmp "$W/hf1/$f" "$W/hf3/$f" || { echo "the fine-tuned checkpoint lost $f"; exit 1; }
done
# Tokenizer flags override what the checkpoint carries.
run "$W/ovr.log" "$M" convert --load "$W/ck" --to-hf "$W/ovr" --vocab-file "$G/encoder.json" \
  --merge-file "$G/vocab.bpe"
cmp "$G/encoder.json" "$W/ovr/vocab.json"
# An altered tokenizer file is refused, by name.
printf ' ' >> "$W/ck/iter_0000000/tokenizer/merges.txt"
out=$("$M" convert --load "$W/ck" --to-hf "$W/bad" 2>&1) && { echo "an altered tokenizer exported"; exit 1; }
grep -q "merges.txt has .* bytes, the metadata says" <<<"$out" || { echo "unexpected: $out"; exit 1; }
# A tokenizer file replaced by a symlink (to anything) is refused: only regular files inside
# the checkpoint are read.
rm "$W/ck/iter_0000000/tokenizer/merges.txt"; ln -s "$G/vocab.bpe" "$W/ck/iter_0000000/tokenizer/merges.txt"
out=$("$M" generate --load "$W/ck" --prompt "a" --num-tokens-to-generate 1 2>&1) && { echo "a symlinked tokenizer file was read"; exit 1; }
grep -q "merges.txt is missing or not a regular file" <<<"$out" || { echo "unexpected: $out"; exit 1; }
# Megatron's convert.py habits.
for args in "--model-type GPT" "--loader megatron" "--saver hf" "--load-dir $W/ck" \
            "--save-dir $W/x" "--target-tensor-parallel-size 2" "--target-pipeline-parallel-size 2" \
            "--true-vocab-size 50257" "--megatron-path /m"; do
  flag=${args%% *}
  out=$("$M" convert $args 2>&1) && { echo "$flag accepted"; exit 1; }
  grep -q "megatron convert: $flag is a flag of Megatron-LM's tools/checkpoint/convert.py" <<<"$out" &&
    grep -q "HINT: " <<<"$out" || { echo "$flag: $out"; exit 1; }
done
out=$("$M" convert --target-tensor-parallel-size 2 2>&1) || true
grep -q "any TP/PP layout loads any checkpoint" <<<"$out" || { echo "no equivalent named: $out"; exit 1; }
echo "tokenizer round trip, generate, finetune, overrides, tampering and convert.py spellings: ok"
