#!/usr/bin/env bash
# memory_plan.sh MPIRUN... -- MEGATRON TRAIN-FLAGS...: the start-up memory plan (per
# micro-batch bytes, in-flight micro-batches, scratch bytes: predicted from the shapes and
# the schedule) must equal what every reporting rank measured after its first iteration,
# and the planned weights, gradients and optimizer state what it allocated (the trainer
# warns "memory plan: ... planned, ... allocated" otherwise).
set -euo pipefail
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
# Each rank's output in its own file where mpirun can do that (OpenMPI's --output-filename):
# the ranks' lines share one pipe otherwise, and a line of one rank can be split by another's.
if "${mpirun[0]}" --version 2>&1 | grep -q "Open\(RTE\| MPI\)"; then
  per_rank=$(mktemp -d); trap 'rm -rf "$per_rank"' EXIT
  "${mpirun[@]}" --output-filename "$per_rank" "$@" --train-iters 2 --lr-warmup-iters 0 \
    > "$per_rank/all" 2>&1 || { cat "$per_rank/all"; cat "$per_rank"/1/rank.*/std*; exit 1; }
  out=$(for r in "$per_rank"/1/rank.*; do cat "$r/stdout" "$r/stderr"; done)
else
  out=$("${mpirun[@]}" "$@" --train-iters 2 --lr-warmup-iters 0 2>&1) || { echo "$out"; exit 1; }
fi
if grep -q "memory plan: .* planned" <<<"$out"; then  # weights/grads/optimizer vs allocated
  echo "FAIL:"; grep "memory plan: .* planned" <<<"$out"; exit 1
fi
plan=$(grep -Eo '\[rank [0-9]+\] Theoretical memory footprints: [^[]*' <<<"$out" |
       sed -E 's/\[rank ([0-9]+)\].*per micro-batch: ([0-9]+) B \| micro-batches in flight at most: ([0-9]+) \| shared scratch: ([0-9]+) B/\1 \2 \3 \4/' | sort)
seen=$(grep -Eo '\[rank [0-9]+\] \(after 1 iterations\) activations [^[]*' <<<"$out" |
       sed -E 's/\[rank ([0-9]+)\].*in flight at the peak: ([0-9]+) \| largest per micro-batch: ([0-9]+) B \| shared scratch: ([0-9]+) B/\1 \3 \2 \4/' | sort)
n=$(wc -l <<<"$plan")
if [ -z "$plan" ] || [ "$plan" != "$seen" ]; then
  echo "FAIL: plan (rank, bytes per micro-batch, in flight, scratch) vs measured:"
  paste <(echo "$plan") <(echo "$seen")
  echo "--- the run's memory lines:"; grep -E "memory|activations" <<<"$out"; exit 1
fi
echo "ok: memory plan equals the measured activations on $n ranks:"; echo "$plan"
