#!/usr/bin/env bash
# `megatron preprocess` end to end: a bad line is an error naming file:line and leaves no
# output; a good run writes the same .bin/.idx with 1 and 4 workers and prints its
# summary line. Usage: preprocess_cli.sh MEGATRON
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for i in $(seq 1 500); do echo "{\"text\": \"$i $((i * 7 % 100)) $((i % 13))\"}"; done >"$W/good.jsonl"
{ head -n 2 "$W/good.jsonl"; echo '{"text": 1 2}'; tail -n +3 "$W/good.jsonl"; } >"$W/bad.jsonl"
run() { "$M" preprocess --tokenizer-type NullTokenizer --vocab-size 1000 --append-eod "$@"; }

if out=$(run --input "$W/bad.jsonl" --output-prefix "$W/bad" --workers 4 2>&1); then
  echo "expected a failure on bad.jsonl:"; echo "$out"; exit 1
fi
grep -q "bad.jsonl:3: not valid JSON" <<<"$out" || { echo "no file:line in: $out"; exit 1; }
grep -q "HINT" <<<"$out" || { echo "no HINT in: $out"; exit 1; }
if ls "$W"/bad_* >/dev/null 2>&1; then echo "left behind: $(ls "$W"/bad_*)"; exit 1; fi

for w in 1 4; do
  out=$(run --input "$W/good.jsonl" --output-prefix "$W/w$w" --workers "$w" 2>&1)
  grep -Eq "preprocess: 500 documents, 2000 tokens, .* \($w workers;" <<<"$out" ||
    { echo "unexpected summary: $out"; exit 1; }
done
cmp "$W/w1_text_document.bin" "$W/w4_text_document.bin"
cmp "$W/w1_text_document.idx" "$W/w4_text_document.idx"
echo ok
