#!/usr/bin/env bash
# window_attention.sh MEGATRON: sliding-window attention (--window-size, --window-attn-skip-freq)
# end to end on the CPU.
#   * a Llama-style model trains with --window-size 63,0 --window-attn-skip-freq 2 over
#     128-token sequences (layer 1 windowed, layer 2 full) and its losses differ from the same
#     run without the window;
#   * the checkpoint records the window: resuming with it continues, without it is an error
#     naming the window, --use-checkpoint-args takes it;
#   * generate runs past the window (prompt + new tokens = 104 > 64), its greedy tokens
#     continuing a shorter run's;
#   * Hugging Face: a model windowed in every layer exports as MistralForCausalLM with
#     sliding_window 64 and imports back with its window; one windowed in some layers only
#     is refused (Mistral slides in every layer);
#   * Megatron's legacy format (--ckpt-format torch) keeps the window (args.window_size,
#     args.window_attn_skip_freq);
#   * start-up errors: L < -1, a frequency list of the wrong length.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 2
   --global-batch-size 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5
   --log-interval 1 --threads 1 --device cpu --position-embedding-type rope
   --normalization RMSNorm --swiglu --group-query-attention --num-query-groups 2
   --untie-embeddings-and-output-weights --disable-bias-linear)
SWA=(--window-size 63,0 --window-attn-skip-freq 2)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }
losses() { grep -oE "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }
refused() {  # refused LOG NEEDLE CMD...: CMD must fail, its output naming NEEDLE
  local log=$1 needle=$2; shift 2
  if "$@" >"$log" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$needle" "$log" || { echo "expected '$needle' in:"; tail -20 "$log"; exit 1; }
}

run "$W/swa.log" "$M" train "${T[@]}" "${SWA[@]}" --train-iters 10 --save "$W/ck" \
    --save-interval 10
grep -Eq "^  window_size \.+ 63,0$" "$W/swa.log" || { echo "window_size not printed"; exit 1; }
run "$W/plain.log" "$M" train "${T[@]}" --train-iters 10
[ "$(losses "$W/swa.log" | wc -l)" -eq 10 ] || { echo "expected 10 losses"; exit 1; }
[ "$(losses "$W/swa.log" | head -1)" = "$(losses "$W/plain.log" | head -1)" ] ||
  echo "note: the first losses differ already"
[ "$(losses "$W/swa.log" | tail -1)" != "$(losses "$W/plain.log" | tail -1)" ] ||
  { echo "the window did not change training"; exit 1; }
echo "losses at 10: window $(losses "$W/swa.log" | tail -1)," \
  "plain $(losses "$W/plain.log" | tail -1)"
grep -q '"window": {"left": 63, "pattern": \[1, 0\]}' "$W/ck/iter_0000010/metadata.json" ||
  grep -Eq '"window": *\{' "$W/ck/iter_0000010/metadata.json" ||
  { echo "the checkpoint does not record the window"; exit 1; }

# Resume with the window; without it the checkpoint is another model; --use-checkpoint-args.
R=(--train-iters 12 --load "$W/ck" --use-checkpoint-opt_param-scheduler)
run "$W/resume.log" "$M" train "${T[@]}" "${SWA[@]}" "${R[@]}"
grep -q "successfully loaded checkpoint" "$W/resume.log" &&
  grep -Eq "iteration +12/ +12" "$W/resume.log" || { echo "did not resume"; exit 1; }
refused "$W/nowin.log" "window (--window-size, --window-attn-skip-freq)" \
  "$M" train "${T[@]}" "${R[@]}"
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
grep -Eq "^  window_size \.+ \(63, 0\)$" "$W/uca.log" &&
  grep -Eq "^  window_attn_skip_freq \.+ \[1, 0\]$" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take the window"; grep window "$W/uca.log"; exit 1; }

# Generation past the window (the KV-cache attention applies it, as training does): 4 + 100
# positions against the window's 64; the longer run continues the shorter one's tokens.
gen() {  # gen N: the greedy continuation of "1 2 3 4", N tokens, on stdout
  "$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate "$1" --ignore-eod \
      --threads 1 2>"$W/gen_$1.err" | grep -v '^> ' ||
    { echo "generate $1 failed"; tail -20 "$W/gen_$1.err"; exit 1; }
}
short=$(gen 8) long=$(gen 100)
echo "generate: $short"
[ "$(wc -w <<<"$long")" -eq 104 ] || { echo "expected 104 tokens: $long"; exit 1; }
[[ "$long " == "$short "* ]] || { echo "the long run does not continue the short one"; exit 1; }

# Hugging Face: every layer windowed -> Mistral with sliding_window 64, and back.
run "$W/all.log" "$M" train "${T[@]}" --window-size "(63,0)" --train-iters 6 --save "$W/ck_all"
run "$W/to_hf.log" "$M" convert --load "$W/ck_all" --to-hf "$W/hf"
grep -q '"model_type": "mistral"' "$W/hf/config.json" &&
  grep -q '"sliding_window": 64' "$W/hf/config.json" ||
  { echo "config.json lacks the window"; cat "$W/hf/config.json"; exit 1; }
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/back"
grep -Eq '"left": *63' "$W/back/iter_0000000/metadata.json" ||
  { echo "--from-hf lost the window"; exit 1; }
refused "$W/to_hf_bad.log" "slides in every layer" \
  "$M" convert --load "$W/ck" --to-hf "$W/hf_bad"
[ ! -e "$W/hf_bad/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }

# Megatron's legacy format (--ckpt-format torch) keeps the window in its args, and
# `convert --from-megatron` reads it back.
run "$W/torch.log" "$M" train "${T[@]}" "${SWA[@]}" --train-iters 6 --ckpt-format torch \
    --save "$W/U" --save-interval 6
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
grep -q '"window": {"left": 63, "pattern": \[1, 0\]}' "$W/C/iter_0000006/metadata.json" ||
  grep -Eq '"left": *63' "$W/C/iter_0000006/metadata.json" ||
  { echo "--from-megatron lost the window"; exit 1; }

# Start-up errors.
refused "$W/bad1.log" "--window-size" "$M" train "${T[@]}" --window-size "(-2,0)" --train-iters 1
refused "$W/bad2.log" "--window-attn-skip-freq" \
  "$M" train "${T[@]}" --window-size 8,0 --window-attn-skip-freq "[1,0,1]" --train-iters 1
echo "all checks passed"
