#!/usr/bin/env bash
# plan_cp.sh MEGATRON: `megatron plan` with the model at CP 1 and CP 2 (same DP): the
# header names the CP layout and each rank's tokens, and the activations per micro-batch
# halve (every saved activation is linear in the rank's tokens; attention keeps no S x S).
set -euo pipefail
meg=$1
model=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 4096
       --max-position-embeddings 4096 --vocab-size 32000 --micro-batch-size 1 --bf16)
act() { awk '$1 == "0" && NF >= 8 { print $5; exit }' <<<"$1"; }
one=$("$meg" plan --pipeline-model-parallel-size 1 "${model[@]}" --world-size 1)
two=$("$meg" plan --pipeline-model-parallel-size 1 "${model[@]}" --world-size 2 \
      --context-parallel-size 2)
grep -q "CP rank 0 of 2 (2048 of the 4096 tokens)" <<<"$two" ||
  { echo "FAIL: no CP line in:"; echo "$two"; exit 1; }
a1=$(act "$one") a2=$(act "$two")
[ -n "$a1" ] && [ -n "$a2" ] || { echo "FAIL: no activation column"; echo "$one"; exit 1; }
awk -v a="$a1" -v b="$a2" 'BEGIN { r = b / a; printf "act/micro-batch: CP1 %s MiB, CP2 %s MiB (ratio %.4f)\n", a, b, r;
  if (r < 0.499 || r > 0.501) { print "FAIL: CP 2 should halve the activations"; exit 1 }
  print "ok: plan knows CP" }'
