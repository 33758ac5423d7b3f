#!/usr/bin/env bash
# tcp_train_equiv.sh WORK NAME NP RTOL MEGATRON LAUNCH COMPARE MPIRUN... -- FLAGS...
# Trains the same tiny model twice with NP processes: under MPIRUN -np NP, and as a
# torchrun-style launch without MPI (LAUNCH = tcp_launch.sh: RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT set). Both must be one job of NP ranks; every iteration's lm loss and grad
# norm must agree in both logs; and the final checkpoints (every parameter and both Adam
# moments) must agree within RTOL by COMPARE (ckpt_compare). RTOL 0 asks for the same bits
# (and the same log text): the TCP backend's rank-order reduction gives MPI's bits for two
# ranks (a sum of two values does not depend on the order); beyond two, OpenMPI's order may
# differ, so the logged values must agree within RTOL or one unit of their last printed
# digit.
set -euo pipefail
work=$1 name=$2 np=$3 rtol=$4 meg=$5 launch=$6 cmp=$7; shift 7
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
mkdir -p "$work"; d=$work/$name; rm -rf "$d".*
"${mpirun[@]}" -np "$np" "$meg" train "$@" --save "$d.mpi.ckpt" > "$d.mpi.log" 2>&1 ||
  { cat "$d.mpi.log"; echo "FAIL: the mpirun run failed"; exit 1; }
"$launch" "$np" "$meg" train "$@" --save "$d.tcp.ckpt" > "$d.tcp.log" 2>&1 ||
  { cat "$d.tcp.log"; echo "FAIL: the torchrun-style run failed"; exit 1; }
for f in "$d.mpi.log" "$d.tcp.log"; do
  grep -Eq "^ +world_size \.+ $np\$" "$f" || { echo "FAIL: $f is not a job of $np ranks"; exit 1; }
done
lines() { grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.* lm loss: [0-9.E+-]+ .*grad norm: [0-9.]+' "$1" |
          sed -E 's/^iteration +([0-9]+)\/.* (lm loss: [0-9.E+-]+) .*(grad norm: [0-9.]+)/\1 \2 \3/'; }
n=$(lines "$d.mpi.log" | wc -l)
# RTOL 0: the same text. Otherwise each value within RTOL, or one unit of its last printed
# digit (a last-bit difference can carry the rounding of the printed value across a digit).
same=0
if [ "$rtol" = 0 ]; then
  [ "$(lines "$d.mpi.log")" = "$(lines "$d.tcp.log")" ] && same=1
else
  paste <(lines "$d.mpi.log") <(lines "$d.tcp.log") | awk -v r="$rtol" -F'\t' '
    function close_to(a, b, unit) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a
                                     return d <= r * m || d <= unit * 1.0001 }
    { split($1, x, " "); split($2, y, " ")  # iteration lm loss: L grad norm: G
      if (x[1] != y[1] || !close_to(x[4], y[4], 1e-6 * (x[4] < 0 ? -x[4] : x[4])) ||
          !close_to(x[7], y[7], 0.001)) bad++ }
    END { exit bad ? 1 : 0 }' && same=1
fi
if [ "$n" -lt 10 ] || [ "$same" != 1 ]; then
  echo "FAIL: mpirun vs torchrun-style ($n iterations):"
  paste <(lines "$d.mpi.log") <(lines "$d.tcp.log"); exit 1
fi
"$cmp" "$d.mpi.ckpt" "$d.tcp.ckpt" "$rtol" | tail -1
if [ "$rtol" = 0 ]; then what="identical"; else what="within $rtol"; fi
echo "ok: $n iterations, lm loss and grad norm $what under mpirun and the TCP backend," \
     "final checkpoints within $rtol"
lines "$d.tcp.log" | tail -1
