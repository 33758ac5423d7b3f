#!/usr/bin/env bash
# sigterm_save.sh MEGATRON [SIGNAL [MPIRUN...]]: with --exit-signal-handler (and
# --exit-signal SIGNAL when given), the signal mid-run finishes the step, saves a
# checkpoint, and exits 0; the checkpoint then loads. With MPIRUN the job runs on two ranks
# and only one of them gets the signal: both must save and exit together (the decision is
# reduced over the world; before, the other rank trained on and the save hung).
set -euo pipefail
M=$1
SIG=${2:-SIGTERM}
shift $(( $# < 2 ? $# : 2 ))
LAUNCH=("$@")
[ ${#LAUNCH[@]} -gt 0 ] && LAUNCH+=(-np 2)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 1 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --train-iters 100000 --log-interval 1 --threads 1)
EXTRA=()
[ "$SIG" != SIGTERM ] && EXTRA=(--exit-signal "$SIG")
"${LAUNCH[@]}" "$M" train "${ARGS[@]}" --save "$W/ck" --exit-signal-handler "${EXTRA[@]}" \
  > "$W/log" 2>&1 &
pid=$!
for _ in $(seq 150); do grep -q "iteration        3/" "$W/log" 2>/dev/null && break; sleep 0.2; done
if [ ${#LAUNCH[@]} -gt 0 ]; then
  # One rank only: the first megatron process of this job.
  target=$(pgrep -f "^$M train .*$W/ck" | head -1)
else
  target=$pid
fi
[ -n "$target" ] || { echo "no training process found"; tail "$W/log"; exit 1; }
kill -s "${SIG#SIG}" "$target"
rc=0
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then
  echo "still running 30 s after $SIG to one rank (hang?)"; kill -9 $pid; tail "$W/log"; exit 1
fi
wait $pid || rc=$?
[ $rc -eq 0 ] || { echo "exit code $rc after $SIG"; tail "$W/log"; exit 1; }
grep -q "exiting on $SIG" "$W/log" || { echo "no exit message"; tail "$W/log"; exit 1; }
it=$(cat "$W/ck/latest_checkpointed_iteration.txt")
[ "$it" -ge 3 ] || { echo "tracker says $it"; exit 1; }
"${LAUNCH[@]}" "$M" train "${ARGS[@]}" --load "$W/ck" --exit-interval $((it + 1)) > "$W/log2" 2>&1 ||
  { tail "$W/log2"; exit 1; }
grep -q "successfully loaded checkpoint" "$W/log2" || { echo "reload failed"; exit 1; }
echo "$SIG at iteration $it${LAUNCH:+ (one of two ranks)}: saved, exit 0, reloaded"
