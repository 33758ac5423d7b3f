#!/usr/bin/env bash
# plan_matches_train.sh NP MPIRUN... -- MEGATRON FLAGS...: `megatron plan FLAGS --world-size NP`
# prints, per pipeline rank, the activation and total memory that `megatron train FLAGS`
# under mpirun prints at start-up ("Theoretical memory footprints"), to the hundredth of
# a MiB, stage for stage (train's lines come from TP rank 0 / DP rank 0, in stage order).
set -euo pipefail
np=$1; shift
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
meg=$1; shift
plan=$("$meg" plan "$@" --world-size "$np" 2>&1) || { echo "$plan"; exit 1; }
rows=$(sed -n '/^memory per pipeline rank/,/^(/p' <<<"$plan" | awk '$1 ~ /^[0-9]+$/ {print $7, $8}')
out=$("${mpirun[@]}" -np "$np" "$meg" train "$@" --train-iters 1 --lr-warmup-iters 0 2>&1) ||
  { echo "$out"; exit 1; }
seen=$(grep -Eo '\[rank [0-9]+\] Theoretical memory footprints: [^[]*' <<<"$out" |
       sed -E 's/\[rank ([0-9]+)\].*activation=([0-9.]+) MB, total=([0-9.]+) MB.*/\1 \2 \3/' |
       sort -n | awk '{print $2, $3}')
if [ -z "$rows" ] || [ "$rows" != "$seen" ]; then
  echo "FAIL: plan (activations, total MiB per stage) vs train:"; paste <(echo "$rows") <(echo "$seen")
  echo "$plan" | tail -8; exit 1
fi
echo "ok: megatron plan's memory per stage equals train's start-up plan on $(wc -l <<<"$rows") stages"
echo "$rows"
