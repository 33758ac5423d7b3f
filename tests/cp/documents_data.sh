#!/usr/bin/env bash
# documents_data.sh MEGATRON OUT_PREFIX: a NullTokenizer dataset of 200 documents of 1 to 12
# tokens, each followed by EOD (--append-eod), so that a 16-token sample packs several
# documents and their boundaries fall anywhere, also across context-parallel chunks.
set -euo pipefail
meg=$1 prefix=$2
mkdir -p "$(dirname "$prefix")"
jsonl=$prefix.jsonl
: > "$jsonl"
for d in $(seq 0 199); do
  n=$(( (d * 7) % 12 + 1 )) text=""
  for i in $(seq 1 $n); do text="$text $(( (d * 31 + i * 17) % 100 ))"; done
  echo "{\"text\": \"${text# }\"}" >> "$jsonl"
done
"$meg" preprocess --input "$jsonl" --output-prefix "$prefix" --tokenizer-type NullTokenizer \
  --vocab-size 100 --append-eod > "$prefix.log" 2>&1 || { cat "$prefix.log"; exit 1; }
ls "${prefix}_text_document.bin" "${prefix}_text_document.idx"
