#!/usr/bin/env bash
# muon.sh MEGATRON [MPIRUN...]: --optimizer muon end to end on the CPU:
#   - the start-up line names the matrices Muon steps and the scalar rule; the loss falls;
#     likewise with --optimizer adaptive_muon;
#   - a checkpoint of Muon's state is refused by --optimizer adam and by Muon with another
#     scalar rule (the state differs), each error naming both;
#   - Megatron's combinations that are errors (or not implemented here) fail at start-up
#     naming the flag; --optimizer dist_muon means Muon with the distributed optimizer;
#   - with MPIRUN: TP 2 with --muon-tp-mode blockwise (each rank's shard orthogonalised
#     alone) trains differently from duplicated (the whole matrix, as without TP), whose
#     losses equal the serial run's to the log's digits (the tests parallel_equiv.muon.*
#     compare every layout to 1e-5).
set -euo pipefail
M=$1; shift
MPIRUN=("$@")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
  --global-batch-size 8 --lr 3e-3 --lr-warmup-iters 2 --lr-decay-style cosine --log-interval 1
  --threads 1 --swiglu --normalization RMSNorm --position-embedding-type rope
  --disable-bias-linear --optimizer muon)
fail() { echo "FAIL: $*"; exit 1; }
run() { local log=$1; shift; "$M" train "${ARGS[@]}" "$@" > "$log" 2>&1 ||
  { tail -20 "$log"; fail "train $*"; }; }
loss() { grep -E "iteration +$2/" "$1" | sed -E 's/.*lm loss: *([^ |]+) *\|.*/\1/'; }
refused() {  # refused TEXT FLAGS...: the run fails at start-up and its error holds TEXT
  local want=$1; shift
  if "$M" train "${ARGS[@]}" --train-iters 2 "$@" > "$W/e.log" 2>&1; then
    fail "accepted $*"; fi
  grep -qF -- "$want" "$W/e.log" || { cat "$W/e.log"; fail "error for $*: no '$want'"; }
}
run "$W/a.log" --train-iters 30 --save "$W/ck" --save-interval 30
grep -qE "> optimizer: Muon for 8 matrices \([0-9]+ parameters on this rank; 5 Newton-Schulz \
steps, quintic, bf16 GEMMs, tp mode duplicated\), adam for the other [0-9]+ parameters" \
  "$W/a.log" || { grep optimizer "$W/a.log"; fail "no start-up line"; }
python3 - "$(loss "$W/a.log" 1)" "$(loss "$W/a.log" 30)" <<'PY' || fail "loss did not fall"
import sys
first, last = map(float, sys.argv[1:])
print(f"lm loss {first} -> {last}")
sys.exit(0 if last < first - 0.5 else 1)
PY
# The checkpoint holds Muon's state: another optimizer's run refuses it.
if "$M" train "${ARGS[@]}" --optimizer adam --train-iters 32 --load "$W/ck" > "$W/r.log" 2>&1
then fail "adam loaded Muon's state"; fi
grep -qF "holds the state of the muon optimizer; this run uses --optimizer adam" "$W/r.log" ||
  { tail -5 "$W/r.log"; fail "adam's error"; }
if "$M" train "${ARGS[@]}" --muon-scalar-optimizer lion --train-iters 32 --load "$W/ck" \
  > "$W/r.log" 2>&1; then fail "Muon with Lion loaded Muon with Adam's state"; fi
grep -qF "holds the state of the muon optimizer; this run uses --optimizer muon_lion" "$W/r.log" ||
  { tail -5 "$W/r.log"; fail "muon_lion's error"; }
run "$W/lion.log" --train-iters 3 --muon-scalar-optimizer lion --muon-coefficient-type cubic5
grep -qF "cubic5, bf16 GEMMs, tp mode duplicated), lion for the other" "$W/lion.log" ||
  fail "lion start-up line"
# Megatron's deprecated --optimizer dist_muon: Muon with the distributed optimizer, said so;
# one rank's distributed optimizer steps the matrices as the plain optimizer does.
run "$W/plain.log" --train-iters 3
run "$W/dist.log" --train-iters 3 --optimizer dist_muon
grep -qF "WARNING: --optimizer dist_muon is deprecated in Megatron-LM: it means --optimizer \
muon --use-distributed-optimizer" "$W/dist.log" || fail "no dist_muon warning"
grep -qF "tp mode duplicated; distributed: each matrix orthogonalised by one data-parallel \
rank), adam for the other" "$W/dist.log" || { grep optimizer "$W/dist.log"; fail "dist line"; }
[ "$(loss "$W/dist.log" 3)" = "$(loss "$W/plain.log" 3)" ] ||
  fail "dist_muon $(loss "$W/dist.log" 3) vs muon $(loss "$W/plain.log" 3)"
# --optimizer adaptive_muon: its start-up line, a falling loss, its state (the second moment
# beside the momentum) its own in checkpoints.
run "$W/ada.log" --train-iters 30 --optimizer adaptive_muon --save "$W/ack" --save-interval 30
grep -qE "> optimizer: adaptive Muon \(AdaMuon: second moment beta2 0.95, eps 1e-08\) for 8 \
matrices" "$W/ada.log" || { grep optimizer "$W/ada.log"; fail "adaptive start-up line"; }
python3 - "$(loss "$W/ada.log" 1)" "$(loss "$W/ada.log" 30)" <<'PY' || fail "adaptive: no fall"
import sys
first, last = map(float, sys.argv[1:])
print(f"adaptive_muon lm loss {first} -> {last}")
sys.exit(0 if last < first - 0.5 else 1)
PY
if "$M" train "${ARGS[@]}" --train-iters 32 --load "$W/ack" > "$W/r.log" 2>&1
then fail "muon loaded adaptive Muon's state"; fi
grep -qF "holds the state of the adaptive_muon optimizer; this run uses --optimizer muon" \
  "$W/r.log" || { tail -5 "$W/r.log"; fail "muon's error on adaptive state"; }
refused "--muon-use-syrk (a Triton SYRK kernel for the Gram matrix) is not implemented yet" \
  --muon-use-syrk
refused "cubic5 is a fixed 5-step schedule; got --muon-num-ns-steps 4" \
  --muon-coefficient-type cubic5 --muon-num-ns-steps 4
refused "--muon-fp32-matmul-prec low" --muon-fp32-matmul-prec low
refused "--muon-scalar-optimizer: 'sgd' is not one of adam, lion" --muon-scalar-optimizer sgd
refused "--muon-num-ns-steps 0 must be at least 1" --muon-num-ns-steps 0
if [ ${#MPIRUN[@]} -gt 0 ]; then
  run "$W/s.log" --train-iters 6 --muon-fp32-matmul-prec high
  for mode in duplicated blockwise; do
    "${MPIRUN[@]}" -np 2 "$M" train "${ARGS[@]}" --train-iters 6 --muon-fp32-matmul-prec high \
      --tensor-model-parallel-size 2 --muon-tp-mode $mode > "$W/$mode.log" 2>&1 ||
      { tail -20 "$W/$mode.log"; fail "TP 2 $mode"; }
  done
  [ "$(loss "$W/duplicated.log" 6)" = "$(loss "$W/s.log" 6)" ] ||
    fail "duplicated TP 2 $(loss "$W/duplicated.log" 6) vs serial $(loss "$W/s.log" 6)"
  [ "$(loss "$W/blockwise.log" 6)" != "$(loss "$W/duplicated.log" 6)" ] ||
    fail "blockwise equals duplicated: the mode had no effect"
  echo "ok: TP 2 duplicated = serial, blockwise differs"
fi
echo "ok: Muon trains, its state is its own in checkpoints, its errors name their flags"
