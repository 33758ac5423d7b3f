#!/usr/bin/env bash
# masked_data.sh MEGATRON OUT_PREFIX: a NullTokenizer dataset whose 16-token documents
# have EOD (id 100) at positions 4..11, so with --seq-length 16 --eod-mask-loss every
# sample's loss mask is 0 on exactly the tokens context-parallel rank 1 of 2 holds
# (chunks 1 and 2 of 4): that rank has no token in the loss. Rank 0's chunks hold 0 to 2
# EOD tokens more, varying by document.
set -euo pipefail
meg=$1 prefix=$2
mkdir -p "$(dirname "$prefix")"
jsonl=$prefix.jsonl
: > "$jsonl"
for d in $(seq 0 63); do
  a=$(( (d * 7) % 97 )) b=$(( (d * 13 + 5) % 97 ))
  # Some documents have one or two more EOD tokens on rank 0's chunks, so micro-batches
  # hold different numbers of loss tokens (the two normalisations then differ).
  c=$a; [ $((d % 3)) -eq 0 ] && c=100
  e=$b; [ $((d % 5)) -eq 0 ] && e=100
  echo "{\"text\": \"$c $((a+1)) $((a+2)) $b 100 100 100 100 100 100 100 100 $e $((b+1)) $a $((a+3))\"}" >> "$jsonl"
done
"$meg" preprocess --input "$jsonl" --output-prefix "$prefix" --tokenizer-type NullTokenizer \
  --vocab-size 100 > "$prefix.log" 2>&1 || { cat "$prefix.log"; exit 1; }
ls "${prefix}_text_document.bin" "${prefix}_text_document.idx"
