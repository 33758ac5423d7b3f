#!/usr/bin/env bash
# The MoE benchmark of issue 18 in one GPU call: configure and build only what it needs
# (test_moe_gpu, bench_gpu_moe), run the MoE GPU tests, then megatron.cpp's training step
# on the Mixtral-style, the fine-grained and the dense Llama-style 1B models
# (bench_gpu_moe, with one profiled step each), then PyTorch's on the two MoE models
# (torch_moe_reference.py: torch._grouped_mm, compiled), and prints one table joining them:
# tokens/s, MFU over the active parameters, peak memory, ours / PyTorch, MoE / dense.
# Ours runs first so that a PyTorch run cut short (TORCH_TIMEOUT) costs only its columns;
# rows PyTorch did not measure in this call show the H200 numbers measured before, "(ref)".
# Usage (on the GPU machine, from the repository root):
#   bench/gpu/moe_bench.sh   env: BUILD_DIR (build-gpu), JOBS, OUT (logs), TESTS=0,
#                            TORCH=0, TORCH_TIMEOUT (seconds, 200), DEADLINE (epoch seconds
#                            by which PyTorch must end), MOE_ARGS (bench_gpu_moe),
#                            TORCH_ARGS (torch_moe_reference.py), VARIANTS (base, or
#                            base,fp8: the same models in FP8 too, hybrid format, recipe
#                            FP8_RECIPE (delayed; tensorwise, blockwise), and a table of FP8
#                            against bf16 per model: step time, speed-up, peak memory; and/or
#                            capacity: the Mixtral-style model with --moe-expert-capacity-factor
#                            CAPACITY (1.0) routed on the device and on the host, one table)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
pyroot() {
  python3 -c "import importlib, os
m = importlib.import_module('$1')
print(m.__file__ and os.path.dirname(m.__file__) or list(m.__path__)[0])" 2>/dev/null
}
CUDNN_ROOT=${MCPP_CUDNN_ROOT:-$(pyroot nvidia.cudnn)}
NCCL_ROOT=${MCPP_NCCL_ROOT:-$(pyroot nvidia.nccl)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DMCPP_CUDNN_ROOT="$CUDNN_ROOT" -DMCPP_NCCL_ROOT="$NCCL_ROOT" > "$LOGS/moe_configure.log" 2>&1
grep -E "megatron.cpp: (CUDA|cuDNN)" "$LOGS/moe_configure.log"
T0=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" --target test_moe_gpu bench_gpu_moe > "$LOGS/moe_build.log" 2>&1 \
  || { echo "moe_bench: build failed"; grep -E "error|FAILED" "$LOGS/moe_build.log" | head -30; exit 1; }
echo "moe_bench: build $(( $(date +%s) - T0 )) s"
export LD_LIBRARY_PATH="${CUDNN_ROOT:+$CUDNN_ROOT/lib:}${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
rc=0
if [[ ${TESTS:-1} != 0 ]]; then
  "$BUILD/tests/moe/test_moe_gpu" > "$LOGS/moe_tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED) |^\[moe|Failure|Expected|Which is|error" "$LOGS/moe_tests.log" | head -40
fi
T1=$(date +%s)
"$BUILD/bench/bench_gpu_moe" --profile --gemm-compare --json-out "$LOGS/moe_ours.json" ${MOE_ARGS:-} \
  > "$LOGS/moe_ours.md" 2> "$LOGS/moe_ours.err" || { rc=1; tail -20 "$LOGS/moe_ours.err"; }
grep -E "bench_gpu_moe:|ms/step" "$LOGS/moe_ours.err"
echo "moe_bench: ours $(( $(date +%s) - T1 )) s"
CAP=0
[[ ,${VARIANTS:-base}, == *,capacity,* ]] && CAP=1
if [[ $CAP == 1 ]]; then
  T4=$(date +%s)
  for where in device host; do
    "$BUILD/bench/bench_gpu_moe" --only Mixtral --capacity-factor "${CAPACITY:-1.0}" \
      $([[ $where == host ]] && echo --host-routing) --json-out "$LOGS/moe_cap_$where.json" \
      > "$LOGS/moe_cap_$where.md" 2> "$LOGS/moe_cap_$where.err" \
      || { rc=1; tail -20 "$LOGS/moe_cap_$where.err"; }
  done
  echo "moe_bench: capacity $(( $(date +%s) - T4 )) s"
fi
FP8=0
[[ ,${VARIANTS:-base}, == *,fp8,* ]] && FP8=1
if [[ $FP8 == 1 ]]; then
  T3=$(date +%s)
  "$BUILD/bench/bench_gpu_moe" --profile --fp8 "${FP8_RECIPE:-delayed}" \
    --json-out "$LOGS/moe_ours_fp8.json" ${MOE_ARGS:-} > "$LOGS/moe_ours_fp8.md" \
    2> "$LOGS/moe_ours_fp8.err" || { rc=1; tail -20 "$LOGS/moe_ours_fp8.err"; }
  grep -E "bench_gpu_moe:|ms/step" "$LOGS/moe_ours_fp8.err"
  echo "moe_bench: ours in FP8 $(( $(date +%s) - T3 )) s"
fi
if [[ ${TORCH:-1} != 0 ]]; then
  T2=$(date +%s)
  budget=${TORCH_TIMEOUT:-200}
  # DEADLINE (epoch seconds): the PyTorch run ends by then (a device call's time budget).
  [[ -n ${DEADLINE:-} ]] && (( DEADLINE - $(date +%s) < budget )) && budget=$(( DEADLINE - $(date +%s) ))
  echo "moe_bench: PyTorch gets ${budget} s"
  (( budget > 20 )) && timeout "$budget" python3 bench/gpu/torch_moe_reference.py --json "$LOGS/moe_torch.json" \
    ${TORCH_ARGS:-} > "$LOGS/moe_torch.md" 2> "$LOGS/moe_torch.err"
  grep -vE "^\s*$" "$LOGS/moe_torch.err" | grep -vE "Warning|warn" | tail -8
  echo "moe_bench: PyTorch $(( $(date +%s) - T2 )) s"
fi
echo
python3 - "$LOGS/moe_ours.json" "$LOGS/moe_torch.json" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
try:
    torch = json.load(open(sys.argv[2]))
except Exception:
    torch = {}
dense = next((r["tps"] for n, r in ours.items() if "dense" in n), 0)
print("| model | micro-batch | step (ms) | tokens/s | MFU (active params) | peak (MB) | PyTorch compiled "
      "| PyTorch peak (MB) | ours / PyTorch | ours / dense 1B |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, r in ours.items():
    t = torch.get(n, {})
    tps, peak, tag = t.get("compiled", 0), t.get("compiled_peak_mb", 0), ""
    if not tps or t.get("mb") != r["mb"]:
        tps, peak, tag = r.get("torch_ref", 0), 0, " (ref)"
    ratio = "%.2fx" % (r["tps"] / tps) if tps else "-"
    vs_dense = "%.2f" % (r["tps"] / dense) if dense else "-"
    ptxt = "%.1fK%s" % (tps / 1e3, tag) if tps else "-"
    pk = "%.0f" % peak if peak else "-"
    print("| %s | %d | %.1f | %.1fK | %.1f%% | %.0f | %s | %s | %s | %s |" % (
        n, r["mb"], r["ms"], r["tps"] / 1e3, 100 * r["mfu"], r["peak_mb"], ptxt, pk, ratio,
        vs_dense))
PY
if [[ $FP8 == 1 ]]; then
  echo
  python3 - "$LOGS/moe_ours.json" "$LOGS/moe_ours_fp8.json" <<'PY'
import json, sys
try:
    bf16, fp8 = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    print(f"moe_bench: no FP8 table ({e})"); sys.exit(0)
print("| model | micro-batch | bf16 step (ms) | FP8 step (ms) | FP8 / bf16 tokens/s | bf16 peak (MB) "
      "| FP8 peak (MB) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for n, r in fp8.items():
    base = bf16.get(n[: n.rfind(" (FP8")], {})
    same = base and base.get("mb") == r["mb"]
    print("| %s | %d | %s | %.1f | %s | %s | %.0f |" % (
        n, r["mb"], "%.1f" % base["ms"] if same else "-", r["ms"],
        "%.2fx" % (r["tps"] / base["tps"]) if same else "-",
        "%.0f" % base["peak_mb"] if same else "-", r["peak_mb"]))
PY
fi
if [[ $CAP == 1 ]]; then
  echo
  python3 - "$LOGS/moe_cap_device.json" "$LOGS/moe_cap_host.json" <<'PY'
import json, sys
rows = {}
for f in sys.argv[1:]:
    try:
        rows.update(json.load(open(f)))
    except Exception as e:
        print(f"moe_bench: {f}: {e}")
print("| model | micro-batch | step (ms) | tokens/s | peak (MB) |")
print("|---|---:|---:|---:|---:|")
for n, r in rows.items():
    print("| %s | %d | %.1f | %.1fK | %.0f |" % (n, r["mb"], r["ms"], r["tps"] / 1e3, r["peak_mb"]))
PY
fi
sed -n '/^### /,$p' "$LOGS/moe_ours.md"
exit $rc
