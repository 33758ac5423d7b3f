#!/usr/bin/env bash
# serve_gpu.sh MEGATRON CKPT (label gpu): `megatron serve --device cuda` answers /api and
# completions with `megatron generate`'s greedy text, 16 concurrent requests batched on the
# GPU included (batched prefill, device argmax, CUDA graphs of the decode step). In fp32 the
# reference is the CPU `generate`; in bf16 (serve's default on the GPU) it is `generate
# --device cuda --dtype bf16` (the plain path: each prompt prefilled alone, logits to the
# host, no graphs), since bf16 rounding may move an argmax away from the f32 model's.
set -eu
M=$1; C=$2
. "$(dirname "$0")/serve_lib.sh"
P1="1 2 3"; P2="7 8"  # the NullTokenizer checkpoint (no tokenizer files needed)
gen() { "$M" generate --load "$C" --prompt "$1" --greedy --num-tokens-to-generate 12 "${@:2}" \
        2>/dev/null | grep -v '^> ' || true; }
for dt in fp32 bf16; do
  if [ $dt = fp32 ]; then G1=$(gen "$P1"); G2=$(gen "$P2")
  else G1=$(gen "$P1" --device cuda --dtype bf16); G2=$(gen "$P2" --device cuda --dtype bf16); fi
  [ -n "$G1" ] && [ -n "$G2" ] || fail "$dt: generate gave nothing"
  start_server server_gpu_$dt.log --load "$C" --device cuda --dtype $dt --inference-max-requests 8
  grep -q "cuda $dt" server_gpu_$dt.log || fail "the server did not report cuda $dt: $(cat server_gpu_$dt.log)"
  a=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P1\", \"$P2\"], \"tokens_to_generate\": 12, \"top_k\": 1}")
  [ "$(jf 'j["text"][0]' <<<"$a")" = "$G1" ] || fail "$dt: GPU /api differs from CPU generate: $a vs $G1"
  [ "$(jf 'j["text"][1]' <<<"$a")" = "$G2" ] || fail "$dt: GPU /api prompt 2: $a vs $G2"
  pids=()
  for i in $(seq 1 16); do
    curl -sf "$URL/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P1\", \"max_tokens\": 12, \"temperature\": 0}" >c$i.json &
    pids+=($!)
  done
  wait "${pids[@]}"  # the clients only (the server is a background job too)
  for i in $(seq 1 16); do
    [ "$P1$(jf 'j["choices"][0]["text"]' <c$i.json)" = "$G1" ] || fail "$dt: concurrent request $i: $(cat c$i.json)"
  done
  [ "$(curl -sf "$URL/health" | jf 'j["peak_active"] >= 2')" = True ] || fail "$dt: not batched"
  stop_server
done
echo ok
