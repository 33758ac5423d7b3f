#!/usr/bin/env bash
# script_switches.sh MEGATRON: switches of Megatron-LM's own test and example scripts.
#   * --apply-wd-to-qk-layernorm decays the q/k norm weights: with --weight-decay 0.5 the
#     training curve differs from the run without it, and the deprecated spelling
#     --no-weight-decay-cond-type apply_wd_to_qk_layernorm gives the same curve as the flag;
#   * --no-position-embedding with RoPE changes nothing (no learned table there) and is
#     refused with learned positions;
#   * the switches accepted by design change nothing either, and each is named at start-up
#     with its reason; --rerun-mode report_stats is refused.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 1e-2 --min-lr 1e-3 --train-iters 6 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0 --weight-decay 0.5)
R=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line

# ---- weight decay on the q/k layernorm weights ----
run "$W/qk.log" "$M" train "${T[@]}" "${R[@]}" --qk-layernorm
run "$W/qkwd.log" "$M" train "${T[@]}" "${R[@]}" --qk-layernorm --apply-wd-to-qk-layernorm
run "$W/qkold.log" "$M" train "${T[@]}" "${R[@]}" --qk-layernorm \
  --no-weight-decay-cond-type apply_wd_to_qk_layernorm
args_line "$W/qkwd.log" apply_wd_to_qk_layernorm True
[ "$(lines "$W/qkwd.log" | wc -l)" -eq 6 ] || { echo "expected 6 iteration lines"; exit 1; }
if diff -q <(lines "$W/qk.log") <(lines "$W/qkwd.log") > /dev/null; then
  echo "--apply-wd-to-qk-layernorm did not change training"; exit 1
fi
diff <(lines "$W/qkwd.log") <(lines "$W/qkold.log") ||
  { echo "the deprecated spelling trained differently"; exit 1; }
grep -q "no-weight-decay-cond-type is deprecated" "$W/qkold.log" ||
  { echo "no deprecation warning"; exit 1; }

# ---- --no-position-embedding: nothing to drop under RoPE; refused with learned positions ----
run "$W/rope.log" "$M" train "${T[@]}" "${R[@]}"
run "$W/nope.log" "$M" train "${T[@]}" "${R[@]}" --no-position-embedding
diff <(lines "$W/rope.log") <(lines "$W/nope.log") ||
  { echo "--no-position-embedding changed a RoPE model"; exit 1; }
out=$("$M" train "${T[@]}" --no-position-embedding 2>&1) &&
  { echo "--no-position-embedding with learned positions was accepted"; exit 1; }
grep -qF "HINT: drop --no-position-embedding, or use --position-embedding-type rope" <<<"$out" ||
  { echo "unexpected error: $out"; exit 1; }

# ---- switches accepted by design: the same curve, each named with its reason ----
run "$W/design.log" "$M" train "${T[@]}" "${R[@]}" --use-persistent-ckpt-worker \
  --async-strategy mcore --dist-ckpt-optim-fully-reshardable --verify-integrity \
  --apply-query-key-layer-scaling --te-rng-tracker --rerun-mode disabled \
  --disable-gloo-process-groups --no-use-tokenizer-model-from-checkpoint-args \
  --enable-experimental
diff <(lines "$W/rope.log") <(lines "$W/design.log") ||
  { echo "a switch accepted by design changed training"; exit 1; }
[ "$(grep -c "accepted by design" "$W/design.log")" -eq 10 ] ||
  { echo "expected 10 'accepted by design' lines"; grep "accepted by design" "$W/design.log"
    exit 1; }
out=$("$M" train "${T[@]}" "${R[@]}" --rerun-mode report_stats 2>&1) &&
  { echo "--rerun-mode report_stats was accepted"; exit 1; }
grep -qF "accepted: disabled, validate_results" <<<"$out" || { echo "unexpected: $out"; exit 1; }
echo "script switches: ok"
