#!/usr/bin/env bash
# dist_ckpt_strictness.sh MEGATRON: --dist-ckpt-strictness end to end. A Llama-style
# checkpoint (no biases) loaded by a model with --add-qkv-bias: by default an error naming
# add_qkv_bias with a HINT naming the flag; with log_unexpected a warning naming the two
# linear_qkv.bias keys, and training resumes (and finetunes from --pretrained-checkpoint);
# return_all is refused with a HINT. dist_ckpt_strictness.sh MEGATRON MPIRUN...: also at
# TP2 x DP2 with the distributed optimizer and at PP2 (each stage checks its own keys).
set -euo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --log-interval 1 --threads 1 --device cpu
   --position-embedding-type rope --normalization RMSNorm --swiglu --group-query-attention
   --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }

run "$W/save.log" "$M" train "${T[@]}" --train-iters 4 --save "$W/ck"

# The default: another model.
out=$("$M" train "${T[@]}" --add-qkv-bias --train-iters 8 --load "$W/ck" 2>&1) &&
  { echo "the default loaded a checkpoint without the model's biases"; exit 1; }
grep -q "add_qkv_bias: checkpoint false vs this run true" <<<"$out" &&
  grep -q "HINT.*--dist-ckpt-strictness log_all" <<<"$out" || { echo "unexpected: $out"; exit 1; }

# log_unexpected: the biases start from their initialisation, training resumes.
run "$W/log.log" "$M" train "${T[@]}" --add-qkv-bias --train-iters 8 --load "$W/ck" \
    --use-checkpoint-opt_param-scheduler --dist-ckpt-strictness log_unexpected
B=decoder.layers.0.self_attention.linear_qkv.bias
grep -q "no tensor for 2 parameter(s) of this model.*$B" "$W/log.log" ||
  { echo "no warning naming the biases"; tail -30 "$W/log.log"; exit 1; }
grep -q "successfully loaded checkpoint" "$W/log.log" &&
  grep -Eq "iteration +8/ +8" "$W/log.log" ||
  { echo "log_unexpected did not resume"; tail -20 "$W/log.log"; exit 1; }

# --pretrained-checkpoint (a finetune) takes the same rule.
run "$W/ft.log" "$M" train "${T[@]}" --add-qkv-bias --train-iters 2 \
    --pretrained-checkpoint "$W/ck" --dist-ckpt-strictness log_all
grep -q "for finetuning" "$W/ft.log" && grep -q "linear_qkv.bias" "$W/ft.log" &&
  grep -Eq "iteration +2/ +2" "$W/ft.log" ||
  { echo "finetune failed"; tail -20 "$W/ft.log"; exit 1; }

out=$("$M" train "${T[@]}" --train-iters 2 --dist-ckpt-strictness return_all 2>&1) &&
  { echo "return_all accepted"; exit 1; }
grep -q "HINT.*log_unexpected" <<<"$out" || { echo "unexpected: $out"; exit 1; }
if [ ${#MPI[@]} -gt 0 ]; then
  for par in "-np 4 --tensor-model-parallel-size 2 --use-distributed-optimizer" \
             "-np 2 --pipeline-model-parallel-size 2"; do
    read -ra P <<<"$par"
    run "$W/par.log" "${MPI[@]}" "${P[@]:0:2}" "$M" train "${T[@]}" "${P[@]:2}" --add-qkv-bias \
        --train-iters 8 --load "$W/ck" --use-checkpoint-opt_param-scheduler \
        --dist-ckpt-strictness log_unexpected
    grep -q "linear_qkv.bias" "$W/par.log" && grep -Eq "iteration +8/ +8" "$W/par.log" ||
      { echo "$par: did not resume around the biases"; tail -20 "$W/par.log"; exit 1; }
  done
fi
echo "dist-ckpt-strictness: ok"
