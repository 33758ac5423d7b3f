#!/usr/bin/env bash
# Long sequences on one GPU (issue 20 item 5): the Llama-style 1B (16 layers, hidden 2048,
# 32 heads, 8 query groups, SwiGLU 8192, vocab 32000, untied) trained by `megatron train
# --device cuda --bf16` on mock data at sequence lengths SEQS (default 8K, 16K, 32K), one
# sequence per step, against the PyTorch reference at the same sequence in the same call:
# bench/gpu/torch_reference.py's model (bf16 autocast, fp32 parameters, fused AdamW, SDPA
# restricted to flash attention), torch.compile'd with dynamic shapes (one compilation
# serves every length), with activation checkpointing of every block only where it would
# not fit otherwise (an out-of-memory run is retried with it).
#   megatron.cpp: the recomputation `megatron plan --device-memory-gib` says is needed (none
#   when the plan fits); tokens/s from Megatron's "elapsed time per iteration" of the last
#   log interval; TFLOP/s from --log-throughput (Megatron's num_floating_point_operations:
#   attention counted, causal not discounted); peak = "max allocated" of the memory line.
#   PyTorch: the same FLOPs per step over its step time; peak = max_memory_allocated.
# MFU against the H200's 989 TFLOP/s (dense bf16 datasheet). Prints one markdown table and
# writes it to $OUT/long_seq.md (the logs beside it).
# Usage: bench/gpu/long_seq.sh BUILD_DIR   (env SEQS="8192 16384 32768", ITERS (6),
#        TORCH=0 to skip PyTorch, TORCH_STEPS (3), OUT for the logs, GIB (139) for the plan)
set -uo pipefail
BUILD=${1:-build-gpu}
M=$BUILD/megatron
HERE=$(cd "$(dirname "$0")" && pwd)
SEQS=${SEQS:-"8192 16384 32768"}
ITERS=${ITERS:-6}
LOG=${OUT:-/tmp}
mkdir -p "$LOG"
MODEL=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention
  --num-query-groups 8 --ffn-hidden-size 8192 --position-embedding-type rope
  --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
  --vocab-size 32000 --tokenizer-type NullTokenizer --mock-data --micro-batch-size 1
  --global-batch-size 1 --attention-dropout 0 --hidden-dropout 0 --lr 1e-4 --min-lr 1e-5
  --weight-decay 0.1 --clip-grad 1.0 --bf16 --device cuda)
TABLE=$LOG/long_seq.md
printf '| S | megatron.cpp recompute | tokens/s | TFLOP/s | MFU | peak (MB) | PyTorch compiled | tokens/s | MFU | peak (MB) | megatron.cpp / PyTorch | memory megatron.cpp / PyTorch |\n|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n' > "$TABLE"

for S in $SEQS; do
  SEQ=(--seq-length "$S" --max-position-embeddings "$S")
  # What the memory plan says: no recomputation when it fits, else selective, else full.
  RECOMP=()
  for r in none selective full; do
    R=()
    [[ $r == selective ]] && R=(--recompute-granularity selective)
    [[ $r == full ]] && R=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
    "$M" plan "${MODEL[@]}" "${SEQ[@]}" "${R[@]}" --train-iters "$ITERS" \
      --device-memory-gib "${GIB:-139}" > "$LOG/plan-$S-$r.log" 2>&1
    if grep -q "fits in" "$LOG/plan-$S-$r.log"; then RECOMP=("${R[@]}"); RNAME=$r; break; fi
    if grep -q "ERROR" "$LOG/plan-$S-$r.log"; then  # the plan itself failed: say so, train plain
      RECOMP=(); RNAME="none (plan failed, see plan-$S-$r.log)"; break
    fi
    RNAME=$r RECOMP=("${R[@]}")
  done
  "$M" train "${MODEL[@]}" "${SEQ[@]}" "${RECOMP[@]}" --train-iters "$ITERS" --log-interval 2 \
    --log-throughput --eval-iters 0 > "$LOG/train-$S.log" 2>&1 || tail -5 "$LOG/train-$S.log"
  ms=$(grep -oE "elapsed time per iteration \(ms\): [0-9.]+" "$LOG/train-$S.log" | tail -1 | awk '{print $NF}')
  tf=$(grep -oE "throughput per GPU \(TFLOP/s/GPU\): [0-9.]+" "$LOG/train-$S.log" | tail -1 | awk '{print $NF}')
  peak=$(grep -oE "max allocated: [0-9.]+" "$LOG/train-$S.log" | head -1 | awk '{print $NF}')
  echo "long_seq: S $S megatron.cpp ${ms:-?} ms/iteration, ${tf:-?} TFLOP/s, peak ${peak:-?} MB (recompute $RNAME)"
  TJSON=$LOG/torch-$S.json
  rm -f "$TJSON"
  if [[ ${TORCH:-1} != 0 ]]; then
    PYTHONUNBUFFERED=1 python3 - "$HERE" "$S" "${TORCH_STEPS:-3}" "$TJSON" <<'PY' > "$LOG/torch-$S.log" 2>&1
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
import torch_reference as tr

S, steps, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
L, h, nh, ng, ffn, _, V, _, llama = tr.MODELS["Llama-style 1B"]


class Ckpt(tr.GPT):  # every block recomputed in backward (activation checkpointing)
    def forward(self, idx, targets):
        x = self.wte(idx)
        rope = (self.cos[:, :, :idx.shape[1]], self.sin[:, :, :idx.shape[1]])
        for blk in self.blocks:
            x = checkpoint(blk, x, rope, use_reentrant=False)
        logits = self.head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def run(ckpt):
    torch.manual_seed(0)
    model = (Ckpt if ckpt else tr.GPT)(L, h, nh, ng, ffn, S, V, llama).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model, dynamic=True)
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
    ms = (time.perf_counter() - t0) / steps * 1e3
    return ms, torch.cuda.max_memory_allocated() / 2**20, warm


res = {"S": S}
for ckpt in (False, True):
    try:
        ms, peak, warm = run(ckpt)
        res.update(ms=ms, peak_mb=peak, ckpt=ckpt)
        print(f"torch S {S} ckpt {ckpt}: {ms:.1f} ms/step, peak {peak:.0f} MB (warm-up {warm:.0f} s)")
        break
    except torch.OutOfMemoryError as e:
        print(f"torch S {S} ckpt {ckpt}: out of memory ({str(e)[:120]}); retrying with checkpointing")
        torch.cuda.empty_cache()
json.dump(res, open(out, "w"))
PY
    tail -2 "$LOG/torch-$S.log"
  fi
  python3 - "$S" "${ms:-0}" "${tf:-0}" "${peak:-0}" "$RNAME" "$TJSON" >> "$TABLE" <<'PY'
import json, os, sys
S, ms, tf, peak, rname, tj = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
t = json.load(open(tj)) if os.path.exists(tj) else {}
tps = S / (ms / 1e3) if ms else 0
flops = tf * 1e12 * ms / 1e3  # the step's FLOPs by Megatron's formula
cell = lambda v, f: f.format(v) if v else "-"
tms, tpeak = t.get("ms", 0), t.get("peak_mb", 0)
ttps = S / (tms / 1e3) if tms else 0
tmfu = flops / (tms / 1e3) / 989e12 if tms and flops else 0
tname = ("yes, with activation checkpointing" if t.get("ckpt") else "yes") if tms else "not measured"
print(f"| {S} | {rname} | {cell(tps, '{:.0f}')} | {cell(tf, '{:.1f}')} | {cell(tf / 989 * 100, '{:.1f}%')} | "
      f"{cell(peak, '{:.0f}')} | {tname} | {cell(ttps, '{:.0f}')} | {cell(tmfu * 100, '{:.1f}%')} | "
      f"{cell(tpeak, '{:.0f}')} | {cell(tps / ttps if ttps else 0, '{:.2f}x')} | "
      f"{cell(peak / tpeak if tpeak else 0, '{:.2f}')} |")
PY
done
cat "$TABLE"
