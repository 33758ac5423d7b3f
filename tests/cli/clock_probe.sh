#!/usr/bin/env bash
# scripts/clock-probe.sh against a fake nvidia-smi (the CPU machines have none): it runs
# the command, passes its exit status through, and prints one table row from the busy
# samples (utilisation >= 50%): mean, min and max SM clock, mean power, max temperature,
# and the share of each clock-event reason.
set -u
root=$1
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
# Samples: clocks.sm, clocks.mem, power.draw, temperature.gpu, utilization.gpu, reasons.
cat > "$fake/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
[[ "$*" == *-lms* ]] || exit 0
while true; do
  # The two busy samples in one write, so a kill never leaves their counts unequal.
  printf '1400, 2619, 600.0, 50, 100, 0x0000000000000004\n1600, 2619, 700.0, 60, 100, 0x0000000000000000\n'
  echo "1980, 2619, 90.0, 40, 0, 0x0000000000000001"
  sleep 0.02
done
SMI
chmod +x "$fake/nvidia-smi"
out=$(PATH="$fake:$PATH" "$root/scripts/clock-probe.sh" "busy run" sleep 0.6)
rc=$?
echo "$out"
[[ $rc == 0 ]] || { echo "FAIL: exit $rc for a command that succeeded"; exit 1; }
row=$(grep "^| busy run |" <<< "$out") || { echo "FAIL: no row"; exit 1; }
# Idle samples (utilisation 0, 1980 MHz) are left out: mean 1500 of 1400 and 1600.
grep -q "| 1500 (1400-1600) | 650 | 60 |" <<< "$row" || { echo "FAIL: wrong numbers: $row"; exit 1; }
grep -q "0x0000000000000004 50%" <<< "$row" || { echo "FAIL: reasons: $row"; exit 1; }
PATH="$fake:$PATH" "$root/scripts/clock-probe.sh" "failing run" false > /dev/null
rc=$?
[[ $rc == 1 ]] || { echo "FAIL: exit $rc for a command that failed with 1"; exit 1; }
echo "ok: clock-probe"
