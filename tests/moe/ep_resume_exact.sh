#!/usr/bin/env bash
# ep_resume_exact.sh WORK NAME NP MEGATRON COMPARE MPIRUN... -- FLAGS...
# Bit-exact resume at the same expert-parallel layout: one run of FLAGS for all iterations
# under `MPIRUN -np NP`, and one stopped at iteration 10 (--exit-interval 10) and resumed
# from its checkpoint in the same layout. Iterations 11-20 must print the same lm loss
# lines, and the final checkpoints (parameters, Adam moments, the expert bias) must be
# equal bit for bit (COMPARE with tolerance 0).
set -euo pipefail
work=$1 name=$2 np=$3 meg=$4 cmp=$5; shift 5
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
d=$work/$name; rm -rf "$d"; mkdir -p "$d"
run() { "${mpirun[@]}" -np "$np" "$meg" train "$@" > "$d/$log" 2>&1 || { cat "$d/$log"; exit 1; }; }
log=full.log run "$@" --save "$d/full.ckpt"
log=first.log run "$@" --save "$d/resumed.ckpt" --exit-interval 10
log=resumed.log run "$@" --load "$d/resumed.ckpt" --save "$d/resumed.ckpt"
grep -q "successfully loaded checkpoint" "$d/resumed.log" || { echo "FAIL: did not load"; exit 1; }
losses() { grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.* lm loss: [0-9.E+-]+' "$1" |
           sed -E 's/iteration +([0-9]+)\/.* lm loss: ([0-9.E+-]+)/\1 \2/' | awk '$1>10'; }
n=$(losses "$d/resumed.log" | wc -l)
if [ "$n" -lt 10 ] || [ "$(losses "$d/full.log")" != "$(losses "$d/resumed.log")" ]; then
  echo "FAIL: lm losses of iterations 11-20, uninterrupted / resumed ($n iterations):"
  paste <(losses "$d/full.log") <(losses "$d/resumed.log"); exit 1
fi
echo "ok: $n iterations of lm loss identical after the resume"
exec "$cmp" "$d/full.ckpt" "$d/resumed.ckpt" 0
