#!/usr/bin/env python3
"""Independent reference for the golden tests, written with plain PyTorch ops.

Reads tests/golden/data/<family>_inputs.safetensors (weights with Megatron-Core names,
a batch, the config as metadata; written by the golden_export program), builds the
same model in float64 with autograd, and writes <family>_expected.safetensors with
the logits [S, B, Vp], the loss, and the gradient of every parameter ("grad.<name>").

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/golden/make_golden.py
"""
import json
import math
import os
import struct
import sys

import torch

DT = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64, "I32": torch.int32}
NAMES = {v: k for k, v in DT.items()}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, v in header.items():
        b, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=DT[v["dtype"]]).reshape(v["shape"])
        out[name] = t.clone()
    return out, meta


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def norm(x, w, b, eps, rms):
    if rms:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rope(x, base):
    # x [S, B, heads, D]; Megatron's non-interleaved rotate-half form.
    S, D = x.shape[0], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]  # [S, D/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * torch.cos(emb) + rot * torch.sin(emb)


def forward(p, meta, tokens, labels, mask):
    fam = meta["family"]
    L = int(meta["num_layers"]); H = int(meta["hidden_size"])
    NH = int(meta["num_attention_heads"]); NG = int(meta["num_query_groups"])
    HD = int(meta["kv_channels"]); eps = float(meta["norm_epsilon"])
    llama = fam == "llama"
    B, S = tokens.shape
    x = p["embedding.word_embeddings.weight"][tokens.t()]  # [S, B, H]
    if not llama:
        x = x + p["embedding.position_embeddings.weight"][:S][:, None, :]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for l in range(L):
        pre = f"decoder.layers.{l}."
        g = lambda n: p.get(pre + n)
        h = norm(x, g("input_layernorm.weight"), g("input_layernorm.bias"), eps, llama)
        qkv = h @ g("self_attention.linear_qkv.weight").t()
        if g("self_attention.linear_qkv.bias") is not None:
            qkv = qkv + g("self_attention.linear_qkv.bias")
        r = NH // NG
        qkv = qkv.reshape(S, B, NG, r + 2, HD)
        q = qkv[:, :, :, :r, :].reshape(S, B, NH, HD)
        k = qkv[:, :, :, r, :]  # [S, B, NG, HD]
        v = qkv[:, :, :, r + 1, :]
        if llama:
            q = rope(q, float(meta["rotary_base"]))
            k = rope(k, float(meta["rotary_base"]))
        k = k.repeat_interleave(r, dim=2)
        v = v.repeat_interleave(r, dim=2)
        scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(HD)
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(S, B, NH * HD)
        o = ctx @ g("self_attention.linear_proj.weight").t()
        if g("self_attention.linear_proj.bias") is not None:
            o = o + g("self_attention.linear_proj.bias")
        x = x + o
        h = norm(x, g("pre_mlp_layernorm.weight"), g("pre_mlp_layernorm.bias"), eps, llama)
        f = h @ g("mlp.linear_fc1.weight").t()
        if g("mlp.linear_fc1.bias") is not None:
            f = f + g("mlp.linear_fc1.bias")
        if llama:
            gate, up = f.chunk(2, dim=-1)
            a = torch.nn.functional.silu(gate) * up
        else:
            a = torch.nn.functional.gelu(f, approximate="tanh")
        o = a @ g("mlp.linear_fc2.weight").t()
        if g("mlp.linear_fc2.bias") is not None:
            o = o + g("mlp.linear_fc2.bias")
        x = x + o
    x = norm(x, p["decoder.final_layernorm.weight"], p.get("decoder.final_layernorm.bias"), eps, llama)
    w_out = p.get("output_layer.weight", p["embedding.word_embeddings.weight"])
    logits = x @ w_out.t()  # [S, B, Vp]
    tok_loss = torch.nn.functional.cross_entropy(
        logits.reshape(S * B, -1), labels.t().reshape(-1), reduction="none")
    m = mask.t().reshape(-1).double()
    loss = (tok_loss * m).sum() / m.sum()
    return logits, loss


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    for fam in ("gpt", "llama"):
        t, meta = load(os.path.join(d, f"{fam}_inputs.safetensors"))
        params = {k: v.requires_grad_(True) for k, v in t.items() if not k.startswith("batch.")}
        logits, loss = forward(params, meta, t["batch.tokens"], t["batch.labels"], t["batch.loss_mask"])
        loss.backward()
        out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
        for k, v in params.items():
            out["grad." + k] = v.grad.detach()
        save(os.path.join(d, f"{fam}_expected.safetensors"), out)
        print(f"{fam}: loss {loss.item():.12f}, {len(params)} parameter gradients")


if __name__ == "__main__":
    main()
