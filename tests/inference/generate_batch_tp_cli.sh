#!/usr/bin/env bash
# generate_batch_tp_cli.sh MEGATRON CKPT [MPIEXEC]: `megatron generate` with several prompts
# of different lengths at once (--micro-batch-size), and under mpirun with
# --tensor-model-parallel-size 2 (a checkpoint written at TP 1), prints the same text as
# the serial run one prompt at a time: greedy, and sampled with a seed.
set -eu
M=$1; C=$2; MPI=${3:-}
fail() { echo "FAIL: $*"; exit 1; }
# main() may log a one-time runtime notice ("> ...") on stdout; the text is the rest.
gen() { "$@" | grep -v '^> ' || true; }
P=(--prompt "1 2 3" --prompt "7 8 9 10 11 12 13" --prompt "4" --prompt "20 21 22 23")
for mode in greedy sampled; do
  if [ $mode = greedy ]; then S=(--greedy); else S=(--seed 5 --temperature 1.3 --top-k 30); fi
  A=(generate --load "$C" "${P[@]}" "${S[@]}" --num-tokens-to-generate 10 --ignore-eod)
  one=$(gen "$M" "${A[@]}" 2>err1.txt) || true
  [ "$(wc -l <<<"$one")" -eq 4 ] || { cat err1.txt; fail "$mode serial: expected 4 lines: $one"; }
  echo "serial, one at a time ($mode):"; echo "$one"
  batch=$(gen "$M" "${A[@]}" --micro-batch-size 3 2>err2.txt) || true
  [ "$one" = "$batch" ] || { cat err2.txt; echo "$batch"; fail "$mode: batch of 3 differs"; }
  grep -q "micro-batch 3" err2.txt || fail "the batch size is not reported"
  if [ -n "$MPI" ]; then
    tp=$(gen $MPI -np 2 "$M" "${A[@]}" --micro-batch-size 4 \
         --tensor-model-parallel-size 2 2>err3.txt) || true
    [ "$one" = "$tp" ] || { cat err3.txt; echo "$tp"; fail "$mode: TP 2 differs"; }
    [ "$(grep -c '\] total:' err3.txt)" -eq 1 ] || fail "only rank 0 reports"
  fi
done
if [ -n "$MPI" ]; then
  # Two processes without --tensor-model-parallel-size 2: a clear error, not a hang.
  if $MPI -np 2 "$M" generate --load "$C" --prompt "1 2" >/dev/null 2>err4.txt; then
    fail "two processes at TP 1 must fail"
  fi
  grep -q "2 processes but --tensor-model-parallel-size 1" err4.txt || {
    cat err4.txt; fail "no clear error for the process count"; }
fi
echo ok
