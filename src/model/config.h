// TransformerConfig: the model's shape and numerics, as Megatron-Core's
// TransformerConfig, with the local (per TP rank) sizes derived in one place.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/fp8/fp8_config.h"
#include "ops/types.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace mcpp::model {

struct TransformerConfig {
  // Shape (global).
  int64_t num_layers = 0;
  int64_t hidden_size = 0;               // H
  int64_t ffn_hidden_size = 0;           // F
  int64_t num_attention_heads = 0;       // NH
  int64_t num_query_groups = 0;          // NG (= NH without GQA)
  int64_t kv_channels = 0;               // HD
  int64_t seq_length = 0;                // S
  int64_t max_position_embeddings = 0;
  int64_t padded_vocab_size = 0;         // Vp
  // Architecture switches (Megatron flag in brackets).
  bool rope = false;                     // --position-embedding-type rope (or yarn)
  // --position-embedding-type none: neither a learned table nor RoPE (NoPE); the causal mask
  // alone orders the tokens.
  bool no_positions = false;
  // The learned position table (--position-embedding-type learned_absolute, Megatron's
  // default): the embedding adds row p to the token at position p.
  bool learned_positions() const { return !rope && !no_positions; }
  // --rotary-interleaved: RoPE on pairs (2i, 2i + 1) (ops/rope_interleave.h: the query and
  // key heads permuted once, then the rotate-half RoPE).
  bool rotary_interleaved = false;
  // Sliding-window attention (--window-size L,0 and --window-attn-skip-freq): in a window
  // layer the query at global position q sees the keys in [q - window_left, q] (and of its
  // document, --reset-attention-mask). window_left -1: no window layer. window_pattern: per
  // global layer (0-based) 1 for a window layer; empty with a window: every layer.
  // Multi-token prediction depth k slides as decoder layer k does: Megatron builds its
  // transformer layer with layer number k + 1, which its window rule reads as the decoder's
  // (validate() asks for at most num_layers depths with a window).
  int64_t window_left = -1;
  std::vector<int64_t> window_pattern;
  // --no-rope-freq: per global layer (0-based) 1 for a layer without RoPE (NoPE, Llama 4,
  // SmolLM3); empty: every layer has it. MTP depth k as decoder layer k (as the window).
  std::vector<int64_t> no_rope_pattern;
  bool layer_rope(int64_t layer) const {
    if (is_mtp_layer(layer)) layer -= kMtpLayerBase;
    return rope && (no_rope_pattern.empty() || no_rope_pattern.at(size_t(layer)) == 0);
  }
  bool is_window_layer(int64_t layer) const {
    if (is_mtp_layer(layer)) layer -= kMtpLayerBase;
    return window_left >= 0 &&
           (window_pattern.empty() || window_pattern.at(size_t(layer)) == 1);
  }
  int64_t num_window_layers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_layers && window_left >= 0; ++l) n += is_window_layer(l);
    return n;
  }
  bool has_window_layers() const { return num_window_layers() > 0; }
  double rotary_base = 10000;            // --rotary-base
  double rotary_percent = 1.0;           // --rotary-percent
  // Llama 3.x RoPE scaling (ops::rope_inv_freq): low frequencies divided by the factor,
  // high ones kept, a smooth blend between. Megatron's flags set the switch and the factor
  // and fix the other three at these values; a Hugging Face config.json may give its own.
  bool rope_scaling = false;                   // --use-rope-scaling
  double rope_scaling_factor = 8.0;            // --rope-scaling-factor
  double rope_low_freq_factor = 1.0;           // HF low_freq_factor
  double rope_high_freq_factor = 4.0;          // HF high_freq_factor
  int64_t rope_original_max_positions = 8192;  // HF original_max_position_embeddings
  // Linear position interpolation (Megatron's RotaryEmbedding seq_len_interpolation_factor):
  // position p rotates as p / factor did, after any Llama 3.x scaling; 1 = off. A double,
  // as Megatron's RotaryEmbedding takes it: the flag gives an integer, a Hugging Face
  // rope_type "linear" any positive factor (e.g. 2.5).
  double seq_len_interpolation_factor = 1.0;  // --rotary-seq-len-interpolation-factor
  // YaRN (--position-embedding-type yarn; Megatron's YarnRotaryEmbedding of a GPT model,
  // ops::yarn_inv_freq): the frequencies blended between interpolation and extrapolation over
  // the whole head (rot_dim = kv_channels), cos and sin times the concentration factor. With
  // it `rope` is on; Llama 3.x scaling and position interpolation are off.
  struct Yarn {
    bool on = false;
    double factor = 1;                      // --rotary-scaling-factor
    int64_t original_max_positions = 4096;  // --yarn-original-max-position-embeddings
    double beta_fast = 32, beta_slow = 1;   // --yarn-beta-fast, --yarn-beta-slow
    bool round_to_int = true;               // --[no-]yarn-correction-range-round-to-int
    double mscale = 1, mscale_all_dim = 0;  // --mscale, --mscale-all-dim
    bool operator==(const Yarn&) const = default;
  } yarn;
  bool rmsnorm = false;                  // --normalization RMSNorm
  double norm_epsilon = 1e-5;            // --norm-epsilon
  bool zero_centered_gamma = false;      // --apply-layernorm-1p: norm weight stored as w - 1
  bool swiglu = false;                   // --swiglu
  bool squared_relu = false;             // --squared-relu: relu(x)^2, not gated (activation())
  // GELU (none of the other switches): the exact x Phi(x) (torch's F.gelu) where Megatron's MLP
  // runs without the bias_gelu fusion (--no-bias-gelu-fusion or --disable-bias-linear, and not
  // --openai-gelu); false: the tanh form of the fusion.
  bool gelu_erf = false;
  // --quick-geglu (gpt-oss): quick_gelu(g) (u + offset), quick_gelu(g) = g sigmoid(1.702 g),
  // gated as SwiGLU (fc1 [gate; up]).
  bool quick_geglu = false;
  // The gated units' --glu-linear-offset and --activation-func-clamp-value (ops::GluParams;
  // Megatron's glu_linear_offset and activation_func_clamp_value): the up half plus the
  // offset, the gate clamped to at most C and the up half to [-C, C] before the activation.
  double glu_linear_offset = 0;
  std::optional<double> activation_func_clamp_value;
  // --qk-layernorm: per-head q/k norms of the form `rmsnorm` gives (as Megatron builds them
  // from --normalization): RMSNorm (ops::qk_norm_*) or LayerNorm with a bias
  // (ops::qk_layernorm_*); under MLA the latents' norms (RMSNorm only)
  bool qk_layernorm = false;
  bool qk_layernorm_weight_decay = false;  // --apply-wd-to-qk-layernorm (an optimizer setting)
  // --softmax-type: attention sinks, one more logit a head in every softmax row, with no
  // value (ops::attention_sink_forward): off-by-one a fixed 0, learnable the parameter
  // self_attention.core_attention.softmax_offset [NH] (split over TP by heads).
  enum class SoftmaxType { Vanilla, OffByOne, Learnable } softmax_type = SoftmaxType::Vanilla;
  bool attention_sink() const { return softmax_type != SoftmaxType::Vanilla; }
  // ---- multi-latent attention (--multi-latent-attention; model/mla_attention.h). On, the
  // attention core sees NH heads of Dq = qk_head_dim + qk_pos_emb_head_dim for queries and
  // keys and values padded to Dq: model_config sets num_query_groups = NH and kv_channels =
  // Dq, so every consumer of the core's shape (CP, the KV cache, the backends) reads them.
  struct Mla {
    bool on = false;
    int64_t q_lora_rank = 0;            // --q-lora-rank (0: linear_q_proj, no query latent)
    int64_t kv_lora_rank = 32;          // --kv-lora-rank
    int64_t qk_head_dim = 128;          // --qk-head-dim (Dn)
    int64_t qk_pos_emb_head_dim = 64;   // --qk-pos-emb-head-dim (Dr)
    int64_t v_head_dim = 128;           // --v-head-dim (Dv)
    bool yarn = true;                   // --rope-type yarn (MLA's default) | rope
    double rotary_scaling_factor = 1;   // --rotary-scaling-factor
    double mscale = 1, mscale_all_dim = 0;  // --mscale, --mscale-all-dim
    // MLATransformerConfig's fixed YaRN settings (no flags set them for MLA).
    int64_t original_max_positions = 4096;
    double beta_fast = 32, beta_slow = 1;
    int64_t q_head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }
  } mla;
  bool tie_embeddings = true;            // !--untie-embeddings-and-output-weights
  bool add_bias_linear = true;           // !--disable-bias-linear
  bool add_qkv_bias = false;             // --add-qkv-bias: linear_qkv's bias alone (qkv_bias())
  // --qk-l2-norm: each query and key head RMS-normalised without a weight (Megatron's
  // L2Norm, eps --norm-epsilon), where --qk-layernorm's norms would be (before RoPE).
  bool qk_l2_norm = false;
  double hidden_dropout = 0.1;           // --hidden-dropout
  double attention_dropout = 0.1;        // --attention-dropout
  double init_method_std = 0.02;         // --init-method-std
  // --embedding-init-method-std: the word and position embeddings' std (unset: the above;
  // a different value keeps them normal under --init-method-xavier-uniform, as Megatron).
  std::optional<double> embedding_init_method_std;
  double embedding_init_std() const {
    return embedding_init_method_std.value_or(init_method_std);
  }
  bool init_method_xavier_uniform = false;  // --init-method-xavier-uniform (Init::XavierUniform)
  // --use-mup (Megatron's maximal update parameterisation; docs/model.md "muP"). width_mult =
  // hidden / --mup-base-hidden-size. Initialisation: every normal weight's std divided by
  // sqrt(width_mult) but the embeddings' (and, untied, the output layer's: the embedding
  // std); the embedding output times embedding_mult; the logits times output_mult (given,
  // or 1 / width_mult when left at 1); the attention's softmax scale sqrt(base_head_dim or 1)
  // / kv_channels^attn_scale_power (not under MLA, whose scale is its own, as in Megatron);
  // the optimizer's per-parameter learning rates and Adam's epsilon (optim/optimizer.h).
  struct Mup {
    bool on = false;
    int64_t base_hidden_size = 0;  // --mup-base-hidden-size (default: hidden_size)
    double width_mult = 1.0, embedding_mult = 1.0, output_mult = 1.0;
    std::optional<double> base_head_dim;
    double attn_scale_power = 1.0;
  } mup;
  // --no-initialization (Megatron's perform_initialization = False): the parameters start
  // at zero instead of being drawn, for a run whose checkpoint replaces them anyway.
  bool perform_initialization = true;
  uint64_t seed = 1234;                  // --seed
  // Where the model runs and in which dtype its parameters and activations live:
  // CPU f32 | f64 (the reference); CUDA bf16 (--bf16) | f16 (--fp16) | f32. Gradients,
  // per-row statistics (norm mean/rstd, attention lse, CE max/sum) and the loss mask
  // are f32 on CUDA (mixed precision as Megatron: fp32 main grads), `dtype` on CPU.
  Device device = Device::CPU;
  DType dtype = DType::F32;
  // Tensor parallelism (local sizes divide by tp_size).
  int64_t tp_size = 1;
  int64_t tp_rank = 0;
  // --sequence-parallel (meaningful only with tp_size > 1): norms, dropout and residuals
  // on [S/TP, B, H]; the model needs the TP communicator then.
  bool sequence_parallel = false;
  // Activation recomputation (Megatron's --recompute-granularity, --recompute-method,
  // --recompute-num-layers); see GPTModel.
  enum class Recompute : uint8_t { None, Full, Selective };
  enum class RecomputeMethod : uint8_t { Uniform, Block };
  Recompute recompute = Recompute::None;
  // Selective recomputation's modules (--recompute-modules): the attention core's output
  // and lse (core_attn, Megatron's default), and the two norms' outputs (layernorm: only
  // the residual stream and each norm's rstd are kept; backward re-runs the norm forward
  // into a shared workspace buffer before the GEMMs that read it), and the MoE layers' shared
  // experts (shared_experts: only their input is kept; backward re-runs their fc1 into
  // scratch), and the dense MLPs (mlp: the same for every dense layer's fc1, whose output
  // is a layer's largest activation), and the MoE layers whole (moe: each keeps nothing of
  // its own; backward re-runs its forward -- router, dispatch, experts -- into one buffer
  // set shared by all of them, then its backward). Read only when recompute is Selective;
  // Megatron's default modules are core_attn alone.
  bool recompute_core_attn = true, recompute_norms = false, recompute_shared_experts = false;
  bool recompute_mlp = false, recompute_moe = false;
  // --recompute-modules mla_up_proj: MLA layers keep their latents, not the up projections'
  // packed q/k/v (model/mla_attention.h).
  bool recompute_mla_up_proj = false;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int64_t recompute_num_layers = 1;
  // --keep-mlp-activations N (megatron.cpp's own): the first N layers of each model chunk
  // that full recomputation does not re-run keep their MLP activation (gelu/swiglu of
  // fc1, [T, F/TP]) for backward instead of recomputing it from fc1's output; every such
  // layer when N is at least the chunk's layer count. 0: none (see GPTModel).
  int64_t keep_mlp_activations = 0;
  // Element alignment of every parameter in the flat parameter/gradient buffers (16:
  // cache lines). The distributed optimizer asks for a multiple of the DP size so that
  // every bucket splits into equal DP shards.
  int64_t param_align = 16;
  // ---- FP8 (docs/fp8.md): the transformer layers' GEMMs in FP8 (off by default).
  Fp8Config fp8;

  // ---- mixture of experts (docs/moe.md; Megatron flag in brackets). num_experts 0: dense.
  struct Moe {
    int64_t num_experts = 0;                 // --num-experts (E)
    std::vector<int64_t> layer_pattern;      // --moe-layer-freq: 1 = MoE layer, per layer
    int64_t ffn_hidden_size = 0;             // --moe-ffn-hidden-size (I)
    int64_t topk = 2;                        // --moe-router-topk (k)
    // --moe-router-score-function: softmax, sigmoid, or sqrt(softplus) (sqrtsoftplus), which
    // routes exactly as sigmoid does (routing.h). Stored in checkpoint metadata by name.
    enum class Score : uint8_t { Softmax, Sigmoid, SqrtSoftplus };
    Score score = Score::Softmax;
    bool pre_softmax = false;                // --moe-router-pre-softmax
    double topk_scaling_factor = 0;          // --moe-router-topk-scaling-factor (0: none)
    int64_t num_groups = 0, group_topk = 0;  // --moe-router-num-groups / -group-topk
    bool expert_bias = false;                // --moe-router-enable-expert-bias
    double bias_update_rate = 1e-3;          // --moe-router-bias-update-rate
    // Megatron's benchmark modes (router.h): --moe-router-force-load-balancing replaces the
    // logits by random normals; --moe-router-force-biased (given: force_biased_given) too,
    // plus a random bias N(0, |force_biased|) per expert, new for each micro-batch (> 0) or
    // drawn once per layer (< 0). Run-time settings, not in checkpoint metadata.
    bool force_load_balancing = false;
    bool force_biased_given = false;
    double force_biased = 0;
    // --moe-input-jitter-eps (Switch Transformer's jitter, Megatron's apply_input_jitter):
    // the router's input times a random factor in [1 - eps, 1 + eps) per element; 0: off.
    // Run-time, not in checkpoint metadata.
    double input_jitter_eps = 0;
    DType router_dtype = DType::F32;         // --moe-router-dtype (else the model's dtype)
    bool router_dtype_given = false;
    // --moe-router-load-balancing-type, paired with --moe-aux-loss-coeff (Megatron's lists of
    // one length): every listed aux loss with a positive coefficient applies (routing.h).
    // Sinkhorn: S-BASE routing (routing.h), no aux loss, alone in its list. Stored in
    // checkpoint metadata as numbers: append only.
    enum class Balance : uint8_t { None, AuxLoss, SeqAuxLoss, Sinkhorn, GlobalAuxLoss };
    std::vector<Balance> balance = {Balance::AuxLoss};
    std::vector<double> aux_loss_coeff = {0.0};
    double z_loss_coeff = 0;                 // --moe-z-loss-coeff
    double capacity_factor = 0;              // --moe-expert-capacity-factor (0: dropless)
    bool pad_to_capacity = false;            // --moe-pad-expert-input-to-capacity
    bool drop_by_position = false;           // --moe-token-drop-policy position
    int64_t pad_multiple = 0;                // --moe-router-padding-for-fp8: 16 (routing.h)
    int64_t shared_ffn_hidden_size = 0;      // --moe-shared-expert-intermediate-size
    bool shared_expert_gate = false;         // --moe-shared-expert-gate
    bool shared_expert_overlap = false;      // --moe-shared-expert-overlap
    // --moe-apply-probs-on-input (top-1): the experts' input rows scaled by their probability
    // before fc1 instead of the activation after it (experts.h); in checkpoint metadata.
    bool apply_probs_on_input = false;
    // Expert parallelism: this rank holds experts [ep_rank*El, (ep_rank+1)*El), El = E/ep_size
    // (--expert-model-parallel-size; the layout's, never in checkpoint metadata).
    int64_t ep_size = 1, ep_rank = 0;
    bool alltoall = false;  // --moe-token-dispatcher-type alltoall (else allgather)
    // Expert tensor parallelism when it differs from TP (--expert-tensor-parallel-size 1 at
    // TP > 1: whole experts on every rank, ETP rank 0); 0: ETP = TP, the expert shards follow
    // the TP rank.
    int64_t etp_size = 0, etp_rank = 0;
    // Sigmoid and sqrtsoftplus: each expert's score a function of its own logit, chosen with
    // the expert bias, renormalised over the top k (Megatron treats the two alike).
    bool sigmoid_like() const { return score != Score::Softmax; }
    // Megatron's get_aux_loss_coeff: the coefficient paired with type b, 0 when not listed.
    double coeff(Balance b) const {
      for (size_t i = 0; i < balance.size() && i < aux_loss_coeff.size(); ++i)
        if (balance[i] == b) return aux_loss_coeff[i];
      return 0.0;
    }
    bool sinkhorn() const { return balance.size() == 1 && balance[0] == Balance::Sinkhorn; }
    // An aux loss (aux_loss, seq_aux_loss or global_aux_loss with a positive coefficient).
    bool aux_loss_on() const {
      return coeff(Balance::AuxLoss) > 0 || coeff(Balance::SeqAuxLoss) > 0 ||
             coeff(Balance::GlobalAuxLoss) > 0;
    }
    int64_t local_experts() const { return num_experts / ep_size; }
    int64_t first_expert() const { return ep_rank * local_experts(); }
  } moe;
  // ---- multi-token prediction (--mtp-num-layers; model/mtp.h): D MTP layers after the
  // decoder on the last stage. Depth k's transformer layer has the layer id kMtpLayerBase + k
  // (its parameters are mtp.layers.k.mtp_model_layer.*, its dropout streams its own) and is
  // a MoE layer when the decoder's last layer is (Megatron builds it from that layer's spec).
  int64_t mtp_num_layers = 0;            // --mtp-num-layers (0: none)
  double mtp_loss_scaling_factor = 0.1;  // --mtp-loss-scaling-factor
  static constexpr int kMtpLayerBase = 1 << 16;
  static_assert(kMtpLayerBase == Fp8Config::kMtpLayerBase, "one MTP layer base");
  static bool is_mtp_layer(int64_t layer) { return layer >= kMtpLayerBase; }
  bool is_moe_layer(int64_t layer) const {
    if (is_mtp_layer(layer)) layer = num_layers - 1;
    return moe.num_experts > 0 &&
           (moe.layer_pattern.empty() || moe.layer_pattern.at(size_t(layer)) == 1);
  }
  int64_t moe_etp() const { return moe.etp_size > 0 ? moe.etp_size : tp_size; }
  int64_t moe_etp_rank() const { return moe.etp_size > 0 ? moe.etp_rank : tp_rank; }
  int64_t moe_ffn_local() const { return moe.ffn_hidden_size / moe_etp(); }
  int64_t moe_fc1_width_local() const { return (gated_linear_unit() ? 2 : 1) * moe_ffn_local(); }

  // Megatron's gated_linear_unit: fc1 is [gate; up] (SwiGLU, quick-GEGLU), twice as wide.
  bool gated_linear_unit() const { return swiglu || quick_geglu; }
  // The MLP's (and every expert's) activation: Megatron's activation_func from the switches
  // (two at once is refused by validate()), with the gated units' offset and clamp.
  ops::MlpAct activation() const {
    ops::GluParams g;
    g.offset = glu_linear_offset;
    if (activation_func_clamp_value) g.clamp = *activation_func_clamp_value;
    return swiglu         ? ops::MlpAct(ops::MlpActivation::Swiglu, g)
           : quick_geglu  ? ops::MlpAct(ops::MlpActivation::QuickGeglu, g)
           : squared_relu ? ops::MlpAct(ops::MlpActivation::SquaredRelu)
           : gelu_erf     ? ops::MlpAct(ops::MlpActivation::GeluErf)
                          : ops::MlpAct(ops::MlpActivation::Gelu);
  }
  // SwiGLU without offset and clamp: the plain swiglu ops and their fused GEMM, decode and FP8
  // forms apply (the other gated units take glu_forward / glu_backward after the GEMM).
  bool plain_swiglu() const { return activation().plain_swiglu(); }

  // Megatron's SelfAttention: linear_qkv has a bias with add_bias_linear or add_qkv_bias.
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  int64_t heads_per_group() const { return num_attention_heads / num_query_groups; }
  int64_t local_heads() const { return num_attention_heads / tp_size; }
  int64_t local_groups() const { return num_query_groups / tp_size; }
  int64_t qkv_width_local() const { return local_groups() * (heads_per_group() + 2) * kv_channels; }
  int64_t qkv_width() const { return num_query_groups * (heads_per_group() + 2) * kv_channels; }
  int64_t ffn_local() const { return ffn_hidden_size / tp_size; }
  int64_t fc1_width_local() const { return (gated_linear_unit() ? 2 : 1) * ffn_local(); }
  int64_t vocab_local() const { return padded_vocab_size / tp_size; }
  bool sp() const { return sequence_parallel && tp_size > 1; }
  // This rank's rows of the sequence: divided by CP (two chunks), then by TP under SP.
  int64_t seq_local() const { return sp() ? seq_cp() / tp_size : seq_cp(); }
  int64_t rot_dim() const { return int64_t(double(kv_channels) * rotary_percent); }
  DType grad_dtype() const { return device == Device::CUDA ? DType::F32 : dtype; }
  DType stat_dtype() const { return grad_dtype(); }

  // ---- context parallel (parallel/context_parallel/; docs/context-parallel.md)
  // The sequence in 2*cp_size chunks, rank r holding chunks r and 2*cp_size-1-r; each
  // layer's attention exchanges keys and values over the CP group as cp_comm says.
  // A2AP2P: --hierarchical-context-parallel-sizes' all-to-all inside groups, ring between.
  enum class CpComm : uint8_t { P2P, A2A, AllGather, A2AP2P };
  int64_t cp_size = 1;
  int64_t cp_rank = 0;
  std::vector<CpComm> cp_comm;  // per layer; empty: P2P everywhere
  int64_t seq_cp() const { return seq_length / cp_size; }  // this CP rank's tokens
  CpComm cp_comm_of(int layer) const {
    if (is_mtp_layer(layer)) layer = int(num_layers) - 1;  // built like the last layer
    return layer >= 0 && size_t(layer) < cp_comm.size() ? cp_comm[size_t(layer)] : CpComm::P2P;
  }

  // The attention core's softmax scale: 1/sqrt(kv_channels); under MLA Megatron's
  // yarn_get_mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(Dq), whatever the rope type.
  double softmax_scale() const;

  // Structural checks; user-facing flag validation happens in training/arguments.
  void validate() const;
  void check_activation() const;  // the activation's part of validate()
};

// --softmax-type's values (vanilla, off-by-one, learnable) and back; an unknown name is an
// error naming the flag.
TransformerConfig::SoftmaxType softmax_type_of(const std::string& name);
const char* softmax_type_name(TransformerConfig::SoftmaxType t);

}  // namespace mcpp::model
