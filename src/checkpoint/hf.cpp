#include "checkpoint/hf.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "checkpoint/fs.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/hf_rope.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }
int64_t cols_of(const Tensor& t) { return t.dim() > 1 ? t.numel() / t.size(0) : 1; }

// One HF tensor: rows `rows` (in HF order) of the Megatron tensor `mname`, transposed for
// GPT-2's Conv1D. rows empty: all rows in order. Every conversion is a row gather (+ transpose).
struct Entry {
  std::string mname, hname;
  std::vector<int64_t> rows;
  bool transpose = false;
  bool norm_weight = false;  // a norm's weight: + 1 on export under --apply-layernorm-1p
};

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> r;
  for (int64_t i = a; i < b; ++i) r.push_back(i);
  return r;
}

// Rows of Megatron's grouped linear_qkv [NG, (r + 2) * HD] (r = NH/NG) holding the query
// heads in head order, the keys and the values (HF's q / k / v row order).
struct QkvRows {
  std::vector<int64_t> q, k, v;
};
QkvRows qkv_rows(const model::TransformerConfig& c) {
  const int64_t r = c.heads_per_group(), HD = c.kv_channels;
  QkvRows o;
  for (int64_t h = 0; h < c.num_attention_heads; ++h)
    for (int64_t d = 0; d < HD; ++d) o.q.push_back(((h / r) * (r + 2) + h % r) * HD + d);
  for (int64_t g = 0; g < c.num_query_groups; ++g)
    for (int64_t d = 0; d < HD; ++d) {
      o.k.push_back((g * (r + 2) + r) * HD + d);
      o.v.push_back((g * (r + 2) + r + 1) * HD + d);
    }
  return o;
}

std::vector<Entry> entries(const model::TransformerConfig& c) {
  const HfArch arch = hf_arch_of(c);
  const QkvRows qkv = qkv_rows(c);
  std::vector<Entry> e;
  auto L = [](int l, const std::string& s) { return model::layer_param_name(l, s); };
  if (arch == HfArch::Gpt2) {
    std::vector<int64_t> all = qkv.q;
    all.insert(all.end(), qkv.k.begin(), qkv.k.end());
    all.insert(all.end(), qkv.v.begin(), qkv.v.end());
    e.push_back({"embedding.word_embeddings.weight", "transformer.wte.weight", {}, false});
    e.push_back({"embedding.position_embeddings.weight", "transformer.wpe.weight", {}, false});
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      e.push_back({L(l, "input_layernorm.weight"), h + "ln_1.weight", {}, false, true});
      e.push_back({L(l, "input_layernorm.bias"), h + "ln_1.bias", {}, false});
      e.push_back({L(l, "self_attention.linear_qkv.weight"), h + "attn.c_attn.weight", all, true});
      e.push_back({L(l, "self_attention.linear_qkv.bias"), h + "attn.c_attn.bias", all, false});
      e.push_back({L(l, "self_attention.linear_proj.weight"), h + "attn.c_proj.weight", {}, true});
      e.push_back({L(l, "self_attention.linear_proj.bias"), h + "attn.c_proj.bias", {}, false});
      e.push_back({L(l, "pre_mlp_layernorm.weight"), h + "ln_2.weight", {}, false, true});
      e.push_back({L(l, "pre_mlp_layernorm.bias"), h + "ln_2.bias", {}, false});
      e.push_back({L(l, "mlp.linear_fc1.weight"), h + "mlp.c_fc.weight", {}, true});
      e.push_back({L(l, "mlp.linear_fc1.bias"), h + "mlp.c_fc.bias", {}, false});
      e.push_back({L(l, "mlp.linear_fc2.weight"), h + "mlp.c_proj.weight", {}, true});
      e.push_back({L(l, "mlp.linear_fc2.bias"), h + "mlp.c_proj.bias", {}, false});
    }
    e.push_back({"decoder.final_layernorm.weight", "transformer.ln_f.weight", {}, false, true});
    e.push_back({"decoder.final_layernorm.bias", "transformer.ln_f.bias", {}, false});
    return e;  // lm_head is tied to wte and not stored, as HF saves GPT-2
  }
  const int64_t F = c.ffn_hidden_size;
  const bool bias = c.add_bias_linear;
  e.push_back({"embedding.word_embeddings.weight", "model.embed_tokens.weight", {}, false});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    e.push_back({L(l, "input_layernorm.weight"), h + "input_layernorm.weight", {}, false, true});
    for (const std::string s : {"weight", "bias"}) {
      if (s == "bias" && !c.qkv_bias()) continue;
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.q_proj." + s, qkv.q, false});
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.k_proj." + s, qkv.k, false});
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.v_proj." + s, qkv.v, false});
      if (s == "bias" && !bias) continue;  // --add-qkv-bias (Qwen2): q/k/v_proj's biases alone
      e.push_back(
          {L(l, "self_attention.linear_proj." + s), h + "self_attn.o_proj." + s, {}, false});
      if (c.is_moe_layer(l)) continue;  // below
      e.push_back({L(l, "mlp.linear_fc1." + s), h + "mlp.gate_proj." + s, range(0, F), false});
      e.push_back({L(l, "mlp.linear_fc1." + s), h + "mlp.up_proj." + s, range(F, 2 * F), false});
      e.push_back({L(l, "mlp.linear_fc2." + s), h + "mlp.down_proj." + s, {}, false});
    }
    if (c.qk_layernorm)  // Qwen3's per-head q/k RMSNorm weights [HD]
      for (const char* n : {"q", "k"})
        e.push_back({L(l, std::string("self_attention.") + n + "_layernorm.weight"),
                     h + "self_attn." + n + "_norm.weight",
                     {},
                     false,
                     true});
    if (c.is_moe_layer(l))  // Mixtral / Qwen3-MoE (hf_moe.h): router and experts
      for (const auto& m : hf_moe::moe_layer_entries(c, l))
        e.push_back(
            {m.mname, m.hname, m.row1 < 0 ? std::vector<int64_t>{} : range(m.row0, m.row1), false});
    e.push_back(
        {L(l, "pre_mlp_layernorm.weight"), h + "post_attention_layernorm.weight", {}, false, true});
  }
  e.push_back({"decoder.final_layernorm.weight", "model.norm.weight", {}, false, true});
  if (!c.tie_embeddings) e.push_back({"output_layer.weight", "lm_head.weight", {}, false});
  return e;
}

bool is_vocab_tensor(const std::string& mname) {
  return mname == "embedding.word_embeddings.weight" || mname == "output_layer.weight";
}

void check_tp1(const model::TransformerConfig& c, const model::ParamStore& ps) {
  MCPP_CHECK_HINT(ps.tp_size() == 1 && c.tp_size == 1,
                  "load the checkpoint into a TP=1 model first (loading reshards)",
                  "Hugging Face conversion needs the whole model (TP=1), got TP={}", ps.tp_size());
}

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

// Sliding-window attention (query i sees key j only when i - j < sliding_window) is not
// implemented. A window at least max_position_embeddings long never applies (an imported
// model trains and generates within that length), so it is accepted; a shorter one in any
// layer is an error naming the field. Where the classes slide:
//  * Mistral: every layer, by sliding_window (MistralConfig's default 4096 when absent);
//  * Qwen2 / Qwen3: only with use_sliding_window, in the layers layer_types calls
//    "sliding_attention" (without layer_types: layers >= max_window_layers, default 28), by
//    sliding_window (default 4096).
void check_full_attention(const json& j, const std::string& type, int64_t layers, int64_t max_pos) {
  const bool mistral = type == "mistral";
  const json use = j.value("use_sliding_window", json(false));
  MCPP_CHECK_HINT(mistral || use.is_boolean(), "check config.json",
                  "Hugging Face config.json ({}): use_sliding_window {} is not true or false", type,
                  use.dump());
  const json w = j.contains("sliding_window") ? j["sliding_window"] : json(4096);
  int64_t sliding = layers;  // Mistral: every layer
  if (!mistral) {
    const json types = j.value("layer_types", json());
    if (!types.is_null()) {
      MCPP_CHECK_HINT(types.is_array() && int64_t(types.size()) == layers, "check config.json",
                      "Hugging Face config.json ({}): layer_types {} is not a list of {} layer "
                      "types",
                      type, types.dump(), layers);
      sliding = 0;
      for (const json& t : types) {
        MCPP_CHECK_HINT(t == "full_attention" || t == "sliding_attention",
                        "megatron.cpp's layers are full (causal) attention layers",
                        "Hugging Face config.json ({}): layer_types holds {}", type, t.dump());
        sliding += t == "sliding_attention" ? 1 : 0;
      }
    } else {
      const json first = j.value("max_window_layers", json(28));
      MCPP_CHECK_HINT(first.is_number_integer() && first.get<int64_t>() >= 0, "check config.json",
                      "Hugging Face config.json ({}): max_window_layers {} is not an integer >= 0",
                      type, first.dump());
      sliding = std::max<int64_t>(0, layers - first.get<int64_t>());
    }
    if (!use.get<bool>()) sliding = 0;
  }
  if (w.is_null() || sliding == 0) return;
  MCPP_CHECK_HINT(w.is_number_integer() && w.get<int64_t>() >= 1, "check config.json",
                  "Hugging Face config.json ({}): sliding_window {} is not a positive integer",
                  type, w.dump());
  MCPP_CHECK_HINT(w.get<int64_t>() >= max_pos,
                  fmt::format("sliding-window attention is not implemented; a window at least "
                              "max_position_embeddings long never applies: set "
                              "max_position_embeddings to {} in config.json to use the model "
                              "on sequences of up to {} tokens",
                              w.get<int64_t>(), w.get<int64_t>()),
                  "Hugging Face config.json ({}) has sliding_window {} in {} of its {} layers, "
                  "shorter than max_position_embeddings {}",
                  type, w.get<int64_t>(), sliding, layers, max_pos);
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
  }
  return "?";
}

HfArch hf_arch_of(const model::TransformerConfig& c) {
  // Mixture of experts: Mixtral, Qwen3-MoE or an error naming what neither can express
  // (never a conversion that drops the experts, as Megatron-LM #5844's did).
  if (c.moe.num_experts > 0)
    return hf_moe::moe_arch_of(c) == hf_moe::MoeArch::Qwen3Moe ? HfArch::Qwen3Moe : HfArch::Mixtral;
  if (!c.rope && !c.rmsnorm && !c.swiglu) {
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
            {"activation_function", "gelu_new"},  // tanh approximation, as ours
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
  const bool moe = arch == HfArch::Mixtral || arch == HfArch::Qwen3Moe;
  if (moe) hf_moe::to_moe_config(c, j);
  if (arch == HfArch::Qwen2 || arch == HfArch::Qwen3 || arch == HfArch::Mistral) {
    j["architectures"] = {hf_arch_name(arch)};
    j["model_type"] = hf_model_type(arch);
    // Qwen2's q/k/v biases and Mistral's none are fixed by the class; only Qwen3 (whose
    // attention_bias is false here) reads attention_bias, and none of them mlp_bias.
    j.erase("mlp_bias");
    if (arch != HfArch::Qwen3) j.erase("attention_bias");
    j["sliding_window"] = nullptr;  // full attention in every layer
    if (arch != HfArch::Mistral) {
      j["use_sliding_window"] = false;
      j["max_window_layers"] = c.num_layers;
    }
  }
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
      MCPP_CHECK_HINT(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast",
                      "megatron.cpp's GELU is the tanh approximation (gelu_new)",
                      "GPT-2 activation_function '{}' is not supported", act);
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
      else if (type != "llama")
        check_full_attention(j, type, c.num_layers, c.max_position_embeddings);
    } else {
      MCPP_FAIL(
          "Hugging Face model_type '{}' is not supported (gpt2, llama, mistral, qwen2, qwen3, "
          "mixtral and qwen3_moe are)",
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

std::map<std::string, Tensor> to_hf_tensors(const model::TransformerConfig& c,
                                            const model::ParamStore& ps, DType dtype) {
  check_tp1(c, ps);
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries(c)) {
    const Tensor src = ps.param(e.mname);
    const int64_t C = cols_of(src);
    const std::vector<int64_t> rows = e.rows.empty() ? range(0, rows_of(src)) : e.rows;
    const int64_t R = int64_t(rows.size());
    Shape shape = src.dim() == 1 ? Shape{R} : e.transpose ? Shape{C, R} : Shape{R, C};
    Tensor t = Tensor::empty(shape, dtype);
    // --apply-layernorm-1p stores a norm weight as w - 1; Hugging Face stores w.
    const double one = c.zero_centered_gamma && e.norm_weight ? 1.0 : 0.0;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j)
        set_float(t, e.transpose ? j * R + i : i * C + j,
                  get_float(src, rows[size_t(i)] * C + j) + one);
    out[e.hname] = t;
  }
  return out;
}

void from_hf_tensors(const model::TransformerConfig& c, const std::map<std::string, Tensor>& in,
                     model::ParamStore& ps) {
  check_tp1(c, ps);
  // HF files may name GPT-2's tensors without the "transformer." prefix (GPT2Model) and carry
  // non-parameter buffers; both are accepted.
  // MoE: transformers 5's fused experts become the Hub's per-expert tensors first.
  const std::map<std::string, Tensor> unfused =
      c.moe.num_experts > 0 ? hf_moe::unfuse_experts(c, in) : std::map<std::string, Tensor>{};
  const std::map<std::string, Tensor>& tensors = c.moe.num_experts > 0 ? unfused : in;
  std::map<std::string, const Tensor*> hf;
  for (const auto& [n, t] : tensors) hf[n] = &t;
  auto find = [&](const std::string& n) -> const Tensor* {
    if (hf.count(n)) return hf[n];
    const std::string p = "transformer.";
    if (n.rfind(p, 0) == 0 && hf.count(n.substr(p.size()))) return hf[n.substr(p.size())];
    return nullptr;
  };
  std::set<std::string> used;
  std::map<std::string, int64_t> rows_filled;
  for (const Entry& e : entries(c)) {
    const Tensor* src = find(e.hname);
    MCPP_CHECK_HINT(src,
                    "the config.json does not describe these weights, or the file is "
                    "incomplete",
                    "Hugging Face tensor {} is missing", e.hname);
    used.insert(hf.count(e.hname) ? e.hname : e.hname.substr(std::string("transformer.").size()));
    Tensor dst = ps.param(e.mname);
    const int64_t C = cols_of(dst);
    std::vector<int64_t> rows = e.rows.empty() ? range(0, rows_of(dst)) : e.rows;
    // The vocabulary may hold fewer rows than our padded one: the rest stays zero.
    if (is_vocab_tensor(e.mname) && src->dim() == 2 && src->size(0) < rows_of(dst)) {
      rows = range(0, src->size(0));
      std::memset(dst.raw(), 0, dst.nbytes());
    }
    const int64_t R = int64_t(rows.size());
    const Shape want = dst.dim() == 1 ? Shape{R} : e.transpose ? Shape{C, R} : Shape{R, C};
    MCPP_CHECK_HINT(src->shape() == want, "the config.json does not match the weights",
                    "Hugging Face tensor {} has shape {}, expected {} (for {})", e.hname,
                    shape_str(src->shape()), shape_str(want), e.mname);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j)
        set_float(dst, rows[size_t(i)] * C + j,
                  get_float(*src, e.transpose ? j * R + i : i * C + j));
    rows_filled[e.mname] += R;
  }
  for (const auto& p : ps.infos()) {
    const bool vocab = is_vocab_tensor(p.name);
    MCPP_CHECK(rows_filled.count(p.name) && (vocab || rows_filled[p.name] == p.global_shape[0]),
               "internal: parameter {} not fully covered by the Hugging Face mapping", p.name);
  }
  std::vector<std::string> unknown;
  for (const auto& [n, t] : tensors) {
    if (used.count(n)) continue;
    const bool buffer = n.find("attn.bias") != std::string::npos ||
                        n.find("attn.masked_bias") != std::string::npos ||
                        n.find("rotary_emb.inv_freq") != std::string::npos;
    const bool tied_head = n == "lm_head.weight" && c.tie_embeddings;
    if (!buffer && !tied_head) unknown.push_back(n);
  }
  MCPP_CHECK_HINT(unknown.empty(), "check that config.json belongs to these weights",
                  "{} Hugging Face tensor(s) have no megatron.cpp parameter, e.g. {}",
                  unknown.size(), unknown.empty() ? "" : unknown.front());
}

void export_hf(const std::string& out_dir, const model::TransformerConfig& c,
               const model::ParamStore& ps, DType dtype, const std::string& model_type) {
  (void)hf_export_arch(c, model_type);  // a model_type that does not fit: before any file
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  MCPP_CHECK(!ec, "cannot create {}: {}", out_dir, ec.message());
  auto tensors = to_hf_tensors(c, ps, dtype);
  // "format": "pt" is what transformers expects in a safetensors file's metadata.
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_durable((fs::path(out_dir) / "config.json").string(),
                     hf_config(c, dtype, model_type).dump(2));
}

json read_hf_config(const std::string& hf_dir) {
  const fs::path p = fs::path(hf_dir) / "config.json";
  MCPP_CHECK_HINT(fs::exists(p), "pass a Hugging Face model folder", "{} has no config.json",
                  hf_dir);
  json j;
  try {
    j = json::parse(read_text_file(p.string(), size_t(16) << 20));
  } catch (const json::exception& e) {
    MCPP_FAIL("{} is not valid JSON: {}", p.string(), e.what());
  }
  MCPP_CHECK(j.is_object(), "{} is not a JSON object", p.string());
  return j;
}

namespace {

// A weight_map entry names a file of the model folder itself: a plain relative name, no
// "..", not absolute, and (after symlinks) inside the folder. An index from the internet
// must not make the importer read /etc/shadow or another user's files.
std::string weight_file_in(const fs::path& dir, const json& entry, const std::string& index) {
  MCPP_CHECK(entry.is_string(), "{}: weight_map value {} is not a file name", index, entry.dump());
  const std::string name = entry.get<std::string>();
  const fs::path rel(name);
  bool up = false;
  for (const auto& part : rel) up |= part == "..";
  MCPP_CHECK_HINT(!name.empty() && rel.is_relative() && !up,
                  "a model folder's index names files inside the folder only",
                  "{}: weight_map names '{}', outside the model folder", index, name);
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(dir, ec), full = fs::weakly_canonical(dir / rel, ec);
  const std::string b = base.string() + "/";
  MCPP_CHECK_HINT(full.string().rfind(b, 0) == 0,
                  "a model folder's index names files inside the folder only",
                  "{}: weight_map names '{}', which resolves to {} outside the model folder", index,
                  name, full.string());
  return name;
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& hf_dir) {
  const fs::path dir(hf_dir);
  std::vector<std::string> files;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const std::string index = (dir / "model.safetensors.index.json").string();
    json idx;
    try {
      idx = json::parse(read_text_file(index, size_t(64) << 20));
    } catch (const json::exception& e) {
      MCPP_FAIL("{} is not valid JSON: {}", index, e.what());
    }
    MCPP_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(),
               "{} has no 'weight_map' object", index);
    std::set<std::string> s;
    for (auto& [k, v] : idx["weight_map"].items()) s.insert(weight_file_in(dir, v, index));
    files.assign(s.begin(), s.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    MCPP_CHECK_HINT(false,
                    "megatron.cpp reads safetensors only (pickle files can execute code); "
                    "convert pytorch_model.bin with safetensors' convert script first",
                    "{} has no model.safetensors", hf_dir);
  }
  return files;
}

void check_hf_fits_files(const std::string& hf_dir, const model::TransformerConfig& c) {
  // A lower bound of the parameter count (embedding and the layers' four weight matrices) at
  // one byte each, in floating point so that no product overflows.
  const double H = double(c.hidden_size), F = double(c.ffn_hidden_size);
  const double qkv = double(c.num_attention_heads + 2 * c.num_query_groups) * double(c.kv_channels);
  // MoE layers: E experts of width I each (a config.json with 2^20 experts is refused here too).
  const double L = double(c.num_layers);
  double moe_layers = c.moe.num_experts > 0 && c.moe.layer_pattern.empty() ? L : 0;
  for (int64_t x : c.moe.layer_pattern) moe_layers += double(x);
  const double params =
      double(c.padded_vocab_size) * H + L * (qkv * H + H * H) +
      moe_layers * double(c.moe.num_experts) * 2 * double(c.moe.ffn_hidden_size) * H +
      (L - moe_layers) * 2 * F * H;
  double have = 0;
  for (const auto& f : hf_weight_files(hf_dir)) {
    std::error_code ec;
    const auto n = fs::file_size(fs::path(hf_dir) / f, ec);
    MCPP_CHECK(!ec, "{}: cannot read the size of {}: {}", hf_dir, f, ec.message());
    have += double(n);
  }
  MCPP_CHECK_HINT(params <= have, "check that config.json belongs to these weights",
                  "{}/config.json describes a model of at least {:.3g} parameters, but its "
                  "weight files hold only {:.3g} bytes",
                  hf_dir, params, have);
}

void import_hf(const std::string& hf_dir, const model::TransformerConfig& c,
               model::ParamStore& ps) {
  const fs::path dir(hf_dir);
  const std::vector<std::string> files = hf_weight_files(hf_dir);
  std::map<std::string, Tensor> tensors;
  for (const auto& f : files) {
    auto st = load_safetensors((dir / f).string());
    for (auto& [n, t] : st.tensors) tensors[n] = t;
  }
  from_hf_tensors(c, tensors, ps);
}

}  // namespace mcpp::checkpoint
