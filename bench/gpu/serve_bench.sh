#!/usr/bin/env bash
# Batched serving on one GPU (issue 21): `megatron serve --device cuda` with the Llama-style
# 1B (16 layers, hidden 2048, 32 heads, 8 query groups, FFN 8192, vocab 32000, RoPE,
# RMSNorm, SwiGLU), prompt 128 tokens, 128 new tokens, greedy, at 1, 8 and 64 concurrent
# streams: generated tokens/s of the server (all streams' new tokens / wall time from the
# first request to the last answer), against Hugging Face transformers' generate (bf16,
# static cache, one batch of the same size) on the same weights in the same call.
# Prints one table. Needs a CUDA build, python3 with torch + transformers for the reference
# (REF=0 skips it), no network (the model is random, written here by `megatron train`).
# Usage: bench/gpu/serve_bench.sh BUILD_DIR [STREAMS="1 8 64"]   env OUT (logs), WORK (the
#        checkpoint and its HF copy, default /tmp/serve-bench-work), REF=0|1,
#        NOGRAPH=1 (also without CUDA graphs), BARRIER=0 (the clock starts before the client
#        threads, not at a barrier that releases them together), CONNECT=0 (each client
#        connects when it sends, not before the clock starts), PROCS (client processes,
#        default 8; 1: every client thread in one Python process), DEVICE=cpu TINY=1 for a smoke test of the
#        script on a CPU build. Every stream count runs once untimed first (warm-up).
set -uo pipefail
DEVICE=${DEVICE:-cuda}
BUILD=${1:-build-gpu}
STREAMS=${2:-"1 8 64"}
M=$BUILD/megatron
LOG=${OUT:-/tmp}/serve-bench
mkdir -p "$LOG"
WORK=${WORK:-/tmp/serve-bench-work}  # the checkpoint and the HF copy (GBs): not under OUT
mkdir -p "$WORK"
CK=$WORK/ckpt
SHAPE=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192
       --seq-length 256 --max-position-embeddings 2048 --vocab-size 32000
       --position-embedding-type rope --normalization RMSNorm --swiglu
       --group-query-attention --num-query-groups 8 --untie-embeddings-and-output-weights
       --disable-bias-linear)
PREC=(--bf16)
if [ "${TINY:-0}" = 1 ]; then
  SHAPE=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 256
         --max-position-embeddings 512 --vocab-size 32000 --position-embedding-type rope
         --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear)
  PREC=()
fi
if [ ! -f "$CK/latest_checkpointed_iteration.txt" ]; then
  "$M" train "${SHAPE[@]}" --mock-data --tokenizer-type NullTokenizer --micro-batch-size 1 \
    --global-batch-size 1 --lr 1e-6 --train-iters 1 --device "$DEVICE" "${PREC[@]}" \
    --save "$CK" --save-interval 1 --no-save-optim >"$LOG/train.log" 2>&1 || { tail "$LOG/train.log"; exit 1; }
fi
MAXS=0; for s in $STREAMS; do [ "$s" -gt "$MAXS" ] && MAXS=$s; done
# One server run: serve_run NAME [serve flags...] -> $LOG/NAME.json {streams: {tokens, seconds, tokens_per_s}}
serve_run() {
  local name=$1; shift
  rm -f "$LOG/port"
  "$M" serve --load "$CK" --device "$DEVICE" --port 0 --port-file "$LOG/port" \
    --inference-max-requests "$MAXS" --inference-max-seq-length 256 "$@" >"$LOG/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 1200); do [ -s "$LOG/port" ] && break; sleep 0.1; done
  [ -s "$LOG/port" ] || { cat "$LOG/$name.log"; kill $pid; return 1; }
  python3 - "http://127.0.0.1:$(cat "$LOG/port")" "$STREAMS" >"$LOG/$name.json" <<'PY'
import http.client, json, multiprocessing as mp, os, random, sys, threading, time, urllib.parse, urllib.request
url, streams = sys.argv[1], [int(s) for s in sys.argv[2].split()]
# Every client thread is started, its request body built and (CONNECT=1, the default) its
# HTTP connection opened before the clock starts, as a load generator with a connection pool
# does; a barrier releases them together (the n streams are concurrent from the first one).
# CONNECT=0: a connection per request at send time (urllib), as before 2026-12-03.
# The threads are spread over PROCS processes (default 8): in one Python process the 64
# answers, which arrive together at the last step, are read and parsed one after another
# under the interpreter's lock (~11 ms, the engine idle meanwhile); PROCS=1 is that client.
# A thread's answer time is taken when it has parsed its answer; the clock stops at the last.
def one(i, out, ends, go):
    random.seed(i)
    body = {"model": "m", "prompt": [random.randrange(100, 31000) for _ in range(128)],
            "max_tokens": 128, "temperature": 0, "ignore_eos": True}
    data = json.dumps(body).encode()
    if os.environ.get("CONNECT", "1") == "0":
        req = urllib.request.Request(url + "/v1/completions", data, method="POST")
        go.wait()
        out[i] = json.load(urllib.request.urlopen(req))["usage"]["completion_tokens"]
        ends[i] = time.perf_counter()
        return
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    conn.connect()
    go.wait()
    conn.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
    out[i] = json.loads(conn.getresponse().read())["usage"]["completion_tokens"]
    ends[i] = time.perf_counter()
    conn.close()
# BARRIER=0: the clock starts before the threads, as before 2026-12-03 (the streams then
# arrive over the ~ms the client takes to start them).
class NoBarrier:
    def wait(self): pass
def health():
    return json.load(urllib.request.urlopen(url + "/health"))
# One process's streams ids: its threads wait at a barrier that the parent's (cross-process)
# barrier opens; reports (tokens, the last answer's time) on q.
def proc(ids, bar, q):
    out, ends = {i: 0 for i in ids}, {i: 0.0 for i in ids}
    go = threading.Barrier(len(ids) + 1)
    ts = [threading.Thread(target=one, args=(i, out, ends, go)) for i in ids]
    for t in ts: t.start()
    bar.wait()
    go.wait()
    for t in ts: t.join()
    q.put((sum(out.values()), max(ends.values())))
# -> (tokens, seconds, the server's counters just before the clock starts: after the threads
# have started, so the engine's idle time while they start stays out of the difference)
def run(n):
    barrier = os.environ.get("BARRIER", "1") != "0"
    nproc = min(n, int(os.environ.get("PROCS", "8")))
    if barrier and nproc > 1:
        ctx = mp.get_context("fork")
        bar, q = ctx.Barrier(nproc + 1), ctx.Queue()
        ps = [ctx.Process(target=proc, args=(list(range(k, n, nproc)), bar, q)) for k in range(nproc)]
        for p in ps: p.start()
        time.sleep(0.3)  # every process started its threads, built its requests, connected
        h0 = health()
        bar.wait()
        t0 = time.perf_counter()
        res = [q.get() for _ in ps]
        for p in ps: p.join()
        return sum(r[0] for r in res), max(r[1] for r in res) - t0, h0
    out, ends = [0] * n, [0.0] * n
    go = threading.Barrier(n + 1) if barrier else NoBarrier()
    ts = [threading.Thread(target=one, args=(i, out, ends, go)) for i in range(n)]
    if not barrier:
        h0 = health()
        t0 = time.perf_counter()
    for t in ts: t.start()
    if barrier:
        time.sleep(0.05)  # every thread built its request and waits at the barrier
        h0 = health()
        go.wait()
        t0 = time.perf_counter()
    for t in ts: t.join()
    return sum(out), max(ends) - t0, h0
for n in streams: run(n)  # warm-up: every batch size's first steps (GEMM tuning, graphs)
res = {}
for n in streams:
    tok, sec, h0 = run(n)
    h1 = health()
    d = {k: h1[k] - h0[k] for k in ("decode_steps", "decode_rows", "decode_seconds",
                                    "prefills", "prefill_rows", "prefill_seconds",
                                    "idle_seconds", "callback_seconds", "host_seconds")}
    res[n] = {"tokens": tok, "seconds": sec, "tokens_per_s": tok / sec, "engine": d}
print(json.dumps(res))
PY
  local rc=$?
  kill -TERM $pid; wait $pid
  grep -E "^\[(serve|generate)\]" "$LOG/$name.log" | grep -vE "listening|signal|stopped" >&2
  return $rc
}
serve_run serve || exit 1
# NOGRAPH=1: the same with every op launched (--no-cuda-graphs), to see what graphs save.
[ "${NOGRAPH:-0}" = 1 ] && serve_run serve_nograph --no-cuda-graphs
REFJ='{}'
if [ "${REF:-1}" = 1 ]; then
  "$M" convert --load "$CK" --to-hf "$WORK/hf" --hf-dtype bfloat16 >"$LOG/convert.log" 2>&1 &&
  python3 - "$WORK/hf" "$STREAMS" >"$LOG/hf.json" 2>"$LOG/hf.err" <<'PY'
import json, sys, time, torch
from transformers import AutoModelForCausalLM
path, streams = sys.argv[1], [int(s) for s in sys.argv[2].split()]
m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda().eval()
res = {}
for n in streams:
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(100, 31000, (n, 128), generator=g).cuda()
    kw = dict(max_new_tokens=128, min_new_tokens=128, do_sample=False, cache_implementation="static")
    m.generate(ids, **kw)  # warm-up
    torch.cuda.synchronize(); t0 = time.perf_counter()
    out = m.generate(ids, **kw)
    torch.cuda.synchronize(); sec = time.perf_counter() - t0
    tok = (out.shape[1] - 128) * n
    res[n] = {"tokens": tok, "seconds": sec, "tokens_per_s": tok / sec}
print(json.dumps(res))
PY
  REFJ=$(cat "$LOG/hf.json" 2>/dev/null || echo '{}')
fi
NOG=$(cat "$LOG/serve_nograph.json" 2>/dev/null || echo '{}')
python3 - "$(cat "$LOG/serve.json")" "$REFJ" "$NOG" <<'PY'
import json, sys
s, r, g = json.loads(sys.argv[1]), json.loads(sys.argv[2] or "{}"), json.loads(sys.argv[3] or "{}")
print("| streams | megatron serve tokens/s | without CUDA graphs | transformers generate tokens/s | ratio |")
print("|---|---|---|---|---|")
for n, v in s.items():
    ours, ref, nog = v["tokens_per_s"], r.get(n, {}).get("tokens_per_s"), g.get(n, {}).get("tokens_per_s")
    print("| %s | %.0f | %s | %s | %s |" % (n, ours, "%.0f" % nog if nog else "-",
          "%.0f" % ref if ref else "-", "%.2f" % (ours / ref) if ref else "-"))
# Where each timed run's wall time went, from the server's /health counters (the engine's
# model operations, each including the copy of its result to the host).
print()
print("| streams | wall s | decode steps | rows/step | ms/step | decode s | prefills | prompts/prefill | ms/prefill | prefill s | idle s | callbacks s | engine host s | rest s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for n, v in s.items():
    e = v.get("engine")
    if not e: continue
    ds, ps = max(e["decode_steps"], 1), max(e["prefills"], 1)
    # rest: the wall time outside the engine's model operations, its idle wait, the
    # callbacks and its own host work -- the clients' spread of arrivals and replies.
    rest = (v["seconds"] - e["decode_seconds"] - e["prefill_seconds"] - e["idle_seconds"] -
            e["callback_seconds"] - e["host_seconds"])
    print("| %s | %.3f | %d | %.1f | %.3f | %.3f | %d | %.1f | %.2f | %.3f | %.4f | %.4f | %.4f | %.4f |" % (
        n, v["seconds"], e["decode_steps"], e["decode_rows"] / ds, 1e3 * e["decode_seconds"] / ds,
        e["decode_seconds"], e["prefills"], e["prefill_rows"] / ps, 1e3 * e["prefill_seconds"] / ps,
        e["prefill_seconds"], e["idle_seconds"], e["callback_seconds"], e["host_seconds"], rest))
PY
