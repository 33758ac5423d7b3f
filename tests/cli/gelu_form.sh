#!/usr/bin/env bash
# gelu_form.sh MEGATRON: GELU's two forms as Megatron's MLP chooses them, end to end on the CPU.
#   * with biases and the bias_gelu fusion (the default) the tanh form; --no-bias-gelu-fusion or
#     --disable-bias-linear give torch's exact F.gelu; --openai-gelu keeps the tanh form. The
#     two forms train alike but not to the same bits;
#   * the checkpoint records the exact form: resuming with another form is an error naming
#     gelu_erf, --use-checkpoint-args takes the form's flags back; generate runs the model;
#   * --to-hf writes activation_function gelu (gelu_new for the tanh form) and --from-hf
#     reads it back; Megatron's legacy format writes bias_gelu_fusion / openai_gelu so that
#     Megatron computes the same form, and convert --from-megatron reads it back.
set -euo pipefail
M=$1
D=$(cd "$(dirname "$0")" && pwd)
source "$D/train_log_lib.sh"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 10
   --log-interval 5 --threads 1 --device cpu --train-iters 40)
meta() {  # meta METADATA_JSON: the model's gelu_erf (False when absent)
  python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['model'].get('gelu_erf', False))" \
    "$1"
}

run "$W/tanh.log" "$M" train "${T[@]}" --save "$W/tanh" --save-interval 40
run "$W/erf.log" "$M" train "${T[@]}" --no-bias-gelu-fusion --save "$W/erf" --save-interval 40
run "$W/nobias.log" "$M" train "${T[@]}" --disable-bias-linear --save "$W/nobias" \
    --save-interval 40
run "$W/openai.log" "$M" train "${T[@]}" --disable-bias-linear --openai-gelu
args_line "$W/tanh.log" bias_gelu_fusion True
args_line "$W/erf.log" bias_gelu_fusion False
args_line "$W/openai.log" openai_gelu True
[ "$(meta "$W/tanh/iter_0000040/metadata.json")" = False ] &&
  [ "$(meta "$W/erf/iter_0000040/metadata.json")" = True ] &&
  [ "$(meta "$W/nobias/iter_0000040/metadata.json")" = True ] ||
  { echo "the checkpoints do not record the GELU form"; exit 1; }
# The same initial weights and data: the first loss alike, the later ones close but not equal.
python3 - "$W/tanh.log" "$W/erf.log" <<'PY'
import re, sys
a, b = ([float(x) for x in re.findall(r"lm loss: ([0-9.E+-]+)", open(f).read())]
        for f in sys.argv[1:])
assert len(a) == len(b) == 8, (a, b)
assert a[-1] < a[0] - 0.5 and b[-1] < b[0] - 0.5, ("the loss did not fall", a, b)
assert a != b, "the exact and the tanh GELU trained to the same losses"
assert max(abs(x - y) for x, y in zip(a, b)) < 0.05, ("the forms diverge", a, b)
print("tanh", a[-1], "exact", b[-1])
PY
# Without biases, --openai-gelu's tanh form is another function than the default exact one.
[ "$(losses "$W/nobias.log" | tail -1)" != "$(losses "$W/openai.log" | tail -1)" ] ||
  { echo "--openai-gelu changed nothing"; exit 1; }

# Resume: the same form continues, another form is another model; --use-checkpoint-args.
R=(--load "$W/erf" --use-checkpoint-opt_param-scheduler --train-iters 45)
run "$W/resume.log" "$M" train "${T[@]}" --no-bias-gelu-fusion "${R[@]}"
grep -Eq "iteration +45/ +45" "$W/resume.log" || { echo "did not resume"; exit 1; }
refused "$W/other.log" "gelu_erf (exact GELU" "$M" train "${T[@]}" "${R[@]}"
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
args_line "$W/uca.log" bias_gelu_fusion False
run "$W/uca_tanh.log" "$M" train "${T[@]}" --no-bias-gelu-fusion --load "$W/tanh" \
    --use-checkpoint-opt_param-scheduler --train-iters 45 --use-checkpoint-args
args_line "$W/uca_tanh.log" bias_gelu_fusion True
run "$W/gen.log" "$M" generate --load "$W/erf" --prompt "1 2 3 4" --num-tokens-to-generate 8 \
    --threads 1

# Hugging Face: GPT-2 with activation_function gelu (exact) / gelu_new (tanh), and back.
run "$W/to_hf.log" "$M" convert --load "$W/erf" --to-hf "$W/hf"
grep -q '"activation_function": "gelu"' "$W/hf/config.json" ||
  { echo "config.json lacks gelu"; cat "$W/hf/config.json"; exit 1; }
run "$W/from_hf.log" "$M" convert --from-hf "$W/hf" --save "$W/back"
[ "$(meta "$W/back/iter_0000000/metadata.json")" = True ] ||
  { echo "--from-hf of gelu lost the exact form"; exit 1; }
run "$W/to_hf2.log" "$M" convert --load "$W/tanh" --to-hf "$W/hf2"
grep -q '"activation_function": "gelu_new"' "$W/hf2/config.json" ||
  { echo "the tanh form exported as another activation"; exit 1; }

# Megatron's legacy format: the flags Megatron reads for the form, and back.
for form in erf nobias; do
  extra=(); [ $form = erf ] && extra=(--no-bias-gelu-fusion) || extra=(--disable-bias-linear)
  run "$W/torch_$form.log" "$M" train "${T[@]}" "${extra[@]}" --train-iters 4 --lr-warmup-iters 1 \
      --ckpt-format torch --save "$W/U_$form" --save-interval 4
  run "$W/from_meg_$form.log" "$M" convert --from-megatron "$W/U_$form" --save "$W/C_$form"
  [ "$(meta "$W/C_$form/iter_0000004/metadata.json")" = True ] ||
    { echo "--from-megatron ($form) lost the exact GELU"; exit 1; }
done
echo "all checks passed"
