#!/usr/bin/env python3
"""The PyTorch side of the CPU comparison: the same 16M-parameter GPT-2-shaped
model as bench_cpu_train's BM_TrainStepGpt16M (4 layers, hidden 256, 8 heads,
seq 256, vocab 50304 tied, micro-batch 8, AdamW, dropout 0.1), trained eagerly in
fp32 with 2 threads. Prints tokens/s. Run: /usr/bin/python3 bench/pytorch_cpu_baseline.py
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(2)
torch.manual_seed(0)
L, H, NH, S, V, B = 4, 256, 8, 256, 50304, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True) \
            if hasattr(F, "scaled_dot_product_attention") else self.attn(q, k, v)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, H)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")))

    def attn(self, q, k, v):
        w = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        w = self.drop(torch.softmax(w.masked_fill(~mask, float("-inf")), -1))
        return w @ v


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(S, H)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.lnf = nn.LayerNorm(H)
        self.drop = nn.Dropout(0.1)

    def forward(self, idx, tgt):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(S)))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
idx = torch.randint(0, 50257, (B, S))
tgt = torch.randint(0, 50257, (B, S))
times = []
for it in range(8):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
steady = sorted(times[2:])[len(times[2:]) // 2]
n = sum(p.numel() for p in model.parameters())
print(f"| PyTorch {torch.__version__} eager, 2 threads | params {n/1e6:.1f}M | step {steady*1e3:.0f} ms | {B*S/steady:.0f} tokens/s |")
