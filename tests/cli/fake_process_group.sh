#!/usr/bin/env bash
# fake_process_group.sh MEGATRON [MPIRUN...]: --fake-process-group, one process playing one
# rank (RANK) of a job of WORLD_SIZE ranks with no exchange.
#   - rank 4 of 8 at TP 2 x PP 2 x DP 2 (sequence parallel, distributed optimizer) trains 3
#     iterations: the start-up line names its place (tensor 0, pipeline 1, data 0), its
#     allocated weights, gradients and optimizer state are the plan's (no memory-plan
#     warning), and it reports its saved activations; rank 7 (tensor 1, data 1) trains too;
#   - an MoE model at expert parallelism 2 (all-to-all dispatcher) and context parallelism 2
#     (the p2p ring) train with finite losses: the exchanges' sizes stay consistent;
#   - errors naming the cause: WORLD_SIZE unset, RANK not below WORLD_SIZE, --save.
# With MPIRUN: the real 8-rank job. Its rank 4 reports the same saved activations and the
# same theoretical memory line as the fake rank 4, and --fake-process-group under mpirun
# is an error.
set -euo pipefail
M=$1; shift
MPIRUN=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 4 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 1 --train-iters 3 --log-interval 1
  --threads 1)
LAYOUT=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel
  --use-distributed-optimizer)
fail() { echo "FAIL: $*"; exit 1; }
fake() {  # fake LOG SIZE RANK ARGS...: a fake-process-group run that must succeed
  local log=$1 size=$2 rank=$3; shift 3
  env WORLD_SIZE="$size" RANK="$rank" "$M" train --fake-process-group "$@" > "$log" 2>&1 ||
    { tail -20 "$log"; fail "fake rank $rank of $size: $*"; }
  ! grep -q "non-finite loss" "$log" || { grep "non-finite" "$log"; fail "$log: non-finite"; }
}
losses_finite() {  # every iteration line of LOG has a finite lm loss
  local n
  n=$(grep -cE "iteration +[0-9]+/ +[0-9]+ .*lm loss: [0-9.]+E[+-][0-9]+" "$1" || true)
  [ "$n" -eq 3 ] || { grep "iteration" "$1" | tail -3; fail "$1: $n finite loss lines of 3"; }
}
fake "$W/r4.log" 8 4 "${ARGS[@]}" "${LAYOUT[@]}"
grep -q "this process plays world rank 4 of 8 (tensor 0, pipeline 1, context 0, data 0," \
  "$W/r4.log" || { grep -- "--fake" "$W/r4.log"; fail "rank 4's place"; }
grep -q "memory plan:" "$W/r4.log" && fail "rank 4 allocated other than the plan"
grep -q "(after 1 iterations) activations | peak saved" "$W/r4.log" ||
  fail "rank 4 reported no saved activations"
losses_finite "$W/r4.log"
fake "$W/r7.log" 8 7 "${ARGS[@]}" "${LAYOUT[@]}"
grep -q "plays world rank 7 of 8 (tensor 1, pipeline 1, context 0, data 1," "$W/r7.log" ||
  fail "rank 7's place"
grep -q "memory plan:" "$W/r7.log" && fail "rank 7 allocated other than the plan"
MOE=(--num-experts 4 --moe-router-topk 2 --expert-model-parallel-size 2
  --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 0.01 --disable-bias-linear)
fake "$W/moe.log" 2 1 "${ARGS[@]}" "${MOE[@]}" --global-batch-size 4
losses_finite "$W/moe.log"
fake "$W/cp.log" 2 1 "${ARGS[@]}" --context-parallel-size 2 --global-batch-size 2
losses_finite "$W/cp.log"

expect_error() {  # expect_error MESSAGE ENV... -- ARGS...: exits non-zero, prints MESSAGE
  local msg=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if env -u WORLD_SIZE -u RANK "${envs[@]}" "$M" train --fake-process-group "$@" \
    > "$W/e.log" 2>&1; then fail "accepted: ${envs[*]} $*"; fi
  grep -qF -- "$msg" "$W/e.log" || { cat "$W/e.log"; fail "no '$msg'"; }
}
expect_error "environment variable WORLD_SIZE is not set" RANK=0 -- "${ARGS[@]}"
expect_error "RANK=8 is not below WORLD_SIZE=8" WORLD_SIZE=8 RANK=8 -- "${ARGS[@]}"
expect_error "--fake-process-group with --save $W/ck" WORLD_SIZE=8 RANK=0 -- "${ARGS[@]}" \
  "${LAYOUT[@]}" --save "$W/ck"
[ -e "$W/ck" ] && fail "--save folder created by a refused run"

if [ ${#MPIRUN[@]} -gt 0 ]; then
  "${MPIRUN[@]}" -np 8 "$M" train "${ARGS[@]}" "${LAYOUT[@]}" > "$W/real.log" 2>&1 ||
    { tail -20 "$W/real.log"; fail "the real 8-rank job"; }
  pick() {  # pick LOG PATTERN: the line's text after any "[rank r] " prefix
    grep -F "$2" "$1" | sed -E 's/^\[rank [0-9]+\] //' | head -1
  }
  for what in "(after 1 iterations) activations" "Theoretical memory footprints"; do
    real=$(grep -F "[rank 4] $what" "$W/real.log" | sed -E 's/^\[rank 4\] //' | head -1)
    mine=$(pick "$W/r4.log" "$what")
    [ -n "$real" ] || { grep -F "$what" "$W/real.log"; fail "the real rank 4: no '$what'"; }
    [ "$real" = "$mine" ] || fail "'$what': real rank 4 '$real', fake '$mine'"
  done
  if env WORLD_SIZE=2 RANK=0 "${MPIRUN[@]}" -np 2 "$M" train --fake-process-group "${ARGS[@]}" \
    > "$W/mpi.log" 2>&1; then fail "--fake-process-group accepted under mpirun"; fi
  grep -q "launched with OMPI_COMM_WORLD_SIZE=2" "$W/mpi.log" ||
    { tail "$W/mpi.log"; fail "no launcher message"; }
fi
echo "ok: fake ranks 4 and 7 of 8, MoE EP 2, CP 2; errors named" \
  "${MPIRUN:+; rank 4 as in the real job}"
