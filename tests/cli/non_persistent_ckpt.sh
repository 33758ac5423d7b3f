#!/usr/bin/env bash
# non_persistent_ckpt.sh MEGATRON [EXTRA FLAGS...]: Megatron's non-persistent checkpoints
# (--non-persistent-save-interval 3 --non-persistent-ckpt-type global) beside persistent
# ones every 10 iterations, 20 iterations, dropout on:
#   * <save>/non_persistent ends holding only iteration 18 (its tracker naming it), while
#     --save keeps 10 and 20 (a persistent save takes the iteration: none at 10 or 20 there);
#   * a crash after the non-persistent save of 18 (iteration 20 of --save gone, its tracker
#     back at 10): --load resumes from the non-persistent 18, and iterations 19-20 and the
#     final weights and optimizer state equal the straight run's, bit for bit;
#   * --ckpt-step 10 loads --load's own iteration 10; a persistent checkpoint newer than the
#     non-persistent one wins, with Megatron's warning; --non-persistent-global-ckpt-dir
#     elsewhere is written and read there;
#   * the start-up errors (interval without a type or --save, local / in_memory, the
#     folder being --save's own).
set -euo pipefail
M=$1; shift
EXTRA=("$@")  # e.g. --async-save, --ckpt-format torch
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
COMMON=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2
  --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --lr-decay-style cosine
  --lr-warmup-iters 3 --hidden-dropout 0.1 --attention-dropout 0.1 --log-interval 1
  --threads 1 --save-interval 10 "${EXTRA[@]}")
NP=(--non-persistent-save-interval 3 --non-persistent-ckpt-type global)
run() {  # log, flags...
  local log=$1; shift
  "$M" train "${COMMON[@]}" "$@" > "$log" 2>&1 || { echo "run failed: $*"; cat "$log"; exit 1; }
}
iters() { (cd "$1" && ls -d iter_* 2>/dev/null | tr '\n' ' '); }
pick() {  # iteration lines $2..20 without time-dependent fields
  grep -E "iteration +[0-9]+/" "$1" | awk -v lo="$2" '{ split($0, a, /iteration +/);
    split(a[2], b, "/"); if (b[1] + 0 >= lo) print }' |
    sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \|//;
            s/tokens per second per GPU: [0-9.]+ \|//'
}

run "$W/a.log" --train-iters 20 --save "$W/A" "${NP[@]}"
[ "$(iters "$W/A/non_persistent")" = "iter_0000018 " ] ||
  { echo "non_persistent holds: $(iters "$W/A/non_persistent")"; exit 1; }
[ "$(cat "$W/A/non_persistent/latest_checkpointed_iteration.txt")" = 18 ] ||
  { echo "non-persistent tracker: $(cat "$W/A/non_persistent/latest_checkpointed_iteration.txt")"; exit 1; }
[ "$(iters "$W/A")" = "iter_0000010 iter_0000020 " ] ||
  { echo "--save holds: $(iters "$W/A")"; exit 1; }
n=$(grep -c "successfully deleted checkpoint" "$W/a.log" || true)
[ "$n" -eq 5 ] || { echo "expected 5 deletions (3, 6, 9, 12, 15), saw $n"; exit 1; }

# The crash: --save lost iteration 20 and names 10 again; the non-persistent 18 survives.
cp -a "$W/A" "$W/B"
rm -rf "$W/B/iter_0000020"
echo 10 > "$W/B/latest_checkpointed_iteration.txt"
run "$W/b.log" --train-iters 20 --save "$W/B" --load "$W/B" "${NP[@]}"
grep -q "resuming from the non-persistent checkpoint of iteration 18" "$W/b.log" ||
  { echo "did not resume from the non-persistent checkpoint"; cat "$W/b.log"; exit 1; }
grep -q "successfully loaded checkpoint from $W/B/non_persistent \[ iteration 18 \]" "$W/b.log" ||
  { echo "did not load iteration 18"; grep -i "load" "$W/b.log"; exit 1; }
if ! diff <(pick "$W/a.log" 19) <(pick "$W/b.log" 19); then echo "resumed losses differ"; exit 1; fi
[ "$(pick "$W/b.log" 1 | wc -l)" -eq 2 ] || { echo "expected iterations 19-20 only"; exit 1; }
for f in "$W"/A/iter_0000020/*; do
  [ -f "$f" ] || continue
  case "$(basename "$f")" in metadata.json|*.txt) continue ;; esac
  cmp "$f" "$W/B/iter_0000020/$(basename "$f")" || { echo "final $(basename "$f") differs"; exit 1; }
done
for f in "$W"/A/iter_0000020/mp_rank_*/*; do  # the legacy layout's files
  [ -f "$f" ] || continue
  rel=${f#"$W/A/"}
  cmp "$f" "$W/B/$rel" || { echo "final $rel differs"; exit 1; }
done

# --ckpt-step: --load's own iteration, not the non-persistent folder.
run "$W/c.log" --train-iters 20 --exit-interval 11 --save "$W/C" --load "$W/B" --ckpt-step 10 "${NP[@]}"
grep -q "successfully loaded checkpoint from $W/B \[ iteration 10 \]" "$W/c.log" ||
  { echo "--ckpt-step 10 did not load --load's iteration 10"; grep -i load "$W/c.log"; exit 1; }
# A persistent checkpoint newer than the non-persistent one wins.
run "$W/d.log" --train-iters 20 --save "$W/D" --load "$W/A" "${NP[@]}"
grep -q "non-persistent checkpoints are older than persistent checkpoint" "$W/d.log" ||
  { echo "no warning about the older non-persistent checkpoint"; exit 1; }
grep -q "successfully loaded checkpoint from $W/A \[ iteration 20 \]" "$W/d.log" ||
  { echo "did not load the persistent 20"; exit 1; }
# A folder of their own, elsewhere: written there, and read back from there.
run "$W/e.log" --train-iters 8 --save "$W/E" "${NP[@]}" --non-persistent-global-ckpt-dir "$W/np"
[ "$(iters "$W/np")" = "iter_0000006 " ] || { echo "$W/np holds: $(iters "$W/np")"; exit 1; }
[ ! -e "$W/E/non_persistent" ] || { echo "wrote <save>/non_persistent too"; exit 1; }
rm -rf "$W/E"
run "$W/f.log" --train-iters 8 --save "$W/E" --load "$W/E" "${NP[@]}" \
  --non-persistent-global-ckpt-dir "$W/np"
grep -q "successfully loaded checkpoint from $W/np \[ iteration 6 \]" "$W/f.log" ||
  { echo "did not load from --non-persistent-global-ckpt-dir"; grep -i load "$W/f.log"; exit 1; }

# Start-up errors, each naming the flag.
expect_error() {  # expected text, flags...
  local want=$1; shift
  local out rc
  out=$("$M" train "${COMMON[@]}" --train-iters 20 "$@" 2>&1) && rc=0 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -gt 128 ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "expected an error with '$want' (exit $rc) for: $*"; echo "$out" | tail -3; exit 1
  fi
}
expect_error "given without --non-persistent-ckpt-type" --save "$W/G" \
  --non-persistent-save-interval 3
expect_error "given without --save" --non-persistent-save-interval 3 \
  --non-persistent-ckpt-type global
expect_error "--non-persistent-ckpt-type local" --save "$W/G" "${NP[@]/global/local}"
expect_error "--non-persistent-ckpt-type in_memory is not implemented" --save "$W/G" \
  --non-persistent-save-interval 3 --non-persistent-ckpt-type in_memory
expect_error "is the --save folder" --save "$W/G" "${NP[@]}" \
  --non-persistent-global-ckpt-dir "$W/G/"
expect_error "--non-persistent-global-ckpt-dir $W/x given without" \
  --non-persistent-global-ckpt-dir "$W/x"
expect_error "no non-persistent checkpoint would be written or read" \
  --non-persistent-ckpt-type global
[ ! -e "$W/G" ] || { echo "a refused run wrote $W/G"; exit 1; }
echo "ok: non-persistent checkpoints kept newest only, resumed bit for bit from them${EXTRA:+ (${EXTRA[*]})}"
