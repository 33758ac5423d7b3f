#!/usr/bin/env python3
"""Fixtures for `megatron convert --from-megatron` (issue 23 A.5), written by PyTorch itself.

Builds two tiny models with Megatron-Core's parameter names and layouts (grouped QKV, SwiGLU
linear_fc1 as [gate; up], padded vocabulary), and writes for each:

  <out>/<fam>_legacy/   Megatron's --ckpt-format torch: latest_checkpointed_iteration.txt and
                        iter_0000010/mp_rank_TT_PPP/model_optim_rng.pt, TP2 x PP2, each file a
                        torch.save() of the state dict Megatron writes (args Namespace, model,
                        optimizer, opt_param_scheduler, rng_state with numpy's and torch's RNG
                        states, checkpoint_version, iteration)
  <out>/<fam>_dist/     Megatron's --ckpt-format torch_dist: iter_0000010/ with the
                        torch.distributed.checkpoint FileSystemWriter files (.metadata,
                        __0_0.distcp), common.pt and metadata.json; layer tensors stacked along
                        a leading layer axis under keys without the layer number, as
                        Megatron-Core's TransformerBlock.sharded_state_dict does
  <out>/<fam>_legacy_optim.safetensors, <fam>_legacy_optim_index.json   the legacy files'
                        optimizer state is Megatron's non-distributed optimizer's (see
                        megatron_optimizer): the TP=1 truth of exp_avg / exp_avg_sq / fp32 main
                        params by name, and every rank key's [group, position, state index]
  <out>/llama_legacy_logits.safetensors   the logits of the Llama main params (bf16 run: the
                        import prefers them over the bf16 weights)
  <out>/<fam>_logits.safetensors   tokens [B, S] and the logits [S, B, Vp] of an independent
                        float64 PyTorch forward of the same weights (as stored: GPT in float32,
                        Llama in bfloat16)

GPT: LayerNorm, GELU (tanh form: Megatron's bias_gelu_fusion), biases, learned positions, tied
embeddings, local-spec names (input_layernorm.weight). Llama: RMSNorm, SwiGLU, RoPE, GQA, no
biases, untied, Transformer Engine names (linear_qkv.layer_norm_weight).

Run on a machine with PyTorch (no GPU needed):  python3 tests/golden/make_megatron_ckpt.py OUT
"""
import argparse
import collections
import enum
import io
import json
import math
import os
import random
import struct
import sys
import types

import numpy as np
import torch

L, H, NH, S, B, MAXPOS, VOCAB, VP, TP, PP, ITER = 4, 16, 4, 8, 3, 12, 61, 64, 2, 2, 10

FAMILIES = {
    "gpt": dict(NG=4, HD=4, F=64, llama=False, dtype=torch.float32, te=False),
    "llama": dict(NG=2, HD=4, F=24, llama=True, dtype=torch.bfloat16, te=True),
}

# Megatron's args hold enums of megatron.core (e.g. attention_backend); pickling one needs
# its class to be importable, so a stand-in module of that name is registered here.
_enums = types.ModuleType("megatron.core.transformer.enums")


class AttnBackend(enum.Enum):
    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5


AttnBackend.__module__ = "megatron.core.transformer.enums"
_enums.AttnBackend = AttnBackend
for name in ("megatron", "megatron.core", "megatron.core.transformer"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["megatron.core.transformer.enums"] = _enums


def full_weights(fam, cfg):
    """TP=1 Megatron-Core tensors (local-spec names), float64 values rounded to cfg dtype."""
    g = torch.Generator().manual_seed(1234 if fam == "gpt" else 4321)
    NG, HD, F, llama = cfg["NG"], cfg["HD"], cfg["F"], cfg["llama"]
    qkv = NG * (NH // NG + 2) * HD
    shapes = {"embedding.word_embeddings.weight": (VP, H)}
    if not llama:
        shapes["embedding.position_embeddings.weight"] = (MAXPOS, H)
    for l in range(L):
        p = f"decoder.layers.{l}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attention.linear_qkv.weight"] = (qkv, H)
        shapes[p + "self_attention.linear_proj.weight"] = (H, NH * HD)
        shapes[p + "pre_mlp_layernorm.weight"] = (H,)
        shapes[p + "mlp.linear_fc1.weight"] = ((2 if llama else 1) * F, H)
        shapes[p + "mlp.linear_fc2.weight"] = (H, F)
        if not llama:
            shapes[p + "input_layernorm.bias"] = (H,)
            shapes[p + "pre_mlp_layernorm.bias"] = (H,)
            shapes[p + "self_attention.linear_qkv.bias"] = (qkv,)
            shapes[p + "self_attention.linear_proj.bias"] = (H,)
            shapes[p + "mlp.linear_fc1.bias"] = (F,)
            shapes[p + "mlp.linear_fc2.bias"] = (H,)
    shapes["decoder.final_layernorm.weight"] = (H,)
    if not llama:
        shapes["decoder.final_layernorm.bias"] = (H,)
    else:
        shapes["output_layer.weight"] = (VP, H)
    out = {}
    for k, shp in shapes.items():
        r = torch.randn(shp, generator=g, dtype=torch.float64)
        if k.endswith("layernorm.weight"):
            v = 1.0 + 0.1 * r
        elif k.endswith(".bias"):
            v = 0.1 * r
        else:
            v = 0.3 * r
        out[k] = v.to(cfg["dtype"])
    return out


# ---- the independent reference forward (float64) -------------------------------------------

def norm(x, w, b, eps, rms):
    if rms:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rope(x, base):
    Sx, D = x.shape[0], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(Sx, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)[:, None, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * torch.cos(emb) + torch.cat([-x2, x1], dim=-1) * torch.sin(emb)


def forward(w, cfg, tokens):
    p = {k: v.double() for k, v in w.items()}
    NG, HD, llama, eps = cfg["NG"], cfg["HD"], cfg["llama"], 1e-5
    Sx = tokens.shape[1]
    x = p["embedding.word_embeddings.weight"][tokens.t()]  # [S, B, H]
    if not llama:
        x = x + p["embedding.position_embeddings.weight"][:Sx][:, None, :]
    causal = torch.ones(Sx, Sx, dtype=torch.bool).tril()
    r = NH // NG
    for l in range(L):
        g = lambda n: p.get(f"decoder.layers.{l}." + n)
        h = norm(x, g("input_layernorm.weight"), g("input_layernorm.bias"), eps, llama)
        qkv = h @ g("self_attention.linear_qkv.weight").t()
        if not llama:
            qkv = qkv + g("self_attention.linear_qkv.bias")
        qkv = qkv.reshape(Sx, B, NG, r + 2, HD)
        q = qkv[:, :, :, :r, :].reshape(Sx, B, NH, HD)
        k, v = qkv[:, :, :, r, :], qkv[:, :, :, r + 1, :]
        if llama:
            q, k = rope(q, 10000.0), rope(k, 10000.0)
        k, v = k.repeat_interleave(r, dim=2), v.repeat_interleave(r, dim=2)
        sc = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(HD)
        pr = torch.softmax(sc.masked_fill(~causal, float("-inf")), dim=-1)
        ctx = torch.einsum("bhst,tbhd->sbhd", pr, v).reshape(Sx, B, NH * HD)
        o = ctx @ g("self_attention.linear_proj.weight").t()
        if not llama:
            o = o + g("self_attention.linear_proj.bias")
        x = x + o
        h = norm(x, g("pre_mlp_layernorm.weight"), g("pre_mlp_layernorm.bias"), eps, llama)
        f = h @ g("mlp.linear_fc1.weight").t()
        if llama:
            gate, up = f.chunk(2, dim=-1)
            a = torch.nn.functional.silu(gate) * up
        else:
            a = torch.nn.functional.gelu(f + g("mlp.linear_fc1.bias"), approximate="tanh")
        o = a @ g("mlp.linear_fc2.weight").t()
        if not llama:
            o = o + g("mlp.linear_fc2.bias")
        x = x + o
    x = norm(x, p["decoder.final_layernorm.weight"], p.get("decoder.final_layernorm.bias"), eps, llama)
    return x @ p.get("output_layer.weight", p["embedding.word_embeddings.weight"]).t()


# ---- Megatron's layouts --------------------------------------------------------------------

def te_name(k):
    """Transformer Engine spec: the norms live inside linear_qkv / linear_fc1."""
    for a, b in (("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
                 ("input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"),
                 ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
                 ("pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias")):
        if k.endswith(a):
            return k[: -len(a)] + b
    return k


def tp_shard(k, t, rank, swiglu):
    """This TP rank's part of a TP=1 tensor, as Megatron's parallel layers hold it."""
    if k in ("embedding.word_embeddings.weight", "output_layer.weight") or \
            "linear_qkv.weight" in k or "linear_qkv.bias" in k:
        return t.chunk(TP, 0)[rank].clone()
    if "linear_fc1.weight" in k or "linear_fc1.bias" in k:
        if swiglu:  # each rank holds [gate_r; up_r]
            gate, up = t.chunk(2, 0)
            return torch.cat([gate.chunk(TP, 0)[rank], up.chunk(TP, 0)[rank]], 0).clone()
        return t.chunk(TP, 0)[rank].clone()
    if "linear_proj.weight" in k or "linear_fc2.weight" in k:
        return t.chunk(TP, 1)[rank].clone()
    return t.clone()  # norms, row-parallel biases, position embeddings: replicated


def megatron_args(fam, cfg, ckpt_format):
    llama = cfg["llama"]
    return argparse.Namespace(
        num_layers=L, hidden_size=H, ffn_hidden_size=cfg["F"], num_attention_heads=NH,
        group_query_attention=cfg["NG"] != NH, num_query_groups=cfg["NG"], kv_channels=cfg["HD"],
        max_position_embeddings=MAXPOS, seq_length=S, padded_vocab_size=VP,
        make_vocab_size_divisible_by=32, normalization="RMSNorm" if llama else "LayerNorm",
        norm_epsilon=1e-5, apply_layernorm_1p=False, swiglu=llama, squared_relu=False,
        openai_gelu=False, bias_gelu_fusion=not llama, position_embedding_type="rope" if llama
        else "learned_absolute", rotary_base=10000, rotary_percent=1.0, rotary_interleaved=False,
        use_rope_scaling=False, untie_embeddings_and_output_weights=llama,
        add_bias_linear=not llama, add_qkv_bias=not llama, qk_layernorm=False, num_experts=None,
        tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP,
        virtual_pipeline_model_parallel_size=None, use_distributed_optimizer=False,
        params_dtype=cfg["dtype"], bf16=llama, fp16=False, transformer_impl="transformer_engine"
        if cfg["te"] else "local", attention_backend=AttnBackend.auto,
        tokenizer_type="GPT2BPETokenizer" if not llama else "HuggingFaceTokenizer",
        vocab_file="/data/gpt2-vocab.json" if not llama else None, seed=1234,
        hidden_dropout=0.1, attention_dropout=0.1, init_method_std=0.02, ckpt_format=ckpt_format,
        iteration=ITER, consumed_train_samples=ITER * 8, lr=3e-4, min_lr=3e-5,
        data_path=["1.0", "/data/corpus_text_document"], split="969,30,1",
        eval_iters=[10], recompute_granularity=None, exit_on_missing_checkpoint=False,
        fp8=None, moe_router_topk=2)


def optimizer_truth(fam, cfg, w):
    """TP=1 Adam state of the model (float32): exp_avg, exp_avg_sq and the fp32 main params.
    bf16 runs: main params within a quarter ulp of the bf16 weights (so rounding them gives
    the weights, as after Megatron's copy of main params to the model); fp32: the weights."""
    g = torch.Generator().manual_seed(99 if fam == "gpt" else 98)
    truth = {}
    for k, t in w.items():
        m = (1e-3 * torch.randn(t.shape, generator=g, dtype=torch.float64)).float()
        v = (1e-6 * (0.1 + torch.rand(t.shape, generator=g, dtype=torch.float64))).float()
        if t.dtype == torch.float32:
            main = t.clone()
        else:
            _, e = torch.frexp(t.double())
            ulp = torch.ldexp(torch.ones_like(t, dtype=torch.float64), e - 8)
            u = torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1
            main = (t.double() + 0.2 * ulp * u).float()
            assert torch.equal(main.to(t.dtype), t), k
        truth[k] = {"exp_avg": m, "exp_avg_sq": v, "main": main}
    return truth


def no_weight_decay(name, t):
    """Megatron's standard override: no weight decay on biases and 1-D parameters."""
    return name.endswith(".bias") or t.dim() == 1


def megatron_optimizer(fam, cfg, sd, truth, pp, tp):
    """A rank's optimizer entry as Megatron's legacy checkpoint holds it (non-distributed).

    Parameter groups as megatron/core/optimizer/__init__.py _get_param_groups builds them:
    the rank's trainable parameters in named_parameters() order (the model state dict's order,
    _extra_state aside) are split by their overrides, and the groups are ordered by their key.
    Megatron-Core today sorts the default group (weight decay) first; older releases sorted
    (wd_mult, lr_mult, ...) tuples, which put wd_mult 0.0 first. GPT uses today's order and
    Llama the older one, so both are covered. torch's Optimizer.state_dict numbers the
    parameters group after group; state is keyed by that number.
    GPT (fp32): FP32Optimizer.state_dict() is the torch state dict itself, torch Adam's per
    parameter 'step'. Llama (bf16): Float16OptimizerWithFloat16Params.state_dict() =
    {optimizer, grad_scaler, fp32_from_fp16_params: main params per group}, and the step kept
    per group (apex / Transformer Engine FusedAdam)."""
    swiglu, per = cfg["llama"], L // PP
    params = [(k, t) for k, t in sd.items() if t is not None]
    wd = [p for p in params if not no_weight_decay(*p)]
    nowd = [p for p in params if no_weight_decay(*p)]
    groups = [(wd, 1.0), (nowd, 0.0)] if fam == "gpt" else [(nowd, 0.0), (wd, 1.0)]
    state, pgroups, mains, index, n = {}, [], [], {}, 0
    for gi, (members, wd_mult) in enumerate(groups):
        ids, main_g = [], []
        for j, (k, t) in enumerate(members):
            glob = global_name(k, pp, per)
            tr = truth[glob if glob in truth else "embedding.word_embeddings.weight"]
            s = {key: tp_shard(glob, tr[key], tp, swiglu) for key in ("exp_avg", "exp_avg_sq", "main")}
            assert s["main"].shape == t.shape, (k, s["main"].shape, t.shape)
            st = {"exp_avg": s["exp_avg"], "exp_avg_sq": s["exp_avg_sq"]}
            if fam == "gpt":
                st = {"step": torch.tensor(float(ITER)), **st}
            state[n] = st
            main_g.append(s["main"])
            index[k] = [gi, j, n]
            ids.append(n)
            n += 1
        pg = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01 * wd_mult,
              "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
              "differentiable": False, "fused": None, "wd_mult": wd_mult, "lr_mult": 1.0,
              "is_expert_parallel": False, "is_decoupled_lr": False, "max_lr": 3e-4,
              "min_lr": 3e-5, "default_config": True, "params": ids}
        if fam != "gpt":
            pg["step"] = ITER
            pg["bias_correction"] = True
        pgroups.append(pg)
        mains.append(main_g)
    torch_sd = {"state": state, "param_groups": pgroups}
    if cfg["dtype"] == torch.float32:
        return torch_sd, index
    return {"optimizer": torch_sd, "grad_scaler": None, "fp32_from_fp16_params": mains}, index


def global_name(k, pp, per):
    """A rank's key -> the TP=1 local-spec name of full_weights (TE names undone)."""
    for a, b in (("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"),
                 ("self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"),
                 ("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"),
                 ("mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias")):
        if k.endswith(a):
            k = k[: -len(a)] + b
    if k.startswith("decoder.layers."):
        _, _, l, rest = k.split(".", 3)
        k = f"decoder.layers.{int(l) + pp * per}.{rest}"
    return k


def write_legacy(out, fam, cfg, w):
    swiglu, te = cfg["llama"], cfg["te"]
    opt_truth = optimizer_truth(fam, cfg, w)
    index = {}
    per = L // PP
    root = os.path.join(out, f"{fam}_legacy")
    for pp in range(PP):
        for tp in range(TP):
            sd = collections.OrderedDict()
            if pp == 0:
                for k in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight"):
                    if k in w:
                        sd[k] = tp_shard(k, w[k], tp, swiglu)
            for l in range(pp * per, (pp + 1) * per):
                pre = f"decoder.layers.{l}."
                for k, t in w.items():
                    if k.startswith(pre):
                        local = f"decoder.layers.{l - pp * per}." + k[len(pre):]
                        sd[te_name(local) if te else local] = tp_shard(k, t, tp, swiglu)
                if te:  # Transformer Engine's extra state (FP8 metadata): empty without FP8
                    for m in ("self_attention.core_attention", "self_attention.linear_qkv",
                              "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"):
                        sd[f"decoder.layers.{l - pp * per}.{m}._extra_state"] = None
            if pp == PP - 1:
                for k in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias"):
                    if k in w:
                        sd[k] = tp_shard(k, w[k], tp, swiglu)
                # the last stage always holds an output layer; tied, it is the embedding's copy
                src = w.get("output_layer.weight", w["embedding.word_embeddings.weight"])
                sd["output_layer.weight"] = tp_shard("output_layer.weight", src, tp, swiglu)
            sd._metadata = collections.OrderedDict([("", {"version": 1})])
            optim, index[f"mp_rank_{tp:02d}_{pp:03d}"] = megatron_optimizer(fam, cfg, sd, opt_truth, pp, tp)
            np.random.seed(1234)
            random.seed(1234)
            rng = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                   "torch_rng_state": torch.get_rng_state(),
                   "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
                   "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}}
            state = {
                "args": megatron_args(fam, cfg, "torch"), "checkpoint_version": 3.0,
                "iteration": ITER, "model": sd, "optimizer": optim,
                # OptimizerParamScheduler.state_dict()'s keys (num_steps counts samples)
                "opt_param_scheduler": {"max_lr": 3e-4, "lr_warmup_steps": 16, "num_steps": ITER * 8,
                                        "lr_decay_style": "cosine", "lr_decay_steps": 800,
                                        "min_lr": 3e-5, "start_wd": 0.01, "end_wd": 0.01,
                                        "wd_incr_style": "constant", "wd_incr_steps": 800},
                "rng_state": [rng], "num_floating_point_operations_so_far": 1.5e9,
            }
            d = os.path.join(root, f"iter_{ITER:07d}", f"mp_rank_{tp:02d}_{pp:03d}")
            os.makedirs(d, exist_ok=True)
            torch.save(state, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITER))
    # for the tests: every rank's key -> [group, position in group, state index], and the TP=1
    # truth (float32) by megatron.cpp/Megatron-Core local-spec name
    with open(os.path.join(out, f"{fam}_legacy_optim_index.json"), "w") as f:
        json.dump({"step": ITER, "ranks": index}, f, indent=1, sort_keys=True)
    flat = {}
    for k, tr in opt_truth.items():
        for key, t in tr.items():
            flat[f"{key}/{k}"] = t
    save_safetensors(os.path.join(out, f"{fam}_legacy_optim.safetensors"), flat)
    if cfg["dtype"] != torch.float32:  # the import prefers the main params: their logits
        return {k: tr["main"] for k, tr in opt_truth.items()}
    return None


def write_dist(out, fam, cfg, w):
    import torch.distributed.checkpoint as dcp
    root = os.path.join(out, f"{fam}_dist")
    d = os.path.join(root, f"iter_{ITER:07d}")
    os.makedirs(d, exist_ok=True)
    sd = {}
    for k, t in w.items():
        if not k.startswith("decoder.layers."):
            sd[k] = t.clone()
    # layer tensors: one global tensor per name with a leading layer axis
    names = sorted({k.split(".", 3)[3] for k in w if k.startswith("decoder.layers.")})
    for n in names:
        key = "decoder.layers." + (te_name(n) if cfg["te"] else n)
        sd[key] = torch.stack([w[f"decoder.layers.{l}.{n}"] for l in range(L)]).contiguous()
    # a ShardedObject as Megatron stores one: pickled bytes under key/shard_<offsets>_<shape>
    sd["rng_state/shard_0.0_1.1"] = io.BytesIO(b"\x80\x02}q\x00.")
    try:
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(d), no_dist=True)
    except TypeError:
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(d))
    torch.save({"args": megatron_args(fam, cfg, "torch_dist"), "checkpoint_version": 3.0,
                "iteration": ITER, "num_floating_point_operations_so_far": 1.5e9},
               os.path.join(d, "common.pt"))
    with open(os.path.join(d, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITER))


def save_safetensors(path, tensors):
    names = {torch.float64: "F64", torch.int64: "I64", torch.float32: "F32"}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b_ in blobs:
            f.write(b_)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "megatron")
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (B, S), generator=g, dtype=torch.int64)
    for fam, cfg in FAMILIES.items():
        w = full_weights(fam, cfg)
        main = None
        for writer in (write_legacy, write_dist):
            try:  # one failing layout must not lose the others' files
                r = writer(out, fam, cfg, w)
                main = r if writer is write_legacy else main
            except Exception:  # noqa: BLE001
                import traceback
                traceback.print_exc()
        if main is not None:
            lm = forward(main, cfg, tokens)
            save_safetensors(os.path.join(out, f"{fam}_legacy_logits.safetensors"),
                             {"tokens": tokens, "logits": lm.contiguous()})
        logits = forward(w, cfg, tokens)
        save_safetensors(os.path.join(out, f"{fam}_logits.safetensors"),
                         {"tokens": tokens, "logits": logits.contiguous()})
        print(f"{fam}: logits {tuple(logits.shape)} sum {logits.sum().item():.9f}")
    total = 0
    for dp, _, fs in os.walk(out):
        for f in fs:
            total += os.path.getsize(os.path.join(dp, f))
            print(os.path.relpath(os.path.join(dp, f), out), os.path.getsize(os.path.join(dp, f)))
    print("total bytes", total, "torch", torch.__version__, "numpy", np.__version__)


if __name__ == "__main__":
    main()
