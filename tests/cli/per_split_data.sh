#!/usr/bin/env bash
# per_split_data.sh MEGATRON: --train-data-path / --valid-data-path (each split from its own
# .bin/.idx datasets, the whole of each) end to end:
#   run A: --train-data-path a --valid-data-path 0.4 b 0.6 c, evaluation every 5 iterations;
#   run B: the same paths from --per-split-data-args-path (JSON): identical iteration and
#          validation lines;
#   run D: --data-path a --split 100,0,0 (no evaluation): the same training losses as A, as
#          the train split of both is the whole of a; run C: D's words from --data-args-path.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
source "$(dirname "$0")/train_log_lib.sh"  # abc_datasets
abc_datasets "$M" "$W"
python3 - "$W" <<'PY'
import json, sys
with open(f"{sys.argv[1]}/split.json", "w") as f:
    json.dump({"train": f"{sys.argv[1]}/a_text_document",
               "valid": ["0.4", f"{sys.argv[1]}/b_text_document",
                         f"0.6 {sys.argv[1]}/c_text_document"],
               "test": None}, f)
PY
COMMON=(--tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 8 --lr 1e-3 --train-iters 12 --log-interval 1 --threads 1)
EVAL=(--eval-interval 5 --eval-iters 2)
run() { local out=$1; shift; "$M" train "${COMMON[@]}" "$@" > "$W/$out.log" 2>&1 ||
  { cat "$W/$out.log"; exit 1; }; }
run a "${EVAL[@]}" --train-data-path "$W/a_text_document" \
  --valid-data-path 0.4 "$W/b_text_document" 0.6 "$W/c_text_document"
run b "${EVAL[@]}" --per-split-data-args-path "$W/split.json"
run d --data-path "$W/a_text_document" --split 100,0,0 --eval-iters 0
echo "$W/a_text_document" > "$W/words.txt"
run c --data-args-path "$W/words.txt" --split 100,0,0 --eval-iters 0
pick() {  # iteration lines without time-dependent fields
  grep -E "iteration +[0-9]+/" "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//; s/throughput per GPU \(TFLOP\/s\/GPU\): [0-9.]+ \|//; s/tokens per second per GPU: [0-9.]+ \|//'
}
vals() { grep -A1 "validation loss at iteration" "$1" | grep "lm loss"; }
[ "$(pick "$W/a.log" | wc -l)" -eq 12 ] || { echo "expected 12 iteration lines"; cat "$W/a.log"; exit 1; }
[ "$(vals "$W/a.log" | wc -l)" -ge 2 ] || { echo "expected validation lines"; cat "$W/a.log"; exit 1; }
diff <(pick "$W/a.log") <(pick "$W/b.log") || { echo "JSON per-split args differ from flags"; exit 1; }
diff <(vals "$W/a.log") <(vals "$W/b.log") || { echo "validation differs"; exit 1; }
diff <(pick "$W/a.log") <(pick "$W/d.log") ||
  { echo "train split differs from --data-path a --split 100,0,0"; exit 1; }
diff <(pick "$W/c.log") <(pick "$W/d.log") || { echo "--data-args-path differs"; exit 1; }
# `megatron inspect` with the per-split flags shows the valid split's own samples: those of
# --data-path b --split 0,100,0.
"$M" inspect --valid-data-path "$W/b_text_document" --seq-length 32 --train-samples 8 \
  --show-split valid --show-samples 0:3 > "$W/i1.log" || { cat "$W/i1.log"; exit 1; }
"$M" inspect --data-path "$W/b_text_document" --split 0,100,0 --seq-length 32 --train-samples 8 \
  --show-split valid --show-samples 0:3 > "$W/i2.log" || { cat "$W/i2.log"; exit 1; }
[ "$(grep -c '^[0-2]:' "$W/i1.log")" = 3 ] || { echo "inspect printed no samples"; cat "$W/i1.log"; exit 1; }
diff <(grep '^[0-2]:' "$W/i1.log") <(grep '^[0-2]:' "$W/i2.log") ||
  { echo "inspect --valid-data-path differs"; exit 1; }
# The error paths: a missing JSON entry names the file and the entry.
echo '{"train": "x"}' > "$W/bad.json"
if "$M" train "${COMMON[@]}" --per-split-data-args-path "$W/bad.json" > "$W/e.log" 2>&1; then
  echo "a JSON without valid/test was accepted"; exit 1
fi
grep -q 'bad.json has no "valid" entry' "$W/e.log" || { cat "$W/e.log"; exit 1; }
echo "per-split data: flags == JSON, train split == --split 100,0,0; $(vals "$W/a.log" | wc -l) validations"
