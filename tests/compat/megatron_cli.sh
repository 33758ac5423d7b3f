#!/usr/bin/env bash
# megatron_cli.sh MEGATRON_BIN SOURCE_DIR: issue 23 A.5 through the command line.
#   convert --from-megatron of both fixture layouts, then inspect/--to-hf of the result;
#   inspect of a Megatron folder says what it is; convert --load of one, and --load of a
#   torch_dist one, stop with the convert HINT (a legacy one loads); flags that do not apply to --from-megatron are refused; --to-megatron
#   writes the converted run back in Megatron's legacy layout, which --from-megatron reads.
set -u
M=$1; SRC=$2; G=$SRC/tests/golden/megatron
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect_fail() {  # REGEX CMD...
  local re=$1; shift
  out=$("$@" 2>&1); rc=$?
  [ $rc -ne 0 ] && [ $rc -le 128 ] || fail "exit $rc for: $* -> $out"
  grep -Eq -- "$re" <<<"$out" || fail "no /$re/ in: $out"
}
for fam in gpt llama; do
  for layout in legacy dist; do
    out=$("$M" convert --from-megatron "$G/${fam}_$layout" --save "$T/$fam$layout" 2>&1) \
      || fail "convert $fam $layout: $out"
    grep -q "imported .*from TP" <<<"$out" || fail "no import line: $out"
    "$M" inspect "$T/$fam$layout" >/dev/null 2>&1 || fail "inspect of the converted $fam $layout"
  done
done
out=$("$M" convert --from-megatron "$G/gpt_legacy" --save "$T/g2" 2>&1)
grep -q "imported the Adam state (step 10, betas 0.9 0.95" <<<"$out" || fail "no optimizer line: $out"
# --load resumes Megatron's run: iteration 10, its consumed samples, LR schedule and Adam state
# (the flags are the fixture run's: a schedule that differs is refused, as Megatron does)
out=$("$M" train --load "$T/g2" --save "$T/g3" --mock-data --tokenizer-type NullTokenizer \
  --vocab-size 61 --make-vocab-size-divisible-by 32 --num-layers 4 --hidden-size 16 \
  --num-attention-heads 4 --seq-length 8 --max-position-embeddings 12 --micro-batch-size 4 \
  --global-batch-size 8 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-samples 16 \
  --lr-decay-samples 800 --weight-decay 0.01 --adam-beta2 0.95 --train-samples 800 \
  --exit-interval 11 --threads 1 --log-interval 1 --save-interval 1 2>&1) || fail "resume: $out"
grep -q "resuming at iteration 10 (80 samples consumed)" <<<"$out" || fail "no resume: $out"
# cosine from 3e-4 to 3e-5 over samples 16..800, at 88 samples: 2.944202E-04
grep -q "iteration  *11/.*consumed samples:  *88 .*learning rate: 2.944202E-04" <<<"$out" \
  || fail "iteration 11: $out"
grep -q '"optimizer_steps": *11' "$T/g3/iter_0000011/metadata.json" || fail "Adam step after resume"
# --no-load-optim: the weights alone, iteration 0; refused where it does not apply
out=$("$M" convert --from-megatron "$G/gpt_legacy" --no-load-optim --save "$T/g4" 2>&1) \
  || fail "--no-load-optim: $out"
grep -q "optimizer state of .* is left out" <<<"$out" || fail "no --no-load-optim line: $out"
grep -q '"iteration": *0' "$T/g4/iter_0000000/metadata.json" || fail "--no-load-optim iteration"
expect_fail "applies to --from-megatron only" "$M" convert --load "$T/g4" --to-hf "$T/h2" --no-load-optim
expect_fail "the checkpoint has 800" \
  "$M" train --load "$T/g2" --mock-data --tokenizer-type NullTokenizer --vocab-size 61 \
  --make-vocab-size-divisible-by 32 --num-layers 4 --hidden-size 16 --num-attention-heads 4 \
  --seq-length 8 --max-position-embeddings 12 --micro-batch-size 4 --global-batch-size 8 \
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-samples 16 --lr-decay-samples 800 \
  --weight-decay 0.01 --train-samples 88 --threads 1
# the converted GPT exports to Hugging Face (GPT2LMHeadModel)
"$M" convert --load "$T/gptlegacy" --to-hf "$T/hf" >/dev/null 2>&1 || fail "--to-hf"
[ -s "$T/hf/model.safetensors" ] || fail "no model.safetensors"
out=$("$M" inspect "$G/llama_dist" 2>&1) || fail "inspect: $out"
grep -q "Megatron-LM checkpoint, torch_dist layout, iteration 10" <<<"$out" || fail "inspect: $out"
expect_fail "is a Megatron-LM checkpoint.*|HINT: convert it once: megatron convert --from-megatron" \
  "$M" convert --load "$G/gpt_legacy" --to-hf "$T/x"
# --load of a torch_dist folder stops with the convert HINT; a legacy one (--ckpt-format
# torch) loads directly, so with other model flags it is the model check that stops it.
expect_fail "was written for a different model" \
  "$M" train --load "$G/llama_legacy" --mock-data --tokenizer-type NullTokenizer --vocab-size 61 \
  --num-layers 4 --hidden-size 16 --num-attention-heads 4 --seq-length 8 \
  --max-position-embeddings 12 --micro-batch-size 1 --global-batch-size 1 --lr 1e-3 \
  --train-iters 1 --threads 1
expect_fail "HINT: convert it once: megatron convert --from-megatron" \
  "$M" train --load "$G/llama_dist" --mock-data --tokenizer-type NullTokenizer --vocab-size 61 \
  --num-layers 4 --hidden-size 16 --num-attention-heads 4 --seq-length 8 \
  --max-position-embeddings 12 --micro-batch-size 1 --global-batch-size 1 --lr 1e-3 \
  --train-iters 1 --threads 1
expect_fail "does not take --hf-dtype" \
  "$M" convert --from-megatron "$G/gpt_dist" --save "$T/y" --hf-dtype bfloat16
expect_fail "holds no Megatron-LM checkpoint" "$M" convert --from-megatron "$T" --save "$T/z"
expect_fail "exactly one of --to-hf, --from-hf, --from-megatron and --to-megatron" \
  "$M" convert --from-megatron "$G/gpt_dist" --from-hf "$T" --save "$T/z"
# --to-megatron: the converted run back to Megatron's legacy layout at TP 2 x PP 2 (TE names),
# read again by --from-megatron; what it refuses
out=$("$M" convert --to-megatron --load "$T/g2" --save "$T/back" --target-tensor-parallel-size 2 \
  --target-pipeline-parallel-size 2 2>&1) || fail "--to-megatron: $out"
for r in 00_000 01_000 00_001 01_001; do
  [ -f "$T/back/iter_0000010/mp_rank_$r/model_optim_rng.pt" ] || fail "--to-megatron: no mp_rank_$r"
done
[ "$(cat "$T/back/latest_checkpointed_iteration.txt")" = 10 ] || fail "--to-megatron: tracker"
out=$("$M" convert --from-megatron "$T/back" --save "$T/back2" 2>&1) || fail "re-import: $out"
grep -q "imported the Adam state (step 10, betas 0.9 0.95" <<<"$out" || fail "re-import: $out"
expect_fail "iter_0000010 exists already" \
  "$M" convert --to-megatron --load "$T/g2" --save "$T/back"
expect_fail "--target-tensor-parallel-size 3 does not divide" \
  "$M" convert --to-megatron --load "$T/g2" --save "$T/b3" --target-tensor-parallel-size 3
expect_fail "not a Megatron transformer implementation" \
  "$M" convert --to-megatron --load "$T/g2" --save "$T/b3" --transformer-impl te
expect_fail "--transformer-impl applies to --to-megatron only" \
  "$M" convert --load "$T/g2" --to-hf "$T/h9" --transformer-impl local
expect_fail "needs --load DIR" "$M" convert --to-megatron --save "$T/b3"
[ ! -e "$T/b3" ] || fail "a refused --to-megatron left $T/b3 behind"
echo ok
