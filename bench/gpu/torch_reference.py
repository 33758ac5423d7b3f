#!/usr/bin/env python3
"""The PyTorch side of the GPU training-step benchmark (bench_gpu_train): the same four
models, micro-batches and step, written the way a PyTorch user would write a GPT trainer:
fp32 parameters, bf16 autocast, F.scaled_dot_product_attention restricted to the flash
backend, fused AdamW, gradient clipping at 1.0, synthetic next-token batches already on
the GPU; eager and torch.compile(model). Variants (--variants, default "base"), as
bench_gpu_train's: base (no dropout, one micro-batch); dropout (Megatron's defaults:
SDPA's dropout_p 0.1 on the attention probabilities, and hidden dropout 0.1 on the
embedding output and on the attention and MLP outputs before each residual add);
accum (the same batch as 4 micro-batches of a quarter, loss / 4, one optimizer step);
dropout+accum. Prints one table and, with --json, writes {"GPT-2 124M": {"mb": 64,
"eager": tok/s, "compiled": tok/s, "eager_peak_mb": MB, "compiled_peak_mb": MB},
"GPT-2 124M|dropout": {...}, ...} for bench_gpu_train --torch (scripts/gpu-check.sh runs
both in one call). The JSON is rewritten after every measurement, so a run cut short
keeps what it measured.

Usage: torch_reference.py [--only NAME] [--steps 6] [--warmup 2] [--modes eager,compiled]
                          [--variants base,dropout,accum,dropout+accum] [--profile]
                          [--json out.json]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# name: (layers, hidden, heads, kv groups, ffn, seq, vocab, micro-batch, llama-style)
MODELS = {
    "GPT-2 124M": (12, 768, 12, 12, 3072, 1024, 50304, 64, False),
    "GPT-2 350M": (24, 1024, 16, 16, 4096, 1024, 50304, 64, False),
    "GPT-3 XL 1.3B": (24, 2048, 16, 16, 8192, 2048, 50304, 16, False),
    "Llama-style 1B": (16, 2048, 32, 8, 8192, 2048, 32000, 16, True),
}


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(h))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x, cos, sin):  # x [B, heads, S, D], rotate-half RoPE
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class Block(nn.Module):
    def __init__(self, h, nh, ng, ffn, llama, p_attn=0.0, p_hidden=0.0):
        super().__init__()
        self.nh, self.ng, self.hd, self.llama = nh, ng, h // nh, llama
        self.p_attn, self.p_hidden = p_attn, p_hidden
        norm = (lambda: RMSNorm(h)) if llama else (lambda: nn.LayerNorm(h))
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = nn.Linear(h, (nh + 2 * ng) * self.hd, bias=not llama)
        self.proj = nn.Linear(h, h, bias=not llama)
        self.fc1 = nn.Linear(h, 2 * ffn if llama else ffn, bias=not llama)
        self.fc2 = nn.Linear(ffn, h, bias=not llama)

    def forward(self, x, rope):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [self.nh * self.hd, self.ng * self.hd, self.ng * self.hd], dim=-1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.ng, self.hd).transpose(1, 2)
        v = v.view(b, s, self.ng, self.hd).transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if self.ng != self.nh:
            k = k.repeat_interleave(self.nh // self.ng, dim=1)
            v = v.repeat_interleave(self.nh // self.ng, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p_attn if self.training else 0.0)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, -1)), self.p_hidden,
                          self.training)
        h = self.fc1(self.ln2(x))
        if self.llama:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + F.dropout(self.fc2(h), self.p_hidden, self.training)


class GPT(nn.Module):
    def __init__(self, L, h, nh, ng, ffn, S, V, llama, p_attn=0.0, p_hidden=0.0):
        super().__init__()
        self.llama, self.p_hidden = llama, p_hidden
        self.wte = nn.Embedding(V, h)
        self.wpe = None if llama else nn.Embedding(S, h)
        self.blocks = nn.ModuleList(Block(h, nh, ng, ffn, llama, p_attn, p_hidden)
                                    for _ in range(L))
        self.ln_f = RMSNorm(h) if llama else nn.LayerNorm(h)
        self.head = nn.Linear(h, V, bias=False)
        if not llama:
            self.head.weight = self.wte.weight  # tied
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * L) if n.endswith(("proj.weight", "fc2.weight")) else 1))
        if llama:
            hd = h // nh
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(S).float(), inv)
            self.register_buffer("cos", ang.cos()[None, None], persistent=False)
            self.register_buffer("sin", ang.sin()[None, None], persistent=False)

    def forward(self, idx, targets):
        s = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(s, device=idx.device))
        x = F.dropout(x, self.p_hidden, self.training)  # Megatron's embedding dropout
        rope = (self.cos[:, :, :s], self.sin[:, :, :s]) if self.llama else None
        for blk in self.blocks:
            x = blk(x, rope)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def gemm_flops(name):
    """FLOPs of the step's GEMMs (forward + both backward GEMMs), as the Megatron formula
    counts them without attention's score and context products."""
    L, h, nh, ng, ffn, S, V, B, llama = MODELS[name]
    T, hd = B * S, h // nh
    qkv = h * (nh + 2 * ng) * hd
    mlp = (2 if llama else 1) * h * ffn + ffn * h
    return 3 * 2 * T * (L * (qkv + h * h + mlp) + h * V)


def profile_step(name, step):
    """One profiled step: CUDA kernel time by class, the GEMMs' rate, the top GEMM kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    cls = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    gemms = {}
    for e in prof.key_averages():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if us <= 0 or e.key.startswith("ProfilerStep"):
            continue
        k = e.key.lower()
        if any(w in k for w in ("flash", "fmha", "attention", "sdpa")):
            cls["attention"] += us
        elif any(w in k for w in ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "matmul")):
            cls["gemm"] += us
            gemms[e.key] = (us, e.count)
        else:
            cls["other"] += us
    total = sum(cls.values())
    rate = gemm_flops(name) / (cls["gemm"] * 1e-6) / 1e12 if cls["gemm"] else 0
    print(f"  {name} profiled: kernels {total / 1e3:.1f} ms: GEMM {cls['gemm'] / 1e3:.1f} ms "
          f"({rate:.0f} TFLOP/s), attention {cls['attention'] / 1e3:.1f} ms, other "
          f"{cls['other'] / 1e3:.1f} ms", file=sys.stderr, flush=True)
    for k, (us, n) in sorted(gemms.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"    {us / 1e3:8.2f} ms {n:4d} x {k[:110]}", file=sys.stderr)


def measure(name, compiled, steps, warmup, prof=False, variant="base"):
    L, h, nh, ng, ffn, S, V, B, llama = MODELS[name]
    torch.manual_seed(0)
    dev = "cuda"
    p = 0.1 if "dropout" in variant else 0.0
    nmb = 4 if "accum" in variant else 1
    model = GPT(L, h, nh, ng, ffn, S, V, llama, p, p).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    tok = torch.randint(0, V - 64, (B, S + 1), device=dev)
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
    xs, ys = x.chunk(nmb), y.chunk(nmb)  # micro-batches of B / nmb sequences

    def step():
        opt.zero_grad(set_to_none=True)
        for xm, ym in zip(xs, ys):
            with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                loss = fwd(xm, ym) / nmb
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t_warm = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"  {name:16s} {variant:13s} {'compiled' if compiled else 'eager':8s} mb {B}: {ms:8.1f} ms/step, "
          f"{B * S / ms * 1e3 / 1e3:7.1f}K tok/s, peak {peak:8.0f} MB, loss {loss.item():.3f} "
          f"(warm-up {t_warm:.0f} s)", file=sys.stderr, flush=True)
    if prof:
        profile_step(name, step)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return B, B * S / ms * 1e3, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--variants", default="base",
                    help="comma list of base, dropout, accum, dropout+accum")
    ap.add_argument("--json", default="")
    ap.add_argument("--profile", action="store_true",
                    help="then one profiled step: kernel time by class, the GEMMs' TFLOP/s")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"torch_reference: torch {torch.__version__}, {torch.cuda.get_device_name()}",
          file=sys.stderr, flush=True)
    res = {}
    variants = a.variants.split(",")
    for v in variants:
        if v not in ("base", "dropout", "accum", "dropout+accum"):
            sys.exit(f"torch_reference: --variants: unknown '{v}' (base, dropout, accum, dropout+accum)")
    for mode in a.modes.split(","):
        for name in MODELS:
            if a.only and a.only not in name:
                continue
            for v in variants:
                B, tps, peak = measure(name, mode == "compiled", a.steps, a.warmup, a.profile, v)
                r = res.setdefault(name if v == "base" else f"{name}|{v}", {"mb": B})
                r[mode], r[mode + "_peak_mb"] = tps, peak
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump(res, f, indent=1)
    print("| model | micro-batch | PyTorch eager tok/s | compiled tok/s | compiled peak (MB) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in res.items():
        print(f"| {name} | {r['mb']} | {r.get('eager', 0) / 1e3:.1f}K | "
              f"{r.get('compiled', 0) / 1e3:.1f}K | {r.get('compiled_peak_mb', 0):.0f} |")


if __name__ == "__main__":
    main()
