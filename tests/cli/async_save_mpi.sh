#!/usr/bin/env bash
# async_save_mpi.sh MEGATRON MPIRUN...: --async-save under mpirun (issue 23 A.1). Four ranks
# (TP2 x DP2, distributed optimizer: every rank writes a shard of the moments), saves every
# 4 iterations in the background:
#   * every checkpoint holds byte-identical shards to the synchronous run's, and each is
#     committed (tracker at the last one);
#   * a run stopped at 8 (--exit-interval, which saves and waits) and resumed from the
#     asynchronous checkpoint logs iterations 9-12 exactly as the uninterrupted run.
set -euo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
F=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --train-iters 12 --log-interval 1 --save-interval 4
   --tensor-model-parallel-size 2 --use-distributed-optimizer --threads 1)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
pick() { grep -E "iteration +(9|1[0-2])/" "$1" | sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//'; }
run "$W/sync.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --save "$W/S"
run "$W/async.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --save "$W/A" --async-save
grep -q "scheduled asynchronous save of checkpoint at iteration        4" "$W/async.log" ||
  { echo "the save was not asynchronous"; exit 1; }
for it in 4 8 12; do
  grep -q "successfully saved checkpoint from iteration $(printf '%8d' $it) to $W/A (asynchronously)" \
    "$W/async.log" || { echo "iteration $it was not committed"; exit 1; }
  d=$(printf 'iter_%07d' $it)
  n=0
  for f in "$W/S/$d"/*.safetensors; do
    cmp "$f" "$W/A/$d/$(basename "$f")" || { echo "$d/$(basename "$f") differs"; exit 1; }
    n=$((n + 1))
  done
  [ $n -ge 4 ] || { echo "$d: only $n shard files"; exit 1; }
done
[ "$(cat "$W/A/latest_checkpointed_iteration.txt")" = 12 ] || { echo "tracker not at 12"; exit 1; }
run "$W/b1.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --save "$W/B" --async-save --exit-interval 8
run "$W/b2.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" --save "$W/B" --load "$W/B" --async-save
grep -q "successfully loaded checkpoint from $W/B \[ iteration 8 \]" "$W/b2.log" ||
  { echo "did not resume from the asynchronous checkpoint at 8"; tail -5 "$W/b2.log"; exit 1; }
diff <(pick "$W/sync.log") <(pick "$W/b2.log") || { echo "resumed run differs"; exit 1; }
echo "--async-save under mpirun: shards identical to synchronous saves, resume bit-exact"
