#!/usr/bin/env bash
# vocab_repad.sh MEGATRON GPT2_DIR MPIRUN...: issue 23 A.3. A checkpoint saved at TP2 with the
# GPT-2 vocabulary (padded to 50432) resumes at TP1 (50304) without extra flags, and that one
# back at TP2; each load says it re-padded, and training continues from the saved iteration.
set -euo pipefail
M=$1; G=$2; shift 2
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
F=(--mock-data --tokenizer-type GPT2BPETokenizer --vocab-file "$G/encoder.json"
   --merge-file "$G/vocab.bpe" --num-layers 2 --hidden-size 32 --num-attention-heads 4
   --seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4
   --lr 1e-3 --log-interval 1 --threads 1)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -20 "$log"; exit 1; }; }
run "$W/tp2.log" "$@" -np 2 "$M" train "${F[@]}" --tensor-model-parallel-size 2 --train-iters 6 \
    --exit-interval 2 --save "$W/ck2"
grep -q "new size: 50432" "$W/tp2.log" || { echo "TP2 did not pad to 50432"; exit 1; }
run "$W/tp1.log" "$M" train "${F[@]}" --train-iters 6 --exit-interval 4 --load "$W/ck2" \
    --save "$W/ck1"
grep -q "new size: 50304" "$W/tp1.log" || { echo "TP1 did not pad to 50304"; exit 1; }
grep -q "re-padding the vocabulary from 50432 rows (TP 2) to 50304 (TP 1)" "$W/tp1.log" ||
  { echo "no re-padding line:"; cat "$W/tp1.log"; exit 1; }
grep -Eq "iteration +3/ +6" "$W/tp1.log" || { echo "did not resume at iteration 3"; exit 1; }
run "$W/back.log" "$@" -np 2 "$M" train "${F[@]}" --tensor-model-parallel-size 2 --train-iters 6 \
    --load "$W/ck1"
grep -q "re-padding the vocabulary from 50304 rows (TP 1) to 50432 (TP 2)" "$W/back.log" ||
  { echo "no re-padding line back:"; cat "$W/back.log"; exit 1; }
grep -Eq "iteration +5/ +6" "$W/back.log" || { echo "did not resume at iteration 5"; exit 1; }
echo "TP2 (50432) -> TP1 (50304) -> TP2: loaded and resumed"
