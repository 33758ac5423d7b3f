#!/usr/bin/env bash
# resume_bitexact.sh MEGATRON [EXTRA FLAGS...]: the checkpoint guarantee, end to end.
# Two real .bin/.idx datasets (preprocessed here) blended 0.3/0.7, dropout on:
#   run A: 20 iterations straight, checkpoints at 10 and 20;
#   run B: stops at 10 (--exit-interval, which saves), then resumes from --load to 20.
# Iterations 11-20 must log identical losses and grad norms, and the two final
# checkpoints must hold byte-identical model and optimizer tensors.
set -euo pipefail
M=$1; shift
EXTRA=("$@")  # e.g. --async-save
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 - "$W" <<'PY'
import json, random, sys
random.seed(7)
for name, n in (("a", 300), ("b", 400)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n):
            start = random.randrange(500)
            toks = [str((start + i) % 500) for i in range(random.randrange(20, 120))]
            f.write(json.dumps({"text": " ".join(toks)}) + "\n")
PY
for n in a b; do
  "$M" preprocess --input "$W/$n.jsonl" --output-prefix "$W/$n" --tokenizer-type NullTokenizer \
    --vocab-size 512 --append-eod --workers 1 > /dev/null
done
COMMON=(--data-path 0.3 "$W/a_text_document" 0.7 "$W/b_text_document" --split 98,2,0
  --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 8 --lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 3 --train-iters 20
  --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1 --eval-interval 5 --eval-iters 1
  --save-interval 10 --threads 1 "${EXTRA[@]}")
"$M" train "${COMMON[@]}" --save "$W/A" > "$W/a.log" 2>&1 || { cat "$W/a.log"; exit 1; }
"$M" train "${COMMON[@]}" --save "$W/B" --exit-interval 10 > "$W/b1.log" 2>&1 || { cat "$W/b1.log"; exit 1; }
"$M" train "${COMMON[@]}" --save "$W/B" --load "$W/B" > "$W/b2.log" 2>&1 || { cat "$W/b2.log"; exit 1; }
grep -q "successfully loaded checkpoint" "$W/b2.log" || { echo "run B did not load"; cat "$W/b2.log"; exit 1; }
pick() {  # iteration lines 11..20 without time-dependent fields
  grep -E "iteration +(1[1-9]|20)/" "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//; s/throughput per GPU \(TFLOP\/s\/GPU\): [0-9.]+ \|//; s/tokens per second per GPU: [0-9.]+ \|//'
}
if ! diff <(pick "$W/a.log") <(pick "$W/b2.log"); then echo "resumed losses differ"; exit 1; fi
[ "$(pick "$W/a.log" | wc -l)" -eq 10 ] || { echo "expected 10 iteration lines"; exit 1; }
grep -A1 "validation loss at iteration 15" "$W/a.log" > "$W/va"; grep -A1 "validation loss at iteration 15" "$W/b2.log" > "$W/vb"
diff "$W/va" "$W/vb" || { echo "validation after resume differs"; exit 1; }
for f in "$W"/A/iter_0000020/*.safetensors; do
  cmp "$f" "$W/B/iter_0000020/$(basename "$f")" || { echo "final $(basename "$f") differs"; exit 1; }
done
echo "bit-exact: iterations 11-20 and final weights + optimizer state identical"
pick "$W/b2.log" | tail -2
