#!/usr/bin/env bash
# serve_gpu.sh MEGATRON CKPT (label gpu): `megatron serve --device cuda` answers /api and
# a streamed completion with the CPU `megatron generate` greedy text, 16 concurrent
# requests batched on the GPU included.
set -eu
M=$1; C=$2
. "$(dirname "$0")/serve_lib.sh"
P1="1 2 3"; P2="7 8"  # the NullTokenizer checkpoint (no tokenizer files needed)
gen() { "$M" generate --load "$C" --prompt "$1" --greedy --num-tokens-to-generate 12 2>/dev/null \
        | grep -v '^> ' || true; }
G1=$(gen "$P1"); G2=$(gen "$P2")
start_server server_gpu.log --load "$C" --device cuda --inference-max-requests 8
a=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P1\", \"$P2\"], \"tokens_to_generate\": 12, \"top_k\": 1}")
[ "$(jf 'j["text"][0]' <<<"$a")" = "$G1" ] || fail "GPU /api differs from CPU generate: $a"
[ "$(jf 'j["text"][1]' <<<"$a")" = "$G2" ] || fail "GPU /api prompt 2: $a"
pids=()
for i in $(seq 1 16); do
  curl -sf "$URL/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P1\", \"max_tokens\": 12, \"temperature\": 0}" >c$i.json &
  pids+=($!)
done
wait "${pids[@]}"  # the clients only (the server is a background job too)
for i in $(seq 1 16); do
  [ "$P1$(jf 'j["choices"][0]["text"]' <c$i.json)" = "$G1" ] || fail "concurrent request $i: $(cat c$i.json)"
done
[ "$(curl -sf "$URL/health" | jf 'j["peak_active"] >= 2')" = True ] || fail "not batched"
stop_server
echo ok
