#!/usr/bin/env bash
# position_none.sh MEGATRON: --position-embedding-type none (no learned table, no RoPE).
#   * a tiny model trains; it has the learned model's parameters less the table's;
#   * the checkpoint records it (model.no_positions, no position tensor): an exact
#     --use-checkpoint-args resume; loading it as a learned-position model is an error naming
#     the field;
#   * generate samples from it; convert --to-hf refuses it before writing anything;
#   * Megatron's legacy format keeps it and convert --from-megatron reads it back.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --train-iters 8 --log-interval 1 --threads 1
   --hidden-dropout 0 --attention-dropout 0)
source "$(dirname "$0")/train_log_lib.sh"  # run, lines, args_line
params() { grep -Eo "model parallel rank \(0, 0\): [0-9]+" "$1" | grep -Eo "[0-9]+$"; }

run "$W/none.log" "$M" train "${T[@]}" --position-embedding-type none
args_line "$W/none.log" position_embedding_type none
[ "$(lines "$W/none.log" | wc -l)" -eq 8 ] || { echo "expected 8 iteration lines"; exit 1; }
run "$W/learned.log" "$M" train "${T[@]}"
[ $(( $(params "$W/learned.log") - $(params "$W/none.log") )) -eq $((64 * 64)) ] ||
  { echo "parameters: learned $(params "$W/learned.log"), none $(params "$W/none.log")"; exit 1; }

run "$W/first.log" "$M" train "${T[@]}" --position-embedding-type none --save "$W/ck" \
    --save-interval 4 --exit-interval 4
python3 - "$W/ck" <<'PY'
import glob, json, sys
md = json.load(open(glob.glob(f"{sys.argv[1]}/iter_0000004/metadata.json")[0]))
assert md["model"].get("no_positions") is True and md["model"]["rope"] is False, md["model"]
assert not [k for k in json.dumps(md).split('"') if "position_embeddings.weight" in k]
print("metadata.json records no_positions and no position table")
PY
cp -r "$W/ck" "$W/ck_copy"
run "$W/resume.log" "$M" train "${T[@]}" --use-checkpoint-args --load "$W/ck"
args_line "$W/resume.log" position_embedding_type none
diff <(lines "$W/none.log" 5 8) <(lines "$W/resume.log" 5 8) ||
  { echo "--use-checkpoint-args resume differs from the uninterrupted run"; exit 1; }
if "$M" train "${T[@]}" --load "$W/ck_copy" >"$W/as_learned.log" 2>&1; then
  echo "a model without positions loaded as a learned-position one"; exit 1
fi
grep -q "no_positions: checkpoint true vs this run false" "$W/as_learned.log" ||
  { echo "unexpected error:"; cat "$W/as_learned.log"; exit 1; }

run "$W/gen.log" "$M" generate --load "$W/ck_copy" --prompt "5 6 7 8" \
    --num-tokens-to-generate 6 --threads 1
grep -q "6 generated" "$W/gen.log" || { echo "generate did not sample"; cat "$W/gen.log"; exit 1; }
if "$M" convert --load "$W/ck_copy" --to-hf "$W/hf" >"$W/to_hf.log" 2>&1; then
  echo "--to-hf accepted a model without positions"; exit 1
fi
grep -q "without position embeddings (--position-embedding-type none) has no" "$W/to_hf.log" &&
  grep -q "HINT:" "$W/to_hf.log" || { echo "unexpected error:"; cat "$W/to_hf.log"; exit 1; }
[ ! -e "$W/hf/config.json" ] || { echo "a refused export wrote config.json"; exit 1; }

run "$W/torch.log" "$M" train "${T[@]}" --position-embedding-type none --train-iters 2 \
    --ckpt-format torch --save "$W/U" --save-interval 2
run "$W/from_meg.log" "$M" convert --from-megatron "$W/U" --save "$W/C"
grep -q '"no_positions": true' "$W"/C/iter_*/metadata.json ||
  { echo "--from-megatron lost position_embedding_type none"; exit 1; }
echo "position embedding none: training, checkpoint, generation and exchange ok"
