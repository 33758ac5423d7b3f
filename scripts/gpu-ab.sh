#!/usr/bin/env bash
# gpu-ab.sh OTHER_TREE [ROUNDS]: the training-step benchmark of two source trees in one
# device call, for "no slowdown" claims (a refactoring against the commit before it). Run
# on the GPU machine from this tree (B); OTHER_TREE (A) is another checkout of the project,
# e.g. carried beside it. Builds bench_gpu_train in both at once, then runs A, B, A, B, ...
# (ROUNDS each, default 2) so both see the same clock and power history, and prints every
# run's step time per model and the ratio B/A of the per-model medians.
# env: A_ARGS / B_ARGS extra bench_gpu_train flags for each tree (a tree may not know a
# newer flag), ARGS for both (default "--steps 6 --warmup 2"), JOBS (default nproc);
# A_BUILD / B_BUILD build folders (default build-ab in each tree; an existing configured
# folder such as gpu-check's build-gpu is reused and only bench_gpu_train is built in it);
# STAGE=build builds only (TREES="A" to build A alone, e.g. in the background while
# scripts/gpu-check.sh builds and tests B), STAGE=run only runs.
set -uo pipefail
cd "$(dirname "$0")/.."
A=$(cd "$1" && pwd); B=$PWD; ROUNDS=${2:-2}
JOBS=${JOBS:-$(nproc)}
LOGS=${OUT:-/tmp/gpu-ab}; mkdir -p "$LOGS"
pyroot() {
  python3 -c "import importlib, os
m = importlib.import_module('$1')
print(m.__file__ and os.path.dirname(m.__file__) or list(m.__path__)[0])" 2>/dev/null
}
CUDNN_ROOT=${MCPP_CUDNN_ROOT:-$(pyroot nvidia.cudnn)}
NCCL_ROOT=${MCPP_NCCL_ROOT:-$(pyroot nvidia.nccl)}
A_BUILD=${A_BUILD:-$A/build-ab}; B_BUILD=${B_BUILD:-$B/build-ab}
[[ $A_BUILD = /* ]] || A_BUILD=$A/$A_BUILD; [[ $B_BUILD = /* ]] || B_BUILD=$B/$B_BUILD
build() {  # build TREE DIR NAME JOBS
  if [[ ! -f $2/build.ninja ]]; then
    cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DMCPP_CUDNN_ROOT="$CUDNN_ROOT" -DMCPP_NCCL_ROOT="$NCCL_ROOT" > "$LOGS/$3-configure.log" 2>&1 ||
      return 1
  fi
  cmake --build "$2" -j "$4" --target bench_gpu_train > "$LOGS/$3-build.log" 2>&1
}
STAGE=${STAGE:-all}
if [[ $STAGE != run ]]; then
  TREES=${TREES:-A B}; n=$(wc -w <<< "$TREES"); per=$(( JOBS / n > 1 ? JOBS / n : 1 ))
  pids=()
  for t in $TREES; do
    if [[ $t == A ]]; then build "$A" "$A_BUILD" A "$per" & else build "$B" "$B_BUILD" B "$per" & fi
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [[ $rc != 0 ]]; then
    echo "gpu-ab: a build failed"; tail -30 "$LOGS"/*-build.log "$LOGS"/*-configure.log; exit 1
  fi
  [[ $STAGE == build ]] && { echo "gpu-ab: built $TREES"; exit 0; }
fi
export LD_LIBRARY_PATH="${CUDNN_ROOT:+$CUDNN_ROOT/lib:}${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
ARGS=${ARGS:---steps 6 --warmup 2}
for r in $(seq "$ROUNDS"); do
  for t in A B; do
    bin=$A_BUILD extra=${A_ARGS:-}; [[ $t == B ]] && bin=$B_BUILD extra=${B_ARGS:-}
    # shellcheck disable=SC2086
    "$bin/bench/bench_gpu_train" $ARGS $extra > "$LOGS/$t-$r.md" 2> "$LOGS/$t-$r.err" ||
      { echo "gpu-ab: $t round $r failed"; tail -20 "$LOGS/$t-$r.err"; exit 1; }
  done
done
# bench_gpu_train's table: | model | micro-batch | step (ms) | tokens/s | ...
python3 - "$LOGS" "$ROUNDS" <<'PY'
import sys, statistics, os
logs, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    out, hdr = {}, None
    for line in open(path):
        if not line.startswith('|'): continue
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if hdr is None and 'step (ms)' in cells:
            hdr = cells; continue
        if hdr and len(cells) == len(hdr) and not set(cells[0]) <= set('-:'):
            out[cells[0]] = float(cells[hdr.index('step (ms)')])
    return out
runs = {t: [rows(os.path.join(logs, f'{t}-{r}.md')) for r in range(1, rounds + 1)] for t in 'AB'}
models = [m for m in runs['A'][0] if m in runs['B'][0]]
if not models: sys.exit('gpu-ab: no model rows in common (see the .md files)')
print('| model | A step ms (runs) | B step ms (runs) | B / A step time (medians) |')
print('|---|---|---|---:|')
for m in models:
    a = [r[m] for r in runs['A'] if m in r]; b = [r[m] for r in runs['B'] if m in r]
    print(f"| {m} | {', '.join(f'{x:.1f}' for x in a)} | {', '.join(f'{x:.1f}' for x in b)} "
          f"| {statistics.median(b) / statistics.median(a):.4f} |")
PY
