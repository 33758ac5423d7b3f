#!/usr/bin/env bash
# tensorboard_cli.sh MEGATRON READER "MPIRUN...": `megatron train --tensorboard-dir` writes
# event files that an independent reader (read_tfevents.py: framing, CRCs, protobuf by
# hand) decodes into Megatron's tags whose steps and values equal the printed log lines;
# --tensorboard-log-interval and --no-log-loss-scale-to-tensorboard act; under mpirun only
# the last rank writes.
set -eu
M=$1; R=$2; MPI=${3:-}
fail() { echo "FAIL: $*"; exit 1; }
TINY=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2
      --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
      --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
      --lr-warmup-iters 2 --threads 1)
rm -rf tb1 tb2 tb3
"$M" train "${TINY[@]}" --train-iters 6 --log-interval 1 --eval-interval 3 --eval-iters 1 \
  --tensorboard-dir tb1 --log-timers-to-tensorboard --timing-log-level 1 --log-throughput \
  --log-validation-ppl-to-tensorboard --log-world-size-to-tensorboard >run1.log 2>&1 \
  || { tail -20 run1.log; fail "training run 1"; }
[ "$(ls tb1 | wc -l)" -eq 1 ] || fail "expected one event file: $(ls tb1)"
python3 "$R" tb1/events.out.tfevents.* >tb1.json || fail "the reader rejected the file"
python3 - run1.log tb1.json <<'PY' || fail "event file against the log lines"
import json, math, re, sys
log, tb = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
assert tb["file_version"] == "brain.Event:2", tb["file_version"]
S = {k: {s: v for s, v, _ in pts} for k, pts in tb["scalars"].items()}
def close(a, b, rel, what):
    assert abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-12, (what, a, b)
lines = [l for l in log.splitlines() if re.search(r"iteration +\d+/", l)]
assert len(lines) == 6, lines
for l in lines:
    it = int(re.search(r"iteration +(\d+)/", l).group(1))
    samples = int(re.search(r"consumed samples: +(\d+)", l).group(1))
    f = lambda name: float(re.search(name + r": +([0-9.E+-]+)", l).group(1))
    close(S["lm loss"][it], f("lm loss"), 2e-6, "lm loss")
    close(S["lm loss vs samples"][samples], f("lm loss"), 2e-6, "lm loss vs samples")
    close(S["learning-rate"][it], f("learning rate"), 2e-6, "learning-rate")
    close(S["learning-rate vs samples"][samples], f("learning rate"), 2e-6, "lr vs samples")
    assert abs(S["grad-norm"][it] - f("grad norm")) <= 6e-4, ("grad-norm", it)
    assert S["batch-size"][it] == f("global batch size") == 8
    assert S["loss-scale"][it] == f("loss scale") == 1.0
    assert S["world-size"][it] == 1.0
    assert abs(S["iteration-time"][it] * 1e3 - f(r"elapsed time per iteration \(ms\)")) <= 0.051
    assert abs(S["throughput"][it] - f(r"throughput per GPU \(TFLOP/s/GPU\)")) <= 0.051
    for t in ("forward-backward-time", "optimizer-time"):
        assert S[t][it] > 0, (t, it)
        assert S[t][it] < S["iteration-time"][it] * 1.5, (t, it)
for it in (3, 6):
    v = float(re.search(rf"validation loss at iteration {it} \| lm loss value: ([0-9.E+-]+)", log).group(1))
    close(S["lm loss validation"][it], v, 2e-6, "validation")
    close(S["lm loss validation ppl"][it], math.exp(v), 1e-5, "ppl")
    close(S["lm loss validation vs samples"][it * 8], v, 2e-6, "validation vs samples")
print("run 1:", len(S), "tags,", tb["records"], "records")
PY
# Every second iteration; no loss scale.
"$M" train "${TINY[@]}" --train-iters 6 --log-interval 3 --tensorboard-dir tb2 \
  --tensorboard-log-interval 2 --no-log-loss-scale-to-tensorboard --tensorboard-queue-size 1 >run2.log 2>&1 \
  || { tail -20 run2.log; fail "training run 2"; }
python3 "$R" tb2/events.out.tfevents.* >tb2.json || fail "reader, run 2"
python3 - tb2.json <<'PY' || fail "--tensorboard-log-interval 2"
import json, sys
S = json.load(open(sys.argv[1]))["scalars"]
assert [p[0] for p in S["lm loss"]] == [2, 4, 6], S["lm loss"]
assert "loss-scale" not in S and "iteration-time" not in S and "forward-backward-time" not in S, S.keys()
PY
if [ -n "$MPI" ]; then
  $MPI -np 2 "$M" train "${TINY[@]}" --train-iters 4 --log-interval 1 --tensorboard-dir tb3 \
    >run3.log 2>&1 || { tail -20 run3.log; fail "training run 3 (mpirun)"; }
  [ "$(ls tb3 | wc -l)" -eq 1 ] || fail "under mpirun -np 2 one rank writes: $(ls tb3)"
  python3 "$R" tb3/events.out.tfevents.* >tb3.json || fail "reader, run 3"
  python3 - run3.log tb3.json <<'PY' || fail "DP2 event file against the log"
import json, re, sys
log, S = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))["scalars"]
S = {k: {s: v for s, v, _ in p} for k, p in S.items()}
for m in re.finditer(r"iteration +(\d+)/.*?lm loss: ([0-9.E+-]+)", log):
    it, v = int(m.group(1)), float(m.group(2))
    assert abs(S["lm loss"][it] - v) <= 2e-6 * abs(v), (it, S["lm loss"][it], v)
PY
fi
echo ok
