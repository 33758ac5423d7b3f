#!/usr/bin/env bash
# mup.sh MEGATRON: muP (--use-mup; docs/model.md "muP") end to end on the CPU.
#   * a Llama-style model at width 4 (hidden 64 over --mup-base-hidden-size 16) trains, its
#     loss falls, and its losses differ from the same run without muP; the log line shows the
#     base learning rate (the vector-like group's, as Megatron's);
#   * the checkpoint records muP: resuming with it continues; without it (or at another
#     base width) is an error naming mup; --use-checkpoint-args takes it; generate runs;
#   * Hugging Face export is refused, naming --use-mup;
#   * Megatron's legacy format (--ckpt-format torch) writes muP's args as Megatron's
#     namespace holds them, and `convert --from-megatron` derives the same multipliers.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 4 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2
   --log-interval 1 --threads 1 --device cpu --position-embedding-type rope
   --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear)
MUP=(--use-mup --mup-base-hidden-size 16 --mup-embedding-mult 2.0)
. "$(dirname "$0")/train_log_lib.sh"

run "$W/mup.log" "$M" train "${T[@]}" "${MUP[@]}" --train-iters 20 --save "$W/ck" \
    --save-interval 20
run "$W/plain.log" "$M" train "${T[@]}" --train-iters 20
[ "$(losses "$W/mup.log" | wc -l)" -eq 20 ] || { echo "expected 20 losses"; exit 1; }
python3 - "$W/mup.log" "$W/plain.log" <<'PY'
import re, sys
def rows(f):
    t = open(f).read()
    return [(float(m[1]), float(m[2])) for m in re.finditer(
        r"learning rate: (\S+) \|.*?lm loss: (\S+) \|", t)]
mup, plain = rows(sys.argv[1]), rows(sys.argv[2])
assert mup[-1][1] < mup[0][1] - 0.2, f"muP loss did not fall: {mup[0][1]} -> {mup[-1][1]}"
assert [r[0] for r in mup] == [r[0] for r in plain], "the logged LR is not the base schedule's"
assert any(abs(a[1] - b[1]) > 1e-3 for a, b in zip(mup, plain)), "muP changed nothing"
print(f"muP: loss {mup[0][1]:.3f} -> {mup[-1][1]:.3f}; plain {plain[0][1]:.3f} -> {plain[-1][1]:.3f}")
PY
grep -q '"mup"' "$W/ck/iter_0000020/metadata.json" ||
  { echo "the checkpoint does not record muP"; exit 1; }

R=(--train-iters 22 --load "$W/ck" --use-checkpoint-opt_param-scheduler)
run "$W/resume.log" "$M" train "${T[@]}" "${MUP[@]}" "${R[@]}"
grep -Eq "iteration +22/ +22" "$W/resume.log" || { echo "did not resume"; exit 1; }
refused "$W/nomup.log" "mup (--use-mup and its flags)" "$M" train "${T[@]}" "${R[@]}"
refused "$W/width.log" "mup (--use-mup and its flags)" \
  "$M" train "${T[@]}" --use-mup --mup-base-hidden-size 32 --mup-embedding-mult 2.0 "${R[@]}"
run "$W/uca.log" "$M" train "${T[@]}" "${R[@]}" --use-checkpoint-args
grep -Eq "^  use_mup \.+ True$" "$W/uca.log" &&
  grep -Eq "^  mup_base_hidden_size \.+ 16$" "$W/uca.log" &&
  grep -Eq "^  mup_embedding_mult \.+ 2\.0$" "$W/uca.log" ||
  { echo "--use-checkpoint-args did not take muP"; grep mup "$W/uca.log"; exit 1; }
"$M" generate --load "$W/ck" --prompt "1 2 3 4" --num-tokens-to-generate 8 --ignore-eod \
    --threads 1 >"$W/gen.out" 2>"$W/gen.err" || { echo "generate failed"; tail "$W/gen.err"; exit 1; }
[ "$(grep -v '^> ' "$W/gen.out" | wc -w)" -eq 12 ] || { echo "generate:"; cat "$W/gen.out"; exit 1; }

refused "$W/hf.log" "--use-mup" "$M" convert --load "$W/ck" --to-hf "$W/hf"
[ ! -e "$W/hf/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }

run "$W/torch.log" "$M" train "${T[@]}" "${MUP[@]}" --train-iters 4 --ckpt-format torch \
    --save "$W/U" --save-interval 4
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
python3 - "$W/ck/iter_0000020/metadata.json" "$W/C/iter_0000004/metadata.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["model"]["mup"]
b = json.load(open(sys.argv[2]))["model"]["mup"]
assert a == b, f"--from-megatron: {b} vs the run's {a}"
assert abs(a["output_mult"] - 0.25) < 1e-15 and a["width_mult"] == 4.0, a
print("legacy format round trip:", b)
PY
echo "all checks passed"
