#!/usr/bin/env bash
# progress_cli.sh MEGATRON: the progress lines of long work: preprocess's ETA after
# Megatron's "Processed N documents" line; checkpoint save and load, and convert, report
# size and GB/s, with the size equal to the files on disk.
set -eu
M=$1
fail() { echo "FAIL: $*"; exit 1; }
rm -rf ck hf pre*
for i in $(seq 1 400); do echo "{\"text\": \"$((i % 50 + 1)) $((i * 7 % 90 + 1)) 3 4 5 6 7 8 9 10\"}"; done >in.jsonl
"$M" preprocess --input in.jsonl --output-prefix pre --tokenizer-type NullTokenizer --vocab-size 100 \
  --workers 2 --log-interval 100 >pre.log 2>&1 || { cat pre.log; fail "preprocess"; }
cat pre.log | grep Processed
[ "$(grep -cE '^Processed [0-9]+ documents \(.* docs/s, .* MB/s\)\. [0-9]+% of the input, ETA [0-9]+:[0-9]{2}:[0-9]{2}$' pre.log)" = 4 ] \
  || fail "expected 4 progress lines with an ETA"
grep -qE "^Processed 400 documents .* 100% of the input, ETA 0:00:00$" pre.log || fail "last line: 100%, ETA 0"
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --threads 1 --log-interval 1)
"$M" train "${T[@]}" --train-iters 2 --save ck --save-interval 2 >save.log 2>&1 || { tail save.log; fail "save"; }
"$M" train "${T[@]}" --train-iters 3 --load ck --override-opt_param-scheduler >load.log 2>&1 || { tail load.log; fail "load"; }
"$M" convert --load ck --to-hf hf >convert.log 2>&1 || { tail convert.log; fail "convert"; }
grep -h -E "checkpoint written|checkpoint read|wrote" save.log load.log convert.log
python3 - <<'PY' || fail "size lines against the files"
import os, re
def size(p):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)
for log, pat, path in [("save.log", r"checkpoint written: ([0-9.]+) GB in [0-9.]+ s \(([0-9.]+) GB/s\)", "ck/iter_0000002"),
                       ("load.log", r"checkpoint read \(iteration 2\): ([0-9.]+) GB in [0-9.]+ s \(([0-9.]+) GB/s\)", "ck/iter_0000002"),
                       ("convert.log", r"wrote ([0-9.]+) GB in [0-9.]+ s \(([0-9.]+) GB/s\)", "hf")]:
    m = re.search(pat, open(log).read())
    assert m, (log, pat)
    gb = float(m.group(1))
    assert abs(gb - size(path) / 1e9) <= 0.0005 + 1e-9, (log, gb, size(path) / 1e9)
    assert float(m.group(2)) >= 0, log
PY
echo ok
