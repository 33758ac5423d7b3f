#!/usr/bin/env bash
# convert_tokenizer.sh MEGATRON GPT2_DIR: a checkpoint trained with the GPT-2 tokenizer exports
# to Hugging Face with vocab.json / merges.txt / tokenizer_config.json alongside when the user
# passes the tokenizer files (the paths a checkpoint records are never followed).
set -euo pipefail
M=$1; G=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$M" train --mock-data --tokenizer-type GPT2BPETokenizer --vocab-file "$G/encoder.json" \
  --merge-file "$G/vocab.bpe" --num-layers 1 --hidden-size 32 --num-attention-heads 4 \
  --seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 \
  --lr 1e-3 --train-iters 2 --log-interval 1 --save "$W/ck" --threads 1 > "$W/log" 2>&1 || { tail "$W/log"; exit 1; }
"$M" convert --load "$W/ck" --to-hf "$W/hf" --vocab-file "$G/encoder.json" \
  --merge-file "$G/vocab.bpe" > "$W/log2" 2>&1 || { cat "$W/log2"; exit 1; }
cmp "$G/encoder.json" "$W/hf/vocab.json"
cmp "$G/vocab.bpe" "$W/hf/merges.txt"
grep -q GPT2Tokenizer "$W/hf/tokenizer_config.json"
grep -q GPT2LMHeadModel "$W/hf/config.json"
test -s "$W/hf/model.safetensors"
echo "exported model.safetensors, config.json and the GPT-2 tokenizer files"
