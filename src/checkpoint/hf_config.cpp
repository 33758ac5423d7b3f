// hf.h's configuration side: which Hugging Face class a model exports as, config.json
// written from a TransformerConfig and read back into one (the tensors and files: hf.cpp;
// the RoPE fields: hf_rope.cpp; the MoE classes: hf_moe.cpp).
#include <cmath>
#include <string>

#include "base/log.h"
#include "checkpoint/hf.h"
#include "checkpoint/hf_gpt_oss.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/hf_rope.h"
#include "checkpoint/hf_window.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

namespace {
const char* torch_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F64:
      return "float64";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      MCPP_FAIL("cannot export weights as {}", dtype_name(t));
  }
}

// The dense model types that share Llama's tensor layout (hf.h).
bool is_llama_like(const std::string& type) {
  return type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3";
}

}  // namespace

const char* hf_arch_name(HfArch a) {
  switch (a) {
    case HfArch::Gpt2:
      return "GPT2LMHeadModel";
    case HfArch::Llama:
      return "LlamaForCausalLM";
    case HfArch::Mixtral:
      return "MixtralForCausalLM";
    case HfArch::Qwen3Moe:
      return "Qwen3MoeForCausalLM";
    case HfArch::Qwen2:
      return "Qwen2ForCausalLM";
    case HfArch::Qwen3:
      return "Qwen3ForCausalLM";
    case HfArch::Mistral:
      return "MistralForCausalLM";
    case HfArch::GptOss:
      return "GptOssForCausalLM";
  }
  return "?";
}

const char* hf_model_type(HfArch a) {
  switch (a) {
    case HfArch::Gpt2:
      return "gpt2";
    case HfArch::Llama:
      return "llama";
    case HfArch::Mixtral:
      return "mixtral";
    case HfArch::Qwen3Moe:
      return "qwen3_moe";
    case HfArch::Qwen2:
      return "qwen2";
    case HfArch::Qwen3:
      return "qwen3";
    case HfArch::Mistral:
      return "mistral";
    case HfArch::GptOss:
      return "gpt_oss";
  }
  return "?";
}

HfArch hf_arch_of(const model::TransformerConfig& c) {
  // muP's multipliers and attention scale have no place in these architectures' configs.
  MCPP_CHECK_HINT(!c.mup.on || (c.mup.embedding_mult == 1.0 && c.mup.output_mult == 1.0 &&
                                c.softmax_scale() == 1.0 / std::sqrt(double(c.kv_channels))),
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "a --use-mup model (embedding multiplier {}, output multiplier {}, softmax "
                  "scale {}) has no Hugging Face export yet: the Llama and GPT-2 configs carry "
                  "no multipliers, and their attention scale is 1/sqrt(head dim)",
                  c.mup.embedding_mult, c.mup.output_mult, c.softmax_scale());
  MCPP_CHECK_HINT(!c.qk_l2_norm,
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "a --qk-l2-norm model has no Hugging Face export yet (Llama 4's config is not "
                  "mapped)");
  MCPP_CHECK_HINT(c.no_rope_pattern.empty(),
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "a model with layers without RoPE (--no-rope-freq) has no Hugging Face export "
                  "yet (Llama 4's and SmolLM3's configs are not mapped)");
  MCPP_CHECK_HINT(!c.mla.on,
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "multi-latent attention has no Hugging Face export yet (DeepSeek-V2/V3's "
                  "layout is not mapped)");
  // Qwen3's q_norm / k_norm are RMSNorms; no architecture has per-head q/k LayerNorms with a
  // bias shared by the heads (the form --normalization LayerNorm gives --qk-layernorm).
  MCPP_CHECK_HINT(!c.qk_layernorm || c.rmsnorm,
                  "keep the checkpoint in megatron.cpp's format, or train with --normalization "
                  "RMSNorm (Qwen3-style q/k norms)",
                  "--qk-layernorm with --normalization LayerNorm (per-head q/k LayerNorms with "
                  "biases) has no Hugging Face architecture");
  // Mixture of experts: Mixtral, Qwen3-MoE or an error naming what neither can express
  // (never a conversion that drops the experts, as Megatron-LM #5844's did).
  MCPP_CHECK_HINT(!c.no_positions,
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "a model without position embeddings (--position-embedding-type none) has no "
                  "Hugging Face architecture: GPT-2 adds a learned table, Llama rotates");
  // gpt-oss (GptOssForCausalLM: sinks, quick-GEGLU experts with offset and clamp, biases),
  // or an error naming what it cannot express (hf_gpt_oss.h).
  if (hf_gpt_oss::looks_like_gpt_oss(c)) {
    hf_gpt_oss::check_exportable(c);
    return HfArch::GptOss;
  }
  // Any other gated unit than plain SwiGLU has no other architecture: a SwiGLU with an offset
  // or a clamp would silently lose them in Llama's or Mixtral's.
  MCPP_CHECK_HINT(!c.quick_geglu && (!c.swiglu || c.plain_swiglu()),
                  "keep the checkpoint in megatron.cpp's format, or train a gpt-oss-style MoE "
                  "model (GptOssForCausalLM: --quick-geglu with experts and sinks)",
                  "{} has no Hugging Face architecture but gpt-oss's, which needs experts",
                  c.quick_geglu ? "--quick-geglu"
                                : "--swiglu with --glu-linear-offset / "
                                  "--activation-func-clamp-value");
  if (c.moe.num_experts > 0)
    return hf_moe::moe_arch_of(c) == hf_moe::MoeArch::Qwen3Moe ? HfArch::Qwen3Moe : HfArch::Mixtral;
  if (!c.rope && !c.rmsnorm && !c.swiglu) {
    MCPP_CHECK_HINT(!c.has_window_layers(),
                    "keep the checkpoint in megatron.cpp's format, or train a Mistral-style "
                    "model (RoPE, RMSNorm, SwiGLU, --disable-bias-linear)",
                    "GPT2LMHeadModel has no sliding-window attention (--window-size)");
    MCPP_CHECK_HINT(!c.qk_layernorm, "drop --qk-layernorm (Qwen3 is RoPE + RMSNorm + SwiGLU)",
                    "GPT2LMHeadModel has no q/k norms (--qk-layernorm)");
    MCPP_CHECK_HINT(c.add_bias_linear && c.tie_embeddings,
                    "GPT-2 needs biases and tied embeddings (drop --disable-bias-linear and "
                    "--untie-embeddings-and-output-weights)",
                    "this GPT-style model has no GPT2LMHeadModel equivalent");
    MCPP_CHECK_HINT(c.num_query_groups == c.num_attention_heads &&
                        c.kv_channels * c.num_attention_heads == c.hidden_size,
                    "GPT-2 has no grouped-query attention and head_dim = hidden / heads",
                    "this model (query groups {}, kv_channels {}) has no GPT2LMHeadModel "
                    "equivalent",
                    c.num_query_groups, c.kv_channels);
    return HfArch::Gpt2;
  }
  // Attention sinks: Hugging Face's models with sinks (GptOssForCausalLM) are MoE models with
  // biased experts and a clamped GLU, whose export megatron.cpp does not write yet.
  MCPP_CHECK_HINT(!c.attention_sink(),
                  "keep the checkpoint in megatron.cpp's format (sampling and serving read it)",
                  "attention sinks (--softmax-type {}) have no Hugging Face architecture among "
                  "those megatron.cpp writes (GPT-2, Llama, Qwen2/3, Mixtral, Qwen3-MoE)",
                  model::softmax_type_name(c.softmax_type));
  // Squared ReLU with RoPE or RMSNorm: Hugging Face's one non-gated relu2 architecture,
  // NemotronForCausalLM, norms with LayerNorm1P (biased LayerNorm, weight + 1) and rotates
  // partially by default; no megatron.cpp model maps onto it exactly yet.
  MCPP_CHECK_HINT(!c.squared_relu,
                  "export a GPT-2-style model (learned positions, LayerNorm, biases, tied "
                  "embeddings) with --squared-relu, or keep the checkpoint in megatron.cpp's "
                  "format",
                  "--squared-relu with rope {}, rmsnorm {}: no Hugging Face architecture matches "
                  "exactly (NemotronForCausalLM uses LayerNorm1P with biases; a Llama-style "
                  "config would silently change the activation)",
                  c.rope, c.rmsnorm);
  MCPP_CHECK_HINT(c.rope && c.rmsnorm && c.swiglu,
                  "Llama is RoPE + RMSNorm + SwiGLU; GPT-2 uses none of them",
                  "the model mixes GPT-2 and Llama features (rope {}, rmsnorm {}, swiglu {}); "
                  "no Hugging Face architecture matches",
                  c.rope, c.rmsnorm, c.swiglu);
  MCPP_CHECK_HINT(c.rotary_percent == 1.0, "use --rotary-percent 1.0",
                  "LlamaForCausalLM rotates every head dimension, this model only {}",
                  c.rotary_percent);
  // Qwen3: Llama + per-head q/k RMSNorm, no biases (its attention_bias would put biases on
  // q/k/v/o_proj and none on the MLP, which no megatron.cpp switch expresses).
  if (c.qk_layernorm) {
    MCPP_CHECK_HINT(!c.qkv_bias(),
                    "train the Qwen3-style model with --disable-bias-linear and without "
                    "--add-qkv-bias",
                    "a model with --qk-layernorm and linear biases ({}) has no Hugging Face "
                    "equivalent (Qwen3ForCausalLM has none)",
                    c.add_bias_linear ? "all of them" : "--add-qkv-bias");
    return HfArch::Qwen3;
  }
  // Qwen2: Llama + biases on q/k/v_proj only (Megatron's --add-qkv-bias).
  if (c.qkv_bias() && !c.add_bias_linear) return HfArch::Qwen2;
  // Llama has no sliding window; Mistral (Llama without biases) slides in every layer.
  if (c.has_window_layers()) {
    MCPP_CHECK_HINT(!c.add_bias_linear,
                    "train the windowed model with --disable-bias-linear (MistralForCausalLM), "
                    "or keep the checkpoint in megatron.cpp's format",
                    "a sliding-window model with linear biases has no Hugging Face equivalent "
                    "(LlamaForCausalLM has no window, MistralForCausalLM no biases)");
    return HfArch::Mistral;
  }
  return HfArch::Llama;
}

HfArch hf_export_arch(const model::TransformerConfig& c, const std::string& model_type) {
  const HfArch arch = hf_arch_of(c);
  if (model_type.empty() || model_type == hf_model_type(arch)) return arch;
  // MistralForCausalLM (without a sliding window) is LlamaForCausalLM without biases.
  if (model_type == "mistral" && arch == HfArch::Llama) {
    MCPP_CHECK_HINT(!c.add_bias_linear, "export it as llama (attention_bias, mlp_bias)",
                    "MistralForCausalLM has no linear biases; this model has them");
    return HfArch::Mistral;
  }
  MCPP_CHECK_HINT(false,
                  fmt::format("export it as {}{}", hf_model_type(arch),
                              arch == HfArch::Llama ? " or mistral" : ""),
                  "this model maps to Hugging Face model_type '{}' ({}), not '{}'",
                  hf_model_type(arch), hf_arch_name(arch), model_type);
  return arch;
}

json hf_config(const model::TransformerConfig& c, DType dtype, const std::string& model_type) {
  const HfArch arch = hf_export_arch(c, model_type);
  if (arch == HfArch::Gpt2)
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.padded_vocab_size},
            {"n_positions", c.max_position_embeddings},
            {"n_ctx", c.max_position_embeddings},
            {"n_embd", c.hidden_size},
            {"n_layer", c.num_layers},
            {"n_head", c.num_attention_heads},
            {"n_inner", c.ffn_hidden_size},
            // GELU's tanh form (gelu_new) or the exact one (gelu); squared ReLU:
            // transformers' ReLUSquaredActivation
            {"activation_function", c.squared_relu ? "relu2" : c.gelu_erf ? "gelu" : "gelu_new"},
            {"layer_norm_epsilon", c.norm_epsilon},
            {"resid_pdrop", c.hidden_dropout},
            {"embd_pdrop", c.hidden_dropout},
            {"attn_pdrop", c.attention_dropout},
            {"initializer_range", c.init_method_std},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", true},
            {"torch_dtype", torch_dtype(dtype)}};
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", c.padded_vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_hidden_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_query_groups},
            {"head_dim", c.kv_channels},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.norm_epsilon},
            {"hidden_act", "silu"},
            {"attention_bias", c.add_bias_linear},
            {"mlp_bias", c.add_bias_linear},
            {"attention_dropout", c.attention_dropout},
            {"initializer_range", c.init_method_std},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", torch_dtype(dtype)}};
  const bool moe = arch == HfArch::Mixtral || arch == HfArch::Qwen3Moe || arch == HfArch::GptOss;
  if (arch == HfArch::GptOss)
    hf_gpt_oss::config_to_hf(c, j);  // its own window fields (layer_types)
  else if (moe)
    hf_moe::to_moe_config(c, j);
  if (arch == HfArch::Qwen2 || arch == HfArch::Qwen3 || arch == HfArch::Mistral) {
    j["architectures"] = {hf_arch_name(arch)};
    j["model_type"] = hf_model_type(arch);
    // Qwen2's q/k/v biases and Mistral's none are fixed by the class; only Qwen3 (whose
    // attention_bias is false here) reads attention_bias, and none of them mlp_bias.
    j.erase("mlp_bias");
    if (arch != HfArch::Qwen3) j.erase("attention_bias");
  }
  if (arch != HfArch::Llama && arch != HfArch::GptOss)
    window_to_hf(c, hf_model_type(arch), j);  // hf_window.h
  // The RoPE base and scaling in 4.x's spelling (rope_theta, rope_scaling); the MoE classes,
  // and any scaled model, in 5.x's rope_parameters too.
  hf_rope::rope_to_hf(c, moe, j);
  return j;
}

model::TransformerConfig model_config_from_hf(const json& j, int64_t divisible_by) {
  model::TransformerConfig c;
  MCPP_CHECK_HINT(j.is_object() && (!j.contains("model_type") || j["model_type"].is_string()),
                  "check config.json", "Hugging Face config.json: model_type is not a string");
  const std::string type = j.value("model_type", "");
  auto need = [&](const char* k) -> const json& {
    MCPP_CHECK_HINT(j.contains(k) && !j[k].is_null(), "check config.json",
                    "Hugging Face config.json ({}) lacks '{}'", type, k);
    return j[k];
  };
  // A size field: an integer in [1, 2^31) (a zero or negative one would divide by zero or
  // allocate nonsense below).
  auto size = [&](const char* k) -> int64_t {
    const json& v = need(k);
    MCPP_CHECK_HINT(
        v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() < (int64_t(1) << 31),
        "check config.json",
        "Hugging Face config.json ({}): '{}' is {}, expected a "
        "positive integer",
        type, k, v.dump());
    return v.get<int64_t>();
  };
  auto opt_size = [&](const char* k, int64_t dflt) -> int64_t {
    return j.contains(k) && !j[k].is_null() ? size(k) : dflt;
  };
  auto pos_real = [&](const char* k, double dflt) -> double {
    if (!j.contains(k) || j[k].is_null()) return dflt;
    const json& v = j[k];
    MCPP_CHECK_HINT(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0,
                    "check config.json",
                    "Hugging Face config.json ({}): '{}' is {}, expected a "
                    "positive number",
                    type, k, v.dump());
    return v.get<double>();
  };
  auto divides = [&](int64_t a, int64_t b, const char* ka, const char* kb) {
    MCPP_CHECK_HINT(a % b == 0, "check config.json",
                    "Hugging Face config.json ({}): '{}' {} is not a multiple of '{}' {}", type, ka,
                    a, kb, b);
  };
  try {
    if (type == "gpt2") {
      c.num_layers = size("n_layer"), c.hidden_size = size("n_embd");
      c.num_attention_heads = size("n_head");
      divides(c.hidden_size, c.num_attention_heads, "n_embd", "n_head");
      c.num_query_groups = c.num_attention_heads;
      c.kv_channels = c.hidden_size / c.num_attention_heads;
      c.ffn_hidden_size = opt_size("n_inner", 4 * c.hidden_size);
      c.max_position_embeddings = size("n_positions");
      c.seq_length = c.max_position_embeddings;
      c.norm_epsilon = pos_real("layer_norm_epsilon", 1e-5);
      const std::string act = j.value("activation_function", "gelu_new");
      // transformers' GELU forms: tanh (gelu_new, gelu_pytorch_tanh, gelu_fast) or the exact
      // erf (gelu, gelu_python)
      const bool erf = act == "gelu" || act == "gelu_python";
      MCPP_CHECK_HINT(erf || act == "gelu_new" || act == "gelu_pytorch_tanh" ||
                          act == "gelu_fast" || act == "relu2",
                      "megatron.cpp's GELU is the tanh form (gelu_new, gelu_pytorch_tanh, "
                      "gelu_fast) or the exact one (gelu); relu2 is --squared-relu",
                      "GPT-2 activation_function '{}' is not supported", act);
      c.squared_relu = act == "relu2", c.gelu_erf = erf;
      c.hidden_dropout = j.value("resid_pdrop", 0.1);
      c.attention_dropout = j.value("attn_pdrop", 0.1);
      c.init_method_std = j.value("initializer_range", 0.02);
    } else if (is_llama_like(type) || hf_moe::is_moe_model_type(type)) {  // MoE: + hf_moe.h
      c.num_layers = size("num_hidden_layers"), c.hidden_size = size("hidden_size");
      c.num_attention_heads = size("num_attention_heads");
      c.num_query_groups = opt_size("num_key_value_heads", c.num_attention_heads);
      divides(c.num_attention_heads, c.num_query_groups, "num_attention_heads",
              "num_key_value_heads");
      // Qwen3Config's head_dim defaults to 128; the others' to hidden_size / heads.
      const bool hd_given = j.contains("head_dim") && !j["head_dim"].is_null();
      if (!hd_given && type != "qwen3")
        divides(c.hidden_size, c.num_attention_heads, "hidden_size", "num_attention_heads");
      c.kv_channels = hd_given          ? size("head_dim")
                      : type == "qwen3" ? 128
                                        : c.hidden_size / c.num_attention_heads;
      c.ffn_hidden_size = size("intermediate_size");
      c.max_position_embeddings = size("max_position_embeddings");
      c.seq_length = c.max_position_embeddings;
      c.norm_epsilon = pos_real("rms_norm_eps", 1e-6);
      c.rope = true, c.rmsnorm = true, c.swiglu = true;
      // transformers 4.x: rope_theta, rope_scaling; 5.x: rope_parameters. Each class's own
      // default base.
      hf_rope::rope_from_hf(j, type, type == "mixtral" ? 1e6 : 1e4, c);
      const std::string act = j.value("hidden_act", "silu");
      MCPP_CHECK_HINT(act == "silu", "megatron.cpp's SwiGLU gates with silu",
                      "Hugging Face config.json ({}): hidden_act '{}' is not supported (only "
                      "silu)",
                      type, act);
      const bool ab = j.value("attention_bias", false), mb = j.value("mlp_bias", false);
      if (type == "qwen2") {  // q/k/v_proj always have biases, o_proj and the MLP none
        c.add_bias_linear = false, c.add_qkv_bias = true;
      } else if (type == "mistral") {  // no biases (MistralConfig has no bias fields)
        c.add_bias_linear = false;
      } else if (hf_gpt_oss::is_gpt_oss_type(type)) {  // biases everywhere (hf_gpt_oss.h)
        c.add_bias_linear = true;
      } else if (type == "qwen3") {  // attention_bias: q/k/v/o_proj; the MLP never has one
        MCPP_CHECK_HINT(!ab,
                        "megatron.cpp has biases on q/k/v alone (--add-qkv-bias) or on every "
                        "linear layer, not on the attention's four alone",
                        "Hugging Face config.json (qwen3) has attention_bias true");
        c.add_bias_linear = false;
      } else {
        MCPP_CHECK_HINT(ab == mb, "megatron.cpp has one switch for all linear biases",
                        "config.json has attention_bias {} but mlp_bias {}", ab, mb);
        c.add_bias_linear = ab;
      }
      c.qk_layernorm = type == "qwen3";  // q_norm / k_norm (qwen3_moe: moe_config_from_hf)
      c.tie_embeddings = j.value("tie_word_embeddings", false);
      c.hidden_dropout = 0.0;
      c.attention_dropout = j.value("attention_dropout", 0.0);
      c.init_method_std = j.value("initializer_range", 0.02);
      if (hf_moe::is_moe_model_type(type))
        hf_moe::moe_config_from_hf(j, type, c);
      if (hf_gpt_oss::is_gpt_oss_type(type)) hf_gpt_oss::config_from_hf(j, c);
      if (type != "llama") window_from_hf(j, type, c);  // sliding window (hf_window.h)
    } else {
      MCPP_FAIL(
          "Hugging Face model_type '{}' is not supported (gpt2, llama, mistral, qwen2, qwen3, "
          "mixtral, qwen3_moe and gpt_oss are)",
          type);
    }
    const int64_t v = size("vocab_size");
    const int64_t m = std::max<int64_t>(1, divisible_by);
    c.padded_vocab_size = (v + m - 1) / m * m;
  } catch (const json::exception& e) {
    MCPP_FAIL("Hugging Face config.json has a field of the wrong type: {}", e.what());
  }
  c.validate();
  return c;
}

}  // namespace mcpp::checkpoint
