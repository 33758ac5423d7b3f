#!/usr/bin/env bash
# qk_layernorm_tp.sh MEGATRON MPIRUN...: --qk-layernorm at --tensor-model-parallel-size 2 (with
# and without --sequence-parallel), in both forms --normalization gives it (RMSNorm, Qwen3's;
# LayerNorm with a bias per norm), is a launch line `megatron plan` and `megatron train` both
# accept, and the run trains (tests/parallel_equiv's qwen3 and gptqk families check them
# against TP 1). The LayerNorm form's checkpoint holds the q/k norm biases, and
# `convert --to-hf` refuses it naming --qk-layernorm and LayerNorm.
set -uo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
B=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 1e-3 --train-iters 3 --log-interval 1 --threads 1
   --group-query-attention --num-query-groups 2 --qk-layernorm --tensor-model-parallel-size 2)
RMS=(--position-embedding-type rope --normalization RMSNorm --swiglu
     --untie-embeddings-and-output-weights --disable-bias-linear)
LN=(--normalization LayerNorm)
for form in RMSNorm LayerNorm; do
  if [[ $form == RMSNorm ]]; then F=("${RMS[@]}"); else F=("${LN[@]}"); fi
  for extra in "" --sequence-parallel; do
    what="--qk-layernorm ($form) at TP 2 $extra"
    out=$("$M" plan "${B[@]}" "${F[@]}" $extra --world-size 2 2>&1) ||
      { echo "FAIL: plan refused $what"; echo "$out" | tail -5; exit 1; }
    ck="$W/ck_${form}${extra:+_sp}"
    out=$("${MPI[@]}" -np 2 "$M" train "${B[@]}" "${F[@]}" $extra --save "$ck" \
          --save-interval 3 2>&1) ||
      { echo "FAIL: train refused $what"; echo "$out" | tail -5; exit 1; }
    grep -Eq "^  qk_layernorm \.+ True$" <<<"$out" ||
      { echo "FAIL: qk_layernorm not True"; exit 1; }
    grep -Eq "^  normalization \.+ $form$" <<<"$out" ||
      { echo "FAIL: normalization not $form"; exit 1; }
    grep -Eq "iteration +3/ +3" <<<"$out" || { echo "FAIL: no iteration 3/3"; echo "$out"; exit 1; }
    bias=$(grep -c 'self_attention\.[qk]_layernorm\.bias' "$ck/iter_0000003/metadata.json")
    if [[ $form == LayerNorm ]]; then
      [[ $bias -gt 0 ]] || { echo "FAIL: no q/k norm biases in the $form checkpoint"; exit 1; }
    else
      [[ $bias -eq 0 ]] || { echo "FAIL: q/k norm biases in the $form checkpoint"; exit 1; }
    fi
    echo "ok: $what"
  done
done
out=$("$M" convert --load "$W/ck_LayerNorm_sp" --to-hf "$W/hf" 2>&1) &&
  { echo "FAIL: --to-hf accepted the LayerNorm q/k norms"; exit 1; }
grep -qF -- "--qk-layernorm with --normalization LayerNorm" <<<"$out" ||
  { echo "FAIL: unexpected --to-hf error: $out"; exit 1; }
[[ ! -e "$W/hf" ]] || { echo "FAIL: --to-hf wrote $W/hf"; exit 1; }
echo "ok: --to-hf refuses the LayerNorm q/k norms"
