#!/usr/bin/env bash
# no_initialization.sh MEGATRON: --no-initialization skips drawing the parameters.
#   - resuming a checkpoint with it gives the iterations of resuming without it, bit for bit
#     (every parameter comes from the checkpoint);
#   - without a checkpoint it warns, and the zero model's first loss is ln(256) to the log
#     line's digits (all logits zero: a uniform prediction over the padded vocabulary, the
#     NullTokenizer's 128 + EOD padded to 256).
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style cosine --train-iters 8
  --log-interval 1 --threads 1)
fail() { echo "FAIL: $*"; exit 1; }
"$M" train "${ARGS[@]}" --save "$W/ck" --exit-interval 4 > "$W/a.log" 2>&1 ||
  { tail "$W/a.log"; fail "first run"; }
pick() {  # iteration lines 5..8 without time-dependent fields
  grep -E "iteration +[5-8]/" "$1" |
    sed -E -e 's/^ \[[^]]*\]//' -e 's/elapsed time per iteration \(ms\): [0-9.]+ \|//' \
      -e 's/throughput per GPU \(TFLOP\/s\/GPU\): [0-9.]+ \|//' \
      -e 's/tokens per second per GPU: [0-9.]+ \|//'
}
"$M" train "${ARGS[@]}" --load "$W/ck" > "$W/b.log" 2>&1 || { tail "$W/b.log"; fail "resume"; }
"$M" train "${ARGS[@]}" --load "$W/ck" --no-initialization > "$W/c.log" 2>&1 ||
  { tail "$W/c.log"; fail "resume with --no-initialization"; }
[ "$(pick "$W/b.log" | wc -l)" -eq 4 ] || fail "expected 4 iteration lines"
diff <(pick "$W/b.log") <(pick "$W/c.log") || fail "--no-initialization changed the resume"
grep -q "without a checkpoint" "$W/c.log" && fail "warned although a checkpoint was loaded"
"$M" train "${ARGS[@]}" --no-initialization --train-iters 1 --lr-warmup-iters 0 \
  > "$W/z.log" 2>&1 || { tail "$W/z.log"; fail "zero model"; }
grep -q -- "--no-initialization without a checkpoint to load" "$W/z.log" || fail "no warning"
loss=$(grep -E "iteration +1/" "$W/z.log" | sed -E 's/.*lm loss: *([^ |]+).*/\1/')
python3 -c "import math, sys; sys.exit(abs(float(sys.argv[1]) - math.log(256)) > 1e-5)" "$loss" ||
  fail "zero model's loss $loss, ln(256) = 5.545177"
echo "ok: resume equal; zero model loss $loss"
