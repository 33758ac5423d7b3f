#!/usr/bin/env bash
# ckpt_convert.sh MEGATRON: Megatron's checkpoint conversion (--ckpt-convert-format F
# --ckpt-convert-save DIR): load --load, save it as F in DIR/F, exit without training.
#   * torch_dist (iteration 6 of a 12-iteration run, dropout on) -> torch -> torch_dist: each
#     conversion writes DIR/F/iter_0000006 in F's layout, trains nothing, says so;
#   * resuming from either converted checkpoint gives iterations 7-12 equal, bit for bit, to
#     the uninterrupted run's;
#   * errors: no --ckpt-convert-save, --ckpt-convert-save alone, an unknown format, a --load
#     holding nothing (an error, not random weights).
set -euo pipefail
M=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2
  --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --lr-decay-style cosine
  --lr-warmup-iters 3 --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1
  --threads 1 --train-iters 12)
run() {  # log, flags...
  local log=$1; shift
  "$M" train "${COMMON[@]}" "$@" > "$log" 2>&1 || { echo "run failed: $*"; cat "$log"; exit 1; }
}
pick() {  # iteration lines 7-12 without time-dependent fields
  grep -E "iteration +([7-9]|1[0-2])/" "$1" |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//;
            s/tokens per second per GPU: [0-9.]+ \|//'
}

run "$W/a.log"
run "$W/s.log" --save "$W/S" --exit-interval 6
run "$W/c1.log" --load "$W/S" --ckpt-convert-format torch --ckpt-convert-save "$W/C1" \
  --save "$W/ignored"
grep -q "> converted checkpoint: torch_dist -> torch." "$W/c1.log" ||
  { echo "no conversion line"; cat "$W/c1.log"; exit 1; }
grep -q "is replaced by $W/C1/torch" "$W/c1.log" || { echo "no --save warning"; exit 1; }
[ -f "$W/C1/torch/iter_0000006/mp_rank_00/model_optim_rng.pt" ] ||
  { echo "no legacy checkpoint in $W/C1/torch"; find "$W/C1"; exit 1; }
[ "$(cat "$W/C1/torch/latest_checkpointed_iteration.txt")" = 6 ] || { echo "tracker"; exit 1; }
[ ! -e "$W/ignored" ] || { echo "--save was written"; exit 1; }
if grep -qE "iteration +[0-9]+/" "$W/c1.log"; then echo "the conversion trained"; exit 1; fi
run "$W/c2.log" --load "$W/C1/torch" --ckpt-convert-format torch_dist --ckpt-convert-save "$W/C2"
grep -q "> converted checkpoint: torch -> torch_dist." "$W/c2.log" ||
  { echo "no conversion line (back)"; cat "$W/c2.log"; exit 1; }
[ -f "$W/C2/torch_dist/iter_0000006/metadata.json" ] || { echo "no torch_dist checkpoint"; exit 1; }

for d in "$W/C1/torch" "$W/C2/torch_dist"; do
  run "$W/r.log" --load "$d" --save "$W/R"
  grep -q "successfully loaded checkpoint from $d \[ iteration 6 \]" "$W/r.log" ||
    { echo "did not resume from $d"; grep -i load "$W/r.log"; exit 1; }
  if ! diff <(pick "$W/a.log") <(pick "$W/r.log"); then echo "resumed from $d: differs"; exit 1; fi
  [ "$(pick "$W/r.log" | wc -l)" -eq 6 ] || { echo "expected iterations 7-12"; exit 1; }
  rm -rf "$W/R"
done

expect_error() {  # expected text, flags...
  local want=$1; shift
  local out rc
  out=$("$M" train "${COMMON[@]}" "$@" 2>&1) && rc=0 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -gt 128 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "expected an error with '$want' (exit $rc) for: $*"; echo "$out" | tail -3; exit 1
  fi
}
expect_error "needs --ckpt-convert-save" --load "$W/S" --ckpt-convert-format torch
expect_error "--ckpt-convert-save $W/x given without --ckpt-convert-format" --load "$W/S" \
  --ckpt-convert-save "$W/x"
expect_error "torch_dcp" --load "$W/S" --ckpt-convert-format torch_dcp --ckpt-convert-save "$W/x"
expect_error "no checkpoint to convert in --load $W/empty" --load "$W/empty" \
  --ckpt-convert-format torch --ckpt-convert-save "$W/x"
[ ! -e "$W/x" ] || { echo "a refused conversion wrote $W/x"; exit 1; }
echo "ok: torch_dist -> torch -> torch_dist, each resumed bit for bit"
