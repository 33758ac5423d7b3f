#!/usr/bin/env bash
# ep_plan.sh MEGATRON: `megatron plan` knows expert parallelism. The same MoE model
# (2 layers, hidden 64, 4 SwiGLU experts of width 32) planned on 2 ranks at EP 1 and EP 2:
# the EP 2 line names EP rank 0's experts, and its parameters are exactly EP 1's minus two
# experts per layer (2 x 2 x (2*32*64 + 64*32) = 24576 elements). And at TP 2 + SP, ETP 1
# plans the experts whole: half of the 4 experts' elements per layer more than ETP 2 (24576).
set -u
M=$1
common=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32
        --max-position-embeddings 32 --micro-batch-size 1 --global-batch-size 2
        --vocab-size 128 --tokenizer-type NullTokenizer --disable-bias-linear --swiglu
        --num-experts 4 --moe-ffn-hidden-size 32 --world-size 2)
params() {  # rank 0's parameters in the memory table
  awk '/^memory per pipeline rank/ { m = 1; next } m && $1 == "0" { print $2; exit }' <<<"$1"; }
one=$("$M" plan "${common[@]}" 2>&1) || { echo "FAIL: plan at EP 1"; echo "$one"; exit 1; }
two=$("$M" plan "${common[@]}" --expert-model-parallel-size 2 2>&1) ||
  { echo "FAIL: plan at EP 2"; echo "$two"; exit 1; }
grep -q "EP rank 0 of 2 (2 of the 4 experts per MoE layer)" <<<"$two" ||
  { echo "FAIL: no EP line"; echo "$two"; exit 1; }
p1=$(params "$one") p2=$(params "$two")
[ -n "$p1" ] && [ -n "$p2" ] && [ $((p1 - p2)) -eq 24576 ] ||
  { echo "FAIL: parameters at EP 1 '$p1', at EP 2 '$p2' (expected 24576 fewer)"; exit 1; }
echo "ok: EP 2 plans $p2 parameters on rank 0, EP 1 $p1"
tp=(--tensor-model-parallel-size 2 --sequence-parallel)
e2=$("$M" plan "${common[@]}" "${tp[@]}" 2>&1) || { echo "FAIL: plan at TP 2"; echo "$e2"; exit 1; }
e1=$("$M" plan "${common[@]}" "${tp[@]}" --expert-tensor-parallel-size 1 2>&1) ||
  { echo "FAIL: plan at TP 2, ETP 1"; echo "$e1"; exit 1; }
q2=$(params "$e2") q1=$(params "$e1")
[ -n "$q1" ] && [ -n "$q2" ] && [ $((q1 - q2)) -eq 24576 ] ||
  { echo "FAIL: parameters at ETP 1 '$q1', at ETP 2 '$q2' (expected 24576 more)"; exit 1; }
echo "ok: TP 2 plans $q1 parameters on rank 0 at ETP 1, $q2 at ETP 2"
