#!/usr/bin/env bash
# fp8_reshard.sh WORK MEGATRON MPIRUN... -- FLAGS...: the delayed-scaling state resharded.
# A TP2 run stops at iteration 2 (--exit-interval saves); one process resumes it (TP 1, so
# the checkpoint is resharded) and stops at 3. Its amax histories and scales must equal,
# within 1e-4, those of a serial run straight to iteration 3: rows 1-2 of each history
# hold iterations 1-2's amaxes only if they were saved, resharded and loaded (a fresh state
# has zeros there and scales of 1).
set -euo pipefail
work=$1 meg=$2; shift 2
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
flags=("$@")
d=$work/reshard; rm -rf "$d"; mkdir -p "$d"
"$meg" train "${flags[@]}" --exit-interval 3 --save "$d/serial.ckpt" > "$d/serial.log" 2>&1 ||
  { cat "$d/serial.log"; exit 1; }
"${mpirun[@]}" -np 2 "$meg" train "${flags[@]}" --tensor-model-parallel-size 2 --exit-interval 2 \
  --save "$d/tp2.ckpt" > "$d/tp2.log" 2>&1 || { cat "$d/tp2.log"; exit 1; }
"$meg" train "${flags[@]}" --exit-interval 3 --load "$d/tp2.ckpt" --save "$d/tp2.ckpt" \
  > "$d/resumed.log" 2>&1 || { cat "$d/resumed.log"; exit 1; }
grep -q "successfully loaded checkpoint" "$d/resumed.log" || { echo "FAIL: did not load"; exit 1; }
[ "$(cat "$d/tp2.ckpt/latest_checkpointed_iteration.txt")" = 3 ] ||
  { echo "FAIL: the resumed run did not save iteration 3"; exit 1; }
python3 "$(dirname "$0")/fp8_state_compare.py" "$d/serial.ckpt" "$d/tp2.ckpt" \
  "at iteration 3, TP2 -> TP1 from iteration 2"
