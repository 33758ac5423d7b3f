#!/usr/bin/env bash
# The real CLI against the harness (issue 17 item 4): `megatron train` as a user runs it
# (Megatron's flags and log line, Megatron's default dropout unless DROPOUT=0) on a
# Megatron .bin/.idx dataset preprocessed here and on --mock-data, then bench_gpu_train on
# the same model, batch and dropout; prints one table: ms per iteration of the last log
# interval (Megatron's "elapsed time per iteration", which includes the data loader and the
# host work the harness leaves out), tokens/s, and each run against the harness.
# The corpus is synthetic (random token ids through NullTokenizer: no download, no network
# on the GPU machine), so the .bin/.idx path, the index building and the loader are real.
# Usage: bench/gpu/cli_time.sh BUILD_DIR [MODEL]   (MODEL 124m (default) | 350m | tiny;
#        env MB micro-batch (16), GBS global batch (64: 4-way accumulation), ITERS (30),
#        DROPOUT=0 for no dropout, DEVICE=cpu with MODEL=tiny for a smoke test, OUT logs)
set -uo pipefail
BUILD=${1:-build-gpu}
MODEL=${2:-124m}
M=$BUILD/megatron
B=$BUILD/bench/bench_gpu_train
MB=${MB:-16} GBS=${GBS:-64} ITERS=${ITERS:-30} DEVICE=${DEVICE:-cuda}
LOG=${OUT:-/tmp}/cli-time-$MODEL
mkdir -p "$LOG"
case $MODEL in
  124m) SHAPE=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
               --max-position-embeddings 1024 --keep-mlp-activations 8); S=1024; BNAME=124M ;;
  350m) SHAPE=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
               --max-position-embeddings 1024 --keep-mlp-activations 24); S=1024; BNAME=350M ;;
  tiny) SHAPE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
               --max-position-embeddings 64); S=64; BNAME= ;;
  *) echo "cli_time.sh: unknown model '$MODEL' (124m, 350m, tiny)"; exit 2 ;;
esac
DROP=()
[[ ${DROPOUT:-1} == 0 ]] && DROP=(--attention-dropout 0 --hidden-dropout 0)
PREC=(--bf16)
[[ $DEVICE == cpu ]] && PREC=()

# A corpus of ~ITERS * GBS * S * 1.5 random token ids (vocab 50257, as GPT-2's), in
# documents of 100-3000 tokens, preprocessed into a .bin/.idx dataset.
python3 - "$LOG/corpus.jsonl" $((ITERS * GBS * S * 3 / 2)) <<'PY' || exit 1
import json, random, sys
random.seed(17)
left = int(sys.argv[2])
with open(sys.argv[1], "w") as f:
    while left > 0:
        n = min(left, random.randint(100, 3000))
        f.write(json.dumps({"text": " ".join(str(random.randrange(50257)) for _ in range(n))}) + "\n")
        left -= n
PY
"$M" preprocess --input "$LOG/corpus.jsonl" --output-prefix "$LOG/corpus" \
  --tokenizer-type NullTokenizer --vocab-size 50257 --append-eod --workers 8 \
  > "$LOG/preprocess.log" 2>&1 || { tail -20 "$LOG/preprocess.log"; exit 1; }

COMMON=("${SHAPE[@]}" --tokenizer-type NullTokenizer --vocab-size 50257
  --micro-batch-size "$MB" --global-batch-size "$GBS" --lr 1e-4 --min-lr 1e-5
  --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 --train-iters "$ITERS"
  --log-interval $((ITERS / 3)) --log-throughput --eval-iters 0 --device "$DEVICE" "${PREC[@]}" "${DROP[@]}")
ms() { grep -oE "elapsed time per iteration \(ms\): [0-9.]+" "$1" | tail -1 | awk '{print $NF}'; }
"$M" train "${COMMON[@]}" --data-path "$LOG/corpus_text_document" --split 100,0,0 \
  > "$LOG/train-bin.log" 2>&1 || { tail -20 "$LOG/train-bin.log"; exit 1; }
"$M" train "${COMMON[@]}" --mock-data > "$LOG/train-mock.log" 2>&1 ||
  { tail -20 "$LOG/train-mock.log"; exit 1; }
HARNESS=""
if [[ -n $BNAME && -x $B ]]; then  # the same step in the harness (global batch GBS as GBS/MB micro-batches)
  V=$([[ ${DROPOUT:-1} == 0 ]] && echo base || echo dropout)
  [[ $GBS != "$MB" ]] && V="$V+accum"
  [[ $V == base+accum ]] && V=accum
  if [[ $V == *accum && $GBS != $((MB * 4)) ]]; then
    echo "cli_time.sh: the harness accumulates 4 micro-batches; GBS must be 4 x MB"; exit 2
  fi
  "$B" --only "$BNAME" --variants "$V" --mb "$BNAME=$GBS" > "$LOG/harness.md" 2> "$LOG/harness.err" ||
    { tail -20 "$LOG/harness.err"; exit 1; }
  HARNESS=$(grep -oE "^ +[0-9.]+ ms/step" "$LOG/harness.err" | tail -1 | awk '{print $1}')
fi
grep -h "attention (all" "$LOG/train-bin.log" | head -1
echo "| run ($MODEL, micro-batch $MB, global batch $GBS, dropout $([[ ${DROPOUT:-1} == 0 ]] && echo 0 || echo 0.1/0.1)) | ms per iteration | tokens/s | vs harness |"
echo "|---|---:|---:|---:|"
row() {
  local t=$2
  [[ -z $t ]] && { echo "| $1 | - | - | - |"; return; }
  local rel="-"
  [[ -n $HARNESS ]] && rel=$(awk -v a="$t" -v b="$HARNESS" 'BEGIN { printf "%+.1f%%", 100 * (a / b - 1) }')
  echo "| $1 | $t | $(awk -v t="$t" -v n=$((GBS * S)) 'BEGIN { printf "%.1fK", n / t }') | $rel |"
}
row "megatron train, .bin/.idx" "$(ms "$LOG/train-bin.log")"
row "megatron train, --mock-data" "$(ms "$LOG/train-mock.log")"
[[ -n $HARNESS ]] && row "bench_gpu_train (harness)" "$HARNESS"
exit 0
