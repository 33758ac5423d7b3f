#!/usr/bin/env bash
# qk_layernorm_tp.sh MEGATRON MPIRUN...: --qk-layernorm at --tensor-model-parallel-size 2 (with
# and without --sequence-parallel) is a launch line `megatron plan` and `megatron train` both
# accept, and the run trains (tests/parallel_equiv's qwen3 family checks it against TP 1).
set -uo pipefail
M=$1; shift
MPI=("$@")
B=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 1e-3 --train-iters 3 --log-interval 1 --threads 1
   --position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
   --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear
   --qk-layernorm --tensor-model-parallel-size 2)
for extra in "" --sequence-parallel; do
  out=$("$M" plan "${B[@]}" $extra --world-size 2 2>&1) ||
    { echo "FAIL: plan refused --qk-layernorm at TP 2 $extra"; echo "$out" | tail -5; exit 1; }
  out=$("${MPI[@]}" -np 2 "$M" train "${B[@]}" $extra 2>&1) ||
    { echo "FAIL: train refused --qk-layernorm at TP 2 $extra"; echo "$out" | tail -5; exit 1; }
  grep -Eq "^  qk_layernorm \.+ True$" <<<"$out" || { echo "FAIL: qk_layernorm not True"; exit 1; }
  grep -Eq "iteration +3/ +3" <<<"$out" || { echo "FAIL: no iteration 3/3"; echo "$out"; exit 1; }
  echo "ok: --qk-layernorm at TP 2 $extra"
done
