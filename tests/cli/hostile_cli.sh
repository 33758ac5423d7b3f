#!/usr/bin/env bash
# hostile_cli.sh MEGATRON GPT2_DIR: issue 23 part B end to end. Each case was a signal, a
# hang, a copied local file, a silent fresh start or exit 0 after a failure; each must now
# be an error naming the file/field/flag, a non-zero exit and never a signal.
set -uo pipefail
M=$1; G=$2
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fails=0
err() {  # err REGEX CMD...: CMD fails (no signal) with output matching REGEX
  "$D/expect_error.sh" "$@" || { echo "FAILED: ${*:2}"; fails=$((fails + 1)); }
}
ok() { "$@" >"$W/ok.log" 2>&1 || { echo "FAILED (exit $?): $*"; cat "$W/ok.log"; fails=$((fails + 1)); }; }
SHAPE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16
       --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 2 --lr 1e-3
       --log-interval 1 --threads 1)
NULLTOK=(--tokenizer-type NullTokenizer --vocab-size 512)
GPT2=(--tokenizer-type GPT2BPETokenizer --vocab-file "$G/encoder.json" --merge-file "$G/vocab.bpe")

# A GPT-2-tokenizer checkpoint (the recorded tokenizer paths matter below).
ok "$M" train --mock-data "${SHAPE[@]}" "${GPT2[@]}" --train-iters 2 --save "$W/ck"
ok "$M" inspect "$W/ck"

# generate falls back to the tokenizer files a checkpoint records only when they are regular
# files: one naming /dev/zero read without end before.
cp -r "$W/ck" "$W/zero"
sed -i "s#$G/encoder.json#/dev/zero#" "$W/zero/iter_0000002/metadata.json"
err "recorded vocab_file '/dev/zero' is not a regular file" \
    timeout 60 "$M" generate --load "$W/zero" --prompt hi --num-tokens-to-generate 2

# inspect: exit non-zero after failed verification; a folder with no checkpoint says so.
cp -r "$W/ck" "$W/flip"
f=$(ls "$W"/flip/iter_0000002/model_*.safetensors | head -1)
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 5 )) conv=notrunc status=none
err "1 shard\(s\) failed verification" "$M" inspect "$W/flip"
mkdir -p "$W/empty"
err "$W/empty is a folder with no checkpoint" "$M" inspect "$W/empty"

# The tracker names iteration 2, its folder is gone: no fresh start from random weights.
cp -r "$W/ck" "$W/lost"; rm -rf "$W/lost/iter_0000002"
err "latest_checkpointed_iteration.txt names iteration 2" \
    "$M" train --mock-data "${SHAPE[@]}" "${GPT2[@]}" --train-iters 4 --load "$W/lost"

# convert --to-hf never copies the files a checkpoint's metadata names: one naming
# /etc/passwd exports weights and config only; the user's own flags export the tokenizer.
sed -i "s#$G/encoder.json#/etc/passwd#" "$W/ck/iter_0000002/metadata.json"
ok "$M" convert --load "$W/ck" --to-hf "$W/hf"
grep -q "not followed" "$W/ok.log" || { echo "FAILED: no warning"; cat "$W/ok.log"; fails=$((fails + 1)); }
if ls "$W/hf" | grep -q vocab.json; then echo "FAILED: a recorded path was followed"; fails=$((fails + 1)); fi
test -s "$W/hf/model.safetensors" || { echo "FAILED: no weights"; fails=$((fails + 1)); }
ok "$M" convert --load "$W/ck" --to-hf "$W/hf2" --vocab-file "$G/encoder.json" --merge-file "$G/vocab.bpe"
cmp -s "$G/encoder.json" "$W/hf2/vocab.json" || { echo "FAILED: vocab.json"; fails=$((fails + 1)); }

# convert --from-hf with sizes of zero or below: SIGFPE before.
for field in n_head n_inner vocab_size; do
  for v in 0 -1; do
    rm -rf "$W/bad_hf"; cp -r "$W/hf" "$W/bad_hf"
    sed -i -E "s/\"$field\": [0-9]+/\"$field\": $v/" "$W/bad_hf/config.json"
    err "'$field' is $v" "$M" convert --from-hf "$W/bad_hf" --save "$W/out_$field$v"
  done
done
rm -rf "$W/bad_hf"; cp -r "$W/hf" "$W/bad_hf"
sed -i -E 's/"n_layer": [0-9]+/"n_layer": 1073741824/' "$W/bad_hf/config.json"
err "weight files hold only" "$M" convert --from-hf "$W/bad_hf" --save "$W/out_layers"

# generate: a directory as prompts file, and --threads far beyond any machine.
err "--prompts-file $W is a directory" "$M" generate --load "$W/ck" --prompts-file "$W" "${GPT2[@]}"
err "--threads 100000 is outside" "$M" generate --load "$W/ck" --prompt hi --threads 100000 "${GPT2[@]}"

# Token ids beyond the model's vocabulary: an error naming the .bin before the first step.
for i in $(seq 1 200); do echo "{\"text\": \"$i 5000 7 8 9 10 11 12\"}"; done >"$W/ids.jsonl"
ok "$M" preprocess --input "$W/ids.jsonl" --output-prefix "$W/ids" --tokenizer-type NullTokenizer \
   --vocab-size 100000
err "ids_text_document.bin: holds token id 5000, outside the model's vocabulary of 640" \
    "$M" train "${SHAPE[@]}" "${NULLTOK[@]}" --train-iters 2 --data-path "$W/ids_text_document" \
    --split 1,0,0

# NullTokenizer ids are int32: a --vocab-size beyond wrapped them.
err "NullTokenizer: --vocab-size 3000000000 does not fit" "$M" preprocess --input "$W/ids.jsonl" \
    --output-prefix "$W/wrap" --tokenizer-type NullTokenizer --vocab-size 3000000000

# preprocess --workers 100000: aborted and left a .bin.tmp<pid> behind.
err "--workers 100000 is more than" "$M" preprocess --input "$W/ids.jsonl" --output-prefix "$W/many" \
    --tokenizer-type NullTokenizer --vocab-size 1000 --workers 100000
if ls "$W" | grep -q '^many'; then echo "FAILED: left $(ls "$W" | grep '^many')"; fails=$((fails + 1)); fi

[ $fails -eq 0 ] && echo "all hostile cases handled" || { echo "$fails case(s) failed"; exit 1; }
