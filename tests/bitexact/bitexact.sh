#!/usr/bin/env bash
# bitexact.sh check|record FIXTURE WORK NP MEGATRON MPIRUN... -- FLAGS...
#
# A refactoring guard: runs `MPIRUN -np NP MEGATRON train FLAGS --save WORK/ckpt` (NP 1:
# no MPIRUN) and reduces the run to what must not change by a single bit when code is
# moved around without meaning to change the numbers:
#   - every iteration's lm loss and grad norm as the log prints them;
#   - the xxh3-64 checksum of every tensor piece of every saved checkpoint (parameters and
#     both Adam moments, as each rank wrote them), which pins the weights and optimizer
#     state bit for bit at each --save-interval.
# `record` writes that digest to FIXTURE (done once, on the commit before a refactoring;
# `BITEXACT_RECORD=1 ctest -R bitexact` records every case); `check` compares against it
# and prints the first differing lines.
set -euo pipefail
mode=$1 fixture=$2 work=$3 np=$4 meg=$5; shift 5
[ "${BITEXACT_RECORD:-0}" = 1 ] && mode=record  # re-record through ctest
mpirun=(); while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done; shift
rm -rf "$work"; mkdir -p "$work"
cmd=("$meg" train "$@" --save "$work/ckpt")
[ "$np" -gt 1 ] && cmd=("${mpirun[@]}" -np "$np" "${cmd[@]}")
"${cmd[@]}" > "$work/log" 2>&1 || { cat "$work/log"; echo "FAIL: training exited non-zero"; exit 1; }
digest() {
  grep -Eo 'iteration +[0-9]+/ *[0-9]+ \|.*' "$work/log" |
    sed -E 's/iteration +([0-9]+)\/.*lm loss: ([0-9.E+-]+).*grad norm: ([0-9.naif]+).*/iter \1 loss \2 gnorm \3/'
  for m in $(find "$work/ckpt" -name metadata.json | sort); do
    rel=${m#"$work/ckpt/"}
    python3 - "$m" "$rel" <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
out = []
def walk(x, path):
    if isinstance(x, dict):
        if 'checksum' in x and ('key' in x or 'name' in x):
            out.append(f"{sys.argv[2]} {x.get('key', x.get('name'))} {x.get('global_offset', x.get('offsets', ''))} {x['checksum']}")
        for k, v in x.items(): walk(v, path + [k])
    elif isinstance(x, list):
        for v in x: walk(v, path)
walk(meta, [])
for line in sorted(out): print(line)
PY
  done
}
digest > "$work/digest"
n_iter=$(grep -c '^iter ' "$work/digest" || true)
n_sum=$(grep -vc '^iter ' "$work/digest" || true)
if [ "$n_iter" -lt 10 ] || [ "$n_sum" -lt 10 ]; then
  cat "$work/log"; echo "FAIL: only $n_iter iterations and $n_sum checksums in the digest"; exit 1
fi
if [ "$mode" = record ]; then
  cp "$work/digest" "$fixture"; echo "recorded $n_iter iterations, $n_sum checksums into $fixture"; exit 0
fi
if ! diff -u "$fixture" "$work/digest" > "$work/diff"; then
  head -40 "$work/diff"; echo "FAIL: the run differs from $fixture (lines above)"; exit 1
fi
echo "ok: $n_iter iterations and $n_sum checkpoint checksums bit-identical to $(basename "$fixture")"
