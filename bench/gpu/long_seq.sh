#!/usr/bin/env bash
# Long sequences on one GPU (issue 20 item 5): the Llama-style 1B (16 layers, hidden 2048,
# 32 heads, 8 query groups, SwiGLU 8192, vocab 32000, untied) trained by `megatron train
# --device cuda --bf16` on mock data at sequence lengths SEQS (default 8K, 16K, 32K), one
# sequence per step, against the PyTorch reference at the same sequences in the same call:
# bench/gpu/torch_reference.py's model (bf16 autocast, fp32 parameters, fused AdamW, SDPA
# restricted to flash attention), torch.compile'd once with dynamic shapes for every
# length, with activation checkpointing of every block only where it would not fit
# otherwise (an out-of-memory length is retried with it).
#   megatron.cpp: the recomputation `megatron plan --device-memory-gib` says is needed (none
#   when the plan fits); tokens/s from Megatron's "elapsed time per iteration" of the last
#   log interval; TFLOP/s from --log-throughput (Megatron's num_floating_point_operations:
#   attention counted, causal not discounted); peak = "max allocated" of the memory line.
#   PyTorch: the same FLOPs per step over its step time; peak = max_memory_allocated.
# MFU against the H200's 989 TFLOP/s (dense bf16 datasheet). Writes one markdown table to
# $OUT/long_seq.md (also when cut short: the lengths measured so far), logs beside it.
# Attention runs as `megatron train` picks it (cuDNN's fused attention here) with its
# deterministic backward, whose workspace holds dP of the heads of one call: NH * S^2 * 2
# bytes for a whole sequence (64 GiB at 32K with 32 heads), so above the cap
# (MCPP_ATTENTION_BWD_WORKSPACE_MB, default 8192) a sequence runs in chunks of whole
# key/value groups (one group of 4 heads at 32K: 8 GiB); the memory plan counts the same
# and its total is the table's "plan" column. DETERMINISTIC=0 runs with
# MCPP_ATTENTION_DETERMINISTIC=0 instead (cuDNN's atomic dQ accumulation, no such workspace;
# PyTorch's flash backward accumulates dQ atomically too).
# Usage: bench/gpu/long_seq.sh BUILD_DIR   (env SEQS="8192 16384 32768", ITERS (4: timed
#        over the last 2), TORCH=0 to skip PyTorch, TORCH_STEPS (2), OUT, GIB (139),
#        DETERMINISTIC=0, MEGATRON=0 to run only PyTorch, BUDGET=torch: PyTorch first, and
#        its peak at each length is megatron.cpp's memory budget there)
set -uo pipefail
BUILD=${1:-build-gpu}
M=$BUILD/megatron
HERE=$(cd "$(dirname "$0")" && pwd)
SEQS=${SEQS:-"8192 16384 32768"}
ITERS=${ITERS:-4}
LOG=${OUT:-/tmp}
mkdir -p "$LOG"
MODEL=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention
  --num-query-groups 8 --ffn-hidden-size 8192 --position-embedding-type rope
  --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
  --vocab-size 32000 --tokenizer-type NullTokenizer --mock-data --micro-batch-size 1
  --global-batch-size 1 --attention-dropout 0 --hidden-dropout 0 --lr 1e-4 --min-lr 1e-5
  --weight-decay 0.1 --clip-grad 1.0 --bf16 --device cuda)

# The table from what exists (megatron-S.json, torch.json): run on exit, also when cut.
table() {
  python3 - "$LOG" $SEQS > "$LOG/long_seq.md" <<'PY'
import json, os, sys
log, seqs = sys.argv[1], [int(s) for s in sys.argv[2:]]
load = lambda p: json.load(open(p)) if os.path.exists(p) else {}
torch = load(os.path.join(log, "torch.json"))
print("| S | megatron.cpp recompute | tokens/s | TFLOP/s | MFU | peak (MB) | plan (MiB) | "
      "PyTorch compiled | tokens/s | MFU | peak (MB) | megatron.cpp / PyTorch | "
      "peak megatron.cpp / PyTorch |")
print("|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
cell = lambda v, f: f.format(v) if v else "-"
for S in seqs:
    m, t = load(os.path.join(log, f"megatron-{S}.json")), torch.get(str(S), {})
    if not m and not t:
        continue
    ms, tf, peak = m.get("ms", 0), m.get("tflops", 0), m.get("peak_mb", 0)
    tps = S / (ms / 1e3) if ms else 0
    flops = tf * 1e12 * ms / 1e3  # the step's FLOPs by Megatron's formula
    tms, tpeak = t.get("ms", 0), t.get("peak_mb", 0)
    ttps = S / (tms / 1e3) if tms else 0
    tmfu = flops / (tms / 1e3) / 989e12 if tms and flops else 0
    tname = ("activation checkpointing" if t.get("ckpt") else "no checkpointing") if tms else \
        t.get("error", "not measured")
    print(f"| {S} | {m.get('recompute', '-')} | {cell(tps, '{:.0f}')} | {cell(tf, '{:.1f}')} | "
          f"{cell(tf / 989 * 100, '{:.1f}%')} | {cell(peak, '{:.0f}')} | "
          f"{cell(m.get('plan_mib', 0), '{:.0f}')} | {tname} | "
          f"{cell(ttps, '{:.0f}')} | {cell(tmfu * 100, '{:.1f}%')} | {cell(tpeak, '{:.0f}')} | "
          f"{cell(tps / ttps if ttps and tps else 0, '{:.2f}x')} | "
          f"{cell(peak / tpeak if tpeak and peak else 0, '{:.2f}')} |")
PY
}
trap table EXIT
[[ ${DETERMINISTIC:-1} == 0 ]] && export MCPP_ATTENTION_DETERMINISTIC=0  # plan and train

# The memory budget of length S (GiB): GIB, or with BUDGET=torch PyTorch's measured peak at
# S (torch.json; the run is then "no more memory than PyTorch" by construction, the plan
# choosing the cheapest recomputation that fits it).
budget() {
  if [[ ${BUDGET:-} == torch && -f $LOG/torch.json ]]; then
    python3 -c "import json,sys; t=json.load(open('$LOG/torch.json')).get('$1',{}); \
print(t['peak_mb']/1024 if 'peak_mb' in t else ${GIB:-139})"
  else
    echo "${GIB:-139}"
  fi
}

run_megatron() {
for S in $SEQS; do
  SEQ=(--seq-length "$S" --max-position-embeddings "$S")
  GIB_S=$(budget "$S")
  # What the memory plan says: the cheapest recomputation that fits the budget -- none, the
  # norms' outputs (selective, layernorm), with the attention core's too, every layer.
  for r in none layernorm selective full; do
    R=()
    [[ $r == layernorm ]] && R=(--recompute-granularity selective --recompute-modules layernorm)
    [[ $r == selective ]] && R=(--recompute-granularity selective --recompute-modules core_attn layernorm)
    [[ $r == full ]] && R=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
    RECOMP=("${R[@]}") RNAME=$r
    "$M" plan "${MODEL[@]}" "${SEQ[@]}" "${R[@]}" --train-iters "$ITERS" \
      --device-memory-gib "$GIB_S" > "$LOG/plan-$S.log" 2>&1
    grep -q "fits in" "$LOG/plan-$S.log" && break
    if grep -q "ERROR" "$LOG/plan-$S.log"; then  # the plan itself failed: say so, train plain
      RECOMP=() RNAME="none (plan failed)"; break
    fi
  done
  "$M" train "${MODEL[@]}" "${SEQ[@]}" "${RECOMP[@]}" --train-iters "$ITERS" --log-interval 2 \
    --log-throughput --eval-iters 0 > "$LOG/train-$S.log" 2>&1 || tail -5 "$LOG/train-$S.log"
  ms=$(grep -oE "elapsed time per iteration \(ms\): [0-9.]+" "$LOG/train-$S.log" | tail -1 | awk '{print $NF}')
  tf=$(grep -oE "throughput per GPU \(TFLOP/s/GPU\): [0-9.]+" "$LOG/train-$S.log" | tail -1 | awk '{print $NF}')
  peak=$(grep -oE "max allocated: [0-9.]+" "$LOG/train-$S.log" | head -1 | awk '{print $NF}')
  # The plan's total for rank 0 (MiB; the last column of its table), to set beside the peak.
  plan=$(awk '$1 == "0" && NF >= 8 { print $NF; exit }' "$LOG/plan-$S.log")
  echo "{\"ms\": ${ms:-0}, \"tflops\": ${tf:-0}, \"peak_mb\": ${peak:-0}, \"plan_mib\": ${plan:-0}, \"recompute\": \"$RNAME\"}" \
    > "$LOG/megatron-$S.json"
  echo "long_seq: S $S megatron.cpp ${ms:-?} ms/iteration, ${tf:-?} TFLOP/s, peak ${peak:-?} MB, plan ${plan:-?} MiB (recompute $RNAME)"
done

}

run_torch() {
PYTHONUNBUFFERED=1 python3 - "$HERE" "${TORCH_STEPS:-2}" "$LOG/torch.json" $SEQS <<'PY' 2>&1 | tee "$LOG/torch.log"
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
import torch_reference as tr

steps, out, seqs = int(sys.argv[2]), sys.argv[3], [int(s) for s in sys.argv[4:]]
L, h, nh, ng, ffn, _, V, _, llama = tr.MODELS["Llama-style 1B"]
torch.backends.cuda.matmul.allow_tf32 = True
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")


class Ckpt(tr.GPT):  # torch_reference's model, every block recomputed in backward
    def forward(self, idx, targets):
        x = self.wte(idx)
        rope = (self.cos[:, :, :idx.shape[1]], self.sin[:, :, :idx.shape[1]])
        for blk in self.blocks:
            x = checkpoint(blk, x, rope, use_reentrant=False)
        logits = self.head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


built = {}  # one compiled model (and optimizer) serves every length


def get(ckpt):
    if ckpt not in built:
        built.clear()
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        model = (Ckpt if ckpt else tr.GPT)(L, h, nh, ng, ffn, max(seqs), V, llama).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
        built[ckpt] = (model, opt, torch.compile(model, dynamic=True))
    return built[ckpt]


def run(S, ckpt):
    model, opt, fwd = get(ckpt)
    tok = torch.randint(0, V - 64, (1, S + 1), device="cuda")
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    t0 = time.perf_counter()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3, torch.cuda.max_memory_allocated() / 2**20, warm


res = {}
ckpt_from = False  # once a length needs checkpointing, the longer ones do too
for S in seqs:
    for ckpt in ((False, True) if not ckpt_from else (True,)):
        try:
            ms, peak, warm = run(S, ckpt)
            res[str(S)] = {"ms": ms, "peak_mb": peak, "ckpt": ckpt}
            print(f"torch S {S} checkpointing {ckpt}: {ms:.1f} ms/step, {S / ms * 1e3:.0f} tok/s, "
                  f"peak {peak:.0f} MB (first two steps {warm:.0f} s)")
            break
        except torch.OutOfMemoryError as e:
            print(f"torch S {S} checkpointing {ckpt}: out of memory ({str(e)[:100]})")
            res[str(S)] = {"error": "out of memory"}
            ckpt_from = True
            built.clear()
            torch.cuda.empty_cache()
    json.dump(res, open(out, "w"), indent=1)
PY
}

if [[ ${BUDGET:-} == torch ]]; then  # PyTorch first: its peaks are the budgets
  [[ ${TORCH:-1} != 0 ]] && run_torch
  [[ ${MEGATRON:-1} != 0 ]] && run_megatron
else
  [[ ${MEGATRON:-1} != 0 ]] && run_megatron
  [[ ${TORCH:-1} != 0 ]] && run_torch
fi
exit 0
