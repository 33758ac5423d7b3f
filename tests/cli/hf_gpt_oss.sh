#!/usr/bin/env bash
# hf_gpt_oss.sh MEGATRON: a gpt-oss model from Hugging Face and back with the `megatron`
# binary, on the fixture of tests/golden/hf_gpt_oss (transformers' GptOssForCausalLM, saved
# with save_pretrained):
#   * convert --from-hf gives a checkpoint whose metadata holds gpt-oss's settings (the
#     quick-GEGLU with offset 1 and clamp 7, learnable sinks, linear biases, the window);
#   * generate samples from it, 1 + 12 positions past its window of 4 (the KV-cache
#     attention applies the window); training continues from it (--finetune, the
#     checkpoint's arguments) with a finite loss;
#   * convert --to-hf writes GptOssForCausalLM again, every tensor byte for byte the
#     fixture's; --from-hf of a folder holding MXFP4 experts (the Hub's released form)
#     converts and samples.
set -euo pipefail
M=$1
SRC=$(cd "$(dirname "$0")/../golden/hf_gpt_oss" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }

# Vocabulary padding 1: the model keeps transformers' 96 rows (NullTokenizer: 95 + EOD).
run "$W/from.log" "$M" convert --from-hf "$SRC" --save "$W/ck" --make-vocab-size-divisible-by 1
meta="$W/ck/iter_0000000/metadata.json"
for want in '"quick_geglu": true' '"glu_linear_offset": 1.0' '"softmax_type": "learnable"' \
            '"add_bias_linear": true'; do
  grep -q "$want" "$meta" || { echo "metadata lacks $want"; cat "$meta"; exit 1; }
done

run "$W/gen.log" "$M" generate --load "$W/ck" --tokenizer-type NullTokenizer --vocab-size 95 \
    --prompt "5" --num-tokens-to-generate 12 --ignore-eod \
    --threads 1 --greedy
grep -q "12 generated" "$W/gen.log" || { echo "generate did not sample"; cat "$W/gen.log"; exit 1; }

run "$W/ft.log" "$M" train --load "$W/ck" --use-checkpoint-args --finetune --mock-data \
    --tokenizer-type NullTokenizer --vocab-size 95 --make-vocab-size-divisible-by 1 \
    --seq-length 10 --micro-batch-size 2 \
    --global-batch-size 2 --train-iters 3 --lr 1e-4 --log-interval 1 --threads 1 --device cpu
grep -Eq "iteration +3/ +3 .*lm loss: [0-9]" "$W/ft.log" ||
  { echo "fine-tuning from the converted model did not run"; tail -20 "$W/ft.log"; exit 1; }

run "$W/to.log" "$M" convert --load "$W/ck" --to-hf "$W/hf"
python3 - "$SRC" "$W/hf" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    def raw(v):
        return b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
    return {k: (v["dtype"], v["shape"], raw(v)) for k, v in head.items()}
a, b = tensors(sys.argv[1] + "/model.safetensors"), tensors(sys.argv[2] + "/model.safetensors")
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, bad
cfg = json.load(open(sys.argv[2] + "/config.json"))
assert cfg["architectures"] == ["GptOssForCausalLM"] and cfg["model_type"] == "gpt_oss", cfg
assert cfg["layer_types"] == ["sliding_attention", "full_attention"], cfg["layer_types"]
assert cfg["swiglu_limit"] == 7.0 and cfg["sliding_window"] == 4, cfg
print("exported GptOssForCausalLM:", len(a), "tensors byte for byte")
PY

# The Hub's released checkpoints store the experts MXFP4-quantised: dequantised on import
# (here layer 0's gate_up_proj as zero blocks), the model then samples.
mkdir -p "$W/mx"
cp "$SRC/config.json" "$W/mx/"
python3 - "$SRC/model.safetensors" "$W/mx/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
head = json.loads(b[8:8 + n])
meta = head.pop("__metadata__", None)
out, data = {}, b""
def put(k, dtype, shape, raw):
    global data
    out[k] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
for k, v in sorted(head.items()):
    raw = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
    if k == "model.layers.0.mlp.experts.gate_up_proj":
        put(k + "_blocks", "U8", [4, 48, 1, 16], bytes(4 * 48 * 16))
        put(k + "_scales", "U8", [4, 48, 1], bytes([127]) * (4 * 48))
    else:
        put(k, v["dtype"], v["shape"], raw)
if meta: out["__metadata__"] = meta
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
run "$W/mx.log" "$M" convert --from-hf "$W/mx" --save "$W/ck_mx"
run "$W/mx_gen.log" "$M" generate --load "$W/ck_mx" --tokenizer-type NullTokenizer \
    --vocab-size 95 --prompt "5" --num-tokens-to-generate 3 --threads 1 --greedy
echo "all checks passed"
