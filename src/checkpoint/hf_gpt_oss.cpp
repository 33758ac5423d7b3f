#include "checkpoint/hf_gpt_oss.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "model/module.h"

namespace mcpp::checkpoint::hf_gpt_oss {

using json = nlohmann::json;

namespace {

const char* const kArch = "GptOssForCausalLM";
const char* const kSink = "self_attention.core_attention.softmax_offset";
// The expert tensors of a layer, as HF names them under model.layers.L.mlp.experts.
const char* const kExpertTensors[] = {"gate_up_proj", "gate_up_proj_bias", "down_proj",
                                      "down_proj_bias"};

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

bool is_gpt_oss_type(const std::string& type) { return type == "gpt_oss"; }

bool looks_like_gpt_oss(const model::TransformerConfig& c) {
  return c.moe.num_experts > 0 && (c.quick_geglu || c.attention_sink());
}

void check_exportable(const model::TransformerConfig& c) {
  const auto& m = c.moe;
  auto need = [&](bool ok, const char* what, const char* hint) {
    MCPP_CHECK_HINT(ok, hint, "this model has no {} equivalent: {}", kArch, what);
  };
  need(c.rope && c.rmsnorm && c.rotary_percent == 1.0, "it is RoPE (all dims) + RMSNorm",
       "use --position-embedding-type rope --normalization RMSNorm");
  need(c.quick_geglu && c.glu_linear_offset == 1.0 && c.activation_func_clamp_value.has_value(),
       "its experts' GLU is --quick-geglu --glu-linear-offset 1 with a clamp "
       "(--activation-func-clamp-value, config.json's swiglu_limit)",
       "train with --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7");
  need(c.attention_sink(), "every attention head has a sink (self_attn.sinks)",
       "train with --softmax-type learnable (off-by-one exports as sinks of zero)");
  for (int64_t l = 0; l < c.num_layers; ++l)
    need(c.is_moe_layer(l), "a dense layer (--moe-layer-freq); gpt-oss's layers are all MoE",
         "use --moe-layer-freq 1");
  need(c.add_bias_linear, "linear layers without biases (its router and experts have them)",
       "train with Megatron's default --add-bias-linear");
  need(!m.sigmoid_like() && !m.pre_softmax && m.topk_scaling_factor == 0 && m.num_groups == 0 &&
           !m.expert_bias && !m.sinkhorn(),
       "the router is not logits -> top-k -> softmax (sigmoid or sqrtsoftplus scores, "
       "pre-softmax, scaling, group-limited, expert bias or sinkhorn)",
       "its router is Megatron's default: drop the other router flags");
  need(m.shared_ffn_hidden_size == 0, "shared experts (--moe-shared-expert-intermediate-size)",
       "it has routed experts only");
  need(!m.apply_probs_on_input,
       "the probabilities applied to the experts' input (--moe-apply-probs-on-input)",
       "its experts weight their outputs: train without --moe-apply-probs-on-input");
  need(m.capacity_factor == 0, "token dropping (--moe-expert-capacity-factor)", "it is dropless");
  need(!c.qk_layernorm, "q/k norms (--qk-layernorm)", "it has none");
}

void config_from_hf(const json& j, model::TransformerConfig& c) {
  const json ab = j.value("attention_bias", json(true));
  MCPP_CHECK_HINT(ab.is_boolean() && ab.get<bool>(),
                  "megatron.cpp has one switch for all linear biases, and gpt-oss's router and "
                  "experts always have them",
                  "Hugging Face config.json (gpt_oss): attention_bias is {}", ab.dump());
  c.add_bias_linear = true, c.add_qkv_bias = true;
  c.swiglu = false, c.quick_geglu = true, c.glu_linear_offset = 1.0;
  const json lim = j.value("swiglu_limit", json(7.0));
  MCPP_CHECK_HINT(lim.is_number() && std::isfinite(lim.get<double>()) && lim.get<double>() > 0,
                  "check config.json",
                  "Hugging Face config.json (gpt_oss): swiglu_limit {} is not a positive number",
                  lim.dump());
  c.activation_func_clamp_value = lim.get<double>();
  c.softmax_type = model::TransformerConfig::SoftmaxType::Learnable;
}

void config_to_hf(const model::TransformerConfig& c, json& j) {
  check_exportable(c);
  j["architectures"] = {kArch};
  j["model_type"] = "gpt_oss";
  j.erase("mlp_bias");
  j["attention_bias"] = true;
  j["intermediate_size"] = c.moe.ffn_hidden_size;
  j["num_local_experts"] = c.moe.num_experts;
  j["num_experts_per_tok"] = c.moe.topk;
  j["experts_per_token"] = c.moe.topk;  // the name of the original release's config
  j["swiglu_limit"] = *c.activation_func_clamp_value;
  j["router_aux_loss_coef"] =
      c.moe.coeff(model::TransformerConfig::Moe::Balance::AuxLoss);
  j["output_router_logits"] = false;
  // Every layer's type; the window applies to the sliding ones (HF: i - j < sliding_window).
  json types = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    types.push_back(c.is_window_layer(l) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["sliding_window"] = c.has_window_layers() ? c.window_left + 1 : c.max_position_embeddings;
}

std::vector<Entry> layer_entries(const model::TransformerConfig& c, int layer) {
  const int64_t F = c.moe.ffn_hidden_size;
  const std::string h = layer_prefix(layer), x = h + "mlp.experts.";
  auto L = [&](const std::string& s) { return model::layer_param_name(layer, s); };
  // [gate; up] rows in gpt-oss's interleaved order: gate 0, up 0, gate 1, up 1, ...
  std::vector<int64_t> inter;
  for (int64_t i = 0; i < F; ++i) inter.push_back(i), inter.push_back(F + i);
  std::vector<Entry> e;
  if (c.softmax_type == model::TransformerConfig::SoftmaxType::Learnable)
    e.push_back({L(kSink), h + "self_attn.sinks", {}});  // off-by-one: zeros (fuse_experts)
  e.push_back({L("mlp.router.weight"), h + "mlp.router.weight", {}});
  e.push_back({L("mlp.router.bias"), h + "mlp.router.bias", {}});
  for (int64_t ex = 0; ex < c.moe.num_experts; ++ex) {
    const std::string s = "." + std::to_string(ex), n = std::to_string(ex);
    e.push_back({L("mlp.experts.linear_fc1.weight" + n), x + "gate_up_proj" + s, inter, true});
    e.push_back({L("mlp.experts.linear_fc1.bias" + n), x + "gate_up_proj_bias" + s, inter});
    e.push_back({L("mlp.experts.linear_fc2.weight" + n), x + "down_proj" + s, {}, true});
    e.push_back({L("mlp.experts.linear_fc2.bias" + n), x + "down_proj_bias" + s, {}});
  }
  return e;
}

void fuse_experts(const model::TransformerConfig& c, std::map<std::string, Tensor>& t) {
  const int64_t E = c.moe.num_experts;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* name : kExpertTensors) {
      const std::string base = layer_prefix(l) + "mlp.experts." + name;
      const Tensor& first = t.at(base + ".0");
      Shape shape{E};
      for (int64_t d : first.shape()) shape.push_back(d);
      Tensor out = Tensor::empty(shape, first.dtype());
      for (int64_t e = 0; e < E; ++e) {
        const std::string n = base + "." + std::to_string(e);
        const Tensor& s = t.at(n);
        std::memcpy(static_cast<char*>(out.raw()) + size_t(e) * s.nbytes(), s.raw(), s.nbytes());
        t.erase(n);
      }
      t[base] = out;
    }
    const std::string sink = layer_prefix(l) + "self_attn.sinks";
    if (!t.count(sink)) {  // off-by-one: a sink of zero logit in every head
      const Tensor& ref = t.at(layer_prefix(l) + "mlp.router.bias");
      Tensor z = Tensor::empty({c.num_attention_heads}, ref.dtype());
      std::memset(z.raw(), 0, z.nbytes());  // +0.0 in every float dtype
      t[sink] = z;
    }
  }
}

namespace {

// An MXFP4 pair (OCP microscaling: blocks of 32 FP4 E2M1 values sharing an E8M0 scale) as
// the released gpt-oss checkpoints store the experts, dequantised to f32 in the Hub's layout:
// blocks [E, R, G, 16] u8 (two values a byte, the low nibble first) and scales [E, R, G] u8
// (2^(s - 127)) hold [E, R, 32 G]; the last two dims are then swapped ([E, 32 G, R]), as
// transformers' convert_moe_packed_tensors does. Every value is exact in f32.
Tensor dequantize_mxfp4(const std::string& name, const Tensor& blocks, const Tensor& scales) {
  MCPP_CHECK_HINT(blocks.dtype() == DType::U8 && scales.dtype() == DType::U8 &&
                      blocks.dim() == 4 && blocks.size(3) == 16 && scales.dim() == 3 &&
                      scales.size(0) == blocks.size(0) && scales.size(1) == blocks.size(1) &&
                      scales.size(2) == blocks.size(2),
                  "check the model folder",
                  "Hugging Face tensors {}_blocks {} ({}) and {}_scales {} ({}) are not an MXFP4 "
                  "pair ([E, R, G, 16] and [E, R, G] u8)",
                  name, shape_str(blocks.shape()), dtype_name(blocks.dtype()), name,
                  shape_str(scales.shape()), dtype_name(scales.dtype()));
  static const float kFp4[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                 -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  const int64_t E = blocks.size(0), R = blocks.size(1), G = blocks.size(2), C = 32 * G;
  Tensor out = Tensor::empty({E, C, R}, DType::F32);
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* sc = scales.data<uint8_t>();
  float* o = out.data<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = (e * R + r) * G + g;
        const int x = int(sc[row]) - 127;
        for (int64_t k = 0; k < 16; ++k) {
          const uint8_t v = b[row * 16 + k];
          const int64_t c0 = 32 * g + 2 * k;
          o[(e * C + c0) * R + r] = std::ldexp(kFp4[v & 0x0F], x);
          o[(e * C + c0 + 1) * R + r] = std::ldexp(kFp4[v >> 4], x);
        }
      }
  return out;
}

}  // namespace

std::map<std::string, Tensor> split_experts(const model::TransformerConfig& c,
                                            const std::map<std::string, Tensor>& in_raw) {
  const int64_t E = c.moe.num_experts;
  // MXFP4 pairs (name_blocks, name_scales) become the dequantised tensor `name` first.
  std::map<std::string, Tensor> in;
  for (const auto& [n, t] : in_raw) {
    const bool blocks = ends_with(n, "_blocks"), scales = ends_with(n, "_scales");
    if (!blocks && !scales) {
      in[n] = t;
      continue;
    }
    const std::string base = n.substr(0, n.size() - 7);
    const std::string other = base + (blocks ? "_scales" : "_blocks");
    MCPP_CHECK_HINT(in_raw.count(other), "check the model folder",
                    "Hugging Face tensor {} (MXFP4) has no {}", n, other);
    if (blocks) {
      MCPP_CHECK_HINT(!in_raw.count(base), "a folder holds an expert tensor in one form",
                      "Hugging Face tensor {} is given both dequantised and as MXFP4 ({})",
                      base, n);
      in[base] = dequantize_mxfp4(base, t, in_raw.at(other));
    }
  }
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : in) {
    const size_t at = n.find(".mlp.experts.");
    const std::string name = at == std::string::npos ? "" : n.substr(at + 13);
    bool expert = false;
    for (const char* x : kExpertTensors) expert = expert || name == x;
    if (n.rfind("model.layers.", 0) != 0 || !expert) {
      out[n] = t;  // not an expert tensor: mapped (or named as unknown) by from_hf_tensors
      continue;
    }
    MCPP_CHECK_HINT(t.dim() >= 2 && t.size(0) == E, "the config.json does not match the weights",
                    "Hugging Face tensor {} has shape {}, expected {} experts first", n,
                    shape_str(t.shape()), E);
    Shape shape(t.shape().begin() + 1, t.shape().end());
    for (int64_t e = 0; e < E; ++e) {
      Tensor s = Tensor::empty(shape, t.dtype());
      std::memcpy(s.raw(), static_cast<const char*>(t.raw()) + size_t(e) * s.nbytes(), s.nbytes());
      out[n + "." + std::to_string(e)] = s;
    }
  }
  return out;
}

}  // namespace mcpp::checkpoint::hf_gpt_oss
