#!/usr/bin/env bash
# eval_equiv.sh NP MPIRUN... -- MEGATRON TRAIN-FLAGS... -- PARALLEL-FLAGS...: evaluation
# (forward-only; through the pipeline's forward-only schedule when PP > 1) gives the serial
# run's validation and test losses within 1e-5 relative.
set -euo pipefail
np=$1; shift
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
EVAL=(--train-iters 6 --lr-warmup-iters 0 --eval-interval 3 --eval-iters 2)
vals() { grep -Eo 'validation loss at .* lm loss value: [0-9.E+-]+' <<<"$1" | sed -E 's/.*value: //'; }
serial=$("${flags[@]}" "${EVAL[@]}" 2>&1) || { echo "$serial"; exit 1; }
par=$("${mpirun[@]}" -np "$np" "${flags[@]}" "${EVAL[@]}" "$@" 2>&1) || { echo "$par"; exit 1; }
a=$(vals "$serial"); b=$(vals "$par")
n=$(wc -l <<<"$a")
[ "$n" -eq 4 ] || { echo "FAIL: expected 4 validation/test losses, got $n"; echo "$serial" | tail; exit 1; }
paste <(echo "$a") <(echo "$b") | awk '
  { if ($2 == "") { print "FAIL: missing parallel value"; bad = 1; next }
    d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r;
    if (r > 1e-5) { printf "FAIL: %s vs serial %s\n", $2, $1; bad = 1 } }
  END { if (!bad) printf "ok: %d validation/test losses equal the serial run (worst %.2e)\n", NR, worst;
        exit bad }'
