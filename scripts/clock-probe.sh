#!/usr/bin/env bash
# Runs a command while sampling the GPU's SM clock, power and clock-event reasons, then
# prints what the GPU ran at while the command was busy (samples with utilisation >= 50%).
# Used to tell a slower kernel from a slower clock: the same GEMM runs up to 15% faster
# isolated than inside a training step (bench/RESULTS.md, session 4).
#
# Usage: scripts/clock-probe.sh LABEL command args...   (env: GPU=0, PERIOD_MS=50)
set -u
label=$1; shift
gpu=${GPU:-0}
log=$(mktemp)
fields=clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
reason=clocks_event_reasons.active
nvidia-smi -i "$gpu" --query-gpu=$reason --format=csv,noheader >/dev/null 2>&1 ||
  reason=clocks_throttle_reasons.active
nvidia-smi -i "$gpu" --query-gpu=$fields,$reason --format=csv,noheader,nounits \
  -lms "${PERIOD_MS:-50}" > "$log" 2>/dev/null &
smi=$!
"$@"
rc=$?
kill $smi 2>/dev/null; wait $smi 2>/dev/null
# Columns: sm MHz, mem MHz, W, C, util %, reasons (bitmask). Reasons: 0x4 SW power cap,
# 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake, 0x1 idle.
awk -F', *' -v label="$label" '
  $5 + 0 >= 50 { n++; sm += $1; w += $3; if (!min || $1 < min) min = $1; if ($1 > max) max = $1;
                 if ($4 > tmax) tmax = $4; r[$6]++ }
  END { if (!n) { printf "| %s | no busy samples | | | | |\n", label; exit }
        rs = ""; for (k in r) rs = rs sprintf("%s %.0f%% ", k, 100 * r[k] / n)
        printf "| %s | %d | %.0f (%d-%d) | %.0f | %d | %s|\n", label, n, sm / n, min, max, w / n, tmax, rs }' "$log"
rm -f "$log"
exit $rc
