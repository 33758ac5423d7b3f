#!/usr/bin/env bash
# log_progress.sh MEGATRON: --log-progress writes <--save>/progress.txt as Megatron does.
#   * a tiny CPU run saving every 4 iterations up to 8 appends "Starting job" and one "Saved
#     checkpoint" line per save (iteration, job and cumulative throughput, floating-point
#     operations, tokens), each with $SLURM_JOB_ID and the world size; a resumed run appends
#     its own "Starting job" and saves, the operations and tokens counting on from the
#     checkpoint's; Megatron's own reader of the file (get_start_time_from_progress_log,
#     restated in Python) reads it;
#   * --async-save: "Saving async checkpoint" when scheduled, "Saved async checkpoint" once
#     committed;
#   * without --save it is refused, with a HINT.
set -euo pipefail
M=$1
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --log-interval 4 --threads 1)
run() { local log=$1; shift; "$@" >"$log" 2>&1 || { echo "FAILED: $*"; tail -30 "$log"; exit 1; }; }

run "$W/a.log" env SLURM_JOB_ID=777 "$M" train "${T[@]}" --train-iters 12 --exit-interval 8 \
  --save "$W/ck" --save-interval 4 --log-progress
run "$W/b.log" env -u SLURM_JOB_ID "$M" train "${T[@]}" --train-iters 12 --save "$W/ck" \
  --load "$W/ck" --save-interval 4 --log-progress
run "$W/c.log" "$M" train "${T[@]}" --train-iters 8 --save "$W/async" --save-interval 4 \
  --log-progress --async-save
cat "$W/ck/progress.txt"
python3 - "$W/ck/progress.txt" "$W/async/progress.txt" <<'PY'
import sys
from datetime import datetime

def rows(path):
    out = []
    for line in open(path):
        assert line.endswith("\n"), line
        t = line.rstrip("\n").split("\t")
        datetime.strptime(t[0], "%Y-%m-%d %H:%M:%S")
        assert t[2] == "# GPUs: 1", t
        out.append(t)
    return out

def field(s, kind=str):  # Megatron's _get_field
    return kind(s.split(": ")[1])

r = rows(sys.argv[1])
assert [t[3] for t in r] == ["Starting job", "Saved checkpoint", "Saved checkpoint",
                             "Starting job", "Saved checkpoint"], [t[3] for t in r]
assert [t[1] for t in r] == ["Job ID: 777"] * 3 + ["Job ID: "] * 2, [t[1] for t in r]
saves = [t for t in r if t[3] == "Saved checkpoint"]
assert [field(t[4], int) for t in saves] == [4, 8, 12]
assert all(t[5].startswith("Job throughput: ") and t[5].endswith(" TFLOP/s/GPU") for t in saves)
assert all(t[6].startswith("Cumulative throughput: ") for t in saves)
assert all(float(t[5].split()[2]) >= 0 and float(t[6].split()[2]) >= 0 for t in saves)
flops = [field(t[7], float) for t in saves]
assert flops[0] > 0, flops
# Every iteration has the same global batch: the operations grow linearly, and the resumed
# job counts on from the checkpoint's.
for k, f in enumerate(flops):
    assert abs(f / flops[0] - (k + 1)) < 0.01, flops
# Tokens: consumed samples x seq_length (8 x 64 per iteration) in billions.
assert [t[8] for t in saves] == ["Tokens (in billions): 0.00"] * 3, [t[8] for t in saves]

# Megatron's get_start_time_from_progress_log (training.py), restated: the first job of the
# last run with this world size, and the operations of the last save before it.
def start(rows, world):
    st = sf = None
    latest = 0
    for t in rows:
        if t[3] == "Saved checkpoint":
            latest = field(t[7], float)
        if field(t[2], int) != world:
            st = sf = None
            continue
        if t[3] == "Starting job" and st is None:
            st, sf = t[0], latest
    return st, sf
st, sf = start(r, 1)
assert st == r[0][0] and sf == 0, (st, sf)
assert start(r, 2) == (None, None)

a = rows(sys.argv[2])
assert [t[3] for t in a] == ["Starting job", "Saving async checkpoint", "Saved async checkpoint",
                             "Saving async checkpoint", "Saved async checkpoint"], a
assert [t[4] for t in a[1:]] == ["Iteration: 4", "Iteration: 4", "Iteration: 8",
                                 "Iteration: 8"], a
print("progress.txt: Megatron's lines, counted on across a resume; async saves too")
PY

out=$("$M" train "${T[@]}" --train-iters 2 --log-progress 2>&1) &&
  { echo "--log-progress without --save was accepted"; exit 1; }
grep -qF -- "--log-progress appends to <--save>/progress.txt, but no --save was given" <<<"$out" &&
  grep -qF "HINT: add --save DIR, or drop --log-progress" <<<"$out" ||
  { echo "unexpected error: $out"; exit 1; }
echo "--log-progress ok"
