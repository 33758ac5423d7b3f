#!/usr/bin/env python3
"""The PyTorch side of the MoE training-step benchmark (bench_gpu_moe, bench/gpu/moe_bench.sh):
the same two MoE models and step, written the way torchtitan writes a MoE trainer: fp32
parameters, bf16 autocast, SDPA restricted to the flash backend, the routed experts as two
torch._grouped_mm calls over the tokens sorted by expert (SwiGLU between them, the routing
weight applied after the activation, as Megatron does), fused AdamW, gradient clipping at
1.0, synthetic next-token batches on the GPU, torch.compile(model).

  Mixtral-style: 16 layers, H 2048, 32 heads, 8 KV groups, 8 experts top-2, expert FFN
                 4096, softmax over the top-k logits, aux loss 1e-2 (added to the loss).
  Fine-grained:  the same attention, 32 experts top-6, expert FFN 1024, one shared expert of
                 2048, sigmoid scores with the expert bias in the selection (the bias update,
                 once per global batch, is outside the step on both sides), no aux loss.

With --json writes {"Mixtral-style 8x top-2": {"mb": 16, "compiled": tok/s,
"compiled_peak_mb": MB}, ...} (bench_gpu_moe --torch reads it), rewritten after every
measurement so that a run cut short keeps what it measured.

Usage: torch_moe_reference.py [--only NAME] [--steps 5] [--warmup 2] [--modes compiled]
                              [--mb NAME=MB] [--json out.json]
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

# name: (experts, top-k, expert ffn, shared ffn, sigmoid+bias, aux coeff, micro-batch)
MODELS = {
    "Mixtral-style 8x top-2": (8, 2, 4096, 0, False, 1e-2, 16),
    "Fine-grained 32x top-6 + shared": (32, 6, 1024, 2048, True, 0.0, 8),
}
L, H, NH, NG, S, V = 16, 2048, 32, 8, 2048, 32000


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(h))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class MoE(nn.Module):
    def __init__(self, E, k, ffn, shared, sigmoid, aux, std, out_std):
        super().__init__()
        self.E, self.k, self.sigmoid, self.aux = E, k, sigmoid, aux
        self.router = nn.Linear(H, E, bias=False)
        # [out, in] per expert as torchtitan stores them; _grouped_mm takes the transposes.
        self.w1 = nn.Parameter(torch.randn(E, 2 * ffn, H) * std)   # [gate | up]
        self.w2 = nn.Parameter(torch.randn(E, H, ffn) * out_std)
        self.shared = None
        if shared:
            self.shared = nn.Sequential(nn.Linear(H, 2 * shared, bias=False))
            self.shared_out = nn.Linear(shared, H, bias=False)
        if sigmoid:
            self.register_buffer("expert_bias", torch.zeros(E), persistent=True)

    def forward(self, x):  # x [T, H] (bf16 under autocast)
        T = x.shape[0]
        logits = self.router(x).float()
        if self.sigmoid:
            s = torch.sigmoid(logits)
            _, idx = torch.topk(s + self.expert_bias, self.k, dim=-1)
            p = s.gather(-1, idx)
            p = p / (p.sum(-1, keepdim=True) + 1e-20)
        else:
            top, idx = torch.topk(logits, self.k, dim=-1)
            p = torch.softmax(top, dim=-1)
        flat = idx.flatten()
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        aux = None
        if self.aux > 0:  # Megatron's aux loss: E/(k T^2) sum_e c_e sum_t softmax(l)[t,e]
            sc = torch.softmax(logits, dim=-1)
            aux = self.aux * self.E / (self.k * T * T) * (counts.float() * sc.sum(0)).sum()
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = x[tok].to(torch.bfloat16)
        h = torch._grouped_mm(xs, self.w1.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        a = (F.silu(gate) * up) * p.flatten()[order].unsqueeze(-1).to(h.dtype)
        y = torch._grouped_mm(a, self.w2.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        out = torch.zeros_like(xs[:T]).index_add_(0, tok, y)
        if self.shared is not None:
            g, u = self.shared(x).chunk(2, dim=-1)
            out = out + self.shared_out(F.silu(g) * u)
        return out, aux


class Block(nn.Module):
    def __init__(self, moe_args):
        super().__init__()
        self.hd = H // NH
        self.ln1, self.ln2 = RMSNorm(H), RMSNorm(H)
        self.qkv = nn.Linear(H, (NH + 2 * NG) * self.hd, bias=False)
        self.proj = nn.Linear(H, H, bias=False)
        self.moe = MoE(*moe_args)

    def forward(self, x, rope):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([NH * self.hd, NG * self.hd, NG * self.hd], dim=-1)
        q = q.view(b, s, NH, self.hd).transpose(1, 2)
        k = k.view(b, s, NG, self.hd).transpose(1, 2)
        v = v.view(b, s, NG, self.hd).transpose(1, 2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        k = k.repeat_interleave(NH // NG, dim=1)
        v = v.repeat_interleave(NH // NG, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        y, aux = self.moe(self.ln2(x).reshape(b * s, H))
        return x + y.view(b, s, H), aux


class MoEGPT(nn.Module):
    def __init__(self, E, k, ffn, shared, sigmoid, aux):
        super().__init__()
        self.wte = nn.Embedding(V, H)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * L)
        self.blocks = nn.ModuleList(Block((E, k, ffn, shared, sigmoid, aux, std, out_std))
                                    for _ in range(L))
        self.ln_f = RMSNorm(H)
        self.head = nn.Linear(H, V, bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=out_std if n.endswith(("proj.weight", "shared_out.weight")) else std)
        hd = H // NH
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(S).float(), inv)
        self.register_buffer("cos", ang.cos()[None, None], persistent=False)
        self.register_buffer("sin", ang.sin()[None, None], persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        rope = (self.cos, self.sin)
        aux_total = 0.0
        for blk in self.blocks:
            x, aux = blk(x, rope)
            if aux is not None:
                aux_total = aux_total + aux
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1)) + aux_total


def measure(name, mb, compiled, steps, warmup):
    E, k, ffn, shared, sigmoid, aux, _ = MODELS[name]
    torch.manual_seed(0)
    model = MoEGPT(E, k, ffn, shared, sigmoid, aux).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    tok = torch.randint(0, V - 64, (mb, S + 1), device="cuda")
    x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            loss = fwd(x, y)
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
    print(f"  {name:32s} {'compiled' if compiled else 'eager':8s} mb {mb}: {ms:8.1f} ms/step, "
          f"{mb * S / ms:7.1f}K tok/s, peak {peak:8.0f} MB, loss {loss.item():.3f} "
          f"(warm-up {t_warm:.0f} s)", file=sys.stderr, flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return mb * S / ms * 1e3, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default="compiled")
    ap.add_argument("--mb", action="append", default=[], help="NAME=MB (a substring of NAME)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"torch_moe_reference: torch {torch.__version__}, {torch.cuda.get_device_name()}",
          file=sys.stderr, flush=True)
    res = {}
    for mode in a.modes.split(","):
        if mode not in ("eager", "compiled"):
            sys.exit(f"torch_moe_reference: --modes: unknown '{mode}' (eager, compiled)")
        for name, spec in MODELS.items():
            if a.only and a.only not in name:
                continue
            mb = spec[-1]
            for kv in a.mb:
                key, _, val = kv.partition("=")
                if key in name:
                    mb = int(val)
            try:
                tps, peak = measure(name, mb, mode == "compiled", a.steps, a.warmup)
            except Exception as e:  # e.g. out of memory: say so, keep the others
                print(f"  {name} {mode}: failed: {type(e).__name__}: {str(e)[:300]}",
                      file=sys.stderr, flush=True)
                torch.cuda.empty_cache()
                continue
            r = res.setdefault(name, {"mb": mb})
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
