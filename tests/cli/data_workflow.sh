#!/usr/bin/env bash
# data_workflow.sh MEGATRON: issue 23 A.7, Megatron's documented data workflow.
#  * preprocess takes unambiguous flag abbreviations (preprocess_data.py's argparse), names
#    the candidates of an ambiguous one and the closest flag of an unknown one, and prints
#    "Processed N documents (docs/s, MB/s)" every --log-interval documents;
#  * Megatron's default --split 969,30,1 on a small dataset leaves the test split without a
#    sequence: training without evaluation and `inspect --show-samples` work; a run that
#    evaluates stops before its first step naming the split and its counts.
set -uo pipefail
M=$1
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fails=0
fail() { echo "FAILED: $*"; fails=$((fails + 1)); }
err() { "$D/expect_error.sh" "$@" || fail "${*:2}"; }
for i in $(seq 1 300); do echo "{\"text\": \"$((i % 50 + 1)) $((i * 7 % 90 + 1)) 3 4 5 6 7 8 9 10\"}"; done >"$W/in.jsonl"
P=(--tokenizer-type NullTokenizer --vocab-size 100 --append-eod)

# Abbreviations, ambiguity, near misses, progress lines.
"$M" preprocess --input "$W/in.jsonl" --output-prefix "$W/d" --json-key text --work 2 \
    --log-interval 100 "${P[@]}" >"$W/pre.log" 2>&1 || { cat "$W/pre.log"; fail "abbreviated flags"; }
test -s "$W/d_text_document.idx" || fail "no dataset written with --json-key"
[ "$(grep -c 'Processed [0-9]* documents (.* docs/s, .* MB/s)' "$W/pre.log")" = 3 ] ||
  { cat "$W/pre.log"; fail "expected 3 progress lines for 300 documents at --log-interval 100"; }
grep -q "Processed 300 documents" "$W/pre.log" || fail "no line at 300 documents"
err "ambiguous option --vocab could match --vocab-extra-ids, --vocab-file, --vocab-size" \
    "$M" preprocess --input "$W/in.jsonl" --output-prefix "$W/x" --tokenizer-type NullTokenizer --vocab 100
err "unknown flag --outptu-prefix; did you mean --output-prefix" \
    "$M" preprocess --input "$W/in.jsonl" --outptu-prefix "$W/x" "${P[@]}"

# The empty test split of --split 969,30,1 (300 documents: the test range rounds to none).
T=(--data-path "$W/d_text_document" --tokenizer-type NullTokenizer --vocab-size 100
   --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16
   --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3
   --train-iters 3 --log-interval 1 --threads 1)
"$M" train "${T[@]}" >"$W/train.log" 2>&1 || { tail "$W/train.log"; fail "training without evaluation"; }
grep -Eq "iteration +3/ +3" "$W/train.log" || fail "training did not reach iteration 3"
err "the test split of dataset .*d_text_document holds 0 sequences" \
    "$M" train "${T[@]}" --eval-interval 2 --eval-iters 1
"$M" train "${T[@]}" --eval-interval 2 --eval-iters 1 >"$W/eval.log" 2>&1
grep -Eq "iteration +1/" "$W/eval.log" && fail "the evaluating run took a step before stopping"
"$M" inspect --data-path "$W/d_text_document" --seq-length 16 --train-samples 4 \
    --show-samples 0:2 >"$W/show.log" 2>"$W/show.err" || { cat "$W/show.err"; fail "inspect --show-samples"; }
[ "$(grep -c '^[01]:' "$W/show.log")" = 2 ] || { cat "$W/show.log"; fail "inspect printed no samples"; }

[ $fails -eq 0 ] && echo "data workflow ok" || { echo "$fails check(s) failed"; exit 1; }
