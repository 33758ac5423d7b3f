#!/usr/bin/env bash
# generate_cli.sh MEGATRON CKPT: `megatron generate` end to end on a tiny checkpoint.
set -eu
M=$1; C=$2
fail() { echo "FAIL: $*"; exit 1; }
# main() may log a one-time runtime notice ("> OpenBLAS chose ...") on stdout before
# re-executing itself; the generated text is every other line.
gen() { "$M" generate "$@" | grep -v '^> ' || true; }
# Greedy, two prompts, tokenizer taken from the checkpoint's recorded config.
out=$(gen --load "$C" --prompt "1 2 3" --prompt "7 8" --greedy \
      --num-tokens-to-generate 8 2>err.txt)
[ -n "$out" ] || { cat err.txt; fail "greedy run"; }
cat err.txt; echo "$out"
[ "$(echo "$out" | wc -l)" -eq 2 ] || fail "expected one line per prompt"
grep -q "^1 2 3 " <<<"$out" || fail "the prompt is echoed first"
grep -Eq "decode [0-9.]+ tokens/s" err.txt || fail "no tokens/s line"
# Greedy is deterministic; sampling is reproducible with --seed and varies without it.
out2=$(gen --load "$C" --prompt "1 2 3" --prompt "7 8" --greedy \
       --num-tokens-to-generate 8 --tokenizer-type NullTokenizer --vocab-size 100 2>/dev/null)
[ "$out" = "$out2" ] || fail "greedy differs between runs"
s1=$(gen --load "$C" --prompts-file <(printf '1 2 3\n4 5\n') --seed 7 \
     --temperature 1.5 --top-k 20 --num-tokens-to-generate 12 --ignore-eod 2>/dev/null)
s2=$(gen --load "$C" --prompts-file <(printf '1 2 3\n4 5\n') --seed 7 \
     --temperature 1.5 --top-k 20 --num-tokens-to-generate 12 --ignore-eod 2>/dev/null)
s3=$(gen --load "$C" --prompts-file <(printf '1 2 3\n4 5\n') --seed 8 \
     --temperature 1.5 --top-k 20 --num-tokens-to-generate 12 --ignore-eod 2>/dev/null)
[ "$s1" = "$s2" ] || fail "same seed, different samples"
[ "$s1" != "$s3" ] || fail "different seeds, same samples"
# 12 new tokens after the prompt (ids separated by spaces).
[ "$(head -1 <<<"$s1" | wc -w)" -eq 15 ] || fail "expected 3 + 12 tokens: $s1"
echo ok
