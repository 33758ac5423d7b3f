#!/usr/bin/env bash
# weight_hash.sh MEGATRON MPIRUN...: --check-weight-hash-across-dp-replicas-interval 2 under
# mpirun at DP 2, and at TP 2 x DP 2 with the distributed optimizer and its overlapped
# parameter gather (the check waits for the gather): the run succeeds and prints Megatron's
# ">>> Weight hashes match after N iterations..." before the first step and after iterations
# 2, 4 and 6, never after odd ones; its per-step log lines are those of the same run without
# the flag. Alone (DP 1) it says once that there is nothing to compare. A replica that
# differs is tests/weight_hash's (the check called directly under mpirun).
set -uo pipefail
M=$1; shift
MPI=("$@")
source "$(dirname "$0")/train_log_lib.sh"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --train-iters 6 --log-interval 1 --threads 1 --device cpu)
F=(--check-weight-hash-across-dp-replicas-interval 2)
# The iterations of the match lines, in order, e.g. "0 2 4 6 ".
matches() {
  grep -oE ">>> Weight hashes match after [0-9]+ iterations\.\.\." "$1" | grep -oE "[0-9]+" |
    tr '\n' ' '
}
for par in "-np 2" "-np 4 --tensor-model-parallel-size 2 --use-distributed-optimizer \
--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 3000"; do
  read -ra P <<<"$par"
  run "$W/with.log" "${MPI[@]}" "${P[@]:0:2}" "$M" train "${T[@]}" "${P[@]:2}" "${F[@]}"
  run "$W/without.log" "${MPI[@]}" "${P[@]:0:2}" "$M" train "${T[@]}" "${P[@]:2}"
  args_line "$W/with.log" check_weight_hash_across_dp_replicas_interval 2
  got=$(matches "$W/with.log")
  [ "$got" = "0 2 4 6 " ] ||
    { echo "FAIL ($par): match lines after iterations '$got', want '0 2 4 6 '"; exit 1; }
  [ -z "$(matches "$W/without.log")" ] ||
    { echo "FAIL ($par): match lines without the flag"; exit 1; }
  [ "$(lines "$W/with.log" | wc -l)" -eq 6 ] ||
    { echo "FAIL ($par): not 6 iteration lines"; tail -20 "$W/with.log"; exit 1; }
  diff <(lines "$W/with.log") <(lines "$W/without.log") ||
    { echo "FAIL ($par): the flag changed the log lines"; exit 1; }
  echo "ok ($par): matches after $got; the same log lines as without the flag"
done
run "$W/one.log" "$M" train "${T[@]}" "${F[@]}"
grep -q "one data-parallel replica, no other copy of the weights to compare with" "$W/one.log" &&
  [ "$(matches "$W/one.log")" = "0 2 4 6 " ] ||
  { echo "FAIL (DP 1): no 'one data-parallel replica' line or match lines"; tail -20 "$W/one.log"
    exit 1; }
echo "weight hash: ok"
