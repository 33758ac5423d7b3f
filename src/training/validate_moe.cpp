// Mixture-of-experts flag checks (validate_moe.h). Megatron's rules first (what its
// validate_args / TransformerConfig reject), then what megatron.cpp does not implement yet.
#include "training/validate_moe.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "base/error.h"
#include "training/arguments.h"
#include "training/layer_freq.h"

namespace mcpp::training {

std::vector<int64_t> parse_moe_layer_freq(const std::string& spec, int64_t num_layers) {
  const LayerFreq f =
      parse_layer_freq("--moe-layer-freq", spec,
                       "give an integer N (every N-th layer is a MoE layer) or a list "
                       "with one 0/1 entry per layer, e.g. \"([0]+[1]*3)\" for 4 layers");
  std::vector<int64_t> pattern;
  if (f.every) {
    const int64_t n = *f.every;
    MCPP_CHECK_HINT(n >= 1, "give --moe-layer-freq N >= 1 (1: every layer is a MoE layer)",
                    "--moe-layer-freq {} must be positive", n);
    for (int64_t l = 0; l < num_layers; ++l) pattern.push_back(l % n == 0 ? 1 : 0);
    return pattern;
  }
  pattern = f.list;
  MCPP_CHECK_HINT(int64_t(pattern.size()) == num_layers,
                  fmt::format("give {} entries, one per layer", num_layers),
                  "--moe-layer-freq '{}' has {} entries but --num-layers is {}", spec,
                  pattern.size(), num_layers);
  for (int64_t x : pattern)
    MCPP_CHECK_HINT(x == 0 || x == 1, "use 1 for a MoE layer and 0 for a dense one",
                    "--moe-layer-freq '{}' holds {}: entries must be 0 or 1", spec, x);
  return pattern;
}

// --moe-use-upcycling (training/upcycle.h): the dense checkpoint in --load, the MoE model's
// in --save (Megatron asserts --save), experts in copies of the granules.
static void validate_upcycling(const Args& a) {
  const int64_t g = a.moe_upcycling_granularity;
  MCPP_CHECK_HINT(g >= 1, "give --moe-upcycling-granularity 1 or more",
                  "--moe-upcycling-granularity {} must be positive", g);
  if (!a.moe_use_upcycling) {
    MCPP_CHECK_HINT(g == 1, "add --moe-use-upcycling, or drop --moe-upcycling-granularity",
                    "--moe-upcycling-granularity {} applies to --moe-use-upcycling only", g);
    return;
  }
  MCPP_CHECK_HINT(*a.num_experts % g == 0,
                  "give --num-experts a multiple of --moe-upcycling-granularity",
                  "--moe-use-upcycling: --num-experts {} is not a multiple of "
                  "--moe-upcycling-granularity {}",
                  *a.num_experts, g);
  MCPP_CHECK_HINT(a.load.has_value(), "give --load DIR, the dense model's checkpoint",
                  "--moe-use-upcycling converts the dense checkpoint in --load, and none was "
                  "given");
  MCPP_CHECK_HINT(a.save.has_value(), "give --save DIR for the upcycled MoE model",
                  "--moe-use-upcycling writes the MoE model to --save, and none was given");
  MCPP_CHECK_HINT(!a.pretrained_checkpoint && !a.finetune,
                  "give the dense checkpoint as --load",
                  "--moe-use-upcycling reads the dense model from --load (not "
                  "--pretrained-checkpoint / --finetune)");
  MCPP_CHECK_HINT(a.ckpt_format != "torch", "use the default --ckpt-format torch_dist",
                  "--moe-use-upcycling with --ckpt-format torch (the legacy layout holds no "
                  "experts)");
  // Megatron splits a gated fc1 into its gate and up halves only for SiLU (SwiGLU); another
  // gated unit's rows it cuts into contiguous granules, which at granularity > 1 would give
  // one expert gate rows only and the next up rows only.
  MCPP_CHECK_HINT(!a.quick_geglu || a.moe_upcycling_granularity == 1,
                  "upcycle at --moe-upcycling-granularity 1",
                  "--moe-use-upcycling with --quick-geglu at --moe-upcycling-granularity {}: "
                  "Megatron-LM's upcycling cuts a non-SiLU gated fc1 into contiguous granules, "
                  "across its gate and up halves",
                  a.moe_upcycling_granularity);
}

// Linear biases in MoE layers (Megatron's default --add-bias-linear): the router's and the
// experts' (model/moe/router.h, experts.h), where Megatron-LM builds them.
static void validate_moe_biases(const Args& a, int64_t etp) {
  const char* off = "or add --disable-bias-linear";
  MCPP_CHECK_HINT(etp == 1, fmt::format("add --expert-tensor-parallel-size 1, {}", off),
                  "MoE layers with linear biases at --expert-tensor-parallel-size {} (it defaults "
                  "to --tensor-model-parallel-size): Megatron-LM supports biases in MoE at ETP 1 "
                  "only (each expert-TP rank would add the whole fc2 bias to its partial sum)",
                  etp);
  MCPP_CHECK_HINT(!a.moe_shared_expert_intermediate_size,
                  fmt::format("drop --moe-shared-expert-intermediate-size, {}", off),
                  "shared experts with linear biases: Megatron-LM's SharedExpertMLP asserts "
                  "add_bias_linear is False");
  MCPP_CHECK_HINT(!(a.moe_grouped_gemm && !a.was_given("bias_dropout_fusion")),
                  fmt::format("add --no-bias-dropout-fusion, {}", off),
                  "--moe-grouped-gemm with linear biases and the bias-dropout fusion: "
                  "Megatron-LM's TEGroupedMLP asserts against bias_dropout_fusion when "
                  "add_bias_linear is set");
  MCPP_CHECK_HINT(!a.init_method_xavier_uniform, fmt::format("drop the flag, {}", off),
                  "--init-method-xavier-uniform with MoE linear biases: Megatron-LM draws the "
                  "router's bias [E] with init_method, and xavier_uniform_ cannot draw a 1-D "
                  "tensor");
  // Upcycling copies the dense biases as Megatron's SequentialMLP path does; its
  // TEGroupedMLP path (--moe-grouped-gemm) leaves the experts' biases at their
  // initialisation, which would silently train another model than the upcycled one.
  MCPP_CHECK_HINT(!(a.moe_use_upcycling && a.moe_grouped_gemm),
                  "drop --moe-grouped-gemm (the experts always run grouped here) to upcycle "
                  "with the dense biases copied",
                  "--moe-use-upcycling with linear biases and --moe-grouped-gemm: Megatron-LM's "
                  "grouped-GEMM upcycling leaves the experts' biases at their initialisation");
}

// --moe-token-dispatcher-type flex (Megatron's MoEFlexTokenDispatcher: one exchange over the
// expert-TP x EP ranks through DeepEP, HybridEP or NCCL EP). Its dropless function is the
// all-to-all dispatcher's -- every token to its top-k experts, their outputs weighted and
// summed -- and that is what runs here, over megatron.cpp's own all-to-all (NCCL / MPI)
// whatever the backend names. Megatron's checks of the flex flags come first; token dropping
// is refused (each backend drops in its own way).
static void validate_flex_dispatcher(const Args& a, int64_t tp) {
  const std::string& d = a.moe_token_dispatcher_type;
  const std::string& b = a.moe_flex_dispatcher_backend;
  MCPP_CHECK(d == "allgather" || d == "alltoall" || d == "flex",
             "--moe-token-dispatcher-type {}: the parser admits only Megatron's choices", d);
  MCPP_CHECK(b == "deepep" || b == "hybridep" || b == "ncclep",
             "--moe-flex-dispatcher-backend {}: the parser admits only Megatron's choices", b);
  if (a.moe_enable_deepep) {  // Megatron's deprecated spelling of flex + deepep
    MCPP_CHECK_HINT(d == "flex", "add --moe-token-dispatcher-type flex",
                    "--moe-enable-deepep is only supported with the flex token dispatcher (as "
                    "in Megatron), and --moe-token-dispatcher-type is {}",
                    d);
    MCPP_CHECK_HINT(b != "hybridep", "drop --moe-enable-deepep (deprecated in Megatron)",
                    "--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: only one "
                    "backend is supported for the flex token dispatcher (as in Megatron)");
  }
  const std::string backend = a.moe_enable_deepep ? "deepep" : b;
  if (d != "flex") {
    MCPP_CHECK_HINT(!a.was_given("moe_flex_dispatcher_backend"),
                    "add --moe-token-dispatcher-type flex, or drop the flag",
                    "--moe-flex-dispatcher-backend chooses the flex dispatcher's backend, and "
                    "--moe-token-dispatcher-type is {}",
                    d);
    return;
  }
  MCPP_CHECK_HINT(!a.fake_process_group, "use --moe-token-dispatcher-type alltoall",
                  "--fake-process-group with the flex token dispatcher: not supported (as in "
                  "Megatron)");
  const int64_t etp = a.expert_tensor_parallel_size.value_or(tp);
  MCPP_CHECK_HINT(backend == "hybridep" || etp * a.expert_model_parallel_size > 1,
                  "use --moe-flex-dispatcher-backend hybridep or --moe-token-dispatcher-type "
                  "alltoall on one expert rank, or add --expert-model-parallel-size N",
                  "the flex dispatcher's {} backend needs more than one expert rank (expert "
                  "tensor parallel x expert parallel is 1; Megatron asserts the same)",
                  backend);
  MCPP_CHECK_HINT(!a.moe_pad_expert_input_to_capacity || backend != "deepep",
                  "use --moe-flex-dispatcher-backend hybridep, or drop "
                  "--moe-pad-expert-input-to-capacity",
                  "the flex dispatcher with the deepep backend does not pad the experts' input "
                  "to capacity (as in Megatron)");
  MCPP_CHECK_HINT(!a.moe_expert_capacity_factor,
                  "use --moe-token-dispatcher-type alltoall to drop tokens over a capacity, or "
                  "drop --moe-expert-capacity-factor",
                  "--moe-expert-capacity-factor with the flex dispatcher is not implemented yet "
                  "by megatron.cpp (megatron.cpp's flex runs dropless)");
}

// --moe-shared-expert-overlap: the shared expert beside the router and the routed experts,
// on a side stream (model/moe/moe_layer.cpp). Megatron's conditions (the alltoall
// dispatcher, no recomputed shared experts), and ours: its linears must not communicate
// (TP 1), as a collective on the side stream would race the main stream's.
static void validate_shared_expert_overlap(const Args& a, int64_t tp) {
  if (!a.moe_shared_expert_overlap) return;
  const char* drop = "drop --moe-shared-expert-overlap";
  MCPP_CHECK_HINT(a.moe_shared_expert_intermediate_size.has_value(),
                  fmt::format("add --moe-shared-expert-intermediate-size N, or {}", drop),
                  "--moe-shared-expert-overlap needs shared experts "
                  "(--moe-shared-expert-intermediate-size)");
  MCPP_CHECK_HINT(a.moe_token_dispatcher_type != "allgather",
                  fmt::format("add --moe-token-dispatcher-type alltoall, or {}", drop),
                  "--moe-shared-expert-overlap works with the alltoall and flex token "
                  "dispatchers only (as in Megatron), and --moe-token-dispatcher-type is {}",
                  a.moe_token_dispatcher_type);
  const auto& m = a.recompute_modules;
  MCPP_CHECK_HINT(a.recompute_granularity != "selective" ||
                      std::find(m.begin(), m.end(), "shared_experts") == m.end(),
                  fmt::format("drop shared_experts from --recompute-modules, or {}", drop),
                  "--moe-shared-expert-overlap with the shared experts recomputed "
                  "(--recompute-modules shared_experts) is not supported (as in Megatron)");
  MCPP_CHECK_HINT(tp == 1, fmt::format("train at --tensor-model-parallel-size 1, or {}", drop),
                  "--moe-shared-expert-overlap at --tensor-model-parallel-size {} is not "
                  "implemented yet by megatron.cpp (the shared expert's tensor-parallel "
                  "communication would run on its side stream)",
                  tp);
}

void validate_moe(Args& a) {
  if (!a.num_experts) {
    // A dense model: the MoE flags would be silently ignored.
    for (const char* f :
         {"moe_ffn_hidden_size", "moe_router_topk", "moe_router_load_balancing_type",
          "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_score_function",
          "moe_router_pre_softmax", "moe_router_topk_scaling_factor",
          "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
          "moe_router_dtype", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
          "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
          "moe_shared_expert_overlap",
          "moe_per_layer_logging", "moe_layer_freq", "moe_router_padding_for_fp8",
          "moe_use_upcycling", "moe_upcycling_granularity", "moe_router_force_load_balancing",
          "moe_router_force_biased", "moe_input_jitter_eps", "moe_apply_probs_on_input"})
      MCPP_CHECK_HINT(!a.was_given(f), "add --num-experts E, or drop the flag",
                      "{} applies to mixture-of-experts models only, and --num-experts was "
                      "not given",
                      flag_name(f));
    MCPP_CHECK_HINT(a.expert_model_parallel_size == 1, "add --num-experts E, or drop the flag",
                    "--expert-model-parallel-size {} needs a mixture-of-experts model "
                    "(--num-experts)",
                    a.expert_model_parallel_size);
    return;
  }
  const int64_t E = *a.num_experts, k = a.moe_router_topk, ep = a.expert_model_parallel_size;
  const int64_t tp = a.tensor_model_parallel_size;
  MCPP_CHECK_HINT(E >= 1, "give --num-experts E >= 1", "--num-experts {} must be positive", E);
  validate_upcycling(a);
  MCPP_CHECK_HINT(k >= 1 && k <= E,
                  fmt::format("give --moe-router-topk between 1 and --num-experts ({})", E),
                  "--moe-router-topk {} is outside [1, {}]", k, E);
  MCPP_CHECK_HINT(ep >= 1, "give --expert-model-parallel-size >= 1",
                  "--expert-model-parallel-size {} must be positive", ep);
  MCPP_CHECK_HINT(E % ep == 0, "choose --expert-model-parallel-size as a divisor of --num-experts",
                  "--num-experts {} is not divisible by --expert-model-parallel-size {} (each "
                  "EP rank holds the same number of experts)",
                  E, ep);
  // Expert-parallel folding (Megatron's expert rank grid): ETP x EP x EDP x PP = world.
  if (!a.expert_tensor_parallel_size) a.expert_tensor_parallel_size = tp;
  const int64_t etp = *a.expert_tensor_parallel_size;
  MCPP_CHECK_HINT(etp >= 1, "give --expert-tensor-parallel-size >= 1",
                  "--expert-tensor-parallel-size {} must be positive", etp);
  const int64_t attn_ranks = tp * a.context_parallel_size * a.data_parallel_size;
  MCPP_CHECK_HINT(attn_ranks % (etp * ep) == 0,
                  "choose --expert-tensor-parallel-size x --expert-model-parallel-size as a "
                  "divisor of TP x CP x DP",
                  "--expert-tensor-parallel-size {} x --expert-model-parallel-size {} does not "
                  "divide the {} ranks of a pipeline stage (TP {} x CP {} x DP {}): the expert "
                  "grid folds over the attention grid",
                  etp, ep, attn_ranks, tp, a.context_parallel_size, a.data_parallel_size);

  if (!a.moe_ffn_hidden_size) a.moe_ffn_hidden_size = a.ffn_hidden_size;
  MCPP_CHECK_HINT(*a.moe_ffn_hidden_size > 0, "give --moe-ffn-hidden-size > 0",
                  "--moe-ffn-hidden-size {} must be positive", *a.moe_ffn_hidden_size);
  MCPP_CHECK_HINT(*a.moe_ffn_hidden_size % etp == 0,
                  "choose --moe-ffn-hidden-size as a multiple of --expert-tensor-parallel-size",
                  "--moe-ffn-hidden-size {} is not divisible by --expert-tensor-parallel-size {}",
                  *a.moe_ffn_hidden_size, etp);
  a.moe_layer_pattern = parse_moe_layer_freq(a.moe_layer_freq, a.num_layers);

  // Router.
  const std::string& score = a.moe_router_score_function;
  // sigmoid and sqrtsoftplus route alike (Megatron's topk_routing_with_score_function).
  const bool sigmoid_like = score == "sigmoid" || score == "sqrtsoftplus";
  MCPP_CHECK_HINT(score == "softmax" || sigmoid_like,
                  "use --moe-router-score-function softmax, sigmoid or sqrtsoftplus",
                  "--moe-router-score-function {} is not a score function megatron.cpp knows",
                  score);
  // Load balancing: Megatron's lists (nargs='+'), one coefficient per type, every aux loss
  // with a positive coefficient applied at once.
  const auto& types = a.moe_router_load_balancing_type;
  MCPP_CHECK_HINT(!types.empty() && types.size() == a.moe_aux_loss_coeff.size(),
                  "give one --moe-aux-loss-coeff per --moe-router-load-balancing-type, in the "
                  "same order (e.g. --moe-router-load-balancing-type aux_loss global_aux_loss "
                  "--moe-aux-loss-coeff 1e-3 1e-2)",
                  "--moe-router-load-balancing-type lists {} type(s) and --moe-aux-loss-coeff {} "
                  "coefficient(s): Megatron pairs them, so both lists need one length",
                  types.size(), a.moe_aux_loss_coeff.size());
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string& lb = types[i];
    MCPP_CHECK_HINT(lb != "quantile_balancing",
                    "use --moe-router-load-balancing-type aux_loss, seq_aux_loss, "
                    "global_aux_loss, sinkhorn or none (or --moe-router-enable-expert-bias for "
                    "balancing without an aux loss)",
                    "--moe-router-load-balancing-type quantile_balancing is not implemented "
                    "yet by megatron.cpp");
    MCPP_CHECK_HINT(lb == "aux_loss" || lb == "seq_aux_loss" || lb == "global_aux_loss" ||
                        lb == "sinkhorn" || lb == "none",
                    "use --moe-router-load-balancing-type aux_loss, seq_aux_loss, "
                    "global_aux_loss, sinkhorn or none",
                    "--moe-router-load-balancing-type {} is not a load-balancing type", lb);
    MCPP_CHECK_HINT(lb != "sinkhorn" || types.size() == 1,
                    "give --moe-router-load-balancing-type sinkhorn alone, or drop it from the "
                    "list",
                    "--moe-router-load-balancing-type lists sinkhorn with other types: sinkhorn "
                    "replaces the top-k routing and has no aux loss (Megatron routes a list by "
                    "top-k, so its sinkhorn entry would do nothing)");
    for (size_t j = 0; j < i; ++j)
      MCPP_CHECK_HINT(types[j] != lb, "list each load-balancing type once",
                      "--moe-router-load-balancing-type lists {} twice (Megatron would read "
                      "the first one's coefficient only)",
                      lb);
    const double v = std::stod(a.moe_aux_loss_coeff[i]);
    MCPP_CHECK_HINT(v >= 0 && std::isfinite(v), "give --moe-aux-loss-coeff >= 0, e.g. 1e-2",
                    "--moe-aux-loss-coeff {} (for {}) must be finite and non-negative",
                    a.moe_aux_loss_coeff[i], lb);
  }
  a.moe_aux_loss_coeff_values.clear();
  for (const std::string& v : a.moe_aux_loss_coeff)
    a.moe_aux_loss_coeff_values.push_back(std::stod(v));
  // Sinkhorn routing (S-BASE) replaces the score function: it chooses by the Sinkhorn-
  // normalised exp(logits) and weighs by softmax (sigmoid at top-1) of the logits.
  const bool sinkhorn = types.size() == 1 && types[0] == "sinkhorn";
  MCPP_CHECK_HINT(!sinkhorn || a.moe_aux_loss_coeff_values[0] == 0,
                  "drop --moe-aux-loss-coeff (sinkhorn balances by its normalisation)",
                  "--moe-router-load-balancing-type sinkhorn with --moe-aux-loss-coeff {}: "
                  "Sinkhorn routing does not support an aux loss (Megatron asserts the same)",
                  a.moe_aux_loss_coeff[0]);
  MCPP_CHECK_HINT(!(k == 1 && !sigmoid_like && !a.moe_router_pre_softmax && !sinkhorn),
                  "add --moe-router-pre-softmax (a softmax over one selected logit is always 1)",
                  "--moe-router-topk 1 with the softmax score function needs "
                  "--moe-router-pre-softmax (as in Megatron)");
  MCPP_CHECK_HINT(!(a.moe_router_pre_softmax && sigmoid_like), "drop --moe-router-pre-softmax",
                  "--moe-router-pre-softmax applies to --moe-router-score-function softmax only");
  MCPP_CHECK_HINT(!a.moe_router_enable_expert_bias || sigmoid_like,
                  "add --moe-router-score-function sigmoid (or sqrtsoftplus), or drop "
                  "--moe-router-enable-expert-bias",
                  "--moe-router-enable-expert-bias (aux-loss-free balancing) supports the sigmoid "
                  "and sqrtsoftplus score functions only (as in Megatron), not {}",
                  score);
  MCPP_CHECK_HINT(a.moe_router_bias_update_rate >= 0, "give a rate >= 0, e.g. 1e-3",
                  "--moe-router-bias-update-rate {} is negative", a.moe_router_bias_update_rate);
  // Megatron's experts assert top-1 for it: with k experts a row's input would be scaled by
  // one probability and its k outputs summed unweighted.
  MCPP_CHECK_HINT(!a.moe_apply_probs_on_input || a.moe_router_topk == 1,
                  "use --moe-router-topk 1 (Llama 4's routing), or drop "
                  "--moe-apply-probs-on-input",
                  "--moe-apply-probs-on-input works with --moe-router-topk 1 only (as in "
                  "Megatron-LM), not {}",
                  a.moe_router_topk);
  if (a.moe_input_jitter_eps)  // torch's Uniform(1 - eps, 1 + eps) needs low < high
    MCPP_CHECK_HINT(*a.moe_input_jitter_eps > 0, "give a small positive epsilon, e.g. 0.01",
                    "--moe-input-jitter-eps {} must be positive", *a.moe_input_jitter_eps);
  if (a.moe_router_topk_scaling_factor)
    MCPP_CHECK_HINT(*a.moe_router_topk_scaling_factor > 0, "give a positive factor, e.g. 2.5",
                    "--moe-router-topk-scaling-factor {} must be positive",
                    *a.moe_router_topk_scaling_factor);
  if (a.moe_router_group_topk || a.moe_router_num_groups) {
    MCPP_CHECK_HINT(a.moe_router_group_topk && a.moe_router_num_groups,
                    "give both --moe-router-num-groups and --moe-router-group-topk",
                    "group-limited routing needs --moe-router-num-groups and "
                    "--moe-router-group-topk together");
    const int64_t g = *a.moe_router_num_groups, gk = *a.moe_router_group_topk;
    MCPP_CHECK_HINT(g >= 1 && E % g == 0,
                    "choose --moe-router-num-groups as a divisor of --num-experts",
                    "--num-experts {} is not divisible by --moe-router-num-groups {}", E, g);
    MCPP_CHECK_HINT(gk >= 1 && gk <= g,
                    "give --moe-router-group-topk between 1 and --moe-router-num-groups",
                    "--moe-router-group-topk {} is outside [1, {}]", gk, g);
    MCPP_CHECK_HINT(k % gk == 0 && k / gk <= E / g,
                    "choose --moe-router-topk as a multiple of --moe-router-group-topk, at most "
                    "group-topk x experts per group",
                    "--moe-router-topk {} with --moe-router-group-topk {}: each kept group "
                    "contributes topk/group_topk experts by its top scores (Megatron's "
                    "group_limited_topk), which needs topk divisible by group_topk and at most "
                    "{} experts per group",
                    k, gk, E / g);
  }

  if (sinkhorn) {
    // Megatron's sinkhorn path reads none of these; given, they would be silently ignored.
    const std::string score_flag = "--moe-router-score-function " + score;
    const std::pair<bool, const char*> unused[] = {
        {sigmoid_like, score_flag.c_str()},
        {a.moe_router_pre_softmax, "--moe-router-pre-softmax"},
        {a.moe_router_topk_scaling_factor.has_value(), "--moe-router-topk-scaling-factor"},
        {a.moe_router_num_groups.has_value() || a.moe_router_group_topk.has_value(),
         "--moe-router-num-groups / --moe-router-group-topk"},
        {a.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias"}};
    for (const auto& [given, flag] : unused)
      MCPP_CHECK_HINT(!given,
                      fmt::format("drop {}, or use another --moe-router-load-balancing-type",
                                  flag),
                      "{} has no effect with --moe-router-load-balancing-type sinkhorn (its "
                      "routing takes softmax, or sigmoid at top-1, of the logits)",
                      flag);
  }

  if (a.moe_z_loss_coeff)
    MCPP_CHECK_HINT(*a.moe_z_loss_coeff >= 0, "give --moe-z-loss-coeff >= 0, e.g. 1e-3",
                    "--moe-z-loss-coeff {} is negative", *a.moe_z_loss_coeff);

  // Capacity.
  if (a.moe_expert_capacity_factor && *a.moe_expert_capacity_factor < 0)
    a.moe_expert_capacity_factor.reset();  // Megatron: negative means dropless
  MCPP_CHECK_HINT(!(sinkhorn && a.moe_expert_capacity_factor),
                  "drop --moe-expert-capacity-factor, or use aux_loss, seq_aux_loss, "
                  "global_aux_loss or none",
                  "--moe-expert-capacity-factor works with the aux_loss, seq_aux_loss, "
                  "global_aux_loss and none load-balancing types only, not sinkhorn (as in "
                  "Megatron)");
  MCPP_CHECK_HINT(!a.moe_pad_expert_input_to_capacity || a.moe_expert_capacity_factor,
                  "add --moe-expert-capacity-factor F, or drop --moe-pad-expert-input-to-capacity",
                  "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (as in "
                  "Megatron)");
  if (a.moe_shared_expert_intermediate_size)
    MCPP_CHECK_HINT(*a.moe_shared_expert_intermediate_size > 0 &&
                        *a.moe_shared_expert_intermediate_size % tp == 0,
                    "give a positive size divisible by --tensor-model-parallel-size",
                    "--moe-shared-expert-intermediate-size {} must be positive and divisible by "
                    "TP {}",
                    *a.moe_shared_expert_intermediate_size, tp);
  MCPP_CHECK_HINT(!a.moe_shared_expert_gate || a.moe_shared_expert_intermediate_size,
                  "add --moe-shared-expert-intermediate-size N, or drop --moe-shared-expert-gate",
                  "--moe-shared-expert-gate needs shared experts "
                  "(--moe-shared-expert-intermediate-size)");
  validate_shared_expert_overlap(a, tp);
  // Megatron's checks of the FP8 router padding (TransformerConfig.__post_init__).
  if (a.moe_router_padding_for_fp8) {
    MCPP_CHECK_HINT(a.fp8, "add --fp8-format, or drop --moe-router-padding-for-fp8",
                    "--moe-router-padding-for-fp8 needs FP8 training (--fp8-format), as in "
                    "Megatron");
    MCPP_CHECK_HINT(a.moe_token_dispatcher_type != "allgather",
                    "add --moe-token-dispatcher-type alltoall",
                    "--moe-router-padding-for-fp8 with --moe-token-dispatcher-type {}: Megatron's "
                    "allgather dispatcher does not support the router padding",
                    a.moe_token_dispatcher_type);
  }
  validate_flex_dispatcher(a, tp);

  // Tensor parallelism: the router and the dispatcher see the sequence shard.
  MCPP_CHECK_HINT(tp == 1 || a.sequence_parallel, "add --sequence-parallel",
                  "mixture-of-experts layers with --tensor-model-parallel-size {} need "
                  "--sequence-parallel (as in Megatron)",
                  tp);

  // Not implemented yet by megatron.cpp.
  // Expert parallelism: what the trainer does not run yet at EP > 1.
  // ETP < TP: each ETP group of consecutive TP ranks sends its own tokens (moe_layer.h).
  MCPP_CHECK_HINT(etp <= tp && tp % etp == 0,
                  "use a divisor of --tensor-model-parallel-size, or drop it (it defaults to "
                  "--tensor-model-parallel-size)",
                  "--expert-tensor-parallel-size {} with --tensor-model-parallel-size {} is not "
                  "implemented yet (ETP dividing TP is)",
                  etp, tp);
  // The bf16 staging buffer exists at DP > 1 only: at DP 1 with EDP > 1 (ETP 1 at TP > 1)
  // the expert buckets would be reduced in fp32, silently ignoring the flag.
  const int64_t edp = attn_ranks / (etp * ep);
  MCPP_CHECK_HINT(!(a.grad_reduce_in_bf16 && a.data_parallel_size == 1 && edp > 1),
                  "drop --grad-reduce-in-bf16, or train with data-parallel size > 1",
                  "--grad-reduce-in-bf16 at data-parallel size 1 with expert-data-parallel "
                  "size {} (--expert-tensor-parallel-size {} at --tensor-model-parallel-size "
                  "{}) is not implemented yet",
                  edp, etp, tp);
  if (a.add_bias_linear) validate_moe_biases(a, etp);
}

}  // namespace mcpp::training
