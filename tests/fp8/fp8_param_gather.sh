#!/usr/bin/env bash
# fp8_param_gather.sh WORK NAME NP FP8_ELEMENTS MEGATRON COMPARE MPIRUN... -- FLAGS...
# --fp8-param-gather under `MPIRUN -np NP` (FLAGS include --use-distributed-optimizer),
# beyond the loss equivalences of CMakeLists.txt:
#   1. the gathered bytes are FP8: the start-up line's FP8 weight elements on a rank equal
#      FP8_ELEMENTS (the model's QKV, projection, fc1 and fc2 weights, computed from its
#      shape by the caller), the FP8 part of a parameter all-gather is exactly that many
#      bytes (every rank's FP8 elements once, no padding), what the DP group's
#      communicator counted received (or gathered) plus the rank's own chunks is exactly
#      the FP8 plus the model-dtype bytes, and that is less than the same gather in the
#      model dtype;
#   2. a checkpoint of a run with the flag, resumed by a run without it (and the other way
#      round), goes on as a run that never had the flag: iterations 11-20 equal and the
#      final checkpoints (weights and both moments) equal bit for bit. (On the CPU the flag
#      changes no value: the layers' FP8 weights are the values their own casts compute.)
set -euo pipefail
work=$1 name=$2 np=$3 elems=$4 meg=$5 cmp=$6; shift 6
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
flags=("$@")
d=$work/$name; rm -rf "$d"; mkdir -p "$d"
run() { local log=$1; shift; "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "$@" > "$d/$log" 2>&1 ||
        { cat "$d/$log"; exit 1; }; }
losses() { grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.* lm loss: [0-9.E+-]+ \|.* grad norm: [0-9.]+' "$1" |
           sed -E 's/iteration +([0-9]+)\/.* lm loss: ([0-9.E+-]+) \|.* grad norm: ([0-9.]+)/\1 \2 \3/'; }
run plain.log --save "$d/plain"
run pg.log --fp8-param-gather --save "$d/pg" --exit-interval 10
line=$(grep -m1 -- "> --fp8-param-gather:" "$d/pg.log") || { echo "FAIL: no --fp8-param-gather line"; exit 1; }
echo "$line" | sed 's/^.*> //'
read -r e f o moved own plain < <(echo "$line" | sed -E 's/.*: ([0-9]+) FP8 weight elements.* writes ([0-9]+) bytes of FP8 and ([0-9]+) bytes of .* \(([0-9]+) counted by the DP group, ([0-9]+) this rank.s own; ([0-9]+) bytes without.*/\1 \2 \3 \4 \5 \6/')
[ "$e" -eq "$elems" ] || { echo "FAIL: $e FP8 weight elements on rank 0, expected $elems"; exit 1; }
[ "$f" -eq "$e" ] || { echo "FAIL: $f FP8 bytes gathered for $e FP8 weight elements"; exit 1; }
[ $((moved + own)) -eq $((f + o)) ] || { echo "FAIL: the DP group counted $moved + $own bytes, not $f + $o"; exit 1; }
[ $((f + o)) -lt "$plain" ] || { echo "FAIL: $((f + o)) bytes gathered, not fewer than $plain"; exit 1; }
echo "ok: $e FP8 weight elements, $f bytes of FP8 + $o other bytes gathered ($plain without the flag)"
# with the flag to 10, then without; without to 10 (the plain run's checkpoint at 10 is
# not kept), then with
run nopg_resumed.log --load "$d/pg" --save "$d/pg"
run nopg10.log --save "$d/nopg" --exit-interval 10
run pg_resumed.log --fp8-param-gather --load "$d/nopg" --save "$d/nopg"
for r in nopg_resumed pg_resumed; do
  grep -q "successfully loaded checkpoint" "$d/$r.log" || { echo "FAIL: $r did not load"; exit 1; }
  a=$(losses "$d/plain.log" | awk '$1 > 10'); b=$(losses "$d/$r.log" | awk '$1 > 10')
  if [ "$(echo "$a" | wc -l)" -ne 10 ] || [ "$a" != "$b" ]; then
    echo "FAIL: $r: iterations 11-20 differ from the run without the flag"; paste <(echo "$a") <(echo "$b"); exit 1
  fi
done
"$cmp" "$d/plain" "$d/pg" 0
"$cmp" "$d/plain" "$d/nopg" 0
echo "ok: resumed across --fp8-param-gather both ways, iterations 11-20 and final checkpoints bit for bit"
