#include "checkpoint/hf_moe.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/hf_window.h"
#include "model/module.h"

namespace mcpp::checkpoint::hf_moe {

using json = nlohmann::json;

bool is_moe_model_type(const std::string& type) {
  return type == "mixtral" || type == "qwen3_moe" || type == "gpt_oss";
}

void moe_config_from_hf(const json& j, const std::string& type, model::TransformerConfig& c) {
  MCPP_CHECK(is_moe_model_type(type), "internal: {} is not a MoE model type", type);
  const bool qwen = type == "qwen3_moe";
  auto count = [&](const char* k) -> int64_t {
    MCPP_CHECK_HINT(j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 1 &&
                        j[k].get<int64_t>() < (int64_t(1) << 20),
                    "check config.json",
                    "Hugging Face config.json ({}): '{}' is {}, expected a positive integer", type,
                    k, j.contains(k) ? j[k].dump() : std::string("missing"));
    return j[k].get<int64_t>();
  };
  // Mixtral: num_local_experts (transformers maps num_experts onto it); Qwen3-MoE: num_experts.
  const char* ne = qwen ? "num_experts" : "num_local_experts";
  if (!j.contains(ne)) ne = qwen ? "num_local_experts" : "num_experts";
  if (!j.contains(ne)) ne = qwen ? "num_experts" : "num_local_experts";  // the error names it
  c.moe.num_experts = count(ne);
  c.moe.topk = count("num_experts_per_tok");
  MCPP_CHECK_HINT(c.moe.topk <= c.moe.num_experts, "check config.json",
                  "Hugging Face config.json ({}): num_experts_per_tok {} exceeds the {} experts",
                  type, c.moe.topk, c.moe.num_experts);
  // Spelt as training spells --moe-layer-freq (checkpoints compare it): one 0/1 per layer,
  // allocated only for a plausible layer count.
  MCPP_CHECK_HINT(c.num_layers <= (int64_t(1) << 16), "check config.json",
                  "Hugging Face config.json ({}): num_hidden_layers {} is implausible", type,
                  c.num_layers);
  c.moe.layer_pattern.assign(size_t(c.num_layers), 1);
  // Softmax -> top-k -> renormalise: Megatron's default (post-softmax) router, no scaling.
  c.moe.score = model::TransformerConfig::Moe::Score::Softmax;
  c.moe.pre_softmax = false, c.moe.topk_scaling_factor = 0;
  if (qwen) {
    // Qwen3-MoE: q/k RMSNorm per head; experts of moe_intermediate_size, dense layers of
    // intermediate_size where mlp_only_layers / decoder_sparse_step say; norm_topk_prob false
    // is softmax -> top-k without renormalising: Megatron's --moe-router-pre-softmax.
    c.qk_layernorm = true;
    c.moe.ffn_hidden_size = count("moe_intermediate_size");
    const json norm = j.value("norm_topk_prob", json(false));
    MCPP_CHECK_HINT(norm.is_boolean(), "check config.json",
                    "Hugging Face config.json ({}): norm_topk_prob {} is not true or false", type,
                    norm.dump());
    c.moe.pre_softmax = !norm.get<bool>();
    const int64_t step = j.contains("decoder_sparse_step") ? count("decoder_sparse_step") : 1;
    const json only = j.value("mlp_only_layers", json::array());
    MCPP_CHECK_HINT(only.is_array() || only.is_null(), "check config.json",
                    "Hugging Face config.json ({}): mlp_only_layers {} is not a list", type,
                    only.dump());
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.moe.layer_pattern[size_t(l)] = (l + 1) % step == 0 ? 1 : 0;
    if (only.is_array())
      for (const json& l : only) {
        MCPP_CHECK_HINT(
            l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < c.num_layers,
            "check config.json",
            "Hugging Face config.json ({}): mlp_only_layers entry {} is not a layer "
            "index below {}",
            type, l.dump(), c.num_layers);
        c.moe.layer_pattern[size_t(l.get<int64_t>())] = 0;
      }
  } else {
    c.moe.ffn_hidden_size = c.ffn_hidden_size;  // Mixtral's intermediate_size is per expert
  }
  c.moe.balance = {model::TransformerConfig::Moe::Balance::AuxLoss};
  const json coef = j.value("router_aux_loss_coef", json(0.0));
  MCPP_CHECK_HINT(coef.is_number() && std::isfinite(coef.get<double>()) && coef.get<double>() >= 0,
                  "check config.json",
                  "Hugging Face config.json ({}): router_aux_loss_coef {} is not a number >= 0",
                  type, coef.dump());
  c.moe.aux_loss_coeff = {coef.get<double>()};
  window_from_hf(j, type, c);  // sliding-window attention (hf_window.h)
  const json jitter = j.value("router_jitter_noise", json(0.0));
  if (!jitter.is_number() || jitter.get<double>() != 0.0)
    log::warn(
        "{} config.json: router_jitter_noise {} (Hugging Face's training-time router "
        "noise) has no megatron.cpp equivalent: training here routes without noise",
        type, jitter.dump());
}

MoeArch moe_arch_of(const model::TransformerConfig& c) {
  const auto& m = c.moe;
  const bool qwen = c.qk_layernorm;  // q/k norms: Qwen3-MoE; none: Mixtral
  const char* arch = qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM";
  auto need = [&](bool ok, const char* what, const char* hint) {
    MCPP_CHECK_HINT(ok, hint, "this mixture-of-experts model has no {} equivalent: {}", arch, what);
  };
  need(!m.apply_probs_on_input,
       "the probabilities applied to the experts' input (--moe-apply-probs-on-input)",
       "its experts weight their outputs: train without --moe-apply-probs-on-input");
  need(c.rope && c.rmsnorm && c.swiglu && c.rotary_percent == 1.0,
       "it is RoPE (all dims) + RMSNorm + SwiGLU",
       "use --position-embedding-type rope --normalization RMSNorm --swiglu");
  if (!qwen)
    for (int64_t l = 0; l < c.num_layers; ++l)
      need(c.is_moe_layer(l), "a dense layer (--moe-layer-freq); Mixtral's layers are all MoE",
           "use --moe-layer-freq 1 (Qwen3-MoE, with --qk-layernorm, has dense layers)");
  need(!m.sigmoid_like() && (qwen || !m.pre_softmax) && m.topk_scaling_factor == 0 &&
           m.num_groups == 0 && !m.expert_bias,
       "the router is not softmax -> top-k (-> renormalise) (sigmoid or sqrtsoftplus, "
       "pre-softmax without Qwen3's norm_topk_prob, scaling, group-limited or expert bias)",
       "its router is Megatron's default (Qwen3-MoE: or --moe-router-pre-softmax): drop the "
       "other router flags");
  need(!m.sinkhorn(),
       "sinkhorn routing (its weights are softmax values of the chosen experts, not "
       "renormalised)",
       "train with --moe-router-load-balancing-type aux_loss, seq_aux_loss, global_aux_loss "
       "or none");
  need(m.shared_ffn_hidden_size == 0, "shared experts (--moe-shared-expert-intermediate-size)",
       "it has routed experts only");
  need(m.capacity_factor == 0, "token dropping (--moe-expert-capacity-factor)", "it is dropless");
  need(!c.qkv_bias(), "linear biases",
       "it has no biases (--disable-bias-linear, no --add-qkv-bias)");
  return qwen ? MoeArch::Qwen3Moe : MoeArch::Mixtral;
}

void to_moe_config(const model::TransformerConfig& c, json& j) {
  const bool qwen = moe_arch_of(c) == MoeArch::Qwen3Moe;
  j["architectures"] = {qwen ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM"};
  j["model_type"] = qwen ? "qwen3_moe" : "mixtral";
  j.erase("mlp_bias");  // not a field of either: they have no biases
  if (!qwen) j.erase("attention_bias");
  j["num_experts_per_tok"] = c.moe.topk;
  if (qwen) {
    j["intermediate_size"] = c.ffn_hidden_size;  // the dense layers'
    j["moe_intermediate_size"] = c.moe.ffn_hidden_size;
    j["num_experts"] = c.moe.num_experts;        // transformers 4.x reads this name,
    j["num_local_experts"] = c.moe.num_experts;  // 5.x writes this one (attribute_map)
    j["norm_topk_prob"] = !c.moe.pre_softmax;
    j["decoder_sparse_step"] = 1;
    json only = json::array();
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (!c.is_moe_layer(l)) only.push_back(l);
    j["mlp_only_layers"] = only;
    j["use_sliding_window"] = false;
  } else {
    j["intermediate_size"] = c.moe.ffn_hidden_size;
    j["num_local_experts"] = c.moe.num_experts;
    j["router_jitter_noise"] = 0.0;
  }
  j["sliding_window"] = nullptr;
  // Hugging Face's aux loss has Switch's form too but is taken over all layers at once and
  // only with output_router_logits; the coefficient is carried, the loss is not identical:
  // aux_loss's when listed, else the first listed seq_aux_loss / global_aux_loss's.
  using Balance = model::TransformerConfig::Moe::Balance;
  double coef = c.moe.coeff(Balance::AuxLoss);
  for (size_t i = 0; i < c.moe.balance.size() && !c.moe.coeff(Balance::AuxLoss); ++i)
    if (c.moe.balance[i] == Balance::SeqAuxLoss || c.moe.balance[i] == Balance::GlobalAuxLoss) {
      coef = c.moe.aux_loss_coeff[i];
      break;
    }
  j["router_aux_loss_coef"] = coef;
  j["output_router_logits"] = false;
}

std::vector<RowsEntry> moe_layer_entries(const model::TransformerConfig& c, int layer) {
  const bool qwen = moe_arch_of(c) == MoeArch::Qwen3Moe;
  const int64_t I = c.moe.ffn_hidden_size;
  const std::string h =
      "model.layers." + std::to_string(layer) + (qwen ? ".mlp." : ".block_sparse_moe.");
  const char* g = qwen ? "gate_proj" : "w1";
  const char* u = qwen ? "up_proj" : "w3";
  const char* d = qwen ? "down_proj" : "w2";
  auto L = [&](const std::string& s) { return model::layer_param_name(layer, s); };
  std::vector<RowsEntry> e;
  e.push_back({L("mlp.router.weight"), h + "gate.weight"});
  for (int64_t x = 0; x < c.moe.num_experts; ++x) {
    const std::string ex = h + "experts." + std::to_string(x) + ".";
    const std::string fc1 = L("mlp.experts.linear_fc1.weight" + std::to_string(x));
    e.push_back({fc1, ex + g + ".weight", 0, I});
    e.push_back({fc1, ex + u + ".weight", I, 2 * I});
    e.push_back({L("mlp.experts.linear_fc2.weight" + std::to_string(x)), ex + d + ".weight"});
  }
  return e;
}

namespace {

// Rows [r0, r1) of slice `e` of a [E, R, C] tensor, as a new [r1 - r0, C] tensor.
Tensor slice_rows(const Tensor& t, int64_t e, int64_t r0, int64_t r1) {
  const int64_t R = t.size(1), C = t.size(2);
  Tensor out = Tensor::empty({r1 - r0, C}, t.dtype());
  const size_t es = dtype_size(t.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + size_t((e * R + r0) * C) * es,
              out.nbytes());
  return out;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

std::map<std::string, Tensor> unfuse_experts(const model::TransformerConfig& c,
                                             const std::map<std::string, Tensor>& in) {
  const int64_t E = c.moe.num_experts, I = c.moe.ffn_hidden_size, H = c.hidden_size;
  const bool qwen = moe_arch_of(c) == MoeArch::Qwen3Moe;  // Hub names: mlp., *_proj
  const char* g = qwen ? "gate_proj" : "w1";
  const char* u = qwen ? "up_proj" : "w3";
  const char* d = qwen ? "down_proj" : "w2";
  std::map<std::string, Tensor> out;
  auto put = [&](const std::string& name, Tensor t, const std::string& from) {
    MCPP_CHECK_HINT(!out.count(name) && (name == from || !in.count(name)),
                    "a folder holds either transformers 5's fused experts or the Hub's "
                    "per-expert tensors, not both",
                    "Hugging Face tensor {} is given twice (also as part of {})", name, from);
    out[name] = std::move(t);
  };
  for (const auto& [n, t] : in) {
    const size_t mlp = n.find(".mlp.");
    if (mlp == std::string::npos || n.rfind("model.layers.", 0) != 0) {
      put(n, t, n);
      continue;
    }
    const std::string pre = n.substr(0, mlp) + (qwen ? ".mlp." : ".block_sparse_moe.");
    auto shape_is = [&](const Shape& want) {
      MCPP_CHECK_HINT(t.shape() == want, "the config.json does not match the weights",
                      "Hugging Face tensor {} has shape {}, expected {}", n, shape_str(t.shape()),
                      shape_str(want));
    };
    if (ends_with(n, ".mlp.gate.weight")) {
      put(pre + "gate.weight", t, n);
    } else if (ends_with(n, ".mlp.experts.gate_up_proj")) {
      shape_is({E, 2 * I, H});
      for (int64_t e = 0; e < E; ++e) {
        const std::string ex = pre + "experts." + std::to_string(e) + ".";
        put(ex + g + ".weight", slice_rows(t, e, 0, I), n);
        put(ex + u + ".weight", slice_rows(t, e, I, 2 * I), n);
      }
    } else if (ends_with(n, ".mlp.experts.down_proj")) {
      shape_is({E, H, I});
      for (int64_t e = 0; e < E; ++e)
        put(pre + "experts." + std::to_string(e) + "." + d + ".weight", slice_rows(t, e, 0, H), n);
    } else {
      put(n, t, n);  // not ours: from_hf_tensors names it as unknown
    }
  }
  return out;
}

}  // namespace mcpp::checkpoint::hf_moe
