#!/usr/bin/env bash
# sp_memory_plan.sh MEGATRON: issue 23 A.8. `megatron plan` for Megatron's GPT-3 175B example
# (96 layers, h 12288, s 2048, mbs 1, gbs 1536) at TP8 x PP16 x DP12 with --sequence-parallel
# and selective recomputation prints Megatron's own estimate beside ours, and ours is at or
# below it: one layer's saved activations <= 34*s*b*h/t bytes (Korthikanti et al., Table 2;
# theoretical_memory_usage.py). Before the column-parallel GEMMs stopped keeping their
# gathered inputs under SP, ours was ~1.6x it. The estimate is checked against the formula
# computed here, not against the binary's own arithmetic.
set -euo pipefail
M=$1
out=$("$M" plan --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \
  --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 1536 \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --world-size 1536 \
  --sequence-parallel --recompute-granularity selective --fp16 --vocab-size 50257 2>&1) ||
  { echo "$out"; exit 1; }
line=$(grep "activations per transformer layer and micro-batch" <<<"$out") ||
  { echo "no per-layer line:"; echo "$out"; exit 1; }
echo "$line"
python3 - "$line" <<'PY'
import re, sys
m = re.search(r": ([0-9.]+) MiB \(megatron.cpp, saved\); Megatron's theoretical estimate .*= ([0-9.]+) MiB",
              sys.argv[1])
assert m, sys.argv[1]
ours, theirs = float(m[1]), float(m[2])
want = 34 * 2048 * 1 * 12288 / 8 / 2**20          # bytes -> MiB, 16-bit activations
assert abs(theirs - want) < 0.01, f"Megatron's estimate printed {theirs}, formula {want:.2f}"
assert ours <= want, f"ours {ours} MiB per layer is above Megatron's {want:.2f}"
print(f"per layer: ours {ours} MiB <= Megatron's 34sbh/t = {want:.2f} MiB")
PY
