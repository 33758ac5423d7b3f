#!/usr/bin/env bash
# straggler_cli.sh MEGATRON "MPIRUN...": --log-straggler under mpirun -np 2 (DP2).
#  1. A report line after every iteration line, naming ranks 0-1; each rank's time (Rtt)
#     at most the interval's time per iteration (it is that minus the time blocked in
#     communication); the rank of lowest throughput is the rank of longest time; with
#     --straggler-minmax-count 1 no bottom/top lines (Megatron prints them for 1 < N < world).
#  2. --disable-straggler-on-startup: no report until a connection to rank 0's
#     --straggler-ctrlr-port, which answers as Megatron's controller; then "Toggling
#     StragglerDetector State ON" at the next log line and reports from there on. The
#     request is a 2 KiB head in two writes, with a pause between them.
# No time is compared with a fixed number.
set -eu
M=$1; MPI=$2
fail() { echo "FAIL: $*"; exit 1; }
T=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 64
   --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
   --global-batch-size 8 --lr 3e-3 --threads 1 --log-straggler)
# A port nobody listens on now (the kernel's pick for port 0), not one derived from the PID,
# which another test running beside this one may hold.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])')

$MPI -np 2 "$M" train "${T[@]}" --train-iters 6 --log-interval 2 --straggler-ctrlr-port "$PORT" \
  >on.log 2>&1 || { tail -20 on.log; fail "DP2 run"; }
grep -E "Rnk|controller" on.log
grep -q "controller ready to receive commands on port $PORT. Current state ON" on.log \
  || fail "no controller line"
python3 - on.log <<'PY' || fail "report lines"
import re, sys
text = open(sys.argv[1]).read().splitlines()
iters = [i for i, l in enumerate(text) if re.search(r"iteration +\d+/", l)]
assert len(iters) == 3, iters
for i in iters:
    per_iter = float(re.search(r"elapsed time per iteration \(ms\): ([0-9.]+)", text[i]).group(1))
    rep = text[i + 1]
    m = {k: (float(v), int(r)) for k, v, r in
         re.findall(r"(Mn\w+|Mx\w+)/Rnk: ([0-9.]+)[A-Za-z%]+/(\d)", rep)}
    assert set(m) == {"MnRtt", "MxRtt", "MnDRtt", "MxDRtt", "MnEtpt", "MxEtpt"}, rep
    assert 0 < m["MnRtt"][0] <= m["MxRtt"][0], rep
    # The time blocked in the gradient all-reduce is taken off (the first interval, where
    # the ranks start their clocks apart, aside).
    assert i == iters[0] or m["MxRtt"][0] < per_iter, (rep, per_iter)
    assert m["MnEtpt"][0] > 0 and m["MnEtpt"][0] <= m["MxEtpt"][0], rep
    if m["MnRtt"][0] < m["MxRtt"][0]:
        assert m["MnEtpt"][1] == m["MxRtt"][1] and m["MxEtpt"][1] == m["MnRtt"][1], rep
    assert {m["MnRtt"][1], m["MxRtt"][1]} <= {0, 1}, rep
assert not any("^^^^" in l for l in text), "bottom/top lines at --straggler-minmax-count 1"
print("report lines ok")
PY

# Off at start-up, switched on from the control port while it trains.
$MPI -np 2 "$M" train "${T[@]}" --train-iters 400 --log-interval 1 --disable-straggler-on-startup \
  --straggler-ctrlr-port "$PORT" >toggle.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT  # a failed check leaves no run behind
for _ in $(seq 1 300); do
  grep -q "controller ready" toggle.log && grep -q "iteration  *3/" toggle.log && break
  sleep 0.1
done
grep -q "Current state OFF" toggle.log || { kill $pid; tail -20 toggle.log; fail "not OFF at start"; }
exec 3<>"/dev/tcp/127.0.0.1/$PORT" || { kill $pid; fail "cannot connect to port $PORT"; }
# A 2 KiB request head in two writes, as a client may send it: the controller must read it
# all before it answers, or the close resets the connection and the answer is lost.
printf 'GET / HTTP/1.0\r\nX-Pad: %s\r\n' "$(printf 'p%.0s' $(seq 1 2048))" >&3
sleep 0.3
printf '\r\n' >&3
reply=$(cat <&3)
exec 3<&-
echo "reply: $reply"
wait $pid || { tail -20 toggle.log; fail "toggle run"; }
[[ $reply == "HTTP/1.0 200 OK"*"Will turn StragglerDetector ON at next logging interval" ]] \
  || fail "controller reply"
python3 - toggle.log <<'PY' || fail "toggle"
import sys
text = open(sys.argv[1]).read().splitlines()
on = [i for i, l in enumerate(text) if "Toggling StragglerDetector State ON" in l]
reports = [i for i, l in enumerate(text) if "MnRtt/Rnk" in l]
assert len(on) == 1, on
assert reports and min(reports) > on[0], "a report before the detector was switched on"
iters = [i for i, l in enumerate(text) if "iteration " in l and "/     400" in l]
assert len([i for i in iters if i > on[0]]) == len(reports), (len(iters), len(reports))
print(f"switched on after iteration line {len([i for i in iters if i < on[0]])}; "
      f"{len(reports)} reports after")
PY
echo "straggler detector ok"
