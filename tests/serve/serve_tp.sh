#!/usr/bin/env bash
# serve_tp.sh MEGATRON CKPT "MPIRUN...": `megatron serve` under mpirun -np 2 with
# --tensor-model-parallel-size 2 answers /api with the serial `megatron generate` text.
set -eu
M=$1; C=$2; MPI=$3
. "$(dirname "$0")/serve_lib.sh"
G=$("$M" generate --load "$C" --prompt "1 2 3" --greedy --num-tokens-to-generate 10 2>/dev/null | grep -v '^> ')
rm -f port.txt
$MPI -np 2 "$M" serve --port 0 --port-file port.txt --load "$C" --tensor-model-parallel-size 2 \
  --inference-max-requests 3 >server.log 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do [ -s port.txt ] && break; sleep 0.1; done
[ -s port.txt ] || { cat server.log; fail "the TP server did not start"; }
URL="http://127.0.0.1:$(cat port.txt)"
a=$(curl -sf -X PUT "$URL/api" -d '{"prompts": ["1 2 3", "1 2 3", "7"], "tokens_to_generate": 10, "top_k": 1}')
echo "$a"
[ "$(jf 'j["text"][0]' <<<"$a")" = "$G" ] || fail "TP /api differs from serial generate: $G"
[ "$(jf 'j["text"][1]' <<<"$a")" = "$G" ] || fail "TP /api prompt 2"
# mpirun exits non-zero when it is signalled itself; rank 0 must still stop cleanly.
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true
grep -q '^\[serve\] stopped' server.log || { cat server.log; fail "rank 0 did not stop cleanly"; }
echo ok
