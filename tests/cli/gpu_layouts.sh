#!/usr/bin/env bash
# scripts/gpu-layouts.sh (the layout table of issue 8's multi-GPU calls) on the CPU machine:
# the real `megatron plan` decides what fits, a fake mpirun stands in for the training run
# and prints a two-rank log. Checks: a layout over the memory limit is listed with its plan
# instead of run; a run's row carries the log's tokens/s, TFLOP/s, MFU, timers, the
# exposed-communication shares and the busiest rank's peak (not the last rank to print); a bad layout word stops before any run.
set -u
root=$1 build=$2
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cat > "$fake/mpirun" <<'MPI'
#!/usr/bin/env bash
cat <<'LOG'
 [2026-11-30 05:02:38] iteration        6/       6 | elapsed time per iteration (ms): 1615.0 | throughput per GPU (TFLOP/s/GPU): 489.5 | lm loss: 1.6E+00 | tokens per second per GPU: 10144.7 |
    forward-backward ...............................: (1565.52, 1566.01)
    grads-reduce ...................................: (0.01, 0.02)
 [2026-11-30 05:02:38] exposed communication (share of the step's wall time, max over ranks): PP 2.1% | DP 0.0% |
[rank 0] (after 3 iterations) memory (MB) | allocated: 83558.3 | max allocated: 84678.8 | reserved: 84736.0
[rank 1] (after 3 iterations) memory (MB) | allocated: 77577.0 | max allocated: 78665.5 | reserved: 78752.0
LOG
MPI
chmod +x "$fake/mpirun"
out=$(PATH="$fake:$PATH" OUT="$fake" "$root/scripts/gpu-layouts.sh" "$build" llama8b "tp1 pp2" 2>&1)
rc=$?
echo "$out"
[[ $rc == 0 ]] || { echo "FAIL: exit $rc"; exit 1; }
grep -qE "^\| tp1 \| 1 \| .*\| [0-9]+ \(plan\) \| does not fit: plan > 130000 MiB \|" <<< "$out" ||
  { echo "FAIL: tp1 (8B on one GPU) should be listed as not fitting"; exit 1; }
row=$(grep "^| pp2 |" <<< "$out") || { echo "FAIL: no pp2 row"; exit 1; }
grep -qF "| pp2 | 2 | 10144.7 | 489.5 | 49.5% | 1565.52 | 0.01 | PP 2.1%, DP 0.0% | 84679 / " <<< "$row" ||
  { echo "FAIL: pp2 row: $row"; exit 1; }
bad=$(PATH="$fake:$PATH" OUT="$fake" "$root/scripts/gpu-layouts.sh" "$build" llama8b "tp2 tq2" 2>&1)
rc=$?
[[ $rc == 2 ]] || { echo "FAIL: exit $rc for a bad layout word"; exit 1; }
grep -q "'tq2' in layout 'tq2' is not tp<N>" <<< "$bad" || { echo "FAIL: message: $bad"; exit 1; }
[[ ! -e $fake/gpu-layouts-llama8b/tp2.log ]] || { echo "FAIL: ran tp2 before checking tq2"; exit 1; }
echo "ok: gpu-layouts"
