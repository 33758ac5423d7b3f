#!/usr/bin/env bash
# ep_equiv.sh EQUIV WORK FAMILY NAME NP MEGATRON COMPARE MPIRUN... -- FLAGS... -- PARALLEL_FLAGS...
# The expert-parallel equivalence check: `EQUIV parallel ...` (tests/parallel_equiv/equiv.sh:
# per-step lm loss and the final checkpoint against the serial run), then the log line's
# other global values, which EP must also reproduce: the grad norm (expert gradients counted
# once per EP rank; printed with 3 decimals, so within 1.5e-3) and the aux / z losses
# (load_balancing_loss, seq_load_balancing_loss, global_load_balancing_loss, z_loss: within
# 1e-5 relative).
set -euo pipefail
equiv=$1; shift
"$equiv" parallel "$@"
work=$1 family=$2 name=$3
ref=$work/$family/serial.log log=$work/$family/$name.log
field() {  # field LOG NAME: "iteration value" per logged iteration
  grep -E 'iteration +[0-9]+/' "$1" | sed -nE "s/.*iteration +([0-9]+)\/.*\| $2: ([0-9.E+-]+) \|.*/\1 \2/p"; }
for f in "grad norm" load_balancing_loss seq_load_balancing_loss global_load_balancing_loss \
         z_loss; do
  n=$(field "$ref" "$f" | wc -l)
  [ "$n" -eq 0 ] && continue
  join <(field "$ref" "$f" | sort -k1,1) <(field "$log" "$f" | sort -k1,1) |
  awk -v f="$f" -v n="$n" '
    { m++; d = $2 - $3; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2;
      bad_here = f == "grad norm" ? d > 1.5e-3 : d > 1e-5 * a;
      if (bad_here) { bad++; printf "FAIL: iteration %d: %s %s vs serial %s\n", $1, f, $3, $2 } }
    END { if (m != n) { printf "FAIL: %s: %d of %d iterations logged\n", f, m, n; exit 1 }
          printf "%s: %d iterations of %s\n", bad ? "FAIL" : "ok", m, f; exit bad ? 1 : 0 }'
done
