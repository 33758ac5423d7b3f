#!/usr/bin/env bash
# sigterm_save.sh MEGATRON: with --exit-signal-handler, SIGTERM mid-run finishes the
# step, saves a checkpoint, and exits 0; the checkpoint then loads.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 1 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 4 --lr 1e-3 --train-iters 100000 --log-interval 1 --threads 1)
"$M" train "${ARGS[@]}" --save "$W/ck" --exit-signal-handler > "$W/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "iteration        3/" "$W/log" 2>/dev/null && break; sleep 0.2; done
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 0 ] || { echo "exit code $rc after SIGTERM"; tail "$W/log"; exit 1; }
grep -q "exiting on SIGTERM" "$W/log" || { echo "no exit message"; tail "$W/log"; exit 1; }
it=$(cat "$W/ck/latest_checkpointed_iteration.txt")
[ "$it" -ge 3 ] || { echo "tracker says $it"; exit 1; }
"$M" train "${ARGS[@]}" --load "$W/ck" --exit-interval $((it + 1)) > "$W/log2" 2>&1 || { tail "$W/log2"; exit 1; }
grep -q "successfully loaded checkpoint" "$W/log2" || { echo "reload failed"; exit 1; }
echo "SIGTERM at iteration $it: saved, exit 0, reloaded"
