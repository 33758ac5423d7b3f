#!/usr/bin/env python3
"""Independent reference for the golden tests, written with plain PyTorch ops.

Reads tests/golden/data/<family>_inputs.safetensors (weights with Megatron-Core names,
a batch, the config as metadata; written by the golden_export program), builds the
same model in float64 with autograd, and writes <family>_expected.safetensors with
the logits [S, B, Vp], the loss, and the gradient of every parameter ("grad.<name>").

The multi-latent attention families follow Megatron-Core's MLASelfAttention (the unfused
qkv_up_proj_and_rope_apply path), its YarnRotaryEmbedding and _apply_rotary_pos_emb_bshd
with mla_rotary_interleaved=True, written from that code, not from ours.

Run with Debian's python3-torch (1.13):
  /usr/bin/python3 tests/golden/make_golden.py [DIR [FAMILY...]]   (default: every family)
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


def rope_interleaved(x, base):
    # Megatron's RotaryEmbedding with rotary_interleaved: the frequencies repeated pairwise
    # and _rotate_half's interleaved form, [-x1, x0, -x3, x2, ...].
    S, D = x.shape[0], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]  # [S, D/2]
    emb = torch.stack([ang, ang], dim=-1).reshape(S, D)[:, None, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    rot = torch.stack([-x2, x1], dim=-1).reshape(x.shape)
    return x * torch.cos(emb) + rot * torch.sin(emb)


# ---- multi-latent attention (Megatron-Core's MLASelfAttention) ----------------------------

def yarn_get_mscale(scale, mscale):
    # yarn_rotary_pos_embedding._yarn_get_mscale
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_rotary(meta, S):
    """The angles [S, 1, 1, Dr] and the factor on cos and sin: RotaryEmbedding for rope_type
    "rope" (mscale stays 1.0 in get_query_key_value_tensors), YarnRotaryEmbedding.get_emb for
    "yarn" (frequencies in float64 here, float32 in Megatron)."""
    dim = int(meta["qk_pos_emb_head_dim"]); base = float(meta["rotary_base"])
    exps = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    if meta["rope_type"] == "rope":
        inv_freq, mscale = 1.0 / (base ** exps), 1.0
    else:
        factor = float(meta["rotary_scaling_factor"])
        orig = int(meta["original_max_position_embeddings"])
        inv_freq_extra = 1.0 / (base ** exps)
        inv_freq_inter = 1.0 / (factor * base ** exps)

        def correction_dim(num_rotations):  # _yarn_find_correction_dim
            return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        # _yarn_find_correction_range, correction_range_round_to_int=True
        low = math.floor(correction_dim(float(meta["beta_fast"])))
        high = math.ceil(correction_dim(float(meta["beta_slow"])))
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:  # _yarn_linear_ramp_mask
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv_freq_mask = 1.0 - ramp
        inv_freq = inv_freq_inter * (1 - inv_freq_mask) + inv_freq_extra * inv_freq_mask
        # _yarn_get_concentration_factor
        mscale = yarn_get_mscale(factor, float(meta["mscale"])) / yarn_get_mscale(
            factor, float(meta["mscale_all_dim"]))
    freqs = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb[:, None, None, :], mscale


def mla_rope_apply(t, emb, mscale):
    # _apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False,
    # mla_rotary_interleaved=True, mscale): t [S, B, heads, Dr], all of it rotated.
    x1 = t[..., 0::2]
    x2 = t[..., 1::2]
    t = torch.cat((x1, x2), dim=-1)
    cos_ = torch.cos(emb) * mscale
    sin_ = torch.sin(emb) * mscale
    a, b = torch.chunk(t, 2, dim=-1)  # _rotate_half, non-interleaved
    return t * cos_ + torch.cat((-b, a), dim=-1) * sin_


def mla_attention(h, g, meta, eps):
    """MLASelfAttention.forward up to linear_proj's input: h [S, B, H] -> [S, B, NH * Dv]."""
    S, B = h.shape[0], h.shape[1]
    NH = int(meta["num_attention_heads"])
    q_lora = int(meta["q_lora_rank"]); kv_lora = int(meta["kv_lora_rank"])
    Dn = int(meta["qk_head_dim"]); Dr = int(meta["qk_pos_emb_head_dim"])
    Dv = int(meta["v_head_dim"]); Dq = Dn + Dr
    qk_ln = meta["qk_layernorm"] == "1"
    # QKNormConfigResolver: RMSNorm on the latents under qk_layernorm, IdentityOp without.
    latent_norm = (lambda x, w: norm(x, w, None, eps, True)) if qk_ln else (lambda x, w: x)
    # _qkv_down_projection and the norms
    if q_lora > 0:
        q_compressed = h @ g("self_attention.linear_q_down_proj.weight").t()
        q_compressed = latent_norm(q_compressed, g("self_attention.q_layernorm.weight"))
    else:
        q_compressed = h
    kv_combined = h @ g("self_attention.linear_kv_down_proj.weight").t()
    kv_compressed, k_pos_emb = torch.split(kv_combined, [kv_lora, Dr], dim=-1)
    kv_compressed = latent_norm(kv_compressed, g("self_attention.kv_layernorm.weight"))
    # qkv_up_proj_and_rope_apply
    if q_lora > 0:
        q = q_compressed @ g("self_attention.linear_q_up_proj.weight").t()
    else:
        q = q_compressed @ g("self_attention.linear_q_proj.weight").t()
    q = q.view(S, B, NH, Dq)
    kv = (kv_compressed @ g("self_attention.linear_kv_up_proj.weight").t()).view(S, B, NH, Dn + Dv)
    k_pos_emb = torch.unsqueeze(k_pos_emb, -2)  # [S, B, 1, Dr]
    rotary_pos_emb, mscale = mla_rotary(meta, S)
    q_no_pe, q_pos_emb = torch.split(q, [Dn, Dr], dim=-1)
    k_no_pe, value = torch.split(kv, [Dn, Dv], dim=-1)
    q_pos_emb = mla_rope_apply(q_pos_emb, rotary_pos_emb, mscale)
    k_pos_emb = mla_rope_apply(k_pos_emb, rotary_pos_emb, mscale)
    query = torch.cat([q_no_pe, q_pos_emb], dim=-1)
    key = torch.cat([k_no_pe, k_pos_emb.expand(-1, -1, NH, -1)], dim=-1)
    # core attention with MultiLatentAttention.softmax_scale (whatever the rope type)
    m = yarn_get_mscale(float(meta["rotary_scaling_factor"]), float(meta["mscale_all_dim"]))
    softmax_scale = m * m / math.sqrt(Dq)
    scores = torch.einsum("sbhd,tbhd->bhst", query, key) * softmax_scale
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.einsum("bhst,tbhd->sbhd", probs, value).reshape(S, B, NH * Dv)


def attention(h, g, meta, llama):
    """Grouped-query self-attention up to linear_proj's input: h [S, B, H] -> [S, B, NH * HD]."""
    S, B = h.shape[0], h.shape[1]
    NH = int(meta["num_attention_heads"]); NG = int(meta["num_query_groups"])
    HD = int(meta["kv_channels"])
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    qkv = h @ g("self_attention.linear_qkv.weight").t()
    if g("self_attention.linear_qkv.bias") is not None:
        qkv = qkv + g("self_attention.linear_qkv.bias")
    r = NH // NG
    qkv = qkv.reshape(S, B, NG, r + 2, HD)
    q = qkv[:, :, :, :r, :].reshape(S, B, NH, HD)
    k = qkv[:, :, :, r, :]  # [S, B, NG, HD]
    v = qkv[:, :, :, r + 1, :]
    if llama:
        rot = rope_interleaved if meta.get("rotary_interleaved") == "1" else rope
        q = rot(q, float(meta["rotary_base"]))
        k = rot(k, float(meta["rotary_base"]))
    k = k.repeat_interleave(r, dim=2)
    v = v.repeat_interleave(r, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(HD)
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhst,tbhd->sbhd", probs, v).reshape(S, B, NH * HD)


def forward(p, meta, tokens, labels, mask):
    fam = meta["family"]
    L = int(meta["num_layers"]); eps = float(meta["norm_epsilon"])
    llama = fam != "gpt"  # RoPE, RMSNorm, SwiGLU (the llama family and its MLA variants)
    mla = meta.get("multi_latent_attention") == "1"
    B, S = tokens.shape
    x = p["embedding.word_embeddings.weight"][tokens.t()]  # [S, B, H]
    if not llama:
        x = x + p["embedding.position_embeddings.weight"][:S][:, None, :]
    for l in range(L):
        pre = f"decoder.layers.{l}."
        g = lambda n: p.get(pre + n)
        h = norm(x, g("input_layernorm.weight"), g("input_layernorm.bias"), eps, llama)
        if mla:
            ctx = mla_attention(h, g, meta, eps)
        else:
            ctx = attention(h, g, meta, llama)
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
    for fam in sys.argv[2:] or ("gpt", "llama", "mla", "mla_rope", "llama_interleaved"):
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
