#!/usr/bin/env bash
# loss_falls.sh MAX_FINAL_LOSS CMD...: runs a training command and checks that it
# prints Megatron log lines, that the last lm loss is below MAX_FINAL_LOSS and
# below the first one. Optional: --expect REGEX (repeatable) lines that must appear.
set -euo pipefail
max=$1; shift
expects=()
while [ "${1:-}" = "--expect" ]; do expects+=("$2"); shift 2; done
out=$("$@" 2>&1) || { echo "$out"; echo "training failed"; exit 1; }
# (No `| head` in pipelines: with pipefail a closed pipe would fail the script.)
lines=$(grep -E "iteration +[0-9]+/" <<<"$out" || true)
awk 'NR<=2' <<<"$lines"; awk '{l=$0} END{print l}' <<<"$lines"
losses=$(grep -oE "lm loss: [0-9.E+-]+" <<<"$out" | awk '{print $3}' || true)
[ -n "$losses" ] || { echo "no 'lm loss:' in the output"; echo "$out" | tail -20; exit 1; }
first=$(awk 'NR==1' <<<"$losses"); last=$(awk '{l=$0} END{print l}' <<<"$losses")
python3 - "$first" "$last" "$max" <<'PY'
import sys
first, last, mx = map(float, sys.argv[1:])
print(f"first logged loss {first:.4f}, last {last:.4f}, required below {mx}")
sys.exit(0 if last < mx and last < first else 1)
PY
for e in "${expects[@]}"; do
  grep -qE -- "$e" <<<"$out" || { echo "missing expected output /$e/"; echo "$out" | tail -20; exit 1; }
done
# Megatron's --log-throughput: the TFLOP/s field (and our tokens/s field) with it, neither
# without it.
if [[ " $* " == *" --log-throughput "* ]]; then
  grep -qE "throughput per GPU \(TFLOP/s/GPU\): [0-9.]+ \| learning rate" <<<"$lines" ||
    { echo "log line format: no throughput field with --log-throughput"; exit 1; }
  grep -qE "tokens per second per GPU: [0-9.]+ \|$" <<<"$lines" ||
    { echo "log line format: no tokens/s field with --log-throughput"; exit 1; }
else
  grep -qE "elapsed time per iteration \(ms\): [0-9.]+ \| learning rate" <<<"$lines" ||
    { echo "log line format: a throughput field without --log-throughput"; exit 1; }
  if grep -qE "TFLOP/s/GPU|tokens per second" <<<"$lines"; then
    echo "log line format: throughput fields printed without --log-throughput"; exit 1
  fi
fi
