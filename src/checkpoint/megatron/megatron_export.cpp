// megatron_export.h: the legacy layout's rank files (model, optimizer, scheduler, args).
#include "checkpoint/megatron/megatron_export.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_write.h"
#include "model/gpt_model.h"
#include "parallel/pipeline/layout.h"

namespace mcpp::checkpoint::megatron {

namespace fs = std::filesystem;

const char* transformer_impl_name(TransformerImpl t) {
  return t == TransformerImpl::Local ? "local" : "transformer_engine";
}

std::string legacy_rank_dir(int64_t tp, int64_t pp, int64_t P) {
  return P > 1 ? fmt::format("mp_rank_{:02d}_{:03d}", tp, pp) : fmt::format("mp_rank_{:02d}", tp);
}

DType recorded_params_dtype(const nlohmann::json& given) {
  auto on = [&](const char* k) {
    return given.is_object() && given.contains(k) && given[k].is_string() &&
           given[k].get<std::string>() == "True";
  };
  return on("bf16") ? DType::BF16 : on("fp16") ? DType::F16 : DType::F32;
}

namespace {

// One entry of a stage's model state dict: its key in the file, and the megatron.cpp
// parameter it holds ("" for a Transformer Engine _extra_state, saved as None); chunk: the
// virtual stage's model chunk (model0, model1, ...) that holds it.
struct Entry {
  std::string key, name;
  int64_t chunk = 0;
};

// The stage's state dict in Megatron's order, which is named_parameters()'s (the order the
// optimizer's groups list their parameters in): embedding; per layer input_layernorm, then
// self_attention's children as SelfAttention creates them (core_attention, linear_proj,
// linear_qkv), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2); final_layernorm; output_layer.
// Transformer Engine fuses the norms into linear_qkv / linear_fc1 (layer_norm_weight first).
// With virtual stages (V chunks) the chunks follow one another, each in this order, as
// Megatron's optimizer lists the chunks' parameters.
std::vector<Entry> stage_entries(const model::TransformerConfig& c, TransformerImpl impl,
                                 int64_t pp, int64_t P, const std::set<std::string>& have,
                                 int64_t V = 1, std::optional<int64_t> first = std::nullopt,
                                 std::optional<int64_t> last = std::nullopt,
                                 const std::optional<std::string>& layout = std::nullopt) {
  std::vector<Entry> out;
  int64_t chunk = 0;
  auto add = [&](const std::string& key, const std::string& name) {
    if (have.count(name)) out.push_back({key, name, chunk});
  };
  auto as_int = [](std::optional<int64_t> v) {
    return v ? std::optional<int>(int(*v)) : std::nullopt;
  };
  // Megatron's get_transformer_layer_offset (or the layout's): the global layers of each
  // (stage, chunk).
  const auto layers = parallel::pipeline::stage_layers(
      int(c.num_layers), int(P), int(V),
      {as_int(first), as_int(last), layout, int(c.mtp_num_layers)});
  const bool te = impl == TransformerImpl::TransformerEngine;
  for (chunk = 0; chunk < V; ++chunk) {
  if (pp == 0 && chunk == 0) {
    add("embedding.word_embeddings.weight", "embedding.word_embeddings.weight");
    add("embedding.position_embeddings.weight", "embedding.position_embeddings.weight");
  }
  const std::vector<int>& ids = layers[size_t(pp * V + chunk)];
  for (size_t l = 0; l < ids.size(); ++l) {
    const std::string key = fmt::format("decoder.layers.{}.", l);
    const std::string name = fmt::format("decoder.layers.{}.", ids[l]);
    auto param = [&](const std::string& k, const std::string& n) { add(key + k, name + n); };
    auto extra = [&](const std::string& m) {
      if (te) out.push_back({key + m + "._extra_state", "", chunk});
    };
    auto linear = [&](const std::string& m, const char* norm) {
      if (te && norm) {
        param(m + ".layer_norm_weight", std::string(norm) + ".weight");
        param(m + ".layer_norm_bias", std::string(norm) + ".bias");
      }
      param(m + ".weight", m + ".weight");
      param(m + ".bias", m + ".bias");
      extra(m);
    };
    if (!te) param("input_layernorm.weight", "input_layernorm.weight");
    if (!te) param("input_layernorm.bias", "input_layernorm.bias");
    // --softmax-type learnable: the core attention's own parameter, before its extra state.
    param("self_attention.core_attention.softmax_offset",
          "self_attention.core_attention.softmax_offset");
    extra("self_attention.core_attention");
    linear("self_attention.linear_proj", nullptr);
    linear("self_attention.linear_qkv", "input_layernorm");
    // Megatron registers q_layernorm and k_layernorm after linear_qkv (no extra state written,
    // as for the final layernorm); each its weight, then (LayerNorm) its bias.
    for (const char* n : {"self_attention.q_layernorm", "self_attention.k_layernorm"}) {
      param(std::string(n) + ".weight", std::string(n) + ".weight");
      param(std::string(n) + ".bias", std::string(n) + ".bias");
    }
    if (!te) param("pre_mlp_layernorm.weight", "pre_mlp_layernorm.weight");
    if (!te) param("pre_mlp_layernorm.bias", "pre_mlp_layernorm.bias");
    linear("mlp.linear_fc1", "pre_mlp_layernorm");
    linear("mlp.linear_fc2", nullptr);
  }
  if (pp == P - 1 && chunk == V - 1) {
    add("decoder.final_layernorm.weight", "decoder.final_layernorm.weight");
    add("decoder.final_layernorm.bias", "decoder.final_layernorm.bias");
    // Tied: the first stage's embedding holds the weight; a last stage that is not also the
    // first keeps a copy as its output layer (Megatron's shared embedding group).
    if (!c.tie_embeddings)
      add("output_layer.weight", "output_layer.weight");
    else if (P > 1)
      add("output_layer.weight", "embedding.word_embeddings.weight");
  }
  }
  return out;
}

// An entry's place among its rank file's tensors (keys repeat across virtual chunks).
std::string slot_of(const Entry& e) { return fmt::format("{}/{}", e.chunk, e.key); }

std::set<std::string> model_names(const model::TransformerConfig& c) {
  model::TransformerConfig one = c;
  one.tp_size = 1, one.tp_rank = 0;
  model::GPTModel m(one);
  std::set<std::string> out;
  for (const auto& p : m.params().infos()) out.insert(p.name);
  MCPP_CHECK_HINT(m.params().buffer_infos().empty(),
                  "convert a dense model without persistent buffers (FP8 scaling state)",
                  "megatron convert --to-megatron: the model has persistent buffers (first '{}'), "
                  "which the legacy export does not write yet",
                  m.params().buffer_infos().front().name);
  return out;
}

Tensor scalar_f32(double v) {
  Tensor t = Tensor::empty({}, DType::F32);
  t.data<float>()[0] = float(v);
  return t;
}

// Integral values as Python ints (Megatron's argparse types), others as floats.
Py py_number(double v) {
  return v == std::floor(v) && std::abs(v) < 1e15 ? Py::integer(int64_t(v)) : Py::real(v);
}

// Megatron's args: the model from the config, the rest from the flags the run was given.
Py make_args(const ExportSource& s, const ExportOptions& o) {
  const auto& c = s.config;
  const TrainingState& st = s.state;
  const nlohmann::json& g = st.config;
  auto given = [&](const char* k) -> std::optional<std::string> {
    if (g.is_object() && g.contains(k) && g[k].is_string()) return g[k].get<std::string>();
    return std::nullopt;
  };
  auto given_num = [&](const char* k, std::optional<double> dflt) -> Py {
    if (auto v = given(k)) {
      try {
        size_t n = 0;
        const double d = std::stod(*v, &n);
        if (n == v->size())
          return v->find_first_of(".eE") == std::string::npos ? Py::integer(int64_t(d))
                                                              : Py::real(d);
      } catch (const std::exception&) {
      }
    }
    return dflt ? Py::real(*dflt) : Py::none();
  };
  auto given_str = [&](const char* k) {
    auto v = given(k);
    return v ? Py::str(*v) : Py::none();
  };
  const bool bf16 = s.params_dtype == DType::BF16, fp16 = s.params_dtype == DType::F16;
  Py a = Py::namespace_();
  a.set("num_layers", Py::integer(c.num_layers));
  a.set("hidden_size", Py::integer(c.hidden_size));
  a.set("ffn_hidden_size", Py::integer(c.ffn_hidden_size));
  a.set("num_attention_heads", Py::integer(c.num_attention_heads));
  a.set("group_query_attention", Py::boolean(c.num_query_groups != c.num_attention_heads));
  a.set("num_query_groups", Py::integer(c.num_query_groups));
  a.set("kv_channels", Py::integer(c.kv_channels));
  a.set("max_position_embeddings", Py::integer(c.max_position_embeddings));
  a.set("seq_length", Py::integer(c.seq_length));
  a.set("encoder_seq_length", Py::integer(c.seq_length));
  a.set("position_embedding_type",
        Py::str(c.yarn.on        ? "yarn"
                : c.rope         ? "rope"
                : c.no_positions ? "none"
                                 : "learned_absolute"));
  // Megatron allows --no-position-embedding with rope only, and its
  // --use-rotary-position-embeddings would turn yarn into rope.
  a.set("add_position_embedding", Py::boolean(!c.rope || c.yarn.on));
  a.set("use_rotary_position_embeddings", Py::boolean(c.rope && !c.yarn.on));
  if (c.yarn.on) {  // what _apply_yarn_config_from_args reads
    const auto& y = c.yarn;
    a.set("rotary_scaling_factor", Py::real(y.factor));
    a.set("yarn_original_max_position_embeddings", Py::integer(y.original_max_positions));
    a.set("yarn_beta_fast", Py::real(y.beta_fast));
    a.set("yarn_beta_slow", Py::real(y.beta_slow));
    a.set("yarn_correction_range_round_to_int", Py::boolean(y.round_to_int));
    a.set("mscale", Py::real(y.mscale));
    a.set("mscale_all_dim", Py::real(y.mscale_all_dim));
  }
  a.set("rotary_base", py_number(c.rotary_base));
  a.set("rotary_percent", Py::real(c.rotary_percent));
  a.set("rotary_interleaved", Py::boolean(c.rope && c.rotary_interleaved));
  a.set("rotary_seq_len_interpolation_factor", c.seq_len_interpolation_factor == 1.0
                                                   ? Py::none()
                                                   : py_number(c.seq_len_interpolation_factor));
  a.set("use_rope_scaling", Py::boolean(c.rope_scaling));
  a.set("rope_scaling_factor", Py::real(c.rope_scaling_factor));
  a.set("normalization", Py::str(c.rmsnorm ? "RMSNorm" : "LayerNorm"));
  a.set("norm_epsilon", Py::real(c.norm_epsilon));
  a.set("apply_layernorm_1p", Py::boolean(c.zero_centered_gamma));
  a.set("swiglu", Py::boolean(c.swiglu));
  a.set("squared_relu", Py::boolean(c.squared_relu));
  // Quick-GEGLU and the gated units' offset and clamp. The bias fusions off where Megatron
  // would refuse them: its dense MLP fuses no quick-GEGLU, and no SwiGLU with an offset.
  a.set("quick_geglu", Py::boolean(c.quick_geglu));
  a.set("glu_linear_offset", Py::real(c.glu_linear_offset));
  a.set("activation_func_clamp_value",
        c.activation_func_clamp_value ? Py::real(*c.activation_func_clamp_value) : Py::none());
  if (c.swiglu) a.set("bias_swiglu_fusion", Py::boolean(c.glu_linear_offset == 0));
  a.set("softmax_type", Py::str(model::softmax_type_name(c.softmax_type)));  // attention sinks
  // GELU's form as Megatron's flags give it: the tanh form through the bias_gelu fusion (with
  // biases) or --openai-gelu (without), the exact one with neither (squared ReLU: neither;
  // Megatron refuses the bias_gelu fusion with it)
  const bool tanh = !c.swiglu && !c.squared_relu && !c.quick_geglu && !c.gelu_erf;
  a.set("bias_gelu_fusion", Py::boolean(tanh && c.add_bias_linear));
  a.set("openai_gelu", Py::boolean(tanh && !c.add_bias_linear));
  a.set("untie_embeddings_and_output_weights", Py::boolean(!c.tie_embeddings));
  a.set("add_bias_linear", Py::boolean(c.add_bias_linear));
  a.set("add_qkv_bias", Py::boolean(c.add_qkv_bias));
  a.set("qk_layernorm", Py::boolean(c.qk_layernorm));
  a.set("qk_l2_norm", Py::boolean(c.qk_l2_norm));
  a.set("apply_wd_to_qk_layernorm", Py::boolean(c.qk_layernorm_weight_decay));
  if (c.has_window_layers()) {  // sliding-window attention: (L, 0) and the layers' pattern
    std::vector<Py> pattern;
    for (int64_t l = 0; l < c.num_layers; ++l) pattern.push_back(Py::integer(c.is_window_layer(l)));
    a.set("window_size", Py::tuple({Py::integer(c.window_left), Py::integer(0)}));
    a.set("window_attn_skip_freq", Py::list(std::move(pattern)));
  } else {
    a.set("window_size", Py::none());
    a.set("window_attn_skip_freq", Py::none());
  }
  if (!c.no_rope_pattern.empty()) {  // --no-rope-freq: Megatron's args keep the list
    std::vector<Py> p;
    for (int64_t x : c.no_rope_pattern) p.push_back(Py::integer(x));
    a.set("no_rope_freq", Py::list(std::move(p)));
  } else {
    a.set("no_rope_freq", Py::none());
  }
  // muP, as Megatron's args hold it: the flags as given (the derived width multiplier and
  // output multiplier live in its TransformerConfig, not in args).
  a.set("use_mup", Py::boolean(c.mup.on));
  if (c.mup.on) {
    const auto& m = c.mup;
    a.set("mup_base_hidden_size", Py::integer(m.base_hidden_size));
    a.set("mup_width_mult", Py::real(1.0));
    a.set("mup_embedding_mult", Py::real(m.embedding_mult));
    const bool derived = m.width_mult != 1.0 && m.output_mult == 1.0 / m.width_mult;
    a.set("mup_output_mult", Py::real(derived ? 1.0 : m.output_mult));
    a.set("mup_base_head_dim", m.base_head_dim ? Py::real(*m.base_head_dim) : Py::none());
    a.set("mup_attn_scale_power", Py::real(m.attn_scale_power));
  }
  a.set("num_experts", Py::none());
  a.set("hidden_dropout", Py::real(c.hidden_dropout));
  a.set("attention_dropout", Py::real(c.attention_dropout));
  a.set("init_method_std", Py::real(c.init_method_std));
  a.set("seed", Py::integer(int64_t(c.seed)));
  a.set("padded_vocab_size", Py::integer(c.padded_vocab_size));
  a.set("make_vocab_size_divisible_by", given_num("make_vocab_size_divisible_by", {}));
  if (a.entries.back().second.kind == Py::Kind::None)
    a.entries.back().second = Py::integer(128);  // Megatron's default
  a.set("vocab_size", given_num("vocab_size", {}));
  a.set("tokenizer_type", given_str("tokenizer_type"));
  a.set("vocab_file", given_str("vocab_file"));
  a.set("merge_file", given_str("merge_file"));
  a.set("tokenizer_model", given_str("tokenizer_model"));
  a.set("tensor_model_parallel_size", Py::integer(o.tp));
  a.set("pipeline_model_parallel_size", Py::integer(o.pp));
  a.set("virtual_pipeline_model_parallel_size", o.vp > 1 ? Py::integer(o.vp) : Py::none());
  auto opt_int = [](std::optional<int64_t> v) { return v ? Py::integer(*v) : Py::none(); };
  a.set("decoder_first_pipeline_num_layers", opt_int(o.first_stage_layers));
  a.set("decoder_last_pipeline_num_layers", opt_int(o.last_stage_layers));
  a.set("pipeline_model_parallel_layout", o.layout ? Py::str(*o.layout) : Py::none());
  a.set("expert_model_parallel_size", Py::integer(1));
  a.set("context_parallel_size", Py::integer(o.cp));
  a.set("sequence_parallel", Py::boolean(o.sequence_parallel));
  a.set("use_distributed_optimizer", Py::boolean(false));
  a.set("bf16", Py::boolean(bf16));
  a.set("fp16", Py::boolean(fp16));
  a.set("params_dtype", Py::global(torch_dtype_global(s.params_dtype)));
  a.set("micro_batch_size", given_num("micro_batch_size", {}));
  a.set("global_batch_size", given_num("global_batch_size", {}));
  a.set("train_iters", given_num("train_iters", {}));
  a.set("train_samples", given_num("train_samples", {}));
  a.set("lr", given_num("lr", {}));
  a.set("min_lr", given_num("min_lr", 0.0));
  a.set("weight_decay", given_num("weight_decay", 0.01));
  a.set("adam_beta1", Py::real(s.beta1));
  a.set("adam_beta2", Py::real(s.beta2));
  a.set("adam_eps", Py::real(s.eps));
  a.set("clip_grad", given_num("clip_grad", 1.0));
  a.set("optimizer", Py::str("adam"));
  a.set("lr_decay_style", Py::str(optim::to_string(st.scheduler.lr_decay_style)));
  a.set("consumed_train_samples", Py::integer(st.consumed_train_samples));
  a.set("consumed_valid_samples", Py::integer(st.consumed_valid_samples));
  a.set("iteration", Py::integer(st.iteration));
  a.set("transformer_impl", Py::str(transformer_impl_name(o.impl)));
  a.set("use_mcore_models", Py::boolean(true));
  a.set("ckpt_format", Py::str("torch"));
  a.set("use_dist_ckpt", Py::boolean(false));
  a.set("no_save_optim", o.save_optim && s.has_optimizer ? Py::none() : Py::boolean(true));
  a.set("no_save_rng", Py::boolean(true));
  a.set("world_size", Py::integer(o.tp * o.pp * o.cp * o.dp));
  a.set("data_parallel_size", Py::integer(o.dp));
  return a;
}

// The weight decay the scheduler sets at num_steps (OptimizerParamScheduler.get_wd).
double current_wd(const optim::SchedulerState& s) {
  if (s.wd_incr_style == optim::WdIncrStyle::Constant || s.wd_incr_steps <= 0) return s.end_wd;
  const double r = std::min(1.0, double(s.num_steps) / double(s.wd_incr_steps));
  const double k =
      s.wd_incr_style == optim::WdIncrStyle::Linear ? r : 0.5 * (std::cos(M_PI * (1 - r)) + 1.0);
  return s.start_wd + k * (s.end_wd - s.start_wd);
}

// torch's Optimizer.state_dict() of Megatron's Adam: groups as _get_param_groups builds them
// (the default group, then wd_mult 0 for biases and 1-D parameters), parameters numbered
// group after group, torch Adam's per-parameter step.
Py optimizer_state(const ExportSource& s, const std::vector<Entry>& entries,
                   const std::map<std::string, Tensor>& params, int64_t tp, int64_t T) {
  std::vector<const Entry*> groups[2];
  for (const Entry& e : entries) {
    if (e.name.empty()) continue;
    const bool no_wd = megatron_no_weight_decay(e.key, size_t(params.at(slot_of(e)).dim()),
                                                s.config.qk_layernorm_weight_decay);
    groups[no_wd ? 1 : 0].push_back(&e);
  }
  const auto& sc = s.state.scheduler;
  Py state = Py::dict(), pgs = Py::list({}), mains = Py::list({});
  int64_t index = 0;
  for (int g = 0; g < 2; ++g) {
    const double wd_mult = g == 0 ? 1.0 : 0.0;
    Py ids = Py::list({}), main = Py::list({});
    for (const Entry* e : groups[g]) {
      Py& st = state.set(index, Py::dict());
      st.set("step", Py::tensor_of(scalar_f32(double(s.optimizer_steps)), DType::F32));
      st.set("exp_avg", Py::tensor_of(s.shard(e->name, "exp_avg", tp, T), DType::F32));
      st.set("exp_avg_sq", Py::tensor_of(s.shard(e->name, "exp_avg_sq", tp, T), DType::F32));
      main.items.push_back(Py::tensor_of(params.at(slot_of(*e)), DType::F32));
      ids.items.push_back(Py::integer(index++));
    }
    Py pg = Py::dict();
    pg.set("lr", Py::real(sc.max_lr));  // Megatron's scheduler sets it again on load
    pg.set("betas", Py::tuple({Py::real(s.beta1), Py::real(s.beta2)}));
    pg.set("eps", Py::real(s.eps));
    pg.set("weight_decay", Py::real(current_wd(sc) * wd_mult));
    pg.set("amsgrad", Py::boolean(false));
    pg.set("maximize", Py::boolean(false));
    pg.set("foreach", Py::none());
    pg.set("capturable", Py::boolean(false));
    pg.set("differentiable", Py::boolean(false));
    pg.set("fused", Py::none());
    pg.set("is_expert_parallel", Py::boolean(false));
    pg.set("default_config", Py::boolean(true));
    pg.set("wd_mult", Py::real(wd_mult));
    pg.set("lr_mult", Py::real(1.0));
    pg.set("is_decoupled_lr", Py::boolean(false));
    pg.set("max_lr", Py::real(sc.max_lr));
    pg.set("min_lr", Py::real(sc.min_lr));
    pg.set("params", std::move(ids));
    pgs.items.push_back(std::move(pg));
    mains.items.push_back(std::move(main));
  }
  Py torch_sd = Py::dict();
  torch_sd.set("state", std::move(state));
  torch_sd.set("param_groups", std::move(pgs));
  if (s.params_dtype == DType::F32) return torch_sd;  // FP32Optimizer
  Py out = Py::dict();                                // Float16OptimizerWithFloat16Params
  out.set("optimizer", std::move(torch_sd));
  const auto& gs = s.state.grad_scaler;
  if (s.params_dtype == DType::F16 && gs.is_object() && gs.contains("scale")) {
    Tensor scale = Tensor::empty({1}, DType::F32);
    scale.data<float>()[0] = gs["scale"].get<float>();
    Py d = Py::dict();
    d.set("scale", Py::tensor_of(scale, DType::F32));
    d.set("growth_tracker", Py::integer(gs.value("growth_tracker", int64_t(0))));
    d.set("hysteresis_tracker", Py::integer(gs.value("hysteresis_tracker", int64_t(0))));
    out.set("grad_scaler", std::move(d));
  }
  out.set("fp32_from_fp16_params", std::move(mains));
  return out;
}

Py scheduler_state(const optim::SchedulerState& s) {
  Py d = Py::dict();
  d.set("max_lr", Py::real(s.max_lr));
  d.set("lr_warmup_steps", py_number(s.lr_warmup_steps));
  d.set("num_steps", Py::integer(s.num_steps));
  d.set("lr_decay_style", Py::str(optim::to_string(s.lr_decay_style)));
  d.set("lr_decay_steps", Py::integer(s.lr_decay_steps));
  d.set("min_lr", Py::real(s.min_lr));
  d.set("start_wd", Py::real(s.start_wd));
  d.set("end_wd", Py::real(s.end_wd));
  d.set("wd_incr_style", Py::str(optim::to_string(s.wd_incr_style)));
  d.set("wd_incr_steps", Py::integer(s.wd_incr_steps));
  return d;
}

}  // namespace

void check_exportable(const model::TransformerConfig& c, const ExportOptions& o,
                      const char* flag_tp, const char* flag_pp) {
  const char* hint =
      "the legacy export writes dense GPT and Llama models; save with the "
      "default --ckpt-format torch_dist, or convert to Hugging Face (--to-hf)";
  MCPP_CHECK_HINT(c.moe.num_experts == 0, hint,
                  "the model has {} experts: writing a mixture-of-experts model in Megatron's "
                  "legacy format (--ckpt-format torch) is not implemented yet",
                  c.moe.num_experts);
  MCPP_CHECK_HINT(!c.mla.on, hint,
                  "multi-latent attention models in Megatron's legacy format (--ckpt-format "
                  "torch) are not implemented yet");
  MCPP_CHECK_HINT(c.mtp_num_layers == 0, hint,
                  "multi-token prediction layers in Megatron's legacy format (--ckpt-format "
                  "torch) are not implemented yet");
  MCPP_CHECK_HINT(o.tp >= 1 && c.num_query_groups % o.tp == 0 &&
                      c.num_attention_heads % o.tp == 0 && c.ffn_hidden_size % o.tp == 0 &&
                      c.padded_vocab_size % o.tp == 0,
                  fmt::format("choose a {} that divides the query groups", flag_tp),
                  "{} {} does not divide the model: {} attention heads, {} query groups, ffn {}, "
                  "padded vocabulary {}",
                  flag_tp, o.tp, c.num_attention_heads, c.num_query_groups, c.ffn_hidden_size,
                  c.padded_vocab_size);
  MCPP_CHECK_HINT(o.pp >= 1 && c.num_layers % o.pp == 0,
                  fmt::format("choose a {} that divides the layer count", flag_pp),
                  "{} {} does not divide the {} layers (the conversion splits them evenly)",
                  flag_pp, o.pp, c.num_layers);
  // Every parameter must land in exactly one stage's entries: a name the export does not
  // place is a model feature it does not know.
  const std::set<std::string> have = model_names(c);
  std::set<std::string> placed;
  for (int64_t pp = 0; pp < o.pp; ++pp)
    for (const Entry& e : stage_entries(c, o.impl, pp, o.pp, have)) placed.insert(e.name);
  for (const auto& n : have)
    MCPP_CHECK_HINT(placed.count(n), hint,
                    "parameter '{}' has no place in Megatron's legacy layout here: not "
                    "implemented yet",
                    n);
}

void check_stage_exportable(const model::TransformerConfig& c, const ExportOptions& o, int64_t pp,
                            const std::set<std::string>& stage_names, bool has_buffers) {
  const char* hint = "train with the default --ckpt-format torch_dist";
  MCPP_CHECK_HINT(!has_buffers, hint,
                  "--ckpt-format torch: the model has persistent buffers (FP8 scaling state), "
                  "which Megatron's legacy layout does not carry here");
  std::set<std::string> placed;
  for (const Entry& e : stage_entries(c, o.impl, pp, o.pp, stage_names, o.vp, o.first_stage_layers,
                                      o.last_stage_layers, o.layout))
    placed.insert(e.name);
  for (const auto& n : stage_names)
    MCPP_CHECK_HINT(placed.count(n), hint,
                    "--ckpt-format torch: parameter '{}' of pipeline stage {} has no place in "
                    "Megatron's legacy layout here: not implemented yet",
                    n, pp);
}

void write_legacy_rank(const std::string& iter_dir, const ExportSource& src, const ExportOptions& o,
                       int64_t tp, int64_t pp) {
  const auto entries =
      stage_entries(src.config, o.impl, pp, o.pp, src.names ? *src.names : model_names(src.config),
                    o.vp, o.first_stage_layers, o.last_stage_layers, o.layout);
  Py root = Py::dict();
  root.set("args", make_args(src, o));
  root.set("checkpoint_version", Py::real(3.0));
  root.set("iteration", Py::integer(src.state.iteration));
  std::vector<Py> chunks(size_t(o.vp), Py::ordered_dict());
  std::map<std::string, Tensor> params;  // by slot_of: the fp32 main params of this rank
  for (const Entry& e : entries) {
    Py& model = chunks[size_t(e.chunk)];
    if (e.name.empty()) {
      model.set(e.key, Py::none());  // Transformer Engine's extra state without FP8
      continue;
    }
    Tensor t = src.shard(e.name, "param", tp, o.tp);
    params[slot_of(e)] = t;
    model.set(e.key, Py::tensor_of(t, src.params_dtype));
  }
  // Megatron's save_checkpoint: "model", or "model0" .. under virtual pipelining.
  for (int64_t v = 0; v < o.vp; ++v)
    root.set(o.vp == 1 ? std::string("model") : "model" + std::to_string(v),
             std::move(chunks[size_t(v)]));
  if (o.save_optim && src.has_optimizer) {
    root.set("optimizer", optimizer_state(src, entries, params, tp, o.tp));
    root.set("opt_param_scheduler", scheduler_state(src.state.scheduler));
  }
  root.set("num_floating_point_operations_so_far",
           Py::real(src.state.num_floating_point_operations_so_far));
  const fs::path dir = fs::path(iter_dir) / legacy_rank_dir(tp, pp, o.pp);
  std::error_code ec;
  fs::create_directories(dir, ec);
  MCPP_CHECK_HINT(!ec, "check that the --save folder is writable", "cannot create {}: {}",
                  dir.string(), ec.message());
  save_torch_file((dir / "model_optim_rng.pt").string(), root);
}

}  // namespace mcpp::checkpoint::megatron
