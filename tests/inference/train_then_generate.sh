#!/usr/bin/env bash
# train_then_generate.sh MEGATRON DIR [MPIEXEC]: trains a tiny model on Megatron's mock
# data (1, 2, 3, ... % vocab) with --save, then `megatron generate` must continue the
# count; with MPIEXEC, also three prompts of different lengths in one batch under
# `mpirun -np 2 ... --tensor-model-parallel-size 2` (the checkpoint was trained at TP 1).
set -eu
M=$1; D=$2; MPI=${3:-}
rm -rf "$D"
"$M" train --mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 \
  --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
  --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
  --lr-warmup-iters 20 --log-interval 100 --threads 1 --train-iters 300 --save "$D" >/dev/null
out=$("$M" generate --load "$D" --prompt "11 12 13 14 15" --greedy --num-tokens-to-generate 10 \
      --threads 1 | grep -v '^> ')
echo "$out"
[ "$out" = "11 12 13 14 15 16 17 18 19 20 21 22 23 24 25" ] || { echo "FAIL: no count"; exit 1; }
if [ -n "$MPI" ]; then
  A=(generate --load "$D" --prompt "11 12 13 14 15" --prompt "100 101" --prompt "7 8 9 10 11 12"
     --greedy --num-tokens-to-generate 6 --threads 1)
  one=$("$M" "${A[@]}" | grep -v '^> ')
  tp=$($MPI -np 2 "$M" "${A[@]}" --micro-batch-size 3 --tensor-model-parallel-size 2 \
       | grep -v '^> ')
  echo "$tp"
  [ "$one" = "$tp" ] || { echo "FAIL: TP 2 batch differs from the serial run: $one"; exit 1; }
  [ "$(head -1 <<<"$tp")" = "11 12 13 14 15 16 17 18 19 20 21" ] || { echo "FAIL: no count"; exit 1; }
fi
echo ok
