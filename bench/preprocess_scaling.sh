#!/usr/bin/env bash
# Thread scaling of `megatron preprocess` (issue 3's goal: >= 75% of linear).
#
# Builds a ~100 MB JSONL by replicating the Gutenberg corpus in a temporary folder, runs
# `megatron preprocess` (GPT2BPETokenizer, --append-eod) at 1, 2, 4, 8, 16 workers (up
# to nproc), best of REPEAT runs each, and prints a table. Two times per row:
#   process s   the whole command as a user runs it: program start, tokenizer load,
#               read + JSON + tokenise + .bin/.idx (fsync'd), exit
#   pipeline s  the summary line's time: preprocess() alone, without program start and
#               tokenizer load
#   CPU s       the process's CPU time (summary line): growth with N means the threads run
#               slower, not that they wait
#   N procs s   with CEILING=1: the input split in N line-aligned parts, N independent
#               1-worker processes at once (nothing shared but the machine): the scaling
#               this machine allows this workload (SMT siblings, turbo, noisy neighbours)
# Efficiency = T(1) / (N * T(N)). Every run's .bin and .idx must be byte-identical to the
# 1-worker output (cmp); the script fails otherwise.
#
# Usage: bench/preprocess_scaling.sh [path/to/megatron]
#   CORPUS=file.jsonl   the corpus to replicate (default: .cache/assets/gutenberg.jsonl,
#                       made by scripts/make_corpus.sh when missing)
#   GPT2_DIR=dir        encoder.json + vocab.bpe (default: .cache/assets/gpt2/package)
#   TARGET_MB=100  REPEAT=3  WORKERS="1 2 4 8 16"  CEILING=1  KEEP=1 (keep the temp folder)
set -euo pipefail
cd "$(dirname "$0")/.."
M=${1:-build/megatron}
CORPUS=${CORPUS:-.cache/assets/gutenberg.jsonl}
GPT2_DIR=${GPT2_DIR:-.cache/assets/gpt2/package}
TARGET_MB=${TARGET_MB:-100}
REPEAT=${REPEAT:-3}
NPROC=$(nproc)
WORKERS=${WORKERS:-1 2 4 8 16}

[ "${WORKERS%% *}" = 1 ] || { echo "WORKERS must start with 1 (the baseline), got '$WORKERS'" >&2; exit 2; }
[ -x "$M" ] || { echo "no megatron binary at $M; HINT: build it or pass its path" >&2; exit 2; }
if [ ! -f "$CORPUS" ]; then
  [ "$CORPUS" = .cache/assets/gutenberg.jsonl ] || { echo "CORPUS=$CORPUS does not exist" >&2; exit 2; }
  scripts/make_corpus.sh >/dev/null
fi
for f in encoder.json vocab.bpe; do
  [ -f "$GPT2_DIR/$f" ] || { echo "no $GPT2_DIR/$f; HINT: scripts/fetch_assets.sh gpt2, or set GPT2_DIR" >&2; exit 2; }
done

W=$(mktemp -d "${TMPDIR:-/tmp}/preprocess_scaling.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
size=$(stat -c %s "$CORPUS")
copies=$(( (TARGET_MB * 1000000 + size / 2) / size ))
((copies >= 1)) || copies=1
for ((i = 0; i < copies; i++)); do cat "$CORPUS"; done >"$W/in.jsonl"
MB=$(awk -v b="$(stat -c %s "$W/in.jsonl")" 'BEGIN { printf "%.2f", b / 1e6 }')
cat "$W/in.jsonl" >/dev/null  # into the page cache before the first timed run

now() { date +%s.%N; }
echo "# megatron preprocess scaling: $copies x $(basename "$CORPUS") = $MB MB, GPT2BPETokenizer,"
echo "# --append-eod, best of $REPEAT; $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
echo
run1() {  # run1 INPUT PREFIX WORKERS LOG
  "$M" preprocess --input "$1" --output-prefix "$2" --append-eod --workers "$3" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2_DIR/encoder.json" \
    --merge-file "$GPT2_DIR/vocab.bpe" >"$4" 2>&1 || { cat "$4" >&2; return 1; }
}
min() { awk -v a="$1" -v b="${2:-1e9}" 'BEGIN { print (a < b ? a : b) }'; }
CEILING=${CEILING:-0}
head="| workers | process s | MB/s | tokens/s | efficiency | pipeline s | MB/s | efficiency | CPU s |"
sep="|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
[ "$CEILING" = 1 ] && head+=" N procs s | efficiency |" sep+="---:|---:|"
echo "$head"
echo "$sep"
base_proc="" base_pipe="" base_ceil=""
for n in $WORKERS; do
  [ "$n" -le "$NPROC" ] || continue
  best_proc="" best_pipe="" best_cpu="" tokens=""
  for ((r = 0; r < REPEAT; r++)); do
    t0=$(now)
    run1 "$W/in.jsonl" "$W/w$n" "$n" "$W/log"
    t1=$(now)
    line=$(grep 'preprocess:' "$W/log")
    tokens=$(sed -E 's/.* documents.*, ([0-9]+) tokens,.*/\1/' <<<"$line")
    best_proc=$(min "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$best_proc")
    best_pipe=$(min "$(sed -E 's/.* MB in ([0-9.]+) s:.*/\1/' <<<"$line")" "$best_pipe")
    best_cpu=$(min "$(sed -E 's/.*; ([0-9.]+) CPU s.*/\1/' <<<"$line")" "$best_cpu")
  done
  best_ceil=""
  if [ "$CEILING" = 1 ]; then
    rm -rf "$W/parts" "$W/parts.out" && mkdir "$W/parts" "$W/parts.out"
    split -n "l/$n" -d -a 3 "$W/in.jsonl" "$W/parts/"
    for ((r = 0; r < REPEAT; r++)); do
      t0=$(now)
      pids=()
      for f in "$W"/parts/*; do
        run1 "$f" "$W/parts.out/${f##*/}" 1 "$W/parts.out/${f##*/}.log" & pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; done
      t1=$(now)
      best_ceil=$(min "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$best_ceil")
    done
  fi
  if [ "$n" = 1 ]; then
    base_proc=$best_proc base_pipe=$best_pipe base_ceil=$best_ceil
  else
    for ext in bin idx; do
      cmp "$W/w1_text_document.$ext" "$W/w${n}_text_document.$ext" ||
        { echo "FAIL: $n workers wrote a different .$ext than 1 worker" >&2; exit 1; }
    done
  fi
  awk -v n="$n" -v mb="$MB" -v tok="$tokens" -v p="$best_proc" -v q="$best_pipe" -v c="$best_cpu" \
    -v p1="$base_proc" -v q1="$base_pipe" -v e="$best_ceil" -v e1="$base_ceil" 'BEGIN {
      printf "| %d | %.3f | %.1f | %.2fM | %.0f%% | %.3f | %.1f | %.0f%% | %.2f |", n, p, mb / p,
        tok / p / 1e6, 100 * p1 / (n * p), q, mb / q, 100 * q1 / (n * q), c
      if (e != "") printf " %.3f | %.0f%% |", e, 100 * e1 / (n * e)
      printf "\n" }'
done
echo
echo "outputs of every worker count byte-identical to 1 worker's (.bin and .idx, cmp)"
