#include "model/config.h"

#include <cmath>

#include "ops/mla.h"

namespace mcpp::model {

double TransformerConfig::softmax_scale() const {
  if (!mla.on && mup.on)  // Megatron's muP attention: 1/d_head (power 1) at the base head dim
    return std::sqrt(mup.base_head_dim.value_or(1.0)) /
           std::pow(double(kv_channels), mup.attn_scale_power);
  if (!mla.on) return 1.0 / std::sqrt(double(kv_channels));
  const double m = ops::yarn_get_mscale(mla.rotary_scaling_factor, mla.mscale_all_dim);
  return m * m / std::sqrt(double(mla.q_head_dim()));
}

TransformerConfig::SoftmaxType softmax_type_of(const std::string& name) {
  using T = TransformerConfig::SoftmaxType;
  if (name == "vanilla") return T::Vanilla;
  if (name == "off-by-one") return T::OffByOne;
  MCPP_CHECK_HINT(name == "learnable", "use vanilla, off-by-one or learnable",
                  "--softmax-type '{}' is not one of Megatron-LM's softmax types", name);
  return T::Learnable;
}

const char* softmax_type_name(TransformerConfig::SoftmaxType t) {
  using T = TransformerConfig::SoftmaxType;
  return t == T::Vanilla ? "vanilla" : t == T::OffByOne ? "off-by-one" : "learnable";
}

// The MLP's activation (Megatron's core_transformer_config_from_args and
// TransformerConfig.__post_init__): one switch; the gated units' offset and clamp where they
// change the function (training/validate_activation.cpp adds the flag-level rules).
void TransformerConfig::check_activation() const {
  MCPP_CHECK_HINT(!(quick_geglu && (swiglu || squared_relu)),
                  "give one of --quick-geglu, --swiglu and --squared-relu",
                  "--quick-geglu and --{} both set the MLP's activation (Megatron-LM asserts "
                  "against --swiglu, and --squared-relu silently wins over --quick-geglu there)",
                  swiglu ? "swiglu" : "squared-relu");
  MCPP_CHECK(!gelu_erf || !(swiglu || squared_relu || quick_geglu),
             "TransformerConfig: gelu_erf (the exact GELU) set for a {} MLP",
             swiglu ? "SwiGLU" : squared_relu ? "squared-ReLU" : "quick-GEGLU");
  const bool clamp = activation_func_clamp_value.has_value();
  const double C = activation_func_clamp_value.value_or(0);
  MCPP_CHECK_HINT(!clamp || !std::isnan(C), "give --activation-func-clamp-value a number",
                  "--activation-func-clamp-value is NaN");
  MCPP_CHECK_HINT(std::isfinite(glu_linear_offset), "give --glu-linear-offset a finite number",
                  "--glu-linear-offset {} is not finite", glu_linear_offset);
  MCPP_CHECK_HINT(gated_linear_unit() || (glu_linear_offset == 0 && !clamp),
                  "use --quick-geglu or --swiglu, or drop the flag",
                  "{} acts on a gated MLP only (Megatron-LM's glu()); with {} it would change "
                  "nothing",
                  glu_linear_offset != 0 ? "--glu-linear-offset" : "--activation-func-clamp-value",
                  squared_relu ? "--squared-relu" : "GELU");
  if (swiglu && clamp) {  // Megatron's clamped SwiGLU: MoE only, no offset
    MCPP_CHECK_HINT(std::isfinite(C) && C > 0, "give --activation-func-clamp-value C > 0",
                    "--activation-func-clamp-value {} for SwiGLU must be finite and greater "
                    "than zero (as Megatron-LM requires)",
                    C);
    MCPP_CHECK_HINT(moe.num_experts > 0, "add --num-experts, or drop --activation-func-clamp-value",
                    "--activation-func-clamp-value with --swiglu is only supported with MoE "
                    "(as in Megatron-LM)");
    MCPP_CHECK_HINT(glu_linear_offset == 0, "drop --glu-linear-offset with a clamped SwiGLU",
                    "--glu-linear-offset {} must be zero when --activation-func-clamp-value is "
                    "set for SwiGLU (as in Megatron-LM)",
                    glu_linear_offset);
  }
}

void TransformerConfig::validate() const {
  MCPP_CHECK(mtp_num_layers >= 0 && (mtp_num_layers == 0 || rope),
             "multi-token prediction: {} layers with {} positions (it needs RoPE)",
             mtp_num_layers, rope ? "rotary" : "learned");
  MCPP_CHECK(num_layers > 0 && hidden_size > 0 && num_attention_heads > 0 && kv_channels > 0,
             "model shape must be positive (layers {}, hidden {}, heads {}, kv_channels {})",
             num_layers, hidden_size, num_attention_heads, kv_channels);
  MCPP_CHECK(num_query_groups > 0 && num_attention_heads % num_query_groups == 0,
             "--num-attention-heads {} is not divisible by --num-query-groups {}",
             num_attention_heads, num_query_groups);
  MCPP_CHECK(num_query_groups % tp_size == 0 && num_attention_heads % tp_size == 0,
             "heads {} / query groups {} not divisible by --tensor-model-parallel-size {}",
             num_attention_heads, num_query_groups, tp_size);
  if (mla.on) {  // the structure model_config gives an MLA model (config.h)
    MCPP_CHECK(mla.kv_lora_rank > 0 && mla.qk_head_dim > 0 && mla.qk_pos_emb_head_dim > 0 &&
                   mla.qk_pos_emb_head_dim % 2 == 0 && mla.v_head_dim > 0 &&
                   mla.v_head_dim <= mla.q_head_dim() && mla.q_lora_rank >= 0,
               "multi-latent attention shape: kv_lora_rank {}, qk_head_dim {}, "
               "qk_pos_emb_head_dim {} (even), v_head_dim {} (<= the two before), q_lora_rank {}",
               mla.kv_lora_rank, mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim,
               mla.q_lora_rank);
    MCPP_CHECK(num_query_groups == num_attention_heads && kv_channels == mla.q_head_dim(),
               "multi-latent attention: the core needs {} heads of {} (query groups {}, "
               "kv_channels {})",
               num_attention_heads, mla.q_head_dim(), num_query_groups, kv_channels);
    MCPP_CHECK(rotary_base > 0 && mla.rotary_scaling_factor > 0,
               "multi-latent attention: rotary base {} and scaling factor {} must be positive",
               rotary_base, mla.rotary_scaling_factor);
  }
  MCPP_CHECK_HINT(keep_mlp_activations >= 0, "give --keep-mlp-activations a value >= 0",
                  "--keep-mlp-activations {} must not be negative", keep_mlp_activations);
  // Megatron's core_transformer_config_from_args asserts `not args.swiglu` under
  // --squared-relu: squared ReLU replaces the gated SiLU, it does not gate.
  MCPP_CHECK_HINT(!(swiglu && squared_relu), "give one of --squared-relu and --swiglu",
                  "--squared-relu and --swiglu both set the MLP's activation; Megatron-LM refuses "
                  "them together");
  check_activation();
  MCPP_CHECK(ffn_hidden_size % tp_size == 0, "--ffn-hidden-size {} not divisible by TP {}",
             ffn_hidden_size, tp_size);
  MCPP_CHECK(padded_vocab_size % tp_size == 0, "padded vocab {} not divisible by TP {}",
             padded_vocab_size, tp_size);
  MCPP_CHECK_HINT(!sp() || seq_length % tp_size == 0,
                  "choose --seq-length as a multiple of --tensor-model-parallel-size",
                  "--sequence-parallel splits --seq-length {} into {} equal parts: not divisible",
                  seq_length, tp_size);
  MCPP_CHECK(!(rope && no_positions), "a model with RoPE has positions");
  MCPP_CHECK(seq_length > 0 && (!learned_positions() || seq_length <= max_position_embeddings),
             "--seq-length {} exceeds --max-position-embeddings {}", seq_length,
             max_position_embeddings);
  MCPP_CHECK(!rope || (rot_dim() % 2 == 0 && rot_dim() > 0),
             "rotary dims {} (kv_channels {} x --rotary-percent {}) must be even and positive",
             rot_dim(), kv_channels, rotary_percent);
  if (rope_scaling) {
    MCPP_CHECK_HINT(rope, "add --position-embedding-type rope, or drop --use-rope-scaling",
                    "RoPE scaling is on but the model has no RoPE");
    MCPP_CHECK(std::isfinite(rope_scaling_factor) && rope_scaling_factor > 0,
               "--rope-scaling-factor {} must be a positive number", rope_scaling_factor);
    MCPP_CHECK(std::isfinite(rope_high_freq_factor) && rope_low_freq_factor > 0 &&
                   rope_low_freq_factor < rope_high_freq_factor && rope_original_max_positions > 0,
               "RoPE scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and a "
               "positive original_max_position_embeddings ({})",
               rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions);
  }
  if (seq_len_interpolation_factor != 1.0) {
    MCPP_CHECK_HINT(rope,
                    "add --position-embedding-type rope, or drop "
                    "--rotary-seq-len-interpolation-factor",
                    "RoPE position interpolation (factor {}) is on but the model has no RoPE",
                    seq_len_interpolation_factor);
    MCPP_CHECK(std::isfinite(seq_len_interpolation_factor) && seq_len_interpolation_factor > 0,
               "--rotary-seq-len-interpolation-factor {} must be positive",
               seq_len_interpolation_factor);
  }
  if (yarn.on) {
    MCPP_CHECK(rope, "YaRN is on but the model has no RoPE");
    MCPP_CHECK_HINT(rot_dim() == kv_channels, "drop --rotary-percent with yarn",
                    "YaRN rotates the whole head (kv_channels {}), --rotary-percent {} leaves "
                    "{} dims",
                    kv_channels, rotary_percent, rot_dim());
    MCPP_CHECK_HINT(!rotary_interleaved, "drop --rotary-interleaved with yarn",
                    "YaRN rotates halves, not interleaved pairs (as Megatron asserts)");
    MCPP_CHECK_HINT(!mla.on, "multi-latent attention takes YaRN from --rope-type yarn",
                    "--position-embedding-type yarn with --multi-latent-attention");
    MCPP_CHECK_HINT(!rope_scaling && seq_len_interpolation_factor == 1.0,
                    "drop --use-rope-scaling and --rotary-seq-len-interpolation-factor",
                    "YaRN is a RoPE scaling of its own: Llama 3.x scaling and position "
                    "interpolation do not combine with it");
    MCPP_CHECK(std::isfinite(yarn.mscale) && std::isfinite(yarn.mscale_all_dim),
               "YaRN: --mscale {} / --mscale-all-dim {} must be finite", yarn.mscale,
               yarn.mscale_all_dim);
    ops::RopeFreqs f(rotary_base);
    f.yarn = true, f.factor = yarn.factor, f.original_max_positions = yarn.original_max_positions;
    f.beta_fast = yarn.beta_fast, f.beta_slow = yarn.beta_slow;
    f.mscale = ops::yarn_concentration(yarn.factor, yarn.mscale, yarn.mscale_all_dim);
    ops::check_rope_freqs(f, "YaRN");
  }
  MCPP_CHECK_HINT(window_left >= -1, "give --window-size L,0 with L >= -1",
                  "sliding window: left extent {} must be -1 (none) or >= 0", window_left);
  MCPP_CHECK_HINT(window_left < 0 || mtp_num_layers <= num_layers,
                  "give at most --num-layers multi-token prediction depths with --window-size",
                  "--mtp-num-layers {} with a sliding window: depth k slides as decoder layer k "
                  "(Megatron's layer number k + 1), and there are {} decoder layers",
                  mtp_num_layers, num_layers);
  MCPP_CHECK(window_pattern.empty() || int64_t(window_pattern.size()) == num_layers,
             "--window-attn-skip-freq lists {} layers, the model has {}", window_pattern.size(),
             num_layers);
  if (moe.num_experts > 0) {
    MCPP_CHECK(moe.topk >= 1 && moe.topk <= moe.num_experts, "--moe-router-topk {} outside [1, {}]",
               moe.topk, moe.num_experts);
    MCPP_CHECK(moe.ffn_hidden_size > 0 && moe.ffn_hidden_size % tp_size == 0,
               "--moe-ffn-hidden-size {} not positive or not divisible by TP {}",
               moe.ffn_hidden_size, tp_size);
    MCPP_CHECK(moe.layer_pattern.empty() || int64_t(moe.layer_pattern.size()) == num_layers,
               "--moe-layer-freq lists {} layers, the model has {}", moe.layer_pattern.size(),
               num_layers);
    // Linear biases: the router's and the experts' (Megatron refuses them at ETP > 1, where
    // each ETP rank would add the whole fc2 bias to its partial sum, and in shared experts).
    MCPP_CHECK_HINT(!add_bias_linear || moe_etp() == 1,
                    "add --expert-tensor-parallel-size 1, or --disable-bias-linear",
                    "MoE layers with linear biases at expert tensor parallel size {}: "
                    "Megatron-LM supports biases in MoE at ETP 1 only",
                    moe_etp());
    MCPP_CHECK_HINT(!add_bias_linear || moe.shared_ffn_hidden_size == 0,
                    "add --disable-bias-linear, or drop --moe-shared-expert-intermediate-size",
                    "shared experts with linear biases: Megatron-LM's SharedExpertMLP asserts "
                    "add_bias_linear is False");
    MCPP_CHECK(moe.balance.size() == moe.aux_loss_coeff.size() && !moe.balance.empty(),
               "{} load-balancing types with {} aux-loss coefficients (one each)",
               moe.balance.size(), moe.aux_loss_coeff.size());
  }
  if (device == Device::CPU)
    MCPP_CHECK_HINT(dtype == DType::F32 || dtype == DType::F64,
                    "drop --bf16/--fp16 on the CPU, or train on a GPU",
                    "the CPU model computes in f32 or f64, not {}", dtype_name(dtype));
  else
    MCPP_CHECK_HINT(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32,
                    "use --bf16, --fp16 or neither (f32)",
                    "the CUDA model computes in bf16, f16 or f32, not {}", dtype_name(dtype));
}

}  // namespace mcpp::model
