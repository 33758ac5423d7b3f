#!/usr/bin/env bash
# override_ckpt_iteration.sh MEGATRON: --override-ckpt-iteration N (Megatron's rewind of the
# data loader). A checkpoint of iteration 10 (global batch 8) resumed with N = 4 continues at
# iteration 5 with 32 samples consumed: the log's iterations 5-10 show Megatron's
# consumed samples 40..80 and the message; the weights are the checkpoint's (its loss at
# iteration 5 is not the fresh model's). A different global batch than the checkpoint's warns; with
# --finetune, or without a checkpoint to load, it is an error.
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2
  --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --micro-batch-size 2 --lr 1e-3 --lr-decay-style constant --log-interval 1 --threads 1
  --hidden-dropout 0 --attention-dropout 0)
"$M" train "${COMMON[@]}" --global-batch-size 8 --train-iters 10 --save "$W/S" \
  > "$W/a.log" 2>&1 || { cat "$W/a.log"; exit 1; }
"$M" train "${COMMON[@]}" --global-batch-size 8 --train-iters 10 --load "$W/S" \
  --override-ckpt-iteration 4 > "$W/b.log" 2>&1 || { cat "$W/b.log"; exit 1; }
grep -q -- "--override-ckpt-iteration: start at iteration 4 (consumed_train_samples 32)" \
  "$W/b.log" || { echo "no override message"; grep -i override "$W/b.log"; exit 1; }
for it in 5 6 7 8 9 10; do
  grep -qE "iteration +$it/ +10 \| consumed samples: +$((it * 8)) \|" "$W/b.log" ||
    { echo "iteration $it: wrong consumed samples"; grep -E "iteration +$it/" "$W/b.log"; exit 1; }
done
[ "$(grep -cE "iteration +[0-9]+/ +10 \|" "$W/b.log")" -eq 6 ] || { echo "expected 6 iterations"; exit 1; }
# The checkpoint's weights, not fresh ones: iteration 5's loss differs from the first run's.
l5() { grep -E "iteration +5/" "$1" | grep -oE "lm loss: [0-9.E+-]+"; }
[ "$(l5 "$W/a.log")" != "$(l5 "$W/b.log")" ] || { echo "the loaded weights were not used"; exit 1; }
"$M" train "${COMMON[@]}" --global-batch-size 16 --train-iters 10 --load "$W/S" \
  --override-ckpt-iteration 4 --override-opt_param-scheduler > "$W/c.log" 2>&1 ||
  { cat "$W/c.log"; exit 1; }
grep -q "but this checkpoint was saved at global_batch_size 8" "$W/c.log" ||
  { echo "no global batch warning"; exit 1; }
grep -qE "iteration +5/ +10 \| consumed samples: +80 \|" "$W/c.log" ||
  { echo "global batch 16: wrong consumed samples"; grep -E "iteration +5/" "$W/c.log"; exit 1; }
for bad in "--finetune" ""; do
  if out=$("$M" train "${COMMON[@]}" --global-batch-size 8 --train-iters 10 \
      ${bad:+--load "$W/S" $bad} --override-ckpt-iteration 4 2>&1); then
    echo "accepted --override-ckpt-iteration with '${bad:-no --load}'"; exit 1
  fi
  grep -qE "with --finetune|needs a checkpoint to load" <<<"$out" ||
    { echo "unexpected error: $(grep -m1 ERROR <<<"$out")"; exit 1; }
done
echo "ok: --override-ckpt-iteration rewinds the data to iteration 4 of the loaded weights"
