#!/usr/bin/env bash
# attention_sink.sh MEGATRON: --softmax-type off-by-one / learnable (attention sinks).
#   * a tiny Llama-style model trains with each; learnable has one parameter a head a layer
#     more than vanilla, off-by-one none; the losses differ from vanilla's;
#   * the checkpoint records the type (model.softmax_type) and the sinks: an exact
#     --use-checkpoint-args resume; loading it as a vanilla model is an error naming the field;
#   * generate samples from it (the KV-cache attention with the sinks; tests/inference's
#     GenerateSink checks the cached decode against the full forward);
#   * convert --to-hf refuses it before writing anything;
#   * Megatron's legacy format keeps the sinks, convert --from-megatron reads them back, and
#     training resumed from that round trip continues the uninterrupted run exactly.
# (--cp-comm-type a2a+p2p's refusal: tests/training/test_validate_sink.cpp.)
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --group-query-attention --num-query-groups 2 --seq-length 64
   --max-position-embeddings 64 --position-embedding-type rope --normalization RMSNorm --swiglu
   --disable-bias-linear --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4
   --train-iters 8 --log-interval 1 --threads 1)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line
params() { grep -Eo "model parallel rank \(0, 0\): [0-9]+" "$1" | grep -Eo "[0-9]+$"; }

run "$W/vanilla.log" "$M" train "${T[@]}"
run "$W/one.log" "$M" train "${T[@]}" --softmax-type off-by-one
run "$W/sink.log" "$M" train "${T[@]}" --softmax-type learnable
args_line "$W/sink.log" softmax_type learnable
[ "$(lines "$W/sink.log" | wc -l)" -eq 8 ] || { echo "expected 8 iteration lines"; exit 1; }
[ "$(params "$W/one.log")" -eq "$(params "$W/vanilla.log")" ] ||
  { echo "off-by-one added parameters"; exit 1; }
# (The log counts the flat buffers, where each parameter starts at a multiple of 16 elements:
# two layers' [4] sinks take 2 x 16.)
[ $(( $(params "$W/sink.log") - $(params "$W/vanilla.log") )) -eq $((2 * 16)) ] ||
  { echo "parameters: vanilla $(params "$W/vanilla.log"), learnable $(params "$W/sink.log")"
    exit 1; }
! diff -q <(lines "$W/vanilla.log" 1 1) <(lines "$W/one.log" 1 1) >/dev/null ||
  { echo "off-by-one's first loss equals vanilla's"; exit 1; }

run "$W/first.log" "$M" train "${T[@]}" --softmax-type learnable --save "$W/ck" \
    --save-interval 4 --exit-interval 4
python3 - "$W/ck" <<'PY'
import glob, json, sys
md = json.load(open(glob.glob(f"{sys.argv[1]}/iter_0000004/metadata.json")[0]))
assert md["model"].get("softmax_type") == "learnable", md["model"]
names = [k for k in json.dumps(md).split('"')
         if k.startswith("decoder.") and k.endswith("core_attention.softmax_offset")]
assert len(set(names)) == 2, names
print("metadata.json records softmax_type learnable and both layers' sinks")
PY
cp -r "$W/ck" "$W/ck_copy"
run "$W/resume.log" "$M" train "${T[@]}" --use-checkpoint-args --load "$W/ck"
args_line "$W/resume.log" softmax_type learnable
diff <(lines "$W/sink.log" 5 8) <(lines "$W/resume.log" 5 8) ||
  { echo "--use-checkpoint-args resume differs from the uninterrupted run"; exit 1; }
if "$M" train "${T[@]}" --load "$W/ck_copy" >"$W/as_vanilla.log" 2>&1; then
  echo "a model with sinks loaded as a vanilla one"; exit 1
fi
grep -q "softmax_type" "$W/as_vanilla.log" ||
  { echo "unexpected error:"; cat "$W/as_vanilla.log"; exit 1; }

run "$W/gen.log" "$M" generate --load "$W/ck_copy" --prompt "5 6 7 8" \
    --num-tokens-to-generate 12 --threads 1 --greedy
grep -q "12 generated" "$W/gen.log" || { echo "generate did not sample"; cat "$W/gen.log"; exit 1; }

if "$M" convert --load "$W/ck_copy" --to-hf "$W/hf" >"$W/to_hf.log" 2>&1; then
  echo "--to-hf accepted a model with attention sinks"; exit 1
fi
grep -q "attention sinks (--softmax-type learnable) have no Hugging Face" "$W/to_hf.log" &&
  grep -q "HINT:" "$W/to_hf.log" || { echo "unexpected error:"; cat "$W/to_hf.log"; exit 1; }
[ ! -e "$W/hf/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }

run "$W/torch.log" "$M" train "${T[@]}" --softmax-type learnable --ckpt-format torch \
    --save "$W/U" --save-interval 2 --exit-interval 2
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
grep -q '"softmax_type": "learnable"' "$W"/C/iter_*/metadata.json ||
  { echo "--from-megatron lost softmax_type"; exit 1; }
run "$W/torch_resume.log" "$M" train "${T[@]}" --softmax-type learnable --load "$W/C" \
    --exit-interval 4
diff <(lines "$W/sink.log" 3 4) <(lines "$W/torch_resume.log" 3 4) ||
  { echo "the run resumed from the Megatron round trip differs"; exit 1; }

echo "attention sinks: training, checkpoint, generation and exchange ok"
