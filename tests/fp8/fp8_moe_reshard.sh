#!/usr/bin/env bash
# fp8_moe_reshard.sh WORK MEGATRON MPIRUN... -- FLAGS... -- PARALLEL_FLAGS...: the routed
# experts' delayed-scaling state resharded across expert-parallel sizes. One process (EP 1,
# every expert) stops at iteration 2 (--exit-interval saves); `MPIRUN -np 2` with
# PARALLEL_FLAGS (EP 2: each rank loads its experts' weights and FP8 state) resumes it and
# stops at 3. Every amax history and scale, the experts' included, must equal within 1e-4
# those of a serial run straight to iteration 3: rows 1-2 of an expert's history hold
# iterations 1-2's amaxes only if they were saved, resharded by expert and loaded (a fresh
# state has zeros there and scales of 1), and the key sets must match (both EP ranks wrote
# their experts' state).
set -euo pipefail
work=$1 meg=$2; shift 2
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
flags=(); while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
par=("$@")
d=$work/moe_reshard; rm -rf "$d"; mkdir -p "$d"
"$meg" train "${flags[@]}" --exit-interval 3 --save "$d/serial.ckpt" > "$d/serial.log" 2>&1 ||
  { cat "$d/serial.log"; exit 1; }
"$meg" train "${flags[@]}" --exit-interval 2 --save "$d/ep.ckpt" > "$d/ep1.log" 2>&1 ||
  { cat "$d/ep1.log"; exit 1; }
"${mpirun[@]}" -np 2 "$meg" train "${flags[@]}" "${par[@]}" --exit-interval 3 --load "$d/ep.ckpt" \
  --save "$d/ep.ckpt" > "$d/resumed.log" 2>&1 || { cat "$d/resumed.log"; exit 1; }
grep -q "successfully loaded checkpoint" "$d/resumed.log" || { echo "FAIL: did not load"; exit 1; }
[ "$(cat "$d/ep.ckpt/latest_checkpointed_iteration.txt")" = 3 ] ||
  { echo "FAIL: the resumed run did not save iteration 3"; exit 1; }
python3 "$(dirname "$0")/fp8_state_compare.py" "$d/serial.ckpt" "$d/ep.ckpt" \
  "at iteration 3, EP1 -> EP2 from iteration 2" "mlp.experts." "mlp.shared_experts."
