// The model config in a checkpoint's metadata.json (checkpoint.h declares these): written
// from a TransformerConfig, read back with its ranges and tensors checked, and compared with
// the model a run builds (shape and meaning differences are errors; the RoPE base, scaling
// and interpolation warnings).
#include <fmt/format.h>

#include <string>

#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checks.h"
#include "checkpoint/moe_metadata.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

namespace {
// Multi-latent attention's shape and RoPE (Megatron's argument names).
json mla_config_json(const model::TransformerConfig::Mla& m) {
  return {{"q_lora_rank", m.q_lora_rank},
          {"kv_lora_rank", m.kv_lora_rank},
          {"qk_head_dim", m.qk_head_dim},
          {"qk_pos_emb_head_dim", m.qk_pos_emb_head_dim},
          {"v_head_dim", m.v_head_dim},
          {"rope_type", m.yarn ? "yarn" : "rope"},
          {"rotary_scaling_factor", m.rotary_scaling_factor},
          {"mscale", m.mscale},
          {"mscale_all_dim", m.mscale_all_dim},
          {"original_max_position_embeddings", m.original_max_positions},
          {"beta_fast", m.beta_fast},
          {"beta_slow", m.beta_slow}};
}

model::TransformerConfig::Mla mla_config_from_json(const json& j) {
  model::TransformerConfig::Mla m;
  m.on = true, m.q_lora_rank = j.at("q_lora_rank"), m.kv_lora_rank = j.at("kv_lora_rank");
  m.qk_head_dim = j.at("qk_head_dim"), m.qk_pos_emb_head_dim = j.at("qk_pos_emb_head_dim");
  m.v_head_dim = j.at("v_head_dim"), m.yarn = j.at("rope_type") == "yarn";
  m.rotary_scaling_factor = j.at("rotary_scaling_factor");
  m.mscale = j.at("mscale"), m.mscale_all_dim = j.at("mscale_all_dim");
  m.original_max_positions = j.at("original_max_position_embeddings");
  m.beta_fast = j.at("beta_fast"), m.beta_slow = j.at("beta_slow");
  return m;
}
}  // namespace

json model_config_json(const model::TransformerConfig& c) {
  json j = {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_query_groups", c.num_query_groups},
          {"kv_channels", c.kv_channels},
          {"seq_length", c.seq_length},
          {"max_position_embeddings", c.max_position_embeddings},
          {"padded_vocab_size", c.padded_vocab_size},
          {"rope", c.rope},
          {"rotary_base", c.rotary_base},
          {"rotary_percent", c.rotary_percent},
          {"rmsnorm", c.rmsnorm},
          {"norm_epsilon", c.norm_epsilon},
          {"zero_centered_gamma", c.zero_centered_gamma},
          {"swiglu", c.swiglu},
          {"tie_embeddings", c.tie_embeddings},
          {"add_bias_linear", c.add_bias_linear},
          {"hidden_dropout", c.hidden_dropout},
          {"attention_dropout", c.attention_dropout},
          {"init_method_std", c.init_method_std},
          {"seed", c.seed},
          {"dtype", std::string(dtype_name(c.dtype))},
          {"tp_size", c.tp_size}};
  if (c.moe.num_experts > 0) j["moe"] = moe_config_json(c.moe);  // mixture of experts
  // --qk-layernorm (absent: off); its form is `rmsnorm`'s (LayerNorm: q/k norm biases).
  if (c.qk_layernorm) j["qk_layernorm"] = true;
  if (c.qk_l2_norm) j["qk_l2_norm"] = true;  // --qk-l2-norm (absent: off)
  if (c.no_positions) j["no_positions"] = true;  // --position-embedding-type none (absent: off)
  if (c.attention_sink())  // --softmax-type (absent: vanilla)
    j["softmax_type"] = model::softmax_type_name(c.softmax_type);
  if (c.squared_relu) j["squared_relu"] = true;  // --squared-relu (absent: off)
  if (c.quick_geglu) j["quick_geglu"] = true;    // --quick-geglu (absent: off)
  if (c.gelu_erf) j["gelu_erf"] = true;  // the exact GELU (absent: the tanh form)
  // The gated units' --glu-linear-offset (absent: 0) and --activation-func-clamp-value
  // (absent: none).
  if (c.glu_linear_offset != 0) j["glu_linear_offset"] = c.glu_linear_offset;
  if (c.activation_func_clamp_value)
    j["activation_func_clamp_value"] = *c.activation_func_clamp_value;
  // --add-qkv-bias where it adds a tensor (without --disable-bias-linear it is implied).
  if (c.qkv_bias() && !c.add_bias_linear) j["add_qkv_bias"] = true;
  if (c.rope_scaling)  // Llama 3.x RoPE scaling (absent: off), in Hugging Face's names
    j["rope_scaling"] = {{"factor", c.rope_scaling_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_positions}};
  if (c.yarn.on)  // --position-embedding-type yarn (absent: off)
    j["yarn"] = {{"factor", c.yarn.factor},
                 {"original_max_position_embeddings", c.yarn.original_max_positions},
                 {"beta_fast", c.yarn.beta_fast},
                 {"beta_slow", c.yarn.beta_slow},
                 {"correction_range_round_to_int", c.yarn.round_to_int},
                 {"mscale", c.yarn.mscale},
                 {"mscale_all_dim", c.yarn.mscale_all_dim}};
  if (c.seq_len_interpolation_factor != 1.0)  // RoPE position interpolation (absent: 1, off)
    j["rotary_seq_len_interpolation_factor"] = c.seq_len_interpolation_factor;
  if (c.rotary_interleaved) j["rotary_interleaved"] = true;  // --rotary-interleaved (absent: off)
  if (c.mla.on) j["mla"] = mla_config_json(c.mla);  // multi-latent attention (absent: off)
  if (c.mup.on) {  // --use-mup (absent: off): the multipliers and the attention scale
    const auto& m = c.mup;
    j["mup"] = {{"base_hidden_size", m.base_hidden_size}, {"width_mult", m.width_mult},
                {"embedding_mult", m.embedding_mult},     {"output_mult", m.output_mult},
                {"base_head_dim", m.base_head_dim ? json(*m.base_head_dim) : json(nullptr)},
                {"attn_scale_power", m.attn_scale_power}};
  }
  if (c.mtp_num_layers > 0) j["mtp_num_layers"] = c.mtp_num_layers;  // MTP depths (absent: 0)
  if (!c.no_rope_pattern.empty()) j["no_rope"] = c.no_rope_pattern;  // --no-rope-freq
  if (c.has_window_layers()) {  // sliding-window attention (absent: none)
    std::vector<int64_t> pattern;
    for (int64_t l = 0; l < c.num_layers; ++l) pattern.push_back(c.is_window_layer(l) ? 1 : 0);
    j["window"] = {{"left", c.window_left}, {"pattern", pattern}};
  }
  return j;
}

model::TransformerConfig model_config_from_metadata(const json& md) {
  MCPP_CHECK_HINT(md.contains("model"),
                  "pass the model shape flags (--num-layers, --hidden-size, ...) instead",
                  "the checkpoint records no model config");
  const std::string iter_dir = md.value("__iter_dir", std::string("."));
  const json& j = md.at("model");
  model::TransformerConfig c;
  try {
  c.num_layers = j.at("num_layers"), c.hidden_size = j.at("hidden_size");
  c.ffn_hidden_size = j.at("ffn_hidden_size");
  c.num_attention_heads = j.at("num_attention_heads");
  c.num_query_groups = j.at("num_query_groups"), c.kv_channels = j.at("kv_channels");
  c.seq_length = j.at("seq_length"), c.max_position_embeddings = j.at("max_position_embeddings");
  c.padded_vocab_size = j.at("padded_vocab_size");
  c.rope = j.at("rope"), c.rotary_base = j.at("rotary_base");
  c.rotary_percent = j.at("rotary_percent"), c.rmsnorm = j.at("rmsnorm");
  c.norm_epsilon = j.at("norm_epsilon"), c.swiglu = j.at("swiglu");
  c.zero_centered_gamma = j.value("zero_centered_gamma", false);  // absent before 1p existed
  c.tie_embeddings = j.at("tie_embeddings"), c.add_bias_linear = j.at("add_bias_linear");
  c.hidden_dropout = j.at("hidden_dropout"), c.attention_dropout = j.at("attention_dropout");
  c.init_method_std = j.at("init_method_std"), c.seed = j.at("seed");
  c.dtype = dtype_from_name(j.at("dtype").get<std::string>());
  if (j.contains("moe")) c.moe = moe_config_from_json(j.at("moe"));  // mixture of experts
  c.qk_layernorm = j.value("qk_layernorm", false);                    // --qk-layernorm
  c.qk_l2_norm = j.value("qk_l2_norm", false);                        // --qk-l2-norm
  c.no_positions = j.value("no_positions", false);  // --position-embedding-type none
  c.softmax_type = model::softmax_type_of(j.value("softmax_type", std::string("vanilla")));
  c.squared_relu = j.value("squared_relu", false);                    // --squared-relu
  c.quick_geglu = j.value("quick_geglu", false);                      // --quick-geglu
  c.gelu_erf = j.value("gelu_erf", false);  // the exact GELU (gelu_is_exact's flags)
  c.glu_linear_offset = j.value("glu_linear_offset", 0.0);            // --glu-linear-offset
  if (j.contains("activation_func_clamp_value"))  // --activation-func-clamp-value
    c.activation_func_clamp_value = j.at("activation_func_clamp_value").get<double>();
  c.add_qkv_bias = j.value("add_qkv_bias", false);                    // --add-qkv-bias
  if (j.contains("rope_scaling")) {  // Llama 3.x RoPE scaling (absent: off)
    const json& r = j.at("rope_scaling");
    c.rope_scaling = true, c.rope_scaling_factor = r.at("factor");
    c.rope_low_freq_factor = r.at("low_freq_factor");
    c.rope_high_freq_factor = r.at("high_freq_factor");
    c.rope_original_max_positions = r.at("original_max_position_embeddings");
  }
  if (j.contains("yarn")) {  // --position-embedding-type yarn (absent: off)
    const json& y = j.at("yarn");
    c.yarn.on = true, c.yarn.factor = y.at("factor");
    c.yarn.original_max_positions = y.at("original_max_position_embeddings");
    c.yarn.beta_fast = y.at("beta_fast"), c.yarn.beta_slow = y.at("beta_slow");
    c.yarn.round_to_int = y.at("correction_range_round_to_int");
    c.yarn.mscale = y.at("mscale"), c.yarn.mscale_all_dim = y.at("mscale_all_dim");
  }
  c.seq_len_interpolation_factor = j.value("rotary_seq_len_interpolation_factor", 1.0);
  c.rotary_interleaved = j.value("rotary_interleaved", false);      // --rotary-interleaved
  if (j.contains("mla")) c.mla = mla_config_from_json(j.at("mla"));  // multi-latent attention
  if (j.contains("mup")) {  // --use-mup
    const json& m = j.at("mup");
    c.mup.on = true, c.mup.base_hidden_size = m.at("base_hidden_size");
    c.mup.width_mult = m.at("width_mult"), c.mup.embedding_mult = m.at("embedding_mult");
    c.mup.output_mult = m.at("output_mult"), c.mup.attn_scale_power = m.at("attn_scale_power");
    if (!m.at("base_head_dim").is_null()) c.mup.base_head_dim = m.at("base_head_dim").get<double>();
  }
  c.mtp_num_layers = j.value("mtp_num_layers", int64_t(0));          // --mtp-num-layers
  if (j.contains("no_rope"))  // --no-rope-freq: 1 per layer without RoPE
    c.no_rope_pattern = j.at("no_rope").get<std::vector<int64_t>>();
  if (j.contains("window")) {  // --window-size, --window-attn-skip-freq
    c.window_left = j.at("window").at("left");
    c.window_pattern = j.at("window").at("pattern").get<std::vector<int64_t>>();
  }
  } catch (const json::exception& e) {
    MCPP_FAIL("{}/{}: malformed 'model' field: {}", iter_dir, kMetadataFile, e.what());
  }
  c.tp_size = 1, c.tp_rank = 0;  // the loader chooses its own layout
  // Ranges, and agreement with the tensors and files, before anyone allocates this model.
  try {
    check_model_config(c, md, iter_dir);
  } catch (const json::exception& e) {
    MCPP_FAIL("{}/{}: malformed 'tensors' or 'files' field: {}", iter_dir, kMetadataFile,
              e.what());
  }
  return c;
}

void check_model_compat(const json& saved, const model::TransformerConfig& cur,
                        const std::string& where, bool vocab_repad, bool key_set_may_differ) {
  const json now = model_config_json(cur);
  std::string diffs, keyset;  // shape / meaning differences; key-set-only differences
  const bool learned = cur.learned_positions();
  auto differ = [&](const std::string& k, const json& a, const json& b) {
    const bool keys_only = k == "num_layers" || k == "mtp_num_layers" ||
                           k == "tie_embeddings" || k == "add_bias_linear" ||
                           k == "add_qkv_bias" || k == "qk_layernorm" || k == "moe.expert_bias" ||
                           k == "moe.shared_expert_gate";
    (keys_only ? keyset : diffs) +=
        fmt::format("\n  {}: checkpoint {} vs this run {}", k, a.dump(), b.dump());
  };
  for (const char* k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                        "num_query_groups", "kv_channels", "padded_vocab_size", "rope", "rmsnorm",
                        "swiglu", "tie_embeddings", "add_bias_linear", "max_position_embeddings"}) {
    if (std::string(k) == "max_position_embeddings" && !learned) continue;
    if (std::string(k) == "padded_vocab_size" && vocab_repad) continue;
    if (!saved.contains(k) || saved[k] != now[k])
      differ(k, saved.contains(k) ? saved[k] : json("(absent)"), now[k]);
  }
  // --squared-relu: the same tensors as GELU's MLP, another function of them; --quick-geglu,
  // its offset and clamp: SwiGLU's tensors, another function of them.
  if (saved.value("squared_relu", false) != cur.squared_relu)
    differ("squared_relu (--squared-relu)", saved.value("squared_relu", false), cur.squared_relu);
  if (saved.value("quick_geglu", false) != cur.quick_geglu)
    differ("quick_geglu (--quick-geglu)", saved.value("quick_geglu", false), cur.quick_geglu);
  // GELU's form: the exact one, or the tanh form (which --openai-gelu keeps without biases)
  if (saved.value("gelu_erf", false) != cur.gelu_erf)
    differ("gelu_erf (exact GELU: --no-bias-gelu-fusion or --disable-bias-linear without "
           "--openai-gelu)",
           saved.value("gelu_erf", false), cur.gelu_erf);
  for (const char* k : {"glu_linear_offset", "activation_func_clamp_value"}) {
    const json none = json(nullptr), a = saved.value(k, none), b = now.value(k, none);
    if (a != b)
      differ(fmt::format("{} (--{})", k, k == std::string("glu_linear_offset")
                                             ? "glu-linear-offset"
                                             : "activation-func-clamp-value"),
             a, b);
  }
  {  // --no-rope-freq: the same tensors, another function of them (absent: RoPE everywhere)
    const json off = json(nullptr), &a = saved.contains("no_rope") ? saved["no_rope"] : off;
    const json b = now.contains("no_rope") ? now["no_rope"] : off;
    if (a != b) differ("no_rope (--no-rope-freq)", a, b);
  }
  {  // muP: the same tensors, another function of them (absent: off)
    const json off = json(nullptr), &a = saved.contains("mup") ? saved["mup"] : off;
    const json b = now.contains("mup") ? now["mup"] : off;
    if (a != b) differ("mup (--use-mup and its flags)", a, b);
  }
  {  // multi-latent attention: its shape and RoPE (absent: off)
    const json off = json(nullptr), &a = saved.contains("mla") ? saved["mla"] : off;
    const json b = now.contains("mla") ? now["mla"] : off;
    if (a != b) differ("mla (--multi-latent-attention and its flags)", a, b);
  }
  // --rotary-interleaved: the same tensors, RoPE on other pairs of their dims.
  if (saved.value("rotary_interleaved", false) != cur.rotary_interleaved)
    differ("rotary_interleaved (--rotary-interleaved)", saved.value("rotary_interleaved", false),
           cur.rotary_interleaved);
  {  // sliding-window attention: the same tensors, another function of them (absent: none)
    const json off = json(nullptr), &a = saved.contains("window") ? saved["window"] : off;
    const json b = now.contains("window") ? now["window"] : off;
    if (a != b) differ("window (--window-size, --window-attn-skip-freq)", a, b);
  }
  if (saved.value("mtp_num_layers", int64_t(0)) != cur.mtp_num_layers)  // --mtp-num-layers
    differ("mtp_num_layers", saved.value("mtp_num_layers", int64_t(0)), cur.mtp_num_layers);
  if (saved.value("qk_layernorm", false) != cur.qk_layernorm)  // --qk-layernorm
    differ("qk_layernorm", saved.value("qk_layernorm", false), cur.qk_layernorm);
  if (saved.value("qk_l2_norm", false) != cur.qk_l2_norm)  // --qk-l2-norm: no tensors of its own
    differ("qk_l2_norm (--qk-l2-norm)", saved.value("qk_l2_norm", false), cur.qk_l2_norm);
  if (saved.value("no_positions", false) != cur.no_positions)  // --position-embedding-type none
    differ("no_positions", saved.value("no_positions", false), cur.no_positions);
  if (const std::string st = saved.value("softmax_type", std::string("vanilla"));
      st != model::softmax_type_name(cur.softmax_type))  // --softmax-type
    differ("softmax_type", st, model::softmax_type_name(cur.softmax_type));
  if (saved.value("add_qkv_bias", false) != now.value("add_qkv_bias", false))  // --add-qkv-bias
    differ("add_qkv_bias", saved.value("add_qkv_bias", false), now.value("add_qkv_bias", false));
  // --apply-layernorm-1p changes what the stored norm weights mean (absent: false).
  if (saved.value("zero_centered_gamma", false) != cur.zero_centered_gamma)
    differ("zero_centered_gamma (--apply-layernorm-1p)", saved.value("zero_centered_gamma", false),
           cur.zero_centered_gamma);
  {  // mixture of experts: the parameter shapes (routing settings may change on resume)
    const json none = json::object(), &a = saved.contains("moe") ? saved["moe"] : none,
               &b = now.contains("moe") ? now["moe"] : none;
    for (const char* k : {"num_experts", "layer_pattern", "ffn_hidden_size",
                          "shared_ffn_hidden_size", "shared_expert_gate", "expert_bias"})
      if (a.value(k, json()) != b.value(k, json()))
        differ(std::string("moe.") + k, a.value(k, json()), b.value(k, json()));
  }
  if (key_set_may_differ && !keyset.empty())
    log::warn("{} was written for a model with other keys (loaded key by key, "
              "--dist-ckpt-strictness):{}",
              where, keyset);
  else
    diffs += keyset;
  MCPP_CHECK_HINT(diffs.empty(),
                  "pass the model flags the checkpoint was trained with (megatron inspect shows "
                  "them); padded_vocab_size follows --make-vocab-size-divisible-by and TP" +
                      std::string(keyset.empty() || key_set_may_differ
                                      ? ""
                                      : "; or, to load around parameters on one side only, "
                                        "--dist-ckpt-strictness log_all"),
                  "{} was written for a different model:{}", where, diffs);
  for (const char* k : {"rotary_base", "rotary_percent", "norm_epsilon"})
    if (saved.contains(k) && saved[k] != now[k])
      log::warn("{}: {} differs (checkpoint {}, this run {})", where, k, saved[k].dump(),
                now[k].dump());
  // RoPE scaling as the base: a warning (extending a model's context is a reason to change
  // it between runs).
  auto scaling = [](const json& m) {
    return m.contains("rope_scaling") ? m["rope_scaling"].dump() : std::string("off");
  };
  if (scaling(saved) != scaling(now))
    log::warn("{}: rope_scaling differs (checkpoint {}, this run {})", where, scaling(saved),
              scaling(now));
  // YaRN likewise: its factor is how a model's context is extended.
  auto yarn = [](const json& m) {
    return m.contains("yarn") ? m["yarn"].dump() : std::string("off");
  };
  if (yarn(saved) != yarn(now))
    log::warn("{}: yarn differs (checkpoint {}, this run {})", where, yarn(saved), yarn(now));
  // Position interpolation likewise: stretching a checkpoint's context is what it is for.
  const json ia = saved.value("rotary_seq_len_interpolation_factor", json(1.0));
  const json ib = now.value("rotary_seq_len_interpolation_factor", json(1.0));
  if (ia != ib)
    log::warn("{}: rotary_seq_len_interpolation_factor differs (checkpoint {}, this run {})", where,
              ia.dump(), ib.dump());
}

}  // namespace mcpp::checkpoint
