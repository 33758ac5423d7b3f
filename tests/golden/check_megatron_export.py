#!/usr/bin/env python3
"""Checks a `megatron convert --to-megatron` folder with PyTorch itself (not run by CI).

    python3 tests/golden/check_megatron_export.py MEGATRON_DIR REFERENCE

MEGATRON_DIR: the exported folder (latest_checkpointed_iteration.txt, iter_N/mp_rank_*/).
REFERENCE: the megatron.cpp checkpoint it was exported from, saved at TP 1 (a --save folder or
its iter_N/ folder; its *.safetensors files hold whole tensors by Megatron-Core name, the
Adam moments under optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name>), or one
.safetensors file of whole tensors by name.

Every mp_rank file is read with torch.load(weights_only=False); the script checks the state
dict's keys (args as an argparse.Namespace, checkpoint_version 3.0, iteration = the tracker's,
model, optimizer / opt_param_scheduler when present), that the model's tensors have the dtype
of args.params_dtype and that TP shards have equal shapes, merges the TP shards as Megatron's
parallel layers split them (vocabulary, linear_qkv, linear_fc1 along rows, SwiGLU's fc1 as
[gate_r; up_r] per rank, linear_proj / linear_fc2 along columns, the rest replicated and
equal on every rank), and compares with the reference: fp32 weights and the fp32 main params
of a bf16/fp16 run bit for bit, bf16/fp16 weights with the reference rounded to that dtype,
the Adam moments bit for bit. Prints PASS, or FAIL with the reasons (exit status 1).
"""
import argparse
import glob
import json
import os
import re
import struct
import sys

import torch

TE = (("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"),
      ("self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"),
      ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
      ("mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"))
ST_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16,
             "F16": torch.float16, "I64": torch.int64, "U8": torch.uint8}
errors = []


def fail(msg):
    errors.append(msg)
    print("FAIL:", msg)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=ST_DTYPES[v["dtype"]]) if b > a else \
            torch.empty(0, dtype=ST_DTYPES[v["dtype"]])
        out[k] = t.reshape(v["shape"])
    return out


def reference_tensors(ref):
    if os.path.isfile(ref):
        return read_safetensors(ref)
    d = ref
    tracker = os.path.join(ref, "latest_checkpointed_iteration.txt")
    if os.path.isfile(tracker):
        d = os.path.join(ref, "iter_%07d" % int(open(tracker).read().strip()))
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(read_safetensors(p))
    if not out:
        sys.exit(f"FAIL: no .safetensors files in {d}")
    return out


def canonical(key, pp, per):
    for a, b in TE:
        if key.endswith(a):
            key = key[: -len(a)] + b
    m = re.match(r"decoder\.layers\.(\d+)\.(.*)", key)
    if m:
        key = f"decoder.layers.{int(m.group(1)) + pp * per}.{m.group(2)}"
    return key


def split_kind(name, swiglu):
    if name in ("embedding.word_embeddings.weight", "output_layer.weight") or \
            "linear_qkv.weight" in name or "linear_qkv.bias" in name:
        return "rows"
    if "linear_fc1.weight" in name or "linear_fc1.bias" in name:
        return "swiglu" if swiglu else "rows"
    if "linear_proj.weight" in name or "linear_fc2.weight" in name:
        return "cols"
    return "replicated"


def merge(shards, kind, name):
    if any(s.shape != shards[0].shape for s in shards):
        fail(f"{name}: TP shards differ in shape {[tuple(s.shape) for s in shards]}")
        return None
    if kind == "rows":
        return torch.cat(shards, 0)
    if kind == "cols":
        return torch.cat(shards, 1)
    if kind == "swiglu":
        halves = [s.chunk(2, 0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    for s in shards[1:]:
        if not torch.equal(s, shards[0]):
            fail(f"{name}: a replicated tensor differs between TP ranks")
    return shards[0]


def rank_param_slots(model_sd, groups):
    """key -> state index, by Megatron's grouping (wd_mult 0: biases and 1-D parameters)."""
    params = [(k, t) for k, t in model_sd.items() if isinstance(t, torch.Tensor)]
    nowd = [k for k, t in params if k.endswith(".bias") or t.dim() == 1]
    wd = [k for k, t in params if not (k.endswith(".bias") or t.dim() == 1)]
    out = {}
    for g in groups:
        members = nowd if g["wd_mult"] == 0.0 else wd
        if len(members) != len(g["params"]):
            fail(f"param group wd_mult {g['wd_mult']} lists {len(g['params'])} parameters, the "
                 f"model has {len(members)}")
            continue
        for k, idx in zip(members, g["params"]):
            out[k] = (idx, groups.index(g), members.index(k))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("megatron_dir")
    ap.add_argument("reference")
    a = ap.parse_args()
    ref = reference_tensors(a.reference)
    it = open(os.path.join(a.megatron_dir, "latest_checkpointed_iteration.txt")).read().strip()
    iter_dir = os.path.join(a.megatron_dir, "iter_%07d" % int(it))
    files = sorted(glob.glob(os.path.join(iter_dir, "mp_rank_*", "model_optim_rng.pt")))
    if not files:
        sys.exit(f"FAIL: no mp_rank_*/model_optim_rng.pt in {iter_dir}")
    loaded = {}
    for f in files:
        m = re.search(r"mp_rank_(\d+)(?:_(\d+))?", f)
        sd = torch.load(f, map_location="cpu", weights_only=False)
        loaded[(int(m.group(1)), int(m.group(2) or 0))] = sd
        for k in ("args", "checkpoint_version", "iteration", "model"):
            if k not in sd:
                fail(f"{f}: no '{k}'")
        if not isinstance(sd.get("args"), argparse.Namespace):
            fail(f"{f}: args is a {type(sd.get('args'))}")
        if sd.get("checkpoint_version") != 3.0 or sd.get("iteration") != int(it):
            fail(f"{f}: checkpoint_version {sd.get('checkpoint_version')}, iteration "
                 f"{sd.get('iteration')} (tracker {it})")
    args = next(iter(loaded.values()))["args"]
    T, P = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if sorted(loaded) != [(t, p) for t in range(T) for p in range(P)]:
        fail(f"rank files {sorted(loaded)} do not match TP {T} x PP {P}")
    per = args.num_layers // P
    swiglu = args.swiglu
    shards, mains, moments = {}, {}, {}
    for (tp, pp), sd in loaded.items():
        model = sd["model"]
        for k, v in model.items():
            if k.endswith("._extra_state"):
                continue
            if not isinstance(v, torch.Tensor):
                fail(f"mp_rank {tp},{pp}: model['{k}'] is a {type(v)}")
                continue
            if v.dtype != args.params_dtype:
                fail(f"mp_rank {tp},{pp}: {k} is {v.dtype}, args.params_dtype {args.params_dtype}")
            name = canonical(k, pp, per)
            if name == "output_layer.weight" and not args.untie_embeddings_and_output_weights:
                name = "embedding.word_embeddings.weight(output copy)"
            shards.setdefault(name, {})[tp] = v
        opt = sd.get("optimizer")
        if opt is None:
            continue
        tsd = opt.get("optimizer", opt)
        slots = rank_param_slots(model, tsd["param_groups"])
        for k, (idx, g, pos) in slots.items():
            name = canonical(k, pp, per)
            if name == "output_layer.weight" and not args.untie_embeddings_and_output_weights:
                continue
            st = tsd["state"][idx]
            for part in ("exp_avg", "exp_avg_sq"):
                moments.setdefault((part, name), {})[tp] = st[part]
            if "fp32_from_fp16_params" in opt:
                mains.setdefault(name, {})[tp] = opt["fp32_from_fp16_params"][g][pos]
    checked = 0
    for name, by_tp in sorted(shards.items()):
        base = name.replace("(output copy)", "")
        full = merge([by_tp[t] for t in range(T)], split_kind(base, swiglu), name)
        if full is None:
            continue
        if base not in ref:
            fail(f"{name}: not in the reference")
            continue
        want = ref[base].to(full.dtype)
        if full.shape != want.shape or not torch.equal(full, want):
            fail(f"{name}: differs from the reference (shape {tuple(full.shape)} vs "
                 f"{tuple(want.shape)})")
        checked += 1
    for name in ref:
        if not name.startswith("optimizer.") and name not in shards:
            fail(f"{name}: in the reference, in no rank file")
    for name, by_tp in sorted(mains.items()):
        full = merge([by_tp[t] for t in range(T)], split_kind(name, swiglu), name)
        if full is not None and (full.dtype != torch.float32 or not torch.equal(full, ref[name])):
            fail(f"fp32_from_fp16_params of {name} differs from the reference")
        checked += 1
    for (part, name), by_tp in sorted(moments.items()):
        full = merge([by_tp[t] for t in range(T)], split_kind(name, swiglu), name)
        key = f"optimizer.{part}.{name}"
        if key not in ref:
            continue  # the reference holds no moments (a .safetensors of weights)
        if full is not None and not torch.equal(full, ref[key]):
            fail(f"{part} of {name} differs from the reference")
        checked += 1
    print(f"{len(files)} files, TP {T} x PP {P}, {checked} tensors compared")
    print("FAIL" if errors else "PASS")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
