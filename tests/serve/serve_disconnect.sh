#!/usr/bin/env bash
# serve_disconnect.sh MEGATRON CKPT: one slot; a streaming client that disconnects after
# its first tokens must free the slot at once (the engine counts it cancelled, long before
# its 3000 tokens), so the next request is answered.
set -eu
M=$1; C=$2
. "$(dirname "$0")/serve_lib.sh"
start_server server.log --load "$C" --inference-max-requests 1 --inference-max-seq-length 4096 --threads 2
curl -sN "$URL/v1/completions" -d '{"model": "m", "prompt": "1 2 3", "max_tokens": 3000, "ignore_eos": true, "stream": true}' >stream.txt &
CURL=$!
for _ in $(seq 1 200); do
  [ "$(grep -c '^data: ' stream.txt || true)" -ge 3 ] && break
  sleep 0.05
done
[ "$(grep -c '^data: ' stream.txt || true)" -ge 3 ] || fail "no tokens streamed"
kill "$CURL"; wait "$CURL" 2>/dev/null || true
for _ in $(seq 1 100); do
  [ "$(curl -sf "$URL/health" | jf 'j["active"]')" = 0 ] && break
  sleep 0.1
done
h=$(curl -sf "$URL/health"); echo "$h"
[ "$(jf 'j["active"], j["cancelled"], j["completed"]' <<<"$h")" = "0 1 0" ] || fail "slot not freed: $h"
[ "$(jf 'j["generated_tokens"] < 3000' <<<"$h")" = True ] || fail "ran to the end: $h"
r=$(curl -sf --max-time 120 "$URL/v1/completions" -d '{"model": "m", "prompt": "4 5", "max_tokens": 3}') \
  || fail "the next request was not answered"
[ "$(jf 'j["usage"]["completion_tokens"] >= 1' <<<"$r")" = True ] || fail "$r"
stop_server
echo ok
