#!/usr/bin/env python3
"""Fixtures for the Hugging Face MoE exchange (tests/checkpoint/hf_moe_test.cpp).

An independent PyTorch MoE forward: Hugging Face transformers' own MixtralForCausalLM and
Qwen3MoeForCausalLM, built from a config here (random weights, fixed seed, 4 experts
top-2), saved with save_pretrained (safetensors), and the logits of a fixed token batch
computed by transformers in float64 on the CPU.

    python3 tests/golden/make_hf_moe.py OUT_DIR      # then copy OUT_DIR to tests/golden/hf_moe

Writes OUT_DIR/<family>/{config.json, model.safetensors, reference.safetensors} for
family in (mixtral, qwen3_moe) and OUT_DIR/info.json (versions, the saved tensor names, the
smallest top-k routing margin, the reload check). Where save_pretrained writes transformers
5's fused expert tensors, mixtral/hub.safetensors also holds the same weights in the Hub's
per-expert layout (block_sparse_moe.experts.M.w1/w2/w3), verified by loading it back into
transformers. reference.safetensors holds `tokens`
[B, S] int64 and `logits` [B, S, V] float64 (V = config vocab_size).

Weights are redrawn at O(1) scale (HF's default init, std 0.02, would give nearly uniform
routing and logits: a weak test). A seed is kept only if every top-k choice of every layer
is decided by a margin of at least MIN_MARGIN in the router logits, so that float32 and
float64 forwards route every token alike. Needs torch and transformers (4.x or 5.x).
"""
import json
import os
import shutil
import sys
import traceback

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

B, S = 2, 8
MIN_MARGIN = 2e-3


def common(vocab):
    return dict(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64, hidden_act="silu",
                tie_word_embeddings=False, attention_dropout=0.0, initializer_range=0.02,
                num_experts_per_tok=2, output_router_logits=False, router_aux_loss_coef=0.01,
                use_cache=False)


def make_config(cls, theta, **kw):
    # transformers 5 takes RoPE as rope_parameters (and writes it to config.json), 4.x as
    # rope_theta.
    if int(transformers.__version__.split(".")[0]) >= 5:
        return cls(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    return cls(rope_theta=theta, **kw)


def families():
    """(name, model class, a function making its config)"""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    mixtral = lambda: make_config(MixtralConfig, 10000.0, num_hidden_layers=2, intermediate_size=48,
                          num_local_experts=4, rms_norm_eps=1e-5, head_dim=8, sliding_window=None,
                          router_jitter_noise=0.0, **common(96))
    # Qwen3-MoE: layer 0 dense (mlp_only_layers), layers 1-2 MoE; norm_topk_prob on.
    qwen = lambda: make_config(Qwen3MoeConfig, 20000.0, num_hidden_layers=3, intermediate_size=40,
                       moe_intermediate_size=24, num_experts=4, decoder_sparse_step=1,
                       mlp_only_layers=[0], norm_topk_prob=True, rms_norm_eps=1e-6,
                       attention_bias=False, use_sliding_window=False, **common(80))
    return [("mixtral", MixtralForCausalLM, mixtral), ("qwen3_moe", Qwen3MoeForCausalLM, qwen)]


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
            elif name.endswith("gate.weight") and p.dim() == 2 and p.shape[0] == 4:
                v = r * 2.0 / p.shape[-1] ** 0.5  # the router: decisive choices
            else:
                v = r / p.shape[-1] ** 0.5  # fan-in of [out, in] and of fused [E, out, in]
            p.copy_(v.to(p.dtype))


def routers(model, n_experts):
    # The MoE routers: a module named ...gate with an [E, H] weight (Mixtral's
    # block_sparse_moe.gate / mlp.gate, Qwen3-MoE's mlp.gate; a dense gate_proj is not one).
    return [m for n, m in model.named_modules()
            if n.endswith(".gate") and getattr(m, "weight", None) is not None
            and m.weight.dim() == 2 and m.weight.shape[0] == n_experts]


def forward64(model, tokens, n_experts, k):
    """Logits [B, S, V] in float64 and the smallest gap between the k-th and (k+1)-th router
    logit over all tokens and MoE layers (recomputed from each router's input)."""
    model = model.double().eval()
    gaps = []

    def hook(mod, args, _out):
        if not args:  # called with keywords only: no margin from this router
            return
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        top = torch.sort(x @ mod.weight.double().t(), dim=-1, descending=True).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    hs = [m.register_forward_hook(hook) for m in routers(model, n_experts)]
    with torch.no_grad():
        out = model(input_ids=tokens, use_cache=False)
    for h in hs:
        h.remove()
    return out.logits, (min(gaps) if gaps else None), len(gaps)


def hub_layout(tensors, mixtral):
    """The Hub's per-expert layout from transformers 5's fused one: experts.gate_up_proj
    [E, 2I, H] = per expert cat([gate; up]) and experts.down_proj [E, H, I] (the inverse of
    transformers' conversion_mapping). Mixtral's Hub names: block_sparse_moe, w1/w3/w2."""
    out = {}
    g, u, dn = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for n, t in tensors.items():
        base = n.replace(".mlp.", ".block_sparse_moe.") if mixtral and ".mlp." in n else n
        if n.endswith(".experts.gate_up_proj"):
            half = t.shape[1] // 2
            pre = base[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.{g}.weight"] = t[e, :half].contiguous()
                out[f"{pre}{e}.{u}.weight"] = t[e, half:].contiguous()
        elif n.endswith(".experts.down_proj"):
            pre = base[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.{dn}.weight"] = t[e].contiguous()
        else:
            out[base if mixtral and ".mlp.gate." in n else n] = t
    return out


def build(name, cls, cfg, out_dir, info):
    k = cfg.num_experts_per_tok
    E = cfg.num_local_experts if hasattr(cfg, "num_local_experts") else cfg.num_experts
    tokens = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(7))
    for seed in range(40):
        torch.manual_seed(seed)
        model = eager(cls(cfg)).float()
        redraw(model, 1000 + seed)
        f32_state = {n: t.clone() for n, t in model.state_dict().items()}
        logits, margin, n_routers = forward64(model, tokens, E, k)
        print(f"{name}: seed {seed}: {n_routers} MoE layers, min top-{k} margin {margin}")
        if margin is None:  # the routers could not be watched: keep the seed, say so
            print(f"{name}: WARNING: no router margin measured")
            break
        if margin >= MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed gave a routing margin >= {MIN_MARGIN}")
    # Save the float32 weights (the float64 forward above ran on exactly these values).
    model = eager(cls(cfg)).float()
    model.load_state_dict(f32_state)
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d)  # safetensors: the default of transformers >= 4.35
    kept = []
    for f in sorted(os.listdir(d)):  # at most 8 files come back from the GPU machine
        if f in ("config.json", "model.safetensors"):
            kept.append(f)
        else:
            os.remove(os.path.join(d, f))
            print(f"  removed {f} (not needed)")
    assert kept == ["config.json", "model.safetensors"], f"save_pretrained wrote {kept}"
    save_file({"tokens": tokens.contiguous(), "logits": logits.contiguous()},
              os.path.join(d, "reference.safetensors"),
              metadata={"family": name, "transformers": transformers.__version__})
    # The saved folder must load back in transformers to the same logits (its on-disk layout
    # is what from_pretrained reads, whichever that is in this version).
    back = eager(transformers.AutoModelForCausalLM.from_pretrained(d))
    logits2, _, _ = forward64(back, tokens, E, k)
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        saved = {kk: f.get_tensor(kk) for kk in keys}
    shapes = {kk: list(t.shape) for kk, t in saved.items()}
    hub_diff = None
    if name == "mixtral" and any(kk.endswith("gate_up_proj") for kk in keys):
        # save_pretrained wrote the fused layout: also keep the Hub's per-expert layout, checked
        # by loading it back into transformers (which converts it on load).
        tmp = os.path.join(out_dir, "_hub_tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        shutil.copy(os.path.join(d, "config.json"), tmp)
        save_file(hub_layout(saved, True), os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        lh, _, _ = forward64(eager(transformers.AutoModelForCausalLM.from_pretrained(tmp)),
                             tokens, E, k)
        hub_diff = float((lh - logits).abs().max())
        print(f"{name}: Hub-layout copy reloads with max abs diff {hub_diff}")
        if hub_diff < 1e-9:
            shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(d, "hub.safetensors"))
        shutil.rmtree(tmp, ignore_errors=True)
    info[name] = {
        "class": cls.__name__, "seed": seed, "min_topk_margin": margin, "moe_layers": n_routers,
        "reload_max_abs_diff": float((logits2 - logits).abs().max()),
        "max_abs_logit": float(logits.abs().max()),
        "f32_vs_f64_max_abs_diff": None, "tensors": shapes, "hub_copy_max_abs_diff": hub_diff,
        "config": json.load(open(os.path.join(d, "config.json"))),
    }
    with torch.no_grad():
        m32 = eager(cls(cfg)).float().eval()
        m32.load_state_dict(f32_state)
        l32 = m32(input_ids=tokens, use_cache=False).logits
        info[name]["f32_vs_f64_max_abs_diff"] = float((l32.double() - logits).abs().max())
    print(f"{name}: saved {len(keys)} tensors; reload diff {info[name]['reload_max_abs_diff']}; "
          f"f32 vs f64 {info[name]['f32_vs_f64_max_abs_diff']}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "hf_moe_out"
    os.makedirs(out_dir, exist_ok=True)
    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "batch": [B, S], "min_margin_required": MIN_MARGIN, "errors": {}}
    torch.set_num_threads(4)
    ok = True
    for name, cls, make_cfg in families():
        try:
            build(name, cls, make_cfg(), out_dir, info)
        except Exception:  # noqa: BLE001 -- keep the other family's fixture
            ok = False
            info["errors"][name] = traceback.format_exc()
            print(info["errors"][name])
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
