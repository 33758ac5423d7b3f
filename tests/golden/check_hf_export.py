#!/usr/bin/env python3
"""Golden check of megatron.cpp's Hugging Face export, independent of megatron.cpp's layout.

For each folder <root>/{gpt2,llama,qwen2,qwen3,mistral} (written by golden_hf_export) this
script reads the exported config.json and model.safetensors *as Hugging Face defines them* and
runs the forward pass of GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM /
Qwen3ForCausalLM / MistralForCausalLM written with plain torch ops (no `transformers` here), in
float64:

  GPT-2: wte + wpe; per block x += c_proj(attn(ln_1(x))), x += mlp(ln_2(x)); Conv1D is
         x @ W + b with W stored [in, out]; c_attn's output splits into q | k | v, each
         [heads, head_dim]; gelu_new (tanh); ln_f; logits = x @ wte^T (tied).
  Llama: embed_tokens; RMSNorm w * x * rsqrt(mean(x^2) + eps); q/k/v_proj [out, in]; RoPE with
         inv_freq = theta^(-arange(0, d, 2)/d), emb = cat(freqs, freqs), x*cos + rotate_half(x)*sin
         with rotate_half(x) = cat(-x2, x1); repeat_kv (kv head h // n_rep); o_proj;
         down(silu(gate(x)) * up(x)); norm; lm_head (or embed_tokens when tied). Biases on
         q/k/v/o_proj with attention_bias, on the MLP with mlp_bias.
  Qwen2: Llama with biases on q_proj / k_proj / v_proj always (none on o_proj or the MLP);
         sliding window only with use_sliding_window.
  Qwen3: Llama with q_norm / k_norm, an RMSNorm (rms_norm_eps) over head_dim applied to each
         query / key head after the projection and before RoPE; head_dim from config.json;
         biases on q/k/v/o_proj with attention_bias.
  Mistral: Llama without biases; sliding_window W (when not null) hides keys j <= i - W.
The folder's tensor names must be exactly the ones the class defines (no extra, none missing).

It compares with megatron.cpp's logits (ours.safetensors) and writes
reference_logits.safetensors ([S, B, V] float64) and check.json. Exit status 1 on mismatch.

Run with Debian's python3-torch (1.13):  /usr/bin/python3 tests/golden/check_hf_export.py tests/golden/hf
"""
import json
import math
import os
import struct
import sys

import torch

DT = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64}
NAMES = {v: k for k, v in DT.items()}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, v in header.items():
        b, e = v["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=DT[v["dtype"]]).reshape(v["shape"]).clone()
    return out


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].contiguous().numpy().tobytes()
        header[name] = {"dtype": NAMES[tensors[name].dtype], "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def causal_attention(q, k, v, window=None):
    # q [B, NH, S, D], k/v [B, NH, S, D]; window: query i sees keys i - window < j <= i
    S, D = q.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    if window is not None:
        mask &= ~torch.ones(S, S, dtype=torch.bool).tril(-window)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gpt2_forward(cfg, w, ids):
    B, S = ids.shape
    H, NH = cfg["n_embd"], cfg["n_head"]
    D = H // NH
    eps = cfg["layer_norm_epsilon"]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (H,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))

    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(S)][None]
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = qkv.split(H, dim=-1)
        heads = lambda t: t.view(B, S, NH, D).transpose(1, 2)
        a = causal_attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(B, S, H)
        x = x + conv1d(a, p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].t()  # [B, S, V]


def llama_family(cfg):
    """(q/k/v bias, o_proj bias, MLP bias, q/k norms, sliding window) of the class."""
    t = cfg["model_type"]
    ab = cfg.get("attention_bias", False)
    window = cfg.get("sliding_window", 4096) if t == "mistral" else None  # every layer
    if t in ("qwen2", "qwen3") and cfg.get("use_sliding_window", False):
        raise ValueError("Qwen's per-layer sliding windows are not modelled here")
    if t == "llama":
        return ab, ab, cfg.get("mlp_bias", False), False, window
    if t == "qwen2":
        return True, False, False, False, window
    if t == "qwen3":
        return ab, ab, False, True, window
    if t == "mistral":
        return False, False, False, False, window
    raise ValueError(f"model_type {t}")


def llama_keys(cfg):
    qkv_b, o_b, mlp_b, qk_norm, _ = llama_family(cfg)
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.get("tie_word_embeddings"):
        keys.add("lm_head.weight")
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        keys |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        for n, b in (("self_attn.q_proj", qkv_b), ("self_attn.k_proj", qkv_b),
                     ("self_attn.v_proj", qkv_b), ("self_attn.o_proj", o_b),
                     ("mlp.gate_proj", mlp_b), ("mlp.up_proj", mlp_b), ("mlp.down_proj", mlp_b)):
            keys |= {p + n + ".weight"} | ({p + n + ".bias"} if b else set())
        if qk_norm:
            keys |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    return keys


def llama_forward(cfg, w, ids):
    B, S = ids.shape
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // NH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    qkv_b, o_b, mlp_b, qk_norm, window = llama_family(cfg)
    assert set(w) == llama_keys(cfg), f"tensors differ from the class's: {set(w) ^ llama_keys(cfg)}"

    def rms(x, p):
        return w[p] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, p, bias):
        y = x @ w[p + ".weight"].t()
        return y + w[p + ".bias"] if bias else y

    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]

    def rotate_half(t):
        return torch.cat([-t[..., D // 2:], t[..., : D // 2]], dim=-1)

    x = w["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, p + "input_layernorm.weight")
        q = lin(h, p + "self_attn.q_proj", qkv_b).view(B, S, NH, D)
        k = lin(h, p + "self_attn.k_proj", qkv_b).view(B, S, NKV, D)
        v = lin(h, p + "self_attn.v_proj", qkv_b).view(B, S, NKV, D).transpose(1, 2)
        if qk_norm:  # Qwen3: per head, over head_dim, before RoPE
            q, k = rms(q, p + "self_attn.q_norm.weight"), rms(k, p + "self_attn.k_norm.weight")
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # repeat_kv: head h reads kv head h // n_rep
        v = v.repeat_interleave(NH // NKV, dim=1)
        a = causal_attention(q, k, v, window).transpose(1, 2).reshape(B, S, NH * D)
        x = x + lin(a, p + "self_attn.o_proj", o_b)
        h = rms(x, p + "post_attention_layernorm.weight")
        x = x + lin(torch.nn.functional.silu(lin(h, p + "mlp.gate_proj", mlp_b)) *
                    lin(h, p + "mlp.up_proj", mlp_b), p + "mlp.down_proj", mlp_b)
    x = rms(x, "model.norm.weight")
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.t()


def main(root):
    ok = True
    report = {}
    for fam in ("gpt2", "llama", "qwen2", "qwen3", "mistral"):
        d = os.path.join(root, fam)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        w = {k: v.double() for k, v in load(os.path.join(d, "model.safetensors")).items()}
        ours = load(os.path.join(d, "ours.safetensors"))
        ids = ours["tokens"]
        fwd = gpt2_forward if cfg["model_type"] == "gpt2" else llama_forward
        ref = fwd(cfg, w, ids).transpose(0, 1).contiguous()  # [S, B, V], as megatron.cpp
        assert ref.shape[-1] == cfg["vocab_size"], "logits width must equal config vocab_size"
        diff = (ref - ours["logits"].double().reshape(ref.shape)).abs().max().item()  # ours: [S*B, V]
        scale = ref.abs().max().item()
        report[fam] = {"architecture": cfg["architectures"][0], "max_abs_diff": diff,
                       "max_abs_logit": scale, "rel_diff": diff / scale,
                       "logits_shape": list(ref.shape)}
        ok = ok and diff / scale < 1e-5
        save(os.path.join(d, "reference_logits.safetensors"), {"logits": ref})
        print(f"{fam}: {cfg['architectures'][0]} max |ref - ours| = {diff:.3e} "
              f"(max |logit| {scale:.3f}, relative {diff / scale:.3e})")
    report["torch_version"] = torch.__version__
    with open(os.path.join(root, "check.json"), "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "hf")))
