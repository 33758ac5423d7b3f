#!/usr/bin/env bash
# fim_data.sh MEGATRON TOKENIZER_JSON: --fim-data end to end, on a code-like corpus
# preprocessed with a tiny Hugging Face tokenizer that has the FIM tokens
# (tests/golden/fim/tokenizer.json: bytes are ids 0-255, <fim_prefix> is 256):
#   * training with --fim-data runs and evaluates; a resumed run's losses equal the
#     uninterrupted run's (each sample's FIM form depends on its index only);
#   * `megatron inspect --fim-data` shows <fim_prefix> in the train samples, and the same
#     samples twice; without --fim-data none;
#   * the same tokenizer without the FIM tokens, and the FIM flags without --fim-data or
#     with --mock-data, are errors naming the flag.
set -euo pipefail
M=$1; TOK=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
E="$(dirname "$0")/expect_error.sh"
mkdir -p "$W/tok" "$W/nofim"
cp "$TOK" "$W/tok/tokenizer.json"
grep -v '"<fim_' "$TOK" > "$W/nofim/tokenizer.json"
for i in $(seq 1 300); do
  printf '{"text": "def f%d(x):\\n    return x * %d + %d\\n"}\n' "$i" "$i" "$((i % 7))"
done > "$W/code.jsonl"
"$M" preprocess --input "$W/code.jsonl" --output-prefix "$W/code" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$W/tok" --append-eod --workers 1 \
  > "$W/pre.log" 2>&1 || { cat "$W/pre.log"; exit 1; }
DATA=(--data-path "$W/code_text_document" --split 90,10,0 --tokenizer-type HuggingFaceTokenizer)
FIM=(--fim-data --fim-rate 0.9 --fim-spm-rate 0.5)
BASE=("${DATA[@]}" --tokenizer-model "$W/tok" --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --train-iters 6 --log-interval 1 --eval-interval 3
  --eval-iters 1 --threads 1)
COMMON=("${BASE[@]}" "${FIM[@]}")
run() { local out=$1; shift; "$M" train "${COMMON[@]}" "$@" > "$W/$out.log" 2>&1 ||
  { cat "$W/$out.log"; exit 1; }; }
run full
run first --save "$W/ck" --save-interval 3 --exit-interval 3
run resumed --load "$W/ck"
losses() { grep -oE "iteration +[0-9]+/.*lm loss: [0-9.E+-]+" "$1" | sed -E 's/\|.*lm loss:/ /'; }
[ "$(losses "$W/full.log" | wc -l)" -eq 6 ] ||
  { echo "expected 6 iterations"; cat "$W/full.log"; exit 1; }
grep -q "validation loss at iteration 6" "$W/full.log" || { echo "no validation"; exit 1; }
diff <(losses "$W/full.log" | tail -3) <(losses "$W/resumed.log") ||
  { echo "the resumed run's losses differ from the uninterrupted run's"; exit 1; }
grep -q "fim_data \.\.*.* True" "$W/full.log" || { echo "arguments block lacks fim_data"; exit 1; }
INSPECT=(inspect "${DATA[@]}" --tokenizer-model "$W/tok" --seq-length 32 --train-samples 24
  --show-samples 0:24)
"$M" "${INSPECT[@]}" "${FIM[@]}" > "$W/fim.txt" 2>/dev/null
"$M" "${INSPECT[@]}" "${FIM[@]}" > "$W/fim2.txt" 2>/dev/null
"$M" "${INSPECT[@]}" > "$W/plain.txt" 2>/dev/null
has_prefix() { grep -cE "(^| )256( |$)" "$1" || true; }
[ "$(has_prefix "$W/fim.txt")" -ge 12 ] || { echo "few FIM samples:"; cat "$W/fim.txt"; exit 1; }
[ "$(has_prefix "$W/plain.txt")" -eq 0 ] || { echo "FIM tokens without --fim-data"; exit 1; }
cmp -s "$W/fim.txt" "$W/fim2.txt" || { echo "inspect --fim-data is not deterministic"; exit 1; }
echo "inspect: $(has_prefix "$W/fim.txt") of 24 train samples hold <fim_prefix>"
# Errors: a tokenizer without the tokens; FIM flags without --fim-data; --mock-data.
"$E" "--fim-prefix-token '<fim_prefix>': the HuggingFaceTokenizer has no such token" \
  "$M" train "${COMMON[@]}" --tokenizer-model "$W/nofim"
"$E" "pass --fim-pad-token with a token this tokenizer has" \
  "$M" train "${COMMON[@]}" --fim-pad-token '<nope>'
"$E" "--fim-rate without --fim-data" \
  "$M" train "${BASE[@]}" --fim-rate 0.3
"$E" "--fim-data with --mock-data" "$M" train --mock-data --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$W/tok" --num-layers 2 --hidden-size 32 --num-attention-heads 4 \
  --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --lr 1e-3 \
  --train-iters 2 --fim-data
echo "fim_data: ok"
