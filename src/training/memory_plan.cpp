#include "training/memory_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "model/core_attention.h"
#include "ops/attention_backend.h"
#include "ops/types.h"
#include "optim/optimizer.h"
#include "parallel/context_parallel/cp_attention.h"
#include "parallel/pipeline/layout.h"
#include "training/validate_fp8.h"

namespace mcpp::training {

namespace pl = parallel::pipeline;

model::TransformerConfig model_config(const Args& a, Device dev, DType dt) {
  model::TransformerConfig c;
  c.num_layers = a.num_layers, c.hidden_size = a.hidden_size;
  c.ffn_hidden_size = a.ffn_hidden_size, c.num_attention_heads = a.num_attention_heads;
  c.num_query_groups = a.num_query_groups, c.kv_channels = a.kv_channels;
  c.seq_length = a.seq_length, c.max_position_embeddings = a.max_position_embeddings;
  c.padded_vocab_size = *a.padded_vocab_size;
  c.rope = a.position_embedding_type == "rope" || a.position_embedding_type == "yarn";
  c.no_positions = a.position_embedding_type == "none";
  c.softmax_type = model::softmax_type_of(a.softmax_type);  // --softmax-type
  if (a.position_embedding_type == "yarn") {
    auto& y = c.yarn;
    y.on = true, y.factor = a.rotary_scaling_factor;
    y.original_max_positions = a.yarn_original_max_position_embeddings.value_or(4096);
    y.beta_fast = a.yarn_beta_fast.value_or(32), y.beta_slow = a.yarn_beta_slow.value_or(1);
    y.round_to_int = a.yarn_correction_range_round_to_int.value_or(true);
    y.mscale = a.mscale, y.mscale_all_dim = a.mscale_all_dim;
  }
  c.mtp_num_layers = a.mtp_num_layers.value_or(0);
  c.mtp_loss_scaling_factor = a.mtp_loss_scaling_factor;
  c.rotary_interleaved = a.rotary_interleaved;
  c.window_left = a.window_left, c.window_pattern = a.window_layer_pattern;
  c.no_rope_pattern = a.no_rope_pattern;
  c.rotary_base = double(a.rotary_base), c.rotary_percent = a.rotary_percent;
  c.rope_scaling = a.use_rope_scaling, c.rope_scaling_factor = a.rope_scaling_factor;
  c.rope_low_freq_factor = a.rope_low_freq_factor;
  c.rope_high_freq_factor = a.rope_high_freq_factor;
  c.rope_original_max_positions = a.rope_original_max_positions;
  c.seq_len_interpolation_factor = a.rotary_seq_len_interpolation_factor.value_or(1.0);
  c.rmsnorm = a.normalization == "RMSNorm", c.norm_epsilon = a.layernorm_epsilon;
  c.zero_centered_gamma = a.layernorm_zero_centered_gamma;
  c.swiglu = a.swiglu, c.squared_relu = a.squared_relu, c.quick_geglu = a.quick_geglu;
  c.gelu_erf = gelu_is_exact(a);
  c.glu_linear_offset = a.glu_linear_offset;
  c.activation_func_clamp_value = a.activation_func_clamp_value;
  c.tie_embeddings = !a.untie_embeddings_and_output_weights;
  c.qk_layernorm = a.qk_layernorm;  // ---- q/k layernorm
  c.qk_l2_norm = a.qk_l2_norm;
  c.qk_layernorm_weight_decay = a.apply_wd_to_qk_layernorm;
  if (a.multi_latent_attention) {  // ---- MLA: the core's heads are NH of Dq (config.h)
    auto& m = c.mla;
    m.on = true, m.q_lora_rank = a.q_lora_rank.value_or(0), m.kv_lora_rank = a.kv_lora_rank;
    m.qk_head_dim = a.qk_head_dim, m.qk_pos_emb_head_dim = a.qk_pos_emb_head_dim;
    m.v_head_dim = a.v_head_dim, m.yarn = a.rope_type.value_or("yarn") == "yarn";
    m.rotary_scaling_factor = a.rotary_scaling_factor;
    m.mscale = a.mscale, m.mscale_all_dim = a.mscale_all_dim;
    c.num_query_groups = a.num_attention_heads, c.kv_channels = m.q_head_dim();
  }
  c.add_bias_linear = a.add_bias_linear, c.add_qkv_bias = a.add_qkv_bias;
  c.hidden_dropout = a.hidden_dropout, c.attention_dropout = a.attention_dropout;
  c.init_method_std = a.init_method_std, c.seed = uint64_t(a.seed), c.dtype = dt;
  c.embedding_init_method_std = a.embedding_init_method_std;
  c.init_method_xavier_uniform = a.init_method_xavier_uniform;
  if (a.use_mup) {  // muP (validate_mup.cpp derived the width multiplier)
    c.mup.on = true, c.mup.width_mult = a.mup_width_mult;
    c.mup.base_hidden_size = a.mup_base_hidden_size.value_or(a.hidden_size);
    c.mup.embedding_mult = a.mup_embedding_mult;
    // Megatron: the output multiplier left at 1 becomes 1 / width_mult.
    c.mup.output_mult = a.mup_output_mult == 1.0 && a.mup_width_mult != 1.0
                            ? 1.0 / a.mup_width_mult
                            : a.mup_output_mult;
    c.mup.base_head_dim = a.mup_base_head_dim;
    c.mup.attn_scale_power = a.mup_attn_scale_power;
  }
  c.perform_initialization = a.perform_initialization;
  c.device = dev;
  c.tp_size = a.tensor_model_parallel_size, c.tp_rank = 0;
  c.sequence_parallel = a.sequence_parallel;
  c.cp_size = a.context_parallel_size;  // context parallel: per-layer exchange, CP rank's rows
  for (const std::string& t : a.cp_comm_type)
    c.cp_comm.push_back(t == "a2a"          ? model::TransformerConfig::CpComm::A2A
                        : t == "all_gather" ? model::TransformerConfig::CpComm::AllGather
                        : t == "a2a+p2p"    ? model::TransformerConfig::CpComm::A2AP2P
                                            : model::TransformerConfig::CpComm::P2P);
  using RC = model::TransformerConfig::Recompute;
  const std::string gran = a.recompute_granularity.value_or("");
  c.recompute = gran == "full" ? RC::Full : gran == "selective" ? RC::Selective : RC::None;
  if (c.recompute == RC::Selective && !a.recompute_modules.empty()) {  // else Megatron's default
    const auto& m = a.recompute_modules;
    c.recompute_core_attn = std::find(m.begin(), m.end(), "core_attn") != m.end();
    c.recompute_norms = std::find(m.begin(), m.end(), "layernorm") != m.end();
    c.recompute_shared_experts = std::find(m.begin(), m.end(), "shared_experts") != m.end();
    c.recompute_mlp = std::find(m.begin(), m.end(), "mlp") != m.end();
    c.recompute_moe = std::find(m.begin(), m.end(), "moe") != m.end();
    c.recompute_mla_up_proj = std::find(m.begin(), m.end(), "mla_up_proj") != m.end();
  }
  c.recompute_method = a.recompute_method.value_or("uniform") == "block"
                           ? model::TransformerConfig::RecomputeMethod::Block
                           : model::TransformerConfig::RecomputeMethod::Uniform;
  c.recompute_num_layers = a.recompute_num_layers.value_or(1);
  c.keep_mlp_activations = a.keep_mlp_activations;
  c.param_align = param_alignment(a);
  c.fp8 = fp8_config(a);  // ---- FP8 (validate_fp8.cpp)
  if (a.num_experts) {  // ---- mixture of experts (validate_moe filled the derived values)
    auto& m = c.moe;
    m.num_experts = *a.num_experts, m.layer_pattern = a.moe_layer_pattern;
    m.ffn_hidden_size = a.moe_ffn_hidden_size.value_or(a.ffn_hidden_size);
    using Score = model::TransformerConfig::Moe::Score;
    m.topk = a.moe_router_topk;
    m.score = a.moe_router_score_function == "sigmoid"        ? Score::Sigmoid
              : a.moe_router_score_function == "sqrtsoftplus" ? Score::SqrtSoftplus
                                                               : Score::Softmax;
    m.pre_softmax = a.moe_router_pre_softmax;
    m.topk_scaling_factor = a.moe_router_topk_scaling_factor.value_or(0.0);
    m.num_groups = a.moe_router_num_groups.value_or(0);
    m.group_topk = a.moe_router_group_topk.value_or(0);
    m.expert_bias = a.moe_router_enable_expert_bias;
    m.bias_update_rate = a.moe_router_bias_update_rate;
    m.force_load_balancing = a.moe_router_force_load_balancing;
    m.force_biased_given = a.moe_router_force_biased.has_value();
    m.force_biased = a.moe_router_force_biased.value_or(0.0);
    m.input_jitter_eps = a.moe_input_jitter_eps.value_or(0.0);
    m.router_dtype_given = a.moe_router_dtype.has_value();
    m.router_dtype = a.moe_router_dtype.value_or("fp32") == "fp64" ? DType::F64 : DType::F32;
    using B = model::TransformerConfig::Moe::Balance;
    m.balance.clear(), m.aux_loss_coeff.clear();  // the lists, paired (validate_moe)
    for (size_t i = 0; i < a.moe_router_load_balancing_type.size(); ++i) {
      const std::string& lb = a.moe_router_load_balancing_type[i];
      m.balance.push_back(lb == "seq_aux_loss"      ? B::SeqAuxLoss
                          : lb == "global_aux_loss" ? B::GlobalAuxLoss
                          : lb == "sinkhorn"        ? B::Sinkhorn
                          : lb == "none"            ? B::None
                                                    : B::AuxLoss);
      m.aux_loss_coeff.push_back(i < a.moe_aux_loss_coeff_values.size()
                                     ? a.moe_aux_loss_coeff_values[i] : 0.0);
    }
    if (m.balance.empty()) m.balance = {B::AuxLoss}, m.aux_loss_coeff = {0.0};
    m.z_loss_coeff = a.moe_z_loss_coeff.value_or(0.0);
    m.capacity_factor = a.moe_expert_capacity_factor.value_or(0.0);
    m.pad_to_capacity = a.moe_pad_expert_input_to_capacity;
    m.pad_multiple = a.moe_router_padding_for_fp8 ? 16 : 0;  // Megatron's FP8 alignment
    m.drop_by_position = a.moe_token_drop_policy == "position";
    m.shared_ffn_hidden_size = a.moe_shared_expert_intermediate_size.value_or(0);
    m.shared_expert_gate = a.moe_shared_expert_gate;
    m.shared_expert_overlap = a.moe_shared_expert_overlap;
    m.apply_probs_on_input = a.moe_apply_probs_on_input;
    m.alltoall = a.moe_token_dispatcher_type != "allgather";  // alltoall, or flex (its math)
    // Expert parallelism: E / EP experts per rank (every EP rank holds as many; the trainer
    // sets its own ep_rank, the plan counts rank 0's).
    m.ep_size = a.expert_model_parallel_size, m.ep_rank = 0;
    // ETP != TP (1 at TP > 1): the experts' own shard count (the trainer sets the rank).
    const int64_t etp = a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size);
    m.etp_size = etp != a.tensor_model_parallel_size ? etp : 0, m.etp_rank = 0;
  }
  return c;
}

int64_t param_alignment(const Args& a) {
  if (!a.use_distributed_optimizer) return 16;
  int64_t align = std::lcm<int64_t>(64, a.data_parallel_size);
  if (a.num_experts) {  // expert buckets split into EDP blocks (EDP > DP when ETP < TP)
    const int64_t etp = a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size);
    const int64_t edp = a.tensor_model_parallel_size * a.context_parallel_size *
                        a.data_parallel_size / (etp * a.expert_model_parallel_size);
    if (edp > 0) align = std::lcm(align, edp);
  }
  return align;
}

std::vector<std::vector<int>> stage_layers(const Args& a) {
  auto opt_int = [](const std::optional<int64_t>& v) {
    return v ? std::optional<int>(int(*v)) : std::nullopt;
  };
  pl::LayerSplit split;
  split.first = opt_int(a.decoder_first_pipeline_num_layers);
  split.last = opt_int(a.decoder_last_pipeline_num_layers);
  split.layout = a.pipeline_model_parallel_layout;
  split.mtp_num_layers = int(a.mtp_num_layers.value_or(0));
  return pl::stage_layers(int(a.num_layers), int(a.pipeline_model_parallel_size),
                          int(a.virtual_pipeline_model_parallel_size), split);
}

model::PipelinePart pipeline_part(const Args& a, int stage) {
  model::PipelinePart part;
  const int pp = int(a.pipeline_model_parallel_size);
  if (pp == 1) return part;
  const int vpp = int(a.virtual_pipeline_model_parallel_size);
  const auto layers = stage_layers(a);
  for (int c = 0; c < vpp; ++c) part.chunks.push_back(layers[size_t(stage * vpp + c)]);
  part.first_stage = stage == 0, part.last_stage = stage == pp - 1;
  return part;
}

pl::ScheduleKind schedule_kind(const Args& a) {
  if (a.virtual_pipeline_model_parallel_size > 1) return pl::ScheduleKind::Interleaved1F1B;
  return a.pipeline_schedule == "gpipe" ? pl::ScheduleKind::AllForwardAllBackward
                                        : pl::ScheduleKind::OneFOneB;
}

StageMemory plan_stage_memory(const Args& a, const model::TransformerConfig& cfg, int stage) {
  StageMemory m;
  const model::PipelinePart part = pipeline_part(a, stage);
  const int64_t align = cfg.param_align;
  int64_t expert_params = 0;  // expert parallelism: sharded over EDP by the dist. optimizer
  for (const auto& p : model::parameter_registry(cfg, part)) {
    const int64_t n = (p.numel() + align - 1) / align * align;
    m.parameters += n;
    if (p.expert >= 0) expert_params += n;
  }
  // The distributed optimizer's shard: dense parameters over DP x CP (over DP x CP / N
  // with --num-distributed-optimizer-instances N: every instance holds the whole state),
  // experts over the expert-data-parallel group (EDP = TP x CP x DP / (ETP x EP); DP at EP 1).
  const int64_t intra = std::max<int64_t>(
      1, a.data_parallel_size * a.context_parallel_size / a.num_distributed_optimizer_instances);
  const int64_t edp = a.data_parallel_size * a.tensor_model_parallel_size *
                      a.context_parallel_size /
                      (a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size) *
                       a.expert_model_parallel_size);
  const int64_t shard =
      (m.parameters - expert_params) / intra + expert_params / std::max<int64_t>(1, edp);
  m.weights = m.parameters * int64_t(dtype_size(cfg.dtype));
  m.grads = m.parameters * int64_t(dtype_size(cfg.grad_dtype()));
  // The distributed optimizer's reduce-scatter target: this rank's shard of the gradients.
  if (a.use_distributed_optimizer)
    m.grads += shard * int64_t(dtype_size(cfg.grad_dtype()));
  // --grad-reduce-in-bf16 (DP > 1): the bf16 staging copy of the buffer (and of the shard).
  if (a.grad_reduce_in_bf16 && a.data_parallel_size > 1)
    m.grads +=
        (m.parameters + (a.use_distributed_optimizer ? shard : 0)) *
        int64_t(dtype_size(DType::BF16));
  // AdamW: two moments in fp32 (f64 for f64 models), SGD and Lion one (Muon: its scalar
  // rule's); plus fp32 main
  // params for 16-bit models (bf16 ones: their lower halves, 2 bytes, beside the model's
  // values; ops/split_main.h); the distributed optimizer keeps main params and moments of
  // its shard.
  const int64_t state = cfg.dtype == DType::F64 ? 8 : 4;
  const int64_t main_bytes = optim::Optimizer::main_param_bytes(cfg.dtype, a.fp8_param_gather);
  // --use-precision-aware-optimizer: bf16 moments, 2 bytes each.
  auto moment = [&](const std::string& d) {
    return a.use_precision_aware_optimizer && d == "bf16" && state == 4 ? int64_t(2) : state;
  };
  // Muon keeps its momentum where Adam's first moment is, beside the scalar rule's state.
  const bool second = a.optimizer == "adam" || a.optimizer == "adaptive_muon" ||
                      (a.optimizer == "muon" && a.muon_scalar_optimizer == "adam");
  const int64_t moments = moment(a.exp_avg_dtype) + (second ? moment(a.exp_avg_sq_dtype) : 0);
  if (a.use_distributed_optimizer)
    m.optimizer = shard * (moments + main_bytes);
  else
    m.optimizer = m.parameters * (moments + main_bytes);
  const int nchunks = part.chunks.empty() ? 1 : int(part.chunks.size());
  for (int c = 0; c < nchunks; ++c)
    m.per_microbatch = std::max(
        m.per_microbatch,
        model::saved_activation_bytes(cfg, part, c, a.micro_batch_size, cfg.seq_cp()));
  const int pp = int(a.pipeline_model_parallel_size);
  m.in_flight =
      pp > 1 ? pl::promised_in_flight(schedule_kind(a), pp, stage,
                                      int(a.virtual_pipeline_model_parallel_size),
                                      int(a.num_microbatches),
                                      int(a.microbatch_group_size_per_vp_stage.value_or(0)))
             : 1;
  m.scratch = model::scratch_activation_bytes(cfg, part, a.micro_batch_size, cfg.seq_cp());
  m.attention_workspace = attention_workspace_bytes(a, cfg);
  m.cp_exchange = cp_exchange_bytes(a, cfg);
  const int64_t emb = a.eval_micro_batch_size.value_or(a.micro_batch_size);
  if (emb != a.micro_batch_size) {  // evaluation's forward-only micro-batches
    Args e = a;
    e.micro_batch_size = emb;
    int64_t per_mb = 0;
    for (int c = 0; c < nchunks; ++c)
      per_mb = std::max(per_mb, model::saved_activation_bytes(cfg, part, c, emb, cfg.seq_cp()));
    const int64_t eval = per_mb + model::scratch_activation_bytes(cfg, part, emb, cfg.seq_cp()) +
                         cp_exchange_bytes(e, cfg);
    const int64_t train = m.activations() + m.attention_workspace + m.cp_exchange;
    m.eval_extra = std::max<int64_t>(0, eval - train);
  }
  return m;
}

namespace {
// A layer's --cp-comm-type as it runs: a2a+p2p with a level of one is the other level's
// exchange over the whole group (cp_attention.cpp).
std::string effective_cp_comm(const Args& a, const std::string& t) {
  if (t != "a2a+p2p" || !a.hierarchical_context_parallel_sizes) return t;
  const int64_t g = (*a.hierarchical_context_parallel_sizes)[0];
  return g == 1 ? "p2p" : g == a.context_parallel_size ? "a2a" : t;
}
}  // namespace

int64_t cp_exchange_bytes(const Args& a, const model::TransformerConfig& cfg) {
  const int64_t cp = a.context_parallel_size;
  if (cp <= 1) return 0;
  const int64_t unit = cfg.seq_cp() * a.micro_batch_size * cfg.qkv_width_local() *
                       int64_t(dtype_size(cfg.dtype));
  // The blocks' cuDNN scratch (ops/cuda/attention_cp.cu): bf16/f16 without attention
  // dropout or the document mask on a GPU, where cuDNN runs them.
  const bool cudnn = cfg.device == Device::CUDA && cfg.dtype != DType::F32 &&
                     cfg.dtype != DType::F64 && cfg.attention_dropout == 0 &&
                     !a.reset_attention_mask && !cfg.has_window_layers();
  const bool fused = cudnn && parallel::context_parallel::fused_steps_enabled();
  const int64_t halves = !cudnn ? 0 : fused ? 3 : 1;  // scratch in half units
  int64_t most = 0;
  for (const std::string& layer_type : a.cp_comm_type) {
    const std::string t = effective_cp_comm(a, layer_type);
    // a2a+p2p: a2a's gathered qkv, output and their gradients (8 halves) live through
    // the ring's 10 (the same sizes: A times the rows on 1/A of the heads).
    const int64_t halves_t = t == "p2p"          ? 10 + halves
                             : t == "all_gather" ? 2 * (2 * cp + 1) + halves
                             : t == "a2a+p2p"    ? 18 + halves
                                                 : 12;
    most = std::max(most, halves_t * unit / 2);
  }
  return most;
}

int64_t attention_workspace_bytes(const Args& a, const model::TransformerConfig& cfg,
                                  int64_t cap_bytes) {
  const int64_t cap = cap_bytes >= 0 ? cap_bytes : ops::attention_bwd_workspace_cap_from_env();
  auto env_is = [](const char* name, const char* v) {
    const char* e = std::getenv(name);
    return e && std::string(e) == v;
  };
  const int64_t cp = a.context_parallel_size;
  if (cfg.device != Device::CUDA) return 0;
  const bool atomic = env_is("MCPP_ATTENTION_DETERMINISTIC", "0");
  // The same choice the GPU dispatch makes (a GPU run is assumed to have cuDNN, as the
  // plan may run on a machine without one).
  ops::AttentionBackendQuery q;
  q.device = cfg.device, q.dtype = cfg.dtype, q.head_dim = cfg.kv_channels;
  q.dropout_p = cfg.attention_dropout;
  q.cudnn_available = !env_is("MCPP_ATTENTION_CUDNN", "0");
  q.fallback_forced = std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr;
  q.request = ops::parse_attention_request(a.attention_backend);
  const ops::AttentionBackend backend = ops::choose_attention_backend(q).backend;
  const int64_t tp = a.tensor_model_parallel_size;
  // The own flash kernel's backward hands dS from its dK/dV kernel to its dQ kernel
  // (ops::flash_ds_bytes, in sequence chunks under the cap); where one sequence's dS is over
  // the cap, with dropout it hands over the mask instead, a bit per score (on its aligned
  // path: S a multiple of 8), unless the layers keep the forward's bits (counted with their
  // saved activations). The CP ring's block kernels hold neither; a2a's whole-sequence
  // attention runs this backward on heads / CP.
  if (backend == ops::AttentionBackend::Flash) {
    bool a2a = false;
    for (const std::string& t : a.cp_comm_type) a2a = a2a || effective_cp_comm(a, t) == "a2a";
    a2a = a2a && cp > 1;
    if (cp > 1 && !a2a) return 0;
    const int64_t heads = cfg.num_attention_heads / tp / cp;
    const int64_t per_seq = ops::flash_ds_bytes(1, heads, a.seq_length);
    if (ops::flash_attention_ds_enabled() && per_seq <= cap)
      return ops::attention_bwd_chunk(a.micro_batch_size, per_seq, cap) * per_seq;
    if (cfg.attention_dropout > 0 && a.seq_length % 8 == 0 &&
        !model::CoreAttention::saves_dropout_mask(cfg, a.seq_length))
      return ops::flash_dropout_mask_bytes(a.micro_batch_size, heads, a.seq_length);
    return 0;
  }
  if (backend != ops::AttentionBackend::Cudnn) return 0;
  const int64_t nh = cfg.num_attention_heads / tp, ng = cfg.num_query_groups / tp;
  auto ws = [&](int64_t heads, int64_t groups, int64_t rows) {
    // The atomic backward (MCPP_ATTENTION_DETERMINISTIC=0) keeps no dP: its f32 dQ
    // accumulator and row sums (ours) and about as much again of cuDNN's own (measured on
    // an H200 with cuDNN 9.19: 141 / 271 / 533 MiB for the 1B's one sequence at 8K / 16K /
    // 32K, against 129 / 258 / 516 by this formula).
    if (atomic)
      return a.micro_batch_size * heads * rows * (2 * cfg.kv_channels * 4 + 4);
    return ops::cudnn_attention_bwd_workspace_bytes(a.micro_batch_size, heads, groups, rows,
                                                    cfg.kv_channels, cap);
  };
  if (cp == 1) return ws(nh, ng, a.seq_length);
  // CP: a2a layers run plain attention over the whole sequence on heads / CP; p2p and
  // all_gather layers run the ring, whose largest block is the diagonal step over the
  // rank's two chunks (S / CP rows; cp_attention.cpp's fused steps), or one chunk (S / 2CP)
  // where the steps run chunk by chunk (the document mask; MCPP_CP_FUSED_STEPS=0).
  int64_t most = 0;
  for (const std::string& layer_type : a.cp_comm_type) {
    const std::string t = effective_cp_comm(a, layer_type);
    const bool chunk_blocks =
        a.reset_attention_mask || a.window_left >= 0 ||
        !parallel::context_parallel::fused_steps_enabled();
    // a2a+p2p: the ring of cp / A ranks on heads / A (A: the all-to-all level).
    const int64_t g = t == "a2a+p2p" ? (*a.hierarchical_context_parallel_sizes)[0] : 1;
    const int64_t ring = cp / g;
    const int64_t rows = chunk_blocks ? a.seq_length / (2 * ring) : a.seq_length / ring;
    most = std::max(most,
                    t == "a2a" ? ws(nh / cp, ng / cp, a.seq_length) : ws(nh / g, ng / g, rows));
  }
  return most;
}

std::string memory_fit_advice(const Args& a, const model::TransformerConfig& cfg, int stage,
                              int64_t budget) {
  const StageMemory m = plan_stage_memory(a, cfg, stage);
  if (m.total() <= budget) return {};
  auto mib = [](int64_t b) { return fmt::format("{:.0f} MiB", double(b) / 1048576.0); };
  std::vector<std::string> tries;
  if (a.keep_mlp_activations > 0) {
    // The most kept layers that fit, if any number does.
    Args b = a;
    model::TransformerConfig c = cfg;
    int64_t fit = -1;
    for (int64_t n = a.keep_mlp_activations - 1; n >= 0 && fit < 0; --n) {
      b.keep_mlp_activations = c.keep_mlp_activations = n;
      if (plan_stage_memory(b, c, stage).total() <= budget) fit = n;
    }
    tries.push_back(fit > 0    ? fmt::format("--keep-mlp-activations {} (the most that fit)", fit)
                    : fit == 0 ? std::string("drop --keep-mlp-activations")
                               : std::string("fewer --keep-mlp-activations (alone not enough)"));
  }
  const char* det = std::getenv("MCPP_ATTENTION_DETERMINISTIC");
  if (m.attention_workspace > 0 && !(det && std::string(det) == "0")) {
    // The largest cap on cuDNN's deterministic attention workspace (MiB, halving from the
    // planned workspace) under which the plan fits, if any does: the backward then runs in
    // more chunks (slower, the same bits).
    int64_t fit = 0;
    for (int64_t mb = (m.attention_workspace >> 20) / 2; mb >= 16 && fit == 0; mb /= 2)
      if (m.total() - m.attention_workspace + attention_workspace_bytes(a, cfg, mb << 20) <=
          budget)
        fit = mb;
    tries.push_back(
        fit > 0 ? fmt::format("MCPP_ATTENTION_BWD_WORKSPACE_MB={} (cuDNN's deterministic "
                              "attention backward in smaller chunks, now {}: slower, the same "
                              "results)",
                              fit, mib(m.attention_workspace))
                : fmt::format("a smaller MCPP_ATTENTION_BWD_WORKSPACE_MB (the attention "
                              "workspace is {}; alone not enough)",
                              mib(m.attention_workspace)));
  }
  if (m.eval_extra > 0)
    tries.push_back(fmt::format("a smaller --eval-micro-batch-size (now {}; evaluation needs {} "
                                "more than a training step)",
                                a.eval_micro_batch_size.value_or(a.micro_batch_size),
                                mib(m.eval_extra)));
  if (a.micro_batch_size > 1)
    tries.push_back(fmt::format("a smaller --micro-batch-size (now {}; activations are {} of "
                                "the plan)",
                                a.micro_batch_size, mib(m.activations())));
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    (cfg.is_moe_layer(l) ? any_moe : any_dense) = true;
  // Selective recomputation with one more module (`name`, its config switch `on`): how much
  // it saves by the plan. mlp: the dense MLPs' fc1 output (a dense layer's largest
  // activation); moe: the MoE layers whole; mla_up_proj: the MLA layers' packed q/k/v.
  auto propose = [&](const char* name, bool model::TransformerConfig::*on, bool applies) {
    if (a.recompute_granularity.value_or("selective") != "selective" || cfg.*on || !applies ||
        a.fp8 || a.keep_mlp_activations != 0)
      return;
    Args b = a;
    model::TransformerConfig c = cfg;
    std::vector<std::string> mods =
        a.recompute_granularity ? a.recompute_modules : std::vector<std::string>{"core_attn"};
    mods.push_back(name);
    b.recompute_granularity = "selective", b.recompute_modules = mods;
    c.recompute = model::TransformerConfig::Recompute::Selective;
    c.recompute_core_attn = std::find(mods.begin(), mods.end(), "core_attn") != mods.end();
    c.*on = true;
    const int64_t with = plan_stage_memory(b, c, stage).total();
    tries.push_back(fmt::format("--recompute-granularity selective --recompute-modules {} ({} "
                                "less; {}fits)",
                                fmt::join(mods, " "), mib(m.total() - with),
                                with <= budget ? "" : "alone not enough: "));
  };
  propose("mlp", &model::TransformerConfig::recompute_mlp, any_dense);
  propose("moe", &model::TransformerConfig::recompute_moe, any_moe);
  propose("mla_up_proj", &model::TransformerConfig::recompute_mla_up_proj, cfg.mla.on);
  if (!a.recompute_granularity)
    tries.push_back("--recompute-activations (or --recompute-granularity full)");
  if (a.data_parallel_size > 1 && !a.use_distributed_optimizer)
    tries.push_back("--use-distributed-optimizer (optimizer state / DP)");
  tries.push_back("more --tensor-model-parallel-size or --pipeline-model-parallel-size "
                  "(`megatron plan` prints each layout's memory)");
  std::string t;
  for (const auto& s : tries) t += (t.empty() ? "" : "; ") + s;
  return fmt::format("pipeline stage {} does not fit: it needs {} by the memory plan (weights, "
                     "gradients and optimizer state {}, activations {}), more than the {} "
                     "available; try: {}",
                     stage, mib(m.total()), mib(m.weights_and_optimizer()), mib(m.activations()),
                     mib(budget), t);
}

int64_t host_memory_available() {
  int64_t avail = -1;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
    }
  }
  // A container's cgroup v2 limit, when lower than what the host has free. Its usage counts
  // the page cache; the inactive file pages are reclaimed before the limit bites, so they
  // count as free (the working set, as container runtimes measure it).
  std::ifstream mx("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::string limit;
  int64_t used = 0;
  if (mx >> limit && limit != "max" && cur >> used) {
    std::ifstream st("/sys/fs/cgroup/memory.stat");
    std::string key;
    int64_t v = 0;
    while (st >> key >> v)
      if (key == "inactive_file") {
        used -= std::min(v, used);
        break;
      }
    const int64_t headroom = std::max<int64_t>(std::atoll(limit.c_str()) - used, 0);
    avail = avail < 0 ? headroom : std::min(avail, headroom);
  }
  return avail;
}

int host_local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* e = std::getenv(name);
    if (e && std::atoi(e) > 0) return std::atoi(e);
  }
  // Slurm: SLURM_TASKS_PER_NODE is "4" or "4(x2),3"; this node's count is not named, so
  // take the smallest (fewer ranks sharing the host: a check that errs on the lenient side).
  if (const char* e = std::getenv("SLURM_TASKS_PER_NODE")) {
    int fewest = 0;
    for (const char* p = e; *p;) {
      const int n = std::atoi(p);
      if (n > 0 && (fewest == 0 || n < fewest)) fewest = n;
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    if (fewest > 0) return fewest;
  }
  return 1;
}

}  // namespace mcpp::training
