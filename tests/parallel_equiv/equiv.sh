#!/usr/bin/env bash
# equiv.sh MODE ...: the parallel-equivalence checks (see CMakeLists.txt).
#   serial WORK FAMILY MEGATRON FLAGS...          reference run: WORK/FAMILY/serial.{log,ckpt}
#   parallel WORK FAMILY NAME NP MEGATRON COMPARE MPIRUN... -- FLAGS... -- PARALLEL_FLAGS...
#       runs `MPIRUN -np NP MEGATRON train FLAGS PARALLEL_FLAGS`; its per-iteration lm loss
#       (and a MoE model's logged aux losses) must equal the serial run's within 1e-5 relative, and its final checkpoint (all
#       parameters, both Adam moments, read back at TP 1) too.
#   resume (same arguments) [-- RESUME_NP RESUME_FLAGS...]
#       runs the parallel layout to iteration 10 (--exit-interval 10, saving), then resumes
#       to 20 as one process without PARALLEL_FLAGS (or under MPIRUN -np RESUME_NP with
#       RESUME_FLAGS): iterations 11-20 and the final checkpoint must match the serial run.
#   exact (as parallel)
#       as parallel, then the layout again to iteration 10 (--exit-interval 10, saving),
#       resumed under the same layout to 20: iterations 11-20 must log the straight run's lm
#       loss and grad norm exactly, and the two final checkpoints must be equal bit for bit.
#   EQUIV_EXPECT (parallel mode): a string the parallel run's log must contain (what rank 0
#       says it holds), for layouts whose mistakes the serial comparison cannot see.
#   same (as parallel) -- EXTRA_FLAGS...
#       runs the parallel layout twice, without and with EXTRA_FLAGS, a setting that must
#       not change a bit (--keep-mlp-activations): the same lm loss lines, and final
#       checkpoints equal bit for bit (COMPARE with tolerance 0).
set -euo pipefail
RTOL=1e-5
# The final checkpoints' tolerance (EQUIV_CKPT_RTOL, default RTOL): looser only for state
# kept in bf16, whose roundings turn the layouts' last-bit differences into bf16 steps.
CKPT_RTOL=${EQUIV_CKPT_RTOL:-$RTOL}
losses() {  # losses LOG [FIELD]: "iteration value" per logged iteration (FIELD: lm loss)
  local f=${2:-lm loss}
  grep -Eo "iteration +[0-9]+/ *[0-9]+ \|.*\| $f: [0-9.E+-]+" "$1" |
    sed -E "s/iteration +([0-9]+)\/.*\| $f: ([0-9.E+-]+)/\1 \2/"; }
compare_losses() {  # compare_losses REF_LOG LOG [FIRST_ITER [FIELD]]
  local first=${3:-1} field=${4:-lm loss}
  join <(losses "$1" "$field" | awk -v f="$first" '$1>=f' | sort -k1,1) \
       <(losses "$2" "$field" | awk -v f="$first" '$1>=f' | sort -k1,1) |
  awk -v tol=$RTOL -v first="$first" -v field="$field" '
    { n++; d = $2 - $3; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; r = d / m;
      if (r > worst) worst = r;
      if (r > tol) { bad++; printf "FAIL: iteration %d: %s %s vs serial %s (relative %.2e)\n", $1, field, $3, $2, r } }
    END { if (n < 10) { printf "FAIL: only %d iterations (from %d) of %s to compare\n", n, first, field; exit 1 }
          printf "%s: %d iterations of %s, worst relative difference %.2e\n", bad ? "FAIL" : "ok", n, field, worst;
          exit bad ? 1 : 0 }'
}
mode=$1; shift
case $mode in
serial)
  work=$1 family=$2 meg=$3; shift 3
  d=$work/$family; rm -rf "$d/serial.ckpt"; mkdir -p "$d"
  "$meg" train "$@" --save "$d/serial.ckpt" > "$d/serial.log" 2>&1 || { cat "$d/serial.log"; exit 1; }
  losses "$d/serial.log" | tail -3
  ;;
parallel|resume|same|exact)
  work=$1 family=$2 name=$3 np=$4 meg=$5 cmp=$6; shift 6
  mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
  flags=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  par=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do par+=("$1"); shift; done
  resume=(); resume_np=1 extra=()
  if [ $# -gt 0 ] && [ $mode = same ]; then shift; extra=("$@");
  elif [ $# -gt 0 ]; then shift; resume_np=$1; shift; resume=("$@"); fi
  d=$work/$family; out=$d/$name; rm -rf "$out.ckpt"
  if [ $mode = same ]; then
    mkdir -p "$d"; rm -rf "$out.ref.ckpt"
    "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" --save "$out.ref.ckpt" \
      > "$out.ref.log" 2>&1 || { cat "$out.ref.log"; exit 1; }
    "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" "${extra[@]}" --save "$out.ckpt" \
      > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
    n=$(losses "$out.ref.log" | wc -l)
    if [ "$n" -lt 10 ] || [ "$(losses "$out.ref.log")" != "$(losses "$out.log")" ]; then
      echo "FAIL: lm losses without / with ${extra[*]} ($n iterations):"
      paste <(losses "$out.ref.log") <(losses "$out.log"); exit 1
    fi
    echo "ok: $n iterations of lm loss identical without and with ${extra[*]}"
    exec "$cmp" "$out.ref.ckpt" "$out.ckpt" 0
  fi
  [ -f "$d/serial.log" ] || { echo "FAIL: no serial reference in $d (run the serial fixture)"; exit 1; }
  if [ $mode = parallel ] || [ $mode = exact ]; then
    "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" --save "$out.ckpt" > "$out.log" 2>&1 ||
      { cat "$out.log"; exit 1; }
    compare_losses "$d/serial.log" "$out.log"
    if [ -n "${EQUIV_EXPECT:-}" ]; then
      grep -qF -- "$EQUIV_EXPECT" "$out.log" ||
        { echo "FAIL: the log lacks '$EQUIV_EXPECT'"; exit 1; }
      echo "ok: the log says '$EQUIV_EXPECT'"
    fi
    # MoE and MTP: the logged aux and MTP losses too (summed over CP, averaged over DP as one
    # process logs them)
    for f in load_balancing_loss seq_load_balancing_loss global_load_balancing_loss z_loss \
             "mtp_1 loss" "mtp_2 loss"; do
      grep -q "| $f: " "$d/serial.log" && compare_losses "$d/serial.log" "$out.log" 1 "$f"
    done
    if [ $mode = exact ]; then
      stop=$out.stop; rm -rf "$stop.ckpt"
      "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" --save "$stop.ckpt" \
        --exit-interval 10 > "$stop.log" 2>&1 || { cat "$stop.log"; exit 1; }
      "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" --load "$stop.ckpt" \
        --save "$stop.ckpt" > "$stop.resumed.log" 2>&1 || { cat "$stop.resumed.log"; exit 1; }
      grep -q "successfully loaded checkpoint" "$stop.resumed.log" ||
        { echo "FAIL: did not load"; exit 1; }
      for f in "lm loss" "grad norm" "mtp_1 loss"; do
        grep -q "| $f: " "$out.log" || continue
        a=$(losses "$out.log" "$f" | awk '$1>10'); b=$(losses "$stop.resumed.log" "$f")
        if [ "$(wc -l <<<"$a")" -ne 10 ] || [ "$a" != "$b" ]; then
          echo "FAIL: $f of iterations 11-20, straight / resumed:"
          paste <(echo "$a") <(echo "$b"); exit 1
        fi
      done
      echo "ok: iterations 11-20 resumed under the same layout log the same lm loss and grad norm"
      "$cmp" "$out.ckpt" "$stop.ckpt" 0
    fi
  else
    "${mpirun[@]}" -np "$np" "$meg" train "${flags[@]}" "${par[@]}" --save "$out.ckpt" --exit-interval 10 \
      > "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
    launch=("$meg"); [ "$resume_np" -gt 1 ] && launch=("${mpirun[@]}" -np "$resume_np" "$meg")
    "${launch[@]}" train "${flags[@]}" "${resume[@]}" --load "$out.ckpt" --save "$out.ckpt" \
      > "$out.resumed.log" 2>&1 || { cat "$out.resumed.log"; exit 1; }
    grep -q "successfully loaded checkpoint" "$out.resumed.log" || { echo "FAIL: did not load"; exit 1; }
    compare_losses "$d/serial.log" "$out.resumed.log" 11
  fi
  "$cmp" "$d/serial.ckpt" "$out.ckpt" $CKPT_RTOL
  ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
