#!/usr/bin/env bash
# The multi-GPU runs of expert parallelism, context parallelism and FP8 (docs/parallel.md,
# "Multi-GPU runs"), in one script for a host with 2, 4 or 8 GPUs: each part runs what the
# visible GPUs allow and lists the rest as not run.
#
#   1 equivalence  tests/gpu_nccl/equiv_gpu.sh per layout: EP2 (alltoall, allgather, with the
#                  distributed optimizer), CP2 (p2p, a2a), FP8 hybrid (delayed, tensorwise)
#                  with TP2 and with DP2 against one GPU; on 4 GPUs EP2xTP2, CP2xTP2,
#                  EP2xPP2, EP2xCP2; on 8 EP8 and TP2xCP2xDP2 (bf16, 20 steps, dropout on)
#   2 experts      scripts/gpu-layouts.sh on the MoE benchmark models (mixtral,
#                  finegrained): one GPU, then EP2/EP4/EP8 over DP at the same tokens per
#                  GPU, alltoall dispatch (EP8 also with the all-gather one)
#   3 context      the Llama-style 1B at 64K and 128K with CP2/CP4/CP8, p2p and a2a, and
#                  one GPU at each sequence length per GPU (8K-64K)
#   4 fp8          the Llama 8B shape on 2/4/8 GPUs, bf16 and FP8 (hybrid, delayed) in the
#                  layouts of scripts/gpu-layouts.sh
#
# Usage: scripts/multi-gpu-runs.sh BUILD_DIR [PARTS]   (PARTS: "1 2 3 4", the default)
#   env: NGPU (default: the visible GPUs), OUT (logs and the tables, default /tmp/multi-gpu),
#        PLAN_ONLY=1 (no GPU needed: every launch of every part checked by `megatron plan`
#        at its GPU count, non-zero if any is refused; the CI runs this), ONE_GPU=1 (a dry
#        run on one GPU: the equivalence baselines on one GPU and the plans of the rest),
#        FAMILIES (equivalence model families, default "gpt llama"), ITERS (gpu-layouts.sh).
set -uo pipefail
BUILD=${1:?usage: multi-gpu-runs.sh BUILD_DIR [PARTS]}
PARTS=${2:-1 2 3 4}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
export OUT=${OUT:-/tmp/multi-gpu}
mkdir -p "$OUT"
if [[ -z ${NGPU:-} ]]; then
  NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
fi
export NCCL_NVLS_ENABLE=0
status=0

# GPUs a gpu-layouts.sh layout word list needs (TP x PP x CP x DP).
gpus_of() {
  local n=1 part
  for part in ${1//-/ }; do
    case $part in tp[0-9]* | pp[0-9]* | cp[0-9]* | dp[0-9]*) n=$((n * ${part//[a-z]/})) ;; esac
  done
  echo "$n"
}

# gpu-layouts.sh on the layouts that fit this host (all of them for PLAN_ONLY, only their
# plans for ONE_GPU), the others listed as not run.
layouts() {  # MODEL "LAYOUT ..." [env assignments]
  local model=$1 all=$2 fit=() skip=() L
  shift 2
  for L in $all; do
    if [[ -n ${PLAN_ONLY:-} ]] || (($(gpus_of "$L") <= NGPU)); then fit+=("$L"); else skip+=("$L"); fi
  done
  if ((${#fit[@]})); then
    local mode=()
    [[ -n ${ONE_GPU:-} && -z ${PLAN_ONLY:-} ]] && mode=(DRY=1)
    env "$@" "${mode[@]}" "$HERE/gpu-layouts.sh" "$BUILD" "$model" "${fit[*]}" || status=1
  fi
  ((${#skip[@]})) && echo "not run ($NGPU GPUs visible): $model ${skip[*]}"
  echo
}

for part in $PARTS; do
  case $part in
    1)
      echo "## 1. Equivalence on GPUs against one GPU"
      for spec in ep2_alltoall:2 ep2_allgather:2 ep2_distopt:2 cp2_p2p:2 cp2_a2a:2 \
                  fp8_tp2_delayed:2 fp8_tp2_tensorwise:2 fp8_dp2_delayed:2 fp8_dp2_tensorwise:2 \
                  ep2_tp2:4 cp2_tp2:4 cp4_a2a_p2p:4 ep2_pp2:4 ep2_cp2:4 ep8:8 tp2_cp2_dp2:8; do
        L=${spec%:*} n=${spec#*:}
        if [[ -z ${PLAN_ONLY:-} && -z ${ONE_GPU:-} ]] && ((n > NGPU)); then
          echo "not run ($NGPU GPUs visible): equivalence $L ($n GPUs)"
          continue
        fi
        FAMILIES=${FAMILIES:-gpt llama} "$ROOT/tests/gpu_nccl/equiv_gpu.sh" "$BUILD/megatron" "$L" \
          mpirun > "$OUT/equiv_$L.log" 2>&1
        rc=$?
        grep -E "^\[|not run|FAIL|ERROR" "$OUT/equiv_$L.log"
        ((rc == 0)) || { echo "equivalence $L: FAILED (see $OUT/equiv_$L.log)"; status=1; }
      done
      echo ;;
    2)
      echo "## 2. Expert parallelism: tokens/s per GPU against one GPU"
      layouts mixtral "dp1 dp2-ep2 dp4-ep4 dp8-ep8 dp8-ep8-allgather dp8-ep4-distopt"
      layouts finegrained "dp1 dp2-ep2 dp4-ep4 dp8-ep8 dp8-ep8-allgather dp8-ep4-distopt" ;;
    3)
      echo "## 3. Context parallelism: MFU against one GPU at the same sequence per GPU"
      for seq in 8192 16384 32768 65536; do
        layouts llama1b "dp1" SEQ=$seq MB=1
      done
      layouts llama1b "cp2 cp2-a2a cp4 cp4-a2a cp8 cp8-a2a" SEQ=65536 MB=1
      layouts llama1b "cp2 cp2-a2a cp4 cp4-a2a cp8 cp8-a2a" SEQ=131072 MB=1 ;;
    4)
      echo "## 4. FP8 across GPUs: the Llama 8B shape, bf16 and FP8 per layout"
      layouts llama8b "tp2 tp2-fp8 tp2-fp8cs dp2-distopt-recompute dp2-distopt-recompute-fp8"
      layouts llama8b "tp4 tp4-fp8 tp2-dp2-distopt tp2-dp2-distopt-fp8"
      layouts llama8b "tp8 tp8-fp8 tp2-dp4-distopt tp2-dp4-distopt-fp8 dp8-distopt-recompute dp8-distopt-recompute-fp8" ;;
    *) echo "multi-gpu-runs: unknown part '$part' (1 2 3 4)"; exit 2 ;;
  esac
done
exit $status
