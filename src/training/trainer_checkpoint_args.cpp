// The checkpoint a run starts from (resolve_load_source: --load, else
// --pretrained-checkpoint as a finetune, as Megatron's load_checkpoint), and what is read
// from it before the model exists.
//
// --use-checkpoint-args: the model's arguments from that checkpoint, as Megatron's
// load_args_from_checkpoint (checkpointing.py). The checkpoint's metadata.json records the
// model config (checkpoint::model_config_json); its fields fill the flags of the same
// meaning. As in Megatron, the shape flags (layers, hidden, FFN, heads, head dim,
// sequence, positions; here also RoPE's position interpolation) are taken only when not given
// on the command line, and the architecture switches (query groups, positions, RoPE base and
// scaling, norm, the MLP's activation with its offset and clamp, ties, biases, dropout,
// zero-centred gamma, sliding window; a MoE checkpoint's experts and router) are forced from
// the checkpoint. The parallel layout is not taken: any layout loads any checkpoint here
// (Megatron forces TP/PP because it cannot).
// Tokenizer paths recorded in a checkpoint are never followed.
#include <fmt/format.h>

#include <optional>
#include <tuple>

#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_train.h"
#include "checkpoint/retention.h"
#include "training/validate_compat.h"

namespace mcpp::training {

namespace {

// The iteration a folder's checkpoint resumes from, in either format; nullopt: none.
std::optional<int64_t> resumable_iteration(const std::string& dir) {
  if (checkpoint::megatron::holds_legacy_checkpoint(dir)) return checkpoint::tracked_iteration(dir);
  return checkpoint::latest_iteration(dir);
}

// --non-persistent-ckpt-type: the non-persistent folder of --load when its checkpoint is at
// least as new as --load's own (Megatron's _load_base_checkpoint). --ckpt-step names an
// iteration of --load itself, so the non-persistent folder is not consulted then.
std::optional<LoadSource> non_persistent_source(const Args& a) {
  if (!a.load || !a.non_persistent_ckpt_type || a.ckpt_step) return std::nullopt;
  const std::string dir = a.non_persistent_dir(*a.load);
  const auto np = resumable_iteration(dir);
  if (!np) return std::nullopt;
  const auto persistent = resumable_iteration(*a.load);
  if (persistent && *np < *persistent) {
    log::warn("non-persistent checkpoints are older than persistent checkpoint: {} holds "
              "iteration {}, --load {} iteration {}",
              dir, *np, *a.load, *persistent);
    return std::nullopt;
  }
  log::info("resuming from the non-persistent checkpoint of iteration {} in {} (--load {}: {})",
            *np, dir, *a.load,
            persistent ? fmt::format("iteration {}", *persistent) : std::string("none"));
  return LoadSource{dir, false};
}

}  // namespace

std::optional<LoadSource> resolve_load_source(const Args& a) {
  if (auto np = non_persistent_source(a)) return np;
  // Megatron's checkpoint_exists: the folder holds a checkpoint (here: a tracker naming one,
  // or a complete iter_* folder; a tracker naming a lost folder is an error of its own).
  // A legacy Megatron-LM checkpoint (--ckpt-format torch) loads directly (megatron_train.h).
  auto holds = [](const std::string& dir) {
    return checkpoint::megatron::holds_legacy_checkpoint(dir) ||
           checkpoint::latest_iteration(dir).has_value();
  };
  if (a.load && holds(*a.load)) {
    if (a.pretrained_checkpoint)
      log::info(
          "--load {} holds a checkpoint: resuming from it (--pretrained-checkpoint {} is "
          "used only while --load holds none)",
          *a.load, *a.pretrained_checkpoint);
    return LoadSource{*a.load, false};
  }
  if (a.pretrained_checkpoint) {
    const std::string& dir = *a.pretrained_checkpoint;
    MCPP_CHECK_HINT(holds(dir),
                    "check the --pretrained-checkpoint path (a checkpoint folder holds "
                    "iter_XXXXXXX/ folders and " +
                        std::string(checkpoint::kTrackerFile) +
                        "; convert a Hugging Face model with megatron convert --from-hf)",
                    "no checkpoint found in --pretrained-checkpoint {}{}", dir,
                    a.load ? fmt::format(" (nor in --load {})", *a.load) : std::string());
    log::info("{}: finetuning from --pretrained-checkpoint {} (weights only, from iteration 0)",
              a.load ? fmt::format("no checkpoint in --load {}", *a.load)
                     : std::string("no --load given"),
              dir);
    return LoadSource{dir, true};
  }
  if (!a.load) return std::nullopt;
  MCPP_CHECK_HINT(!a.ckpt_convert_format, "check the --load path",
                  "--ckpt-convert-format {}: no checkpoint to convert in --load {} (no {} and no "
                  "complete iter_* folder)",
                  a.ckpt_convert_format.value_or(""), *a.load, checkpoint::kTrackerFile);
  MCPP_CHECK_HINT(!a.exit_on_missing_checkpoint,
                  "check the --load path, or drop --exit-on-missing-checkpoint to start from "
                  "random weights",
                  "--exit-on-missing-checkpoint: no checkpoint found in --load {} (no {} and no "
                  "complete iter_* folder)",
                  *a.load, checkpoint::kTrackerFile);
  if (a.ckpt_step) return LoadSource{*a.load, false};  // the loader says what is missing
  log::warn("could not find a checkpoint in --load {}; starting from random initialisation",
            *a.load);
  return std::nullopt;
}

void apply_checkpoint_args(Args& a, const std::optional<LoadSource>& src) {
  check_checkpoint_args_source(a);
  // No checkpoint to start from: read_metadata says so, naming --load.
  const std::string dir = src ? src->dir : a.load.value_or("");
  const auto md = checkpoint::read_metadata(dir, a.ckpt_step);
  const model::TransformerConfig c = checkpoint::model_config_from_metadata(md);
  int taken = 0;
  // Shape: only where the command line said nothing (Megatron's _set_arg without force).
  auto shape = [&](const char* dest, int64_t& field, int64_t v) {
    if (a.was_given(dest)) return;
    field = v, a.given[dest] = std::to_string(v), ++taken;
  };
  shape("num_layers", a.num_layers, c.num_layers);
  shape("hidden_size", a.hidden_size, c.hidden_size);
  shape("ffn_hidden_size", a.ffn_hidden_size, c.ffn_hidden_size);
  shape("num_attention_heads", a.num_attention_heads, c.num_attention_heads);
  if (!c.mla.on) shape("kv_channels", a.kv_channels, c.kv_channels);  // MLA: Dq, derived
  shape("seq_length", a.seq_length, c.seq_length);
  shape("max_position_embeddings", a.max_position_embeddings, c.max_position_embeddings);
  // Switches: forced (_set_arg(..., force=True)); a different command-line value is
  // overridden, and said so.
  auto force = [&](const char* dest, auto& field, auto v, const std::string& shown) {
    if (a.was_given(dest) && field != v)
      log::warn("--use-checkpoint-args: {} {} from the command line is replaced by the "
                "checkpoint's {}",
                flag_name(dest), a.given[dest], shown);
    field = v, a.given[dest] = shown, ++taken;
  };
  auto py = [](bool b) { return std::string(b ? "True" : "False"); };
  const bool gqa = c.num_query_groups != c.num_attention_heads;
  force("group_query_attention", a.group_query_attention, gqa, py(gqa));
  force("num_query_groups", a.num_query_groups, c.num_query_groups,
        std::to_string(c.num_query_groups));
  const std::string pos = c.yarn.on        ? "yarn"
                          : c.rope         ? "rope"
                          : c.no_positions ? "none"
                                           : "learned_absolute";
  force("position_embedding_type", a.position_embedding_type, pos, pos);
  if (c.yarn.on) {  // YaRN: forced like the Llama 3.x scaling below
    const auto& y = c.yarn;
    force("rotary_scaling_factor", a.rotary_scaling_factor, y.factor, python_float(y.factor));
    force("mscale", a.mscale, y.mscale, python_float(y.mscale));
    force("mscale_all_dim", a.mscale_all_dim, y.mscale_all_dim, python_float(y.mscale_all_dim));
    force("yarn_original_max_position_embeddings", a.yarn_original_max_position_embeddings,
          std::optional<int64_t>(y.original_max_positions),
          std::to_string(y.original_max_positions));
    force("yarn_beta_fast", a.yarn_beta_fast, std::optional<double>(y.beta_fast),
          python_float(y.beta_fast));
    force("yarn_beta_slow", a.yarn_beta_slow, std::optional<double>(y.beta_slow),
          python_float(y.beta_slow));
    force("yarn_correction_range_round_to_int", a.yarn_correction_range_round_to_int,
          std::optional<bool>(y.round_to_int), py(y.round_to_int));
  }
  force("rotary_base", a.rotary_base, int64_t(c.rotary_base),
        std::to_string(int64_t(c.rotary_base)));
  force("rotary_percent", a.rotary_percent, c.rotary_percent, python_float(c.rotary_percent));
  // Llama 3.x RoPE scaling: forced like the base (Megatron's checkpoint args leave it to the
  // command line; its checkpoint records it, ours too, so a resumed model stays the same).
  force("use_rope_scaling", a.use_rope_scaling, c.rope_scaling, py(c.rope_scaling));
  if (c.rope_scaling) {
    force("rope_scaling_factor", a.rope_scaling_factor, c.rope_scaling_factor,
          python_float(c.rope_scaling_factor));
    a.rope_low_freq_factor = c.rope_low_freq_factor;  // no flags: Megatron's constants
    a.rope_high_freq_factor = c.rope_high_freq_factor;
    a.rope_original_max_positions = c.rope_original_max_positions;
  }
  // Linear position interpolation: taken like a shape flag, only when the command line says
  // nothing (Megatron's checkpoint args leave it to the command line). A resumed run keeps
  // the checkpoint's; a new factor given with the checkpoint stretches its context further,
  // which is what the flag is for (the loader warns that it differs).
  if (!a.was_given("rotary_seq_len_interpolation_factor") &&
      c.seq_len_interpolation_factor != 1.0) {
    const double f = c.seq_len_interpolation_factor;
    a.rotary_seq_len_interpolation_factor = f, ++taken;
    a.given["rotary_seq_len_interpolation_factor"] = python_int_or_float(f);
  }
  force("rotary_interleaved", a.rotary_interleaved, c.rotary_interleaved,
        py(c.rotary_interleaved));
  {  // Sliding-window attention: forced like the switches (a window changes the function)
    std::optional<std::string> size, freq;
    if (c.has_window_layers()) {
      size = fmt::format("({}, 0)", c.window_left);
      std::string l;
      for (int64_t i = 0; i < c.num_layers; ++i)
        l += fmt::format("{}{}", i ? ", " : "", c.is_window_layer(i) ? 1 : 0);
      freq = "[" + l + "]";
    }
    force("window_size", a.window_size, size, size.value_or("None"));
    force("window_attn_skip_freq", a.window_attn_skip_freq, freq, freq.value_or("None"));
  }
  {  // --no-rope-freq, as the layers' list (forced like the switches)
    std::optional<std::string> freq;
    if (!c.no_rope_pattern.empty()) {
      std::string l;
      for (size_t i = 0; i < c.no_rope_pattern.size(); ++i)
        l += fmt::format("{}{}", i ? ", " : "", c.no_rope_pattern[i]);
      freq = "[" + l + "]";
    }
    force("no_rope_freq", a.no_rope_freq, freq, freq.value_or("None"));
  }
  // muP: its switch, base width, multipliers and attention scale, forced like the switches
  // (the output multiplier as the checkpoint's run derived it).
  force("use_mup", a.use_mup, c.mup.on, py(c.mup.on));
  if (c.mup.on) {
    const auto& m = c.mup;
    const std::optional<int64_t> base = m.base_hidden_size;
    force("mup_base_hidden_size", a.mup_base_hidden_size, base, std::to_string(*base));
    force("mup_embedding_mult", a.mup_embedding_mult, m.embedding_mult,
          python_float(m.embedding_mult));
    force("mup_output_mult", a.mup_output_mult, m.output_mult, python_float(m.output_mult));
    force("mup_base_head_dim", a.mup_base_head_dim, m.base_head_dim,
          m.base_head_dim ? python_float(*m.base_head_dim) : std::string("None"));
    force("mup_attn_scale_power", a.mup_attn_scale_power, m.attn_scale_power,
          python_float(m.attn_scale_power));
  }
  // Multi-latent attention: its switch, shape and RoPE, forced like the switches.
  force("multi_latent_attention", a.multi_latent_attention, c.mla.on, py(c.mla.on));
  if (c.mla.on) {
    const auto& m = c.mla;
    const std::optional<int64_t> rq =
        m.q_lora_rank > 0 ? std::optional<int64_t>(m.q_lora_rank) : std::nullopt;
    force("q_lora_rank", a.q_lora_rank, rq, rq ? std::to_string(*rq) : "None");
    for (auto [dest, field, v] : {std::tuple{"kv_lora_rank", &a.kv_lora_rank, m.kv_lora_rank},
                                  std::tuple{"qk_head_dim", &a.qk_head_dim, m.qk_head_dim},
                                  std::tuple{"qk_pos_emb_head_dim", &a.qk_pos_emb_head_dim,
                                             m.qk_pos_emb_head_dim},
                                  std::tuple{"v_head_dim", &a.v_head_dim, m.v_head_dim}})
      force(dest, *field, v, std::to_string(v));
    const std::optional<std::string> rt = std::string(m.yarn ? "yarn" : "rope");
    force("rope_type", a.rope_type, rt, *rt);
    force("rotary_scaling_factor", a.rotary_scaling_factor, m.rotary_scaling_factor,
          python_float(m.rotary_scaling_factor));
    force("mscale", a.mscale, m.mscale, python_float(m.mscale));
    force("mscale_all_dim", a.mscale_all_dim, m.mscale_all_dim, python_float(m.mscale_all_dim));
  }
  // The q/k norms (standard attention's per-head norms or MLA's latent norms; the weightless
  // --qk-l2-norm), forced like the switches.
  force("qk_layernorm", a.qk_layernorm, c.qk_layernorm, py(c.qk_layernorm));
  force("qk_l2_norm", a.qk_l2_norm, c.qk_l2_norm, py(c.qk_l2_norm));
  const std::string norm = c.rmsnorm ? "RMSNorm" : "LayerNorm";
  force("normalization", a.normalization, norm, norm);
  force("layernorm_epsilon", a.layernorm_epsilon, c.norm_epsilon, python_float(c.norm_epsilon));
  force("swiglu", a.swiglu, c.swiglu, py(c.swiglu));
  force("squared_relu", a.squared_relu, c.squared_relu, py(c.squared_relu));
  force("quick_geglu", a.quick_geglu, c.quick_geglu, py(c.quick_geglu));
  force("glu_linear_offset", a.glu_linear_offset, c.glu_linear_offset,
        python_float(c.glu_linear_offset));
  force("activation_func_clamp_value", a.activation_func_clamp_value,
        c.activation_func_clamp_value,
        c.activation_func_clamp_value ? python_float(*c.activation_func_clamp_value) : "None");
  const std::string softmax = model::softmax_type_name(c.softmax_type);
  force("softmax_type", a.softmax_type, softmax, softmax);
  force("untie_embeddings_and_output_weights", a.untie_embeddings_and_output_weights,
        !c.tie_embeddings, py(!c.tie_embeddings));
  force("add_bias_linear", a.add_bias_linear, c.add_bias_linear, py(c.add_bias_linear));
  force("add_qkv_bias", a.add_qkv_bias, c.qkv_bias(), py(c.qkv_bias()));
  // GELU's form (gelu_is_exact): exact, the fused tanh form (biases), or --openai-gelu's.
  if (!c.swiglu && !c.squared_relu && !c.quick_geglu) {
    const bool openai = !c.gelu_erf && !c.add_bias_linear;
    if (c.gelu_erf || c.add_bias_linear)
      force("bias_gelu_fusion", a.bias_gelu_fusion, !c.gelu_erf, py(!c.gelu_erf));
    force("openai_gelu", a.openai_gelu, openai, py(openai));
  }
  force("layernorm_zero_centered_gamma", a.layernorm_zero_centered_gamma, c.zero_centered_gamma,
        py(c.zero_centered_gamma));
  force("hidden_dropout", a.hidden_dropout, c.hidden_dropout, python_float(c.hidden_dropout));
  force("attention_dropout", a.attention_dropout, c.attention_dropout,
        python_float(c.attention_dropout));
  // Mixture of experts: Megatron's forced MoE arguments (the experts, their layers and width,
  // the router's top-k, scores, pre-softmax, scaling and expert bias, the shared expert), and
  // the shared expert's gate, which the checkpoint's parameters also depend on. Only from a
  // MoE checkpoint: a dense one leaves the command line's (--moe-use-upcycling starts a MoE
  // model from it).
  if (c.moe.num_experts > 0) {
    const auto& m = c.moe;
    force("num_experts", a.num_experts, std::optional<int64_t>(m.num_experts),
          std::to_string(m.num_experts));
    std::string freq = "[";
    for (int64_t l = 0; l < c.num_layers; ++l)
      freq += fmt::format("{}{}", l ? ", " : "", c.is_moe_layer(l) ? 1 : 0);
    freq += "]";
    force("moe_layer_freq", a.moe_layer_freq, freq, freq);
    force("moe_ffn_hidden_size", a.moe_ffn_hidden_size, std::optional<int64_t>(m.ffn_hidden_size),
          std::to_string(m.ffn_hidden_size));
    force("moe_router_topk", a.moe_router_topk, m.topk, std::to_string(m.topk));
    force("moe_router_pre_softmax", a.moe_router_pre_softmax, m.pre_softmax, py(m.pre_softmax));
    const std::optional<int64_t> shared =
        m.shared_ffn_hidden_size > 0 ? std::optional<int64_t>(m.shared_ffn_hidden_size)
                                     : std::nullopt;
    force("moe_shared_expert_intermediate_size", a.moe_shared_expert_intermediate_size, shared,
          shared ? std::to_string(*shared) : "None");
    force("moe_shared_expert_gate", a.moe_shared_expert_gate, m.shared_expert_gate,
          py(m.shared_expert_gate));
    const std::string score = m.score == model::TransformerConfig::Moe::Score::Sigmoid ? "sigmoid"
                              : m.score == model::TransformerConfig::Moe::Score::SqrtSoftplus
                                  ? "sqrtsoftplus"
                                  : "softmax";
    force("moe_router_score_function", a.moe_router_score_function, score, score);
    force("moe_router_enable_expert_bias", a.moe_router_enable_expert_bias, m.expert_bias,
          py(m.expert_bias));
    const std::optional<double> scaling =
        m.topk_scaling_factor != 0 ? std::optional<double>(m.topk_scaling_factor) : std::nullopt;
    force("moe_router_topk_scaling_factor", a.moe_router_topk_scaling_factor, scaling,
          scaling ? python_float(*scaling) : "None");
    force("moe_apply_probs_on_input", a.moe_apply_probs_on_input, m.apply_probs_on_input,
          py(m.apply_probs_on_input));
  }
  log::info("--use-checkpoint-args: {} model arguments from {}", taken, dir);
}

std::optional<checkpoint::TokenizerFiles> apply_checkpoint_tokenizer(
    Args& a, const std::optional<LoadSource>& src) {
  if (!src) return std::nullopt;
  for (const char* d : {"tokenizer_type", "vocab_file", "merge_file", "tokenizer_model"})
    if (a.was_given(d)) return std::nullopt;  // flags override what the checkpoint carries
  if (checkpoint::megatron::holds_legacy_checkpoint(src->dir, a.ckpt_step))
    return std::nullopt;  // Megatron's legacy layout carries no tokenizer files
  if (!a.ckpt_step && !checkpoint::latest_iteration(src->dir)) return std::nullopt;
  const auto md = checkpoint::read_metadata(src->dir, a.ckpt_step);
  auto t = checkpoint::checkpoint_tokenizer(md.value("__iter_dir", src->dir), md);
  if (!t) return std::nullopt;
  a.tokenizer_type = t->type, a.given["tokenizer_type"] = t->type;
  auto set = [&](const char* dest, std::optional<std::string>& field, const std::string& v) {
    if (v.empty()) return;
    field = v, a.given[dest] = v;
  };
  set("vocab_file", a.vocab_file, t->vocab_file);
  set("merge_file", a.merge_file, t->merge_file);
  set("tokenizer_model", a.tokenizer_model, t->tokenizer_model);
  log::info("using the {} files the checkpoint in {} carries (tokenizer flags override them)",
            t->type, src->dir);
  return t;
}

}  // namespace mcpp::training
