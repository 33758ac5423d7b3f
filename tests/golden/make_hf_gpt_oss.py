#!/usr/bin/env python3
"""Fixtures for the Hugging Face gpt-oss exchange (tests/checkpoint/hf_gpt_oss_test.cpp).

An independent PyTorch forward: transformers' own GptOssForCausalLM, built from a small
config here (random weights at O(1) scale, fixed seed), saved with save_pretrained
(safetensors), and the logits of a fixed token batch computed by transformers in float64
on the CPU. The config exercises what gpt-oss adds to a Llama-style MoE model: learnable
attention sinks, q/k/v/o biases, a head dim whose product with the heads is not the hidden
size, alternating sliding-window and full layers, YaRN RoPE with truncate false, a router
with a bias, experts with biases and the clamped GLU (gate * sigmoid(1.702 gate) * (up + 1),
limit 7) in the Hub's interleaved gate_up_proj layout.

    python3 tests/golden/make_hf_gpt_oss.py OUT_DIR    # then copy OUT_DIR to tests/golden/hf_gpt_oss

Writes OUT_DIR/{config.json, model.safetensors, reference.safetensors, info.json}.
reference.safetensors holds `tokens` [B, S] int64 and `logits` [B, S, V] float64; info.json
the versions, the saved tensor names and shapes, the smallest top-k routing margin and the
reload check. A seed is kept only if every top-k choice is decided by a margin of at least
MIN_MARGIN in the router logits (float32 and float64 forwards then route alike). Some
router logits are pushed past the clamp (|gate|, |up| > 7) so the clamp is exercised.
Needs torch and transformers (with gpt_oss: 4.55 or later).
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

B, S = 2, 10
E, K = 4, 2
MIN_MARGIN = 2e-3


def make_config():
    from transformers import GptOssConfig
    kw = dict(vocab_size=96, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              num_local_experts=E, num_experts_per_tok=K, sliding_window=4,
              layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
              rms_norm_eps=1e-5, attention_bias=True, attention_dropout=0.0, swiglu_limit=7.0,
              tie_word_embeddings=False, router_aux_loss_coef=0.01, output_router_logits=False,
              use_cache=False, initializer_range=0.02)
    yarn = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 16, "truncate": False}
    if int(transformers.__version__.split(".")[0]) >= 5:
        return GptOssConfig(rope_parameters=dict(yarn, rope_theta=150000.0), **kw)
    return GptOssConfig(rope_theta=150000.0, rope_scaling=yarn, **kw)


def eager(model):
    for setter in ("set_attn_implementation", "set_experts_implementation"):
        if hasattr(model, setter):
            try:
                getattr(model, setter)("eager")
            except Exception as e:  # noqa: BLE001 -- report, the default may do
                print(f"  {setter}('eager') failed: {e}")
    try:
        model.config._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    return model


def redraw(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * r
            elif "embed_tokens" in name:
                v = r
            elif name.endswith("sinks"):
                v = r  # some heads with a large sink, some with a small one
            elif name.endswith("router.weight"):
                v = r * 2.0 / p.shape[-1] ** 0.5
            elif name.endswith("bias"):
                v = 0.5 * r
            elif name.endswith("gate_up_proj"):
                v = r * 3.0 / p.shape[-2] ** 0.5  # [E, H, 2F]: fan-in H; large: the clamp bites
            elif name.endswith("down_proj"):
                v = r / p.shape[-2] ** 0.5  # [E, F, H]: fan-in F
            else:
                v = r / p.shape[-1] ** 0.5
            p.copy_(v.to(p.dtype))


def forward64(model, tokens):
    """Logits [B, S, V] in float64, the smallest gap between the K-th and (K+1)-th router
    logit, and the fraction of GLU inputs beyond the clamp (from each expert layer's input)."""
    model = model.double().eval()
    gaps, clamped = [], []

    def router_hook(mod, args, _out):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        logits = x @ mod.weight.double().t() + mod.bias.double()
        top = torch.sort(logits, dim=-1, descending=True).values
        gaps.append(float((top[:, K - 1] - top[:, K]).min()))

    def experts_hook(mod, args, kwargs, _out):
        try:  # the Hub layout gate_up_proj [E, H, 2F]; another layout: not measured
            x = (args[0] if args else kwargs["hidden_states"])
            x = x.reshape(-1, mod.gate_up_proj.shape[1]).double()
            gu = torch.einsum("th,ehf->etf", x, mod.gate_up_proj.double())
            clamped.append(float((gu.abs() > 7.0).double().mean()))
        except Exception as e:  # noqa: BLE001
            clamped.append(f"not measured: {e}")

    hs = []
    for n, m in model.named_modules():
        if n.endswith("mlp.router"):
            hs.append(m.register_forward_hook(router_hook))
        if n.endswith("mlp.experts"):
            hs.append(m.register_forward_hook(experts_hook, with_kwargs=True))
    with torch.no_grad():
        out = model(input_ids=tokens, use_cache=False)
    for h in hs:
        h.remove()
    return out.logits, (min(gaps) if gaps else None), clamped


def main(out_dir):
    from transformers import GptOssForCausalLM
    os.makedirs(out_dir, exist_ok=True)
    cfg = make_config()
    tokens = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(7))
    for seed in range(60):
        torch.manual_seed(seed)
        model = eager(GptOssForCausalLM(cfg)).float()
        redraw(model, 2000 + seed)
        f32_state = {n: t.clone() for n, t in model.state_dict().items()}
        logits, margin, clamped = forward64(model, tokens)
        print(f"seed {seed}: min top-{K} margin {margin}, clamped fractions {clamped}")
        if margin is not None and margin >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"no seed gave a routing margin >= {MIN_MARGIN}")
    model = eager(GptOssForCausalLM(cfg)).float()
    model.load_state_dict(f32_state)
    tmp = os.path.join(out_dir, "_save")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))
    shutil.rmtree(tmp)
    save_file({"tokens": tokens.contiguous(), "logits": logits.contiguous()},
              os.path.join(out_dir, "reference.safetensors"),
              metadata={"family": "gpt_oss", "transformers": transformers.__version__})
    back = eager(transformers.AutoModelForCausalLM.from_pretrained(out_dir))
    logits2, _, _ = forward64(back, tokens)
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_tensor(k).shape) for k in sorted(f.keys())}
    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "batch": [B, S], "seed": seed, "min_margin": margin,
            "min_margin_required": MIN_MARGIN, "clamped_fractions": clamped,
            "reload_max_abs_diff": float((logits2 - logits).abs().max()),
            "logits_max_abs": float(logits.abs().max()), "tensors": shapes}
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    print(json.dumps(info, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hf_gpt_oss_out")
