#!/usr/bin/env bash
# comm_volumes.sh MPIRUN... -- MEGATRON FLAGS...: runs the tiny GPT (2 layers, H 32, S 16,
# micro-batch 2, global batch 8) at TP 2 + SP x DP 2 with --logging-level 10 and checks the
# logged per-iteration communication volumes against the analytical ones:
#   M = 2 micro-batches per DP rank, T = S*B = 32 rows, one activation [T, H] f32 = 4096 B.
#   tp all_gather:     M * ((2L+1) forward SP gathers + (2L+1) backward duals + (2L+1)
#                      backward re-gathers of the column-parallel GEMMs' inputs, which SP
#                      does not keep, as Megatron) = 30 calls, each one activation: 30 * 4096 B
#   tp reduce_scatter: M * ((2L+1) + (2L+1)) = 20 calls of one activation (the duals of the
#                      gathers and vice versa)
#   tp all_reduce:     3 per micro-batch (CE row max, sum-exp, target logit: [T] f32)
#                      + one per SP-partial gradient (4L+2 norm tensors of [H], the position
#                      table [S, H]) + the grad norm (8 B)
#                      = 6 + 11 + 1 = 18 calls, 6*128 + 10*128 + 16*32*4 + 8 = 4104 B
#   dp all_reduce:     one bucket of 4*P bytes (P = parameters incl. padding, logged)
#                      + the masked-token count and the loss sum (8 B each)
set -euo pipefail
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
out=$("${mpirun[@]}" -np 4 "$@" --tensor-model-parallel-size 2 --sequence-parallel \
      --train-iters 2 --lr-warmup-iters 0 --log-interval 1 --logging-level 10 2>&1) || { echo "$out"; exit 1; }
P=$(grep -Eo 'model parallel rank \(0, 0\): [0-9]+' <<<"$out" | grep -Eo '[0-9]+$')
fail=0
expect() {
  if grep -q -- "$1" <<<"$out"; then echo "ok: $1"; else echo "FAIL: missing '$1'"; fail=1; fi
}
expect "group 'tp' (2 ranks): all_gather 30 calls 122880 bytes"
expect "group 'tp' (2 ranks): reduce_scatter 20 calls 81920 bytes"
expect "group 'tp' (2 ranks): all_reduce 18 calls 4104 bytes"
expect "group 'dp' (2 ranks): all_reduce 3 calls $((4 * P + 16)) bytes"
[ $fail = 0 ] || { grep "comm per" <<<"$out"; exit 1; }
echo "all volumes as predicted"
