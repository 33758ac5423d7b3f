#!/usr/bin/env bash
# tcp_train_equiv.sh WORK NAME MEGATRON LAUNCH MPIRUN... -- FLAGS...
# Trains the same tiny model twice with two processes: under MPIRUN -np 2, and as a
# torchrun-style launch without MPI (LAUNCH = tcp_launch.sh: RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT set). Both must be one job of two ranks, and every iteration's lm loss and
# grad norm must be the same text in both logs (the TCP backend reduces two ranks' values
# to the same bits as MPI).
set -euo pipefail
work=$1 name=$2 meg=$3 launch=$4; shift 4
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
mkdir -p "$work"; d=$work/$name; rm -rf "$d".*
"${mpirun[@]}" -np 2 "$meg" train "$@" --save "$d.mpi.ckpt" > "$d.mpi.log" 2>&1 ||
  { cat "$d.mpi.log"; echo "FAIL: the mpirun run failed"; exit 1; }
"$launch" 2 "$meg" train "$@" --save "$d.tcp.ckpt" > "$d.tcp.log" 2>&1 ||
  { cat "$d.tcp.log"; echo "FAIL: the torchrun-style run failed"; exit 1; }
for f in "$d.mpi.log" "$d.tcp.log"; do
  grep -Eq '^ +world_size \.+ 2$' "$f" || { echo "FAIL: $f is not a job of 2 ranks"; exit 1; }
done
lines() { grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.* lm loss: [0-9.E+-]+ .*grad norm: [0-9.]+' "$1" |
          sed -E 's/^iteration +([0-9]+)\/.* (lm loss: [0-9.E+-]+) .*(grad norm: [0-9.]+)/\1 \2 \3/'; }
n=$(lines "$d.mpi.log" | wc -l)
if [ "$n" -lt 10 ] || [ "$(lines "$d.mpi.log")" != "$(lines "$d.tcp.log")" ]; then
  echo "FAIL: mpirun vs torchrun-style ($n iterations):"
  paste <(lines "$d.mpi.log") <(lines "$d.tcp.log"); exit 1
fi
echo "ok: $n iterations, lm loss and grad norm identical under mpirun and the TCP backend"
lines "$d.tcp.log" | tail -2
