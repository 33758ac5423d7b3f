#!/usr/bin/env bash
# serve_clients.sh MEGATRON CKPT NODE_DIR: the official `openai` npm client (installed here
# from the npm registry at a pinned version) for completions, chat and streaming; then 32
# concurrent clients x 8 requests each, every answer equal to `megatron generate`'s greedy
# text, with the server's peak memory bounded and the batch never above its slots.
set -eu
M=$1; C=$2; NODE_DIR=$3
OPENAI_VERSION=5.23.2  # pinned: no dependencies of its own
. "$(dirname "$0")/serve_lib.sh"
D=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$NODE_DIR/node_modules/openai/package.json" ] ||
   ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$NODE_DIR/node_modules/openai/package.json"; then
  mkdir -p "$NODE_DIR"
  npm install --no-audit --no-fund --no-save --prefix "$NODE_DIR" "openai@$OPENAI_VERSION" >npm.log 2>&1 \
    || { cat npm.log; fail "npm install openai@$OPENAI_VERSION"; }
fi
cp "$D/openai_client.mjs" "$D/concurrent_clients.mjs" "$NODE_DIR/"
gen() { "$M" generate --load "$C" --prompt "$1" --greedy --num-tokens-to-generate "$2" 2>/dev/null \
        | grep -v '^> ' || true; }
SLOTS=8
start_server server.log --load "$C" --inference-max-requests $SLOTS --threads 2

P="Deep in the forest"
out=$(node "$NODE_DIR/openai_client.mjs" "$URL" "$P") || fail "openai client"
echo "$out"
G=$(gen "$P" 12)
python3 - "$out" "$G" "$P" <<'PY' || fail "openai client results"
import json, sys
o, full, prompt = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
assert prompt + o["completion"] == full, (o["completion"], full)
assert o["completion_stream"] == o["completion"], o
assert o["completion_finish"] in ("length", "stop")
assert o["usage"]["completion_tokens"] <= 12 and o["usage"]["prompt_tokens"] == 4, o["usage"]
assert o["chat_role"] == "assistant" and o["chat"] != "", o
assert o["chat_stream"] == o["chat"], o
assert o["chat_stream_usage"]["completion_tokens"] >= 1, o
assert o["error"] == {"status": 400, "param": "max_tokens"}, o["error"]
PY

# The expected text of 16 prompts, from `megatron generate` one at a time.
: >prompts.txt
for i in $(seq 1 16); do echo "Story number $i begins with" >>prompts.txt; done
python3 - "$M" "$C" <<'PY' >expected.json
import json, subprocess, sys
m, c = sys.argv[1], sys.argv[2]
out = []
for p in open("prompts.txt").read().splitlines():
    r = subprocess.run([m, "generate", "--load", c, "--prompt", p, "--greedy",
                        "--num-tokens-to-generate", "16"], capture_output=True, text=True, check=True)
    text = "\n".join(l for l in r.stdout.split("\n") if not l.startswith("> "))
    text = text[:-1] if text.endswith("\n") else text
    assert text.startswith(p), (p, text)
    out.append({"prompt": p, "continuation": text[len(p):]})
print(json.dumps(out))
PY
rss() { awk '/VmHWM/ {print $2}' "/proc/$SERVER_PID/status"; }
before=$(rss)
res=$(node "$NODE_DIR/concurrent_clients.mjs" "$URL" expected.json 32 8) || fail "concurrent clients"
after=$(rss)
h=$(curl -sf "$URL/health")
echo "$res; peak memory ${before} kB before, ${after} kB after; $h"
[ "$(jf 'j["done"], j["bad"]' <<<"$res")" = "256 0" ] || fail "concurrent answers: $res"
[ "$(jf 'j["peak_active"]' <<<"$h")" -le $SLOTS ] || fail "more sequences than slots: $h"
[ "$(jf 'j["peak_active"]' <<<"$h")" -ge 2 ] || fail "requests were not batched together: $h"
[ "$(jf 'j["active"], j["waiting"]' <<<"$h")" = "0 0" ] || fail "sequences left: $h"
# Where the engine's time went: the model's operations, the idle wait, the callbacks (256
# answers and their tokens) and its own host work are each counted.
[ "$(jf 'all(j[k] > 0 for k in ("decode_seconds", "prefill_seconds", "idle_seconds", "callback_seconds", "host_seconds"))' <<<"$h")" = True ] ||
  fail "an engine time counter stayed at 0: $h"
# 256 requests must not grow the server: the KV cache is fixed, so only buffers of
# requests in flight (well under 64 MiB here) may come on top of the first requests' peak.
[ $((after - before)) -lt 65536 ] || fail "peak memory grew by $((after - before)) kB"
stop_server
echo ok
