#!/usr/bin/env bash
# serve_cli.sh MEGATRON CKPT: `megatron serve` over loopback with curl: Megatron's /api
# and the OpenAI endpoints give `megatron generate`'s greedy text; SSE framing; every bad
# input gets its 4xx naming the field and the next request succeeds; SIGTERM exits 0;
# --dtype and --no-cuda-graphs that the CPU cannot honour are refused.
set -eu
M=$1; C=$2
. "$(dirname "$0")/serve_lib.sh"
P1="The quick brown fox"; P2="Once upon a time"; P3="1 2 3"
# The oracle: `megatron generate`, one prompt per process (a continuation may hold newlines).
gen() { "$M" generate --load "$C" --prompt "$1" --greedy --num-tokens-to-generate "$2" 2>/dev/null \
        | grep -v '^> ' || true; }
G1=$(gen "$P1" 12); G2=$(gen "$P2" 12); G3=$(gen "$P3" 12)
[ -n "$G1" ] || fail "megatron generate gave nothing"
# Device flags that do not apply: a clear error and a non-zero exit, for serve and generate.
for cmd in "serve --load $C --dtype bf16" "generate --load $C --prompt x --dtype bf16"; do
  out=$("$M" $cmd 2>&1) && fail "$cmd was accepted on the CPU"
  grep -q -- "--dtype bf16 on --device cpu" <<<"$out" || fail "$cmd: $out"
done
out=$("$M" serve --load "$C" --dtype fp8 2>&1) && fail "--dtype fp8 was accepted"
grep -q -- "--dtype 'fp8' is not a dtype" <<<"$out" || fail "--dtype fp8: $out"
out=$("$M" serve --load "$C" --no-cuda-graphs 2>&1) && fail "--no-cuda-graphs was accepted on the CPU"
grep -q -- "--no-cuda-graphs applies to --device cuda only" <<<"$out" || fail "--no-cuda-graphs: $out"
start_server server.log --load "$C" --inference-max-requests 4 --threads 2
cat server.log
grep -q "; cpu fp32, TP 1" server.log || fail "the start-up line does not name the dtype"

# Megatron's PUT /api: the text is prompt + continuation, as generate prints it.
api=$(curl -sf -X PUT "$URL/api" -H 'Content-Type: application/json' \
      -d "{\"prompts\": [\"$P1\", \"$P2\", \"$P3\"], \"tokens_to_generate\": 12, \"top_k\": 1}")
echo "$api"
[ "$(jf 'j["text"][0]' <<<"$api")" = "$G1" ] || fail "/api text 0 differs from generate: $G1"
[ "$(jf 'j["text"][1]' <<<"$api")" = "$G2" ] || fail "/api text 1 differs from generate: $G2"
[ "$(jf 'j["text"][2]' <<<"$api")" = "$G3" ] || fail "/api text 2 differs from generate: $G3"
[ "$(jf '"".join(j["segments"][0]) == j["text"][0]' <<<"$api")" = True ] || fail "segments"
[ "$(jf 'j["logprobs"]' <<<"$api")" = None ] || fail "logprobs only when asked"
# logprobs: one per token after the first, all <= 0; the prompt's equal with 0 new tokens.
lp=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P1\"], \"tokens_to_generate\": 4, \"logprobs\": true, \"top_k\": 1}")
lp0=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P1\"], \"tokens_to_generate\": 0, \"logprobs\": true}")
[ "$(jf 'len(j["logprobs"][0]) == len(j["segments"][0]) - 1 and all(x <= 0 for x in j["logprobs"][0])' <<<"$lp")" = True ] \
  || fail "logprobs shape: $lp"
python3 - "$lp" "$lp0" <<'PY' || fail "prompt logprobs differ between 0 and 4 new tokens"
import json, sys
a, b = json.loads(sys.argv[1])["logprobs"][0], json.loads(sys.argv[2])["logprobs"][0]
assert len(b) >= 1 and all(abs(x - y) < 1e-4 for x, y in zip(a, b)), (a, b)
PY
# Seeded sampling reproduces.
s1=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P2\"], \"tokens_to_generate\": 10, \"temperature\": 1.2, \"random_seed\": 5}")
s2=$(curl -sf -X PUT "$URL/api" -d "{\"prompts\": [\"$P2\"], \"tokens_to_generate\": 10, \"temperature\": 1.2, \"random_seed\": 5}")
[ "$s1" = "$s2" ] || fail "same random_seed, different text"

# OpenAI completions: the continuation only; echo puts the prompt first.
c=$(curl -sf "$URL/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P1\", \"max_tokens\": 12, \"temperature\": 0}")
[ "$P1$(jf 'j["choices"][0]["text"]' <<<"$c")" = "$G1" ] || fail "completion differs: $c"
[ "$(jf 'j["object"], j["usage"]["prompt_tokens"] > 0' <<<"$c")" = "text_completion True" ] || fail "$c"
ce=$(curl -sf "$URL/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P1\", \"max_tokens\": 12, \"temperature\": 0, \"echo\": true}")
[ "$(jf 'j["choices"][0]["text"]' <<<"$ce")" = "$G1" ] || fail "echo: $ce"

# SSE with curl: data: events, the pieces add up, finish_reason last, then [DONE].
curl -sfN "$URL/v1/completions" -d "{\"model\": \"m\", \"prompt\": \"$P1\", \"max_tokens\": 12, \"temperature\": 0, \"stream\": true}" >sse.txt
head -c 600 sse.txt; echo
python3 - "$G1" "$P1" <<'PY' || fail "SSE stream"
import json, sys
full, prompt = sys.argv[1], sys.argv[2]
events = [e for e in open("sse.txt").read().split("\n\n") if e.strip()]
assert all(e.startswith("data: ") for e in events), events
assert events[-1] == "data: [DONE]", events[-1]
chunks = [json.loads(e[6:]) for e in events[:-1]]
assert len(chunks) >= 2, "expected several events"
text = "".join(c["choices"][0]["text"] for c in chunks)
assert prompt + text == full, (text, full)
assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
PY
# Stop strings cut the text (not sent in the stream either).
word=$(cut -c1-4 <<<"${G1#"$P1"}" | tr -d '\n')
if [ -n "$(tr -d ' ' <<<"$word")" ]; then
  st=$(curl -sf "$URL/v1/completions" -d "$(python3 -c 'import json,sys; print(json.dumps({"model":"m","prompt":sys.argv[1],"max_tokens":12,"temperature":0,"stop":[sys.argv[2]]}))' "$P1" "$word")")
  [ "$(jf 'j["choices"][0]["text"], j["choices"][0]["finish_reason"]' <<<"$st")" = " stop" ] \
    || fail "stop string '$word': $st"
fi

# Bad input: status and the field named; the server keeps serving.
expect() {  # expect STATUS PARAM METHOD PATH BODY
  local out code
  out=$(curl -s -o body.json -w '%{http_code}' -X "$3" "$URL$4" --data-binary "$5")
  code=$out
  [ "$code" = "$1" ] || { cat body.json; fail "$4 $5: HTTP $code, expected $1"; }
  [ "$(jf 'j["error"]["param"]' <body.json)" = "$2" ] || { cat body.json; fail "$4 $5: param, expected $2"; }
  [ -n "$(jf 'j["message"]' <body.json)" ] || fail "no message"
  curl -sf "$URL/v1/completions" -d '{"model": "m", "prompt": "ok", "max_tokens": 2}' >/dev/null \
    || fail "the request after '$5' failed"
}
long=$(python3 -c 'print(" ".join(["word"] * 400))')
expect 400 None POST /v1/completions '{"model": "m", "prompt": "x",'
expect 400 None POST /v1/completions '[1, 2]'
expect 400 max_tokens POST /v1/completions '{"model": "m", "prompt": "x", "max_tokens": "8"}'
expect 400 max_tokens POST /v1/completions '{"model": "m", "prompt": "x", "max_tokens": -1}'
expect 400 max_tokens POST /v1/completions '{"model": "m", "prompt": "x", "max_tokens": 100000}'
expect 400 prompt POST /v1/completions "{\"model\": \"m\", \"prompt\": \"$long\"}"
expect 400 prompt POST /v1/completions '{"model": "m", "prompt": [3, 99999999]}'
expect 400 prompt POST /v1/completions '{"model": "m", "prompt": {"a": 1}}'
expect 400 prompt POST /v1/completions '{"model": "m"}'
expect 400 temperature POST /v1/completions '{"model": "m", "prompt": "x", "temperature": 7}'
expect 400 stream POST /v1/completions '{"model": "m", "prompt": "x", "stream": "yes"}'
expect 400 n POST /v1/completions '{"model": "m", "prompt": "x", "n": 2}'
expect 400 colour POST /v1/completions '{"model": "m", "prompt": "x", "colour": "red"}'
expect 400 messages POST /v1/chat/completions '{"model": "m", "messages": []}'
expect 400 'messages[0].role' POST /v1/chat/completions '{"model": "m", "messages": [{"role": "robot", "content": "x"}]}'
expect 400 'messages[0].content' POST /v1/chat/completions '{"model": "m", "messages": [{"role": "user", "content": 5}]}'
expect 400 prompts PUT /api '{"tokens_to_generate": 5}'
expect 400 prompts PUT /api '{"prompts": "not a list"}'
expect 400 tokens_to_generate PUT /api '{"prompts": ["a"], "tokens_to_generate": 1.5}'
expect 400 tokens_to_generate PUT /api '{"prompts": ["a"], "tokens_to_generate": 0}'
expect 400 top_p PUT /api '{"prompts": ["a"], "top_k": 5, "top_p": 0.5}'
expect 400 add_BOS PUT /api '{"prompts": ["a"], "add_BOS": 1}'
expect 400 beam_width PUT /api '{"prompts": ["a"], "beam_width": 2}'
expect 400 unknown_field PUT /api '{"prompts": ["a"], "unknown_field": 2}'
head -c 1100000 /dev/zero | tr '\0' 'a' >big.txt
expect 413 body POST /v1/completions @big.txt
expect 404 None GET /v2/nothing ''
models=$(curl -sf "$URL/v1/models")
[ "$(jf 'j["data"][0]["object"]' <<<"$models")" = model ] || fail "models: $models"
h=$(curl -sf "$URL/health")
[ "$(jf 'j["status"], j["active"], j["waiting"]' <<<"$h")" = "ok 0 0" ] || fail "health: $h"
# Chat = a completion of the rendered template with the template's stop strings: the plain
# template here, ChatML from a tokenizer_config.json below.
chat_vs_completion() {  # MESSAGES_JSON RENDERED STOPS_JSON
  local a b
  a=$(curl -sf "$URL/v1/chat/completions" -d "{\"model\": \"m\", \"messages\": $1, \"max_tokens\": 12, \"temperature\": 0}")
  b=$(curl -sf "$URL/v1/completions" -d "$(python3 -c 'import json,sys; print(json.dumps({"model":"m","prompt":sys.argv[1],"max_tokens":12,"temperature":0,"stop":json.loads(sys.argv[2])}))' "$2" "$3")")
  [ "$(jf 'j["choices"][0]["message"]["content"], j["usage"]["prompt_tokens"]' <<<"$a")" = \
    "$(jf 'j["choices"][0]["text"], j["usage"]["prompt_tokens"]' <<<"$b")" ] || fail "chat $a vs completion $b"
}
chat_vs_completion '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]' \
  $'System: Be brief.\n\nUser: Hi\n\nAssistant:' '["\nUser:", "\nSystem:"]'
stop_server
grep -q "stopped" server.log || fail "no clean stop"
cat >tokenizer_config.json <<'JSON'
{"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"}
JSON
start_server server2.log --load "$C" --inference-max-requests 2 --threads 2 --tokenizer-config tokenizer_config.json
grep -q "chat template: chatml (tokenizer_config.json)" server2.log || { cat server2.log; fail "chatml not chosen"; }
chat_vs_completion '[{"role": "user", "content": "Hi"}]' \
  $'<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n' '["<|im_end|>"]'
stop_server
echo ok
