#!/usr/bin/env bash
# fully_parallel_ckpt.sh MEGATRON MPIRUN...: Megatron's fully parallel checkpoint save (the
# default) and --ckpt-fully-parallel-load under mpirun, at DP2 (Adam moments laid out like
# the parameters), TP2 x DP2 with the distributed optimizer, and a MoE model at CP2 x DP2 x
# EP2 (the DP x CP group of 4 holds the dense tensors on all 4 ranks, each expert on 2; the
# router's expert bias is a buffer). For each layout:
#   * U runs 8 iterations with --no-ckpt-fully-parallel-save (DP rank 0 writes the model)
#     and saves at 4 and 8; P stops at 4 with the default, fully parallel save: every rank
#     wrote a model file of P, and every tensor's bytes (checksums, boxes) are U's;
#   * resumed at 4 -- from P with and without --ckpt-fully-parallel-load, and from U's
#     checkpoint with it -- iterations 5-8 log exactly as U's;
#   * with the flag each rank reads from storage a share (at most 3/4) of the tensor bytes it
#     reads without it; at DP2 and TP2 x DP2, where the replicas need the same tensors, the
#     shares of all ranks add up to the whole read once per replica group.
# At DP2 also: a corrupt tensor fails the load under the flag. At TP2 x DP2 also:
# --async-save both ways writes the same files as the synchronous save of that kind, and one
# process (TP1, DP1) loads P and U's checkpoint to the same next step.
set -euo pipefail
M=$1; shift
MPI=("$@")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
F=(--mock-data --tokenizer-type NullTokenizer --vocab-size 512 --num-layers 2 --hidden-size 32
   --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --train-iters 8 --log-interval 1 --threads 1 --device cpu)
source "$(dirname "$0")/train_log_lib.sh"  # run
pick() {  # iterations 5-8 without the time-dependent fields
  grep -E "iteration +[5-8]/" "$1" | sed -E 's/^ \[[^]]*\]//;
    s/elapsed time per iteration \(ms\): [0-9.]+ \|//; s/tokens per second per GPU: [0-9.]+ \|//'
}
# Bytes of tensor data each rank read from storage, by rank (one number a line); $2: what
# precedes "read N bytes" (ranks share stdout: a line may follow another rank's partial one).
bytes_read() {
  { grep -oE "\[rank [0-9]+\] +$2read [0-9]+ bytes of tensor data" "$1" || true; } |
    sed -E 's/^\[rank ([0-9]+)\].* read ([0-9]+) bytes.*/\1 \2/' | sort -n | awk '{print $2}'
}
same_tensors() {  # the two checkpoints' tensors: the same shards, boxes and checksums
  python3 - "$1" "$2" <<'PY'
import json, sys
def shards(d):
    md = json.load(open(d + "/metadata.json"))
    out = {}
    for k, t in md["tensors"].items():
        out[k] = sorted(json.dumps({a: b for a, b in s.items() if a != "file"}, sort_keys=True)
                        for s in t["shards"])
    return out
a, b = shards(sys.argv[1]), shards(sys.argv[2])
bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
if bad:
    sys.exit(f"tensors differ: {bad[:5]} ({len(bad)})")
PY
}

layout() {  # name np dp flags... (dp: the replicas of every tensor; 0: they differ)
  local n=$1 np=$2 dp=$3; shift 3
  local L=("$@") D="$W/$n"
  mkdir -p "$D"
  run "$D/u.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --save "$D/U" \
      --save-interval 4 --no-ckpt-fully-parallel-save
  run "$D/p.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --save "$D/P" \
      --save-interval 4 --exit-interval 4
  # The save: every rank wrote a model file, and the tensors are U's.
  local nf
  nf=$(ls "$D/P/iter_0000004" |
         grep -Ec '^model_tp[0-9]+_pp[0-9]+_dp[0-9]+(_ep[0-9]+)?\.safetensors$' || true)
  [ "$nf" -eq "$np" ] ||
    { echo "$n: $nf model files from $np ranks"; ls "$D/P/iter_0000004"; exit 1; }
  same_tensors "$D/U/iter_0000004" "$D/P/iter_0000004" ||
    { echo "$n: the fully parallel save wrote other tensors"; exit 1; }
  # The resumes.
  run "$D/r1.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --load "$D/P" \
      --ckpt-fully-parallel-load
  run "$D/r2.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --load "$D/P"
  run "$D/r3.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --load "$D/U" --ckpt-step 4 \
      --ckpt-fully-parallel-load --ckpt-fully-parallel-load-exchange-algo gather_rounds
  local rs=(r1 r2 r3)
  if [ "$n" = moe_cp2_dp2_ep2 ]; then  # the expert-DP group shares the load instead
    run "$D/r4.log" "${MPI[@]}" -np "$np" "$M" train "${F[@]}" "${L[@]}" --load "$D/P" \
        --ckpt-fully-parallel-load --ckpt-fully-parallel-load-process-group ep_dp
    grep -q "fully parallel load: .* group expert-dp (2 ranks)" "$D/r4.log" ||
      { echo "$n r4: not loaded over the expert-DP group"; exit 1; }
    rs+=(r4)
  fi
  for r in "${rs[@]}"; do
    grep -q "successfully loaded checkpoint from $D/[PU] \[ iteration 4 \]" "$D/$r.log" ||
      { echo "$n $r: did not resume at 4"; tail -5 "$D/$r.log"; exit 1; }
    diff <(pick "$D/u.log") <(pick "$D/$r.log") || { echo "$n $r: resumed run differs"; exit 1; }
  done
  [ "$(pick "$D/u.log" | wc -l)" -eq 4 ] || { echo "$n: expected 4 iteration lines"; exit 1; }
  # What each rank read.
  local with without
  with=$(bytes_read "$D/r1.log" "fully parallel load: ")
  without=$(bytes_read "$D/r2.log" "")
  [ "$(wc -l <<<"$with")" -eq "$np" ] && [ "$(wc -l <<<"$without")" -eq "$np" ] ||
    { echo "$n: expected $np lines of bytes read: '$with' / '$without'"; exit 1; }
  paste <(echo "$with") <(echo "$without") | awk -v dp="$dp" -v n="$n" '
    { if ($1 <= 0 || 4 * $1 > 3 * $2) { print n ": a rank read " $1 " of " $2 " bytes"; bad = 1 }
      sw += $1; so += $2 }
    END { if (dp > 0 && sw * dp != so) {
            print n ": the shares add up to " sw " bytes, not " so "/" dp; bad = 1 }
          exit bad }' || exit 1
  echo "$n: fully parallel save and load bit-exact; bytes read per rank: $(echo $with)" \
       "of $(echo $without)"
}

layout dp2 2 2
# A corrupt tensor under the flag: the rank that reads it stops on its checksum, and the run
# fails (the other rank names it when it gets to print before mpirun ends the job).
D="$W/dp2"
cp -r "$D/P" "$D/C"
python3 - "$D/C/iter_0000004/model_tp00_pp00_dp01.safetensors" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[-1] ^= 0xFF; open(sys.argv[1], "wb").write(b)
PY
rc=0
out=$(timeout 300 "${MPI[@]}" -np 2 "$M" train "${F[@]}" --load "$D/C" --ckpt-fully-parallel-load \
      2>&1) || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "checksum mismatch for tensor" <<<"$out" ||
  { echo "corrupt checkpoint: rc $rc"; tail -20 <<<"$out"; exit 1; }
layout tp2_dp2_distopt 4 2 --tensor-model-parallel-size 2 --use-distributed-optimizer
layout moe_cp2_dp2_ep2 4 0 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 16 \
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
  --moe-router-bias-update-rate 1e-2 --expert-model-parallel-size 2 \
  --moe-token-dispatcher-type alltoall --context-parallel-size 2 --disable-bias-linear

# --async-save, fully parallel and not: the files of the synchronous save of that kind.
D="$W/tp2_dp2_distopt"
L=(--tensor-model-parallel-size 2 --use-distributed-optimizer)
run "$D/a1.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${L[@]}" --save "$D/A1" \
    --save-interval 4 --exit-interval 4 --async-save
run "$D/a2.log" "${MPI[@]}" -np 4 "$M" train "${F[@]}" "${L[@]}" --save "$D/A2" \
    --save-interval 4 --exit-interval 4 --async-save --no-ckpt-fully-parallel-save
for pair in "A1 P" "A2 U"; do
  read -r a s <<<"$pair"
  n=0
  for f in "$D/$s/iter_0000004"/*.safetensors; do
    cmp "$f" "$D/$a/iter_0000004/$(basename "$f")" ||
      { echo "async $a: $(basename "$f") differs"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -eq "$(ls "$D/$a/iter_0000004" | grep -c safetensors)" ] ||
    { echo "async $a: other files"; exit 1; }
done
# Another layout: one process loads both checkpoints to the same next step.
run "$D/s1.log" "$M" train "${F[@]}" --exit-interval 5 --load "$D/P"
run "$D/s2.log" "$M" train "${F[@]}" --exit-interval 5 --load "$D/U" --ckpt-step 4
grep -q "successfully loaded checkpoint from $D/P \[ iteration 4 \]" "$D/s1.log" ||
  { echo "one process did not load the fully parallel checkpoint"; tail -5 "$D/s1.log"; exit 1; }
diff <(pick "$D/s1.log") <(pick "$D/s2.log") ||
  { echo "TP1 loads of the two saves differ"; exit 1; }
[ "$(pick "$D/s1.log" | wc -l)" -eq 1 ] || { echo "expected iteration 5"; exit 1; }
echo "--async-save writes the same files; one process loads the fully parallel checkpoint"
