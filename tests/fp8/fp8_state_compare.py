#!/usr/bin/env python3
# fp8_state_compare.py REF_CKPT CKPT [WHAT [PATTERN...]]: the FP8 delayed-scaling state (every
# *.fp8_amax_history and *.fp8_scale tensor of the latest checkpoint's model files, read
# straight from the safetensors; TP ranks must agree) of two save directories, which may
# have been written under different layouts. Passes when every value is within 1e-4
# relative and the state is not the untouched initial one; with PATTERNs, each must name at
# least one amax history and every history it names must hold a value (e.g. "mlp.experts."). Standard library only.
import glob, json, struct, sys
what = sys.argv[3] if len(sys.argv) > 3 else ""
def scales(ckpt):
    it = open(f"{ckpt}/latest_checkpointed_iteration.txt").read().strip()
    out = {}
    for f in sorted(glob.glob(f"{ckpt}/iter_{int(it):07d}/model_*.safetensors")):
        raw = open(f, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.loads(raw[8:8 + n])
        for k, v in head.items():
            if ".fp8_" in k:
                a, b = v["data_offsets"]
                vals = struct.unpack(f"<{(b - a) // 4}f", raw[8 + n + a:8 + n + b])
                assert out.get(k, vals) == vals, f"{k}: TP ranks disagree"
                out[k] = vals
    return out
ref, got = scales(sys.argv[1]), scales(sys.argv[2])
if not ref:
    print("no FP8 state (tensorwise or blockwise recipe: no scales are kept)"); sys.exit(0)
assert ref.keys() == got.keys(), f"scales {sorted(ref)} vs {sorted(got)}"
worst = max(abs(x - y) / max(abs(x), 1e-30) for k in ref for x, y in zip(ref[k], got[k]))
nz = sum(1 for k in ref for x in ref[k] if x != 0 and x != 1)
print(f"{'ok' if worst <= 1e-4 and nz else 'FAIL'}: {len(ref)} FP8 state tensors {what} "
      f"({nz} values set), worst relative difference {worst:.2e}")
def hists(p): return [k for k in ref if p in k and k.endswith("fp8_amax_history")]
missing = [p for p in sys.argv[4:] if not hists(p) or not all(any(ref[k]) for k in hists(p))]
for p in missing:
    print(f"FAIL: an amax history of '{p}' is missing or was never recorded")
sys.exit(0 if worst <= 1e-4 and nz and not missing else 1)
