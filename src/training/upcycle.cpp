// --moe-use-upcycling / --moe-upcycling-granularity: a dense checkpoint becomes the MoE
// model's starting point, as Megatron-LM's upcycling_utils.py builds it (after Nakamura et
// al., "Upcycling Large Language Models into Mixture of Experts", arXiv 2410.07524):
//   - every tensor the two models share (attention, norms, embeddings, the dense layers of
//     a mixed model) is copied;
//   - each MoE layer's dense MLP of FFN width F = g * I (g the granularity, I the experts'
//     width) is cut into g granules -- rows of linear_fc1 (SwiGLU: the same rows of its
//     gate and up halves), columns of linear_fc2 -- and expert e takes granule e mod g, so
//     the E experts are E / g copies of the g granules;
//   - the weights are scaled so that the MoE layer's output starts near the dense MLP's:
//     the activation scale is g (or, with --moe-router-pre-softmax, E * g / topk), applied
//     to linear_fc1 and linear_fc2 as its cube root each for gated units (SwiGLU,
//     quick-GEGLU) and squared ReLU, as its square root each otherwise (with g = 1 and the default post-softmax router the
//     top-k weights sum to 1 and the MoE layer computes the dense MLP exactly);
//   - linear biases (as Megatron's SequentialMLP path): expert e's fc1 bias is granule e mod
//     g of the dense fc1 bias (SwiGLU: of its gate and up halves), times the weight scale;
//     its fc2 bias is the dense fc2 bias as it is (each expert's times its routing weight,
//     which sum to 1 over the top-k with the post-softmax router);
//   - the router keeps its random initialisation, its first E / g rows each repeated g
//     times (the experts that hold the granules of one copy share a row); its bias keeps
//     its initialisation;
//   - what the dense model lacks (shared experts, the expert bias) keeps its initialisation.
// Rank 0 builds the whole MoE model on the host from the dense checkpoint (read at
// tensor-parallel size 1 whatever layout wrote it) and saves it as iteration 1 in --save;
// every rank then loads that checkpoint under its own layout (TP, PP, EP, ETP), with no
// optimizer state and no RNG state, and training goes on from iteration 1, as in Megatron.
#include "training/upcycle.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>

#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "model/gpt_model.h"
#include "model/module.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"

namespace mcpp::training {

namespace {

// The model of `c` as one process holds it: every layer, every expert, on the host in f32.
model::TransformerConfig whole_model_config(model::TransformerConfig c) {
  c.tp_size = 1, c.tp_rank = 0, c.sequence_parallel = false;
  c.cp_size = 1, c.cp_rank = 0, c.cp_comm.clear();
  c.moe.ep_size = 1, c.moe.ep_rank = 0, c.moe.etp_size = 0, c.moe.etp_rank = 0;
  c.device = Device::CPU, c.dtype = DType::F32, c.param_align = 16;
  c.fp8 = {};  // FP8 scaling state starts fresh (the loader keeps a missing buffer's init)
  c.perform_initialization = true;  // the router and shared experts are drawn as usual
  return c;
}

// Megatron's _get_moe_activation_scale and _get_weight_scale.
double weight_scale(const model::TransformerConfig& c, int64_t g) {
  const int64_t E = c.moe.num_experts, expansion = E / g;
  const double act = c.moe.pre_softmax ? double(expansion * g * g) / double(c.moe.topk)
                                       : double(g);
  return c.gated_linear_unit() || c.squared_relu ? std::cbrt(act) : std::sqrt(act);
}

// Rows [r0, r0 + n) of a [R, C] host tensor (a 1-D one: elements) into rows [d0, d0 + n)
// of dst, times s.
void copy_rows(const Tensor& src, int64_t r0, int64_t n, Tensor& dst, int64_t d0, float s) {
  const int64_t C = src.dim() == 1 ? 1 : src.size(1);
  const float* S = src.data<float>() + r0 * C;
  float* D = dst.data<float>() + d0 * C;
  for (int64_t i = 0; i < n * C; ++i) D[i] = S[i] * s;
}

void upcycle(const Args& a, const model::TransformerConfig& rank_cfg) {
  const std::string& dense_dir = *a.load;
  const int64_t g = a.moe_upcycling_granularity;
  checkpoint::ModelWeights dense = checkpoint::load_model_weights(dense_dir, a.ckpt_step);
  const model::TransformerConfig& dc = dense.config;
  MCPP_CHECK_HINT(dc.moe.num_experts == 0,
                  "point --load at the dense model's checkpoint, or drop --moe-use-upcycling "
                  "to resume this MoE checkpoint",
                  "--moe-use-upcycling: --load {} holds a model with {} experts already",
                  dense_dir, dc.moe.num_experts);
  const model::TransformerConfig mc = whole_model_config(rank_cfg);
  const int64_t I = mc.moe.ffn_hidden_size;
  MCPP_CHECK_HINT(dc.ffn_hidden_size == I * g,
                  fmt::format("give --moe-upcycling-granularity {} (dense FFN / expert FFN), or "
                              "set the experts' FFN width (--moe-ffn-hidden-size) to {}",
                              dc.ffn_hidden_size % I == 0 ? dc.ffn_hidden_size / I : 0,
                              dc.ffn_hidden_size / g),
                  "--moe-use-upcycling: the dense checkpoint's FFN width {} is not the experts' "
                  "{} x --moe-upcycling-granularity {}",
                  dc.ffn_hidden_size, I, g);
  MCPP_CHECK_HINT(dc.activation() == mc.activation(),
                  "give the MoE model the dense model's activation (--swiglu / --squared-relu)",
                  "--moe-use-upcycling: the dense checkpoint's MLP activation differs from the "
                  "MoE model's");
  model::GPTModel moe(mc);  // initialised from --seed: the router's and shared experts' values
  model::ParamStore& P = moe.params();
  const model::ParamStore& D = dense.params;
  const float scale = float(weight_scale(mc, g));
  std::set<std::string> used;
  std::vector<std::string> kept;
  for (const model::ParamInfo& p : P.infos()) {
    Tensor dst = P.param(p.name);
    if (D.has(p.name)) {  // shared by both models
      const model::ParamInfo& q = D.info(p.name);
      MCPP_CHECK_HINT(q.global_shape == p.global_shape,
                      "give the MoE run the dense model's shape flags (--use-checkpoint-args "
                      "takes them from the checkpoint)",
                      "--moe-use-upcycling: {} is {} in the dense checkpoint, {} in the MoE "
                      "model",
                      p.name, shape_str(q.global_shape), shape_str(p.global_shape));
      ops::copy(D.param(p.name), dst, ops::default_stream(Device::CPU));
      used.insert(p.name);
      continue;
    }
    kept.push_back(p.name);
  }
  for (int64_t L = 0; L < mc.num_layers; ++L) {
    if (!mc.is_moe_layer(L)) continue;
    const int layer = int(L);
    const std::string fc1 = model::layer_param_name(layer, "mlp.linear_fc1.weight");
    const std::string fc2 = model::layer_param_name(layer, "mlp.linear_fc2.weight");
    for (const std::string& n : {fc1, fc2})
      MCPP_CHECK_HINT(D.has(n), "upcycle a checkpoint of the same number of layers",
                      "--moe-use-upcycling: the dense checkpoint {} has no {}", dense_dir, n);
    used.insert(fc1), used.insert(fc2);
    const Tensor w1 = D.param(fc1), w2 = D.param(fc2);  // [(2)F, H], [H, F]
    // Linear biases, where both models have them ([(2)F] and [H]).
    const std::string b1n = model::layer_param_name(layer, "mlp.linear_fc1.bias");
    const std::string b2n = model::layer_param_name(layer, "mlp.linear_fc2.bias");
    const bool biases = D.has(b1n) && D.has(b2n) && mc.add_bias_linear;
    if (biases) used.insert(b1n), used.insert(b2n);
    const int64_t F = dc.ffn_hidden_size, H = mc.hidden_size;
    for (int64_t e = 0; e < mc.moe.num_experts; ++e) {
      const int64_t j = e % g;  // the granule this expert holds
      Tensor e1 = P.param(
          model::layer_param_name(layer, "mlp.experts.linear_fc1.weight" + std::to_string(e)));
      Tensor e2 = P.param(
          model::layer_param_name(layer, "mlp.experts.linear_fc2.weight" + std::to_string(e)));
      copy_rows(w1, j * I, I, e1, 0, scale);                 // gate (or the whole fc1)
      if (mc.gated_linear_unit()) copy_rows(w1, F + j * I, I, e1, I, scale);  // up
      // fc2's columns [j I, (j + 1) I) of each of its H rows.
      const float* S = w2.data<float>();
      float* Dd = e2.data<float>();
      for (int64_t r = 0; r < H; ++r)
        for (int64_t c = 0; c < I; ++c) Dd[r * I + c] = S[r * F + j * I + c] * scale;
      if (biases) {
        const std::string n = std::to_string(e);
        Tensor c1 = P.param(model::layer_param_name(layer, "mlp.experts.linear_fc1.bias" + n));
        Tensor c2 = P.param(model::layer_param_name(layer, "mlp.experts.linear_fc2.bias" + n));
        const Tensor b1 = D.param(b1n), b2 = D.param(b2n);
        copy_rows(b1, j * I, I, c1, 0, scale);
        if (mc.gated_linear_unit()) copy_rows(b1, F + j * I, I, c1, I, scale);
        copy_rows(b2, 0, H, c2, 0, 1.f);
      }
      const std::string none = "-";  // (no bias: nothing to take off the kept list)
      for (const std::string& n : {std::string("mlp.experts.linear_fc1.weight"),
                                   std::string("mlp.experts.linear_fc2.weight"),
                                   biases ? "mlp.experts.linear_fc1.bias" : none,
                                   biases ? "mlp.experts.linear_fc2.bias" : none}) {
        const std::string full = model::layer_param_name(layer, n + std::to_string(e));
        kept.erase(std::remove(kept.begin(), kept.end(), full), kept.end());
      }
    }
    // The router: its first E / g rows, each repeated g times (_process_router_param).
    const std::string rn = model::layer_param_name(layer, "mlp.router.weight");
    Tensor r = P.param(rn);
    const Tensor first = r.clone();
    for (int64_t e = 0; e < mc.moe.num_experts; ++e) copy_rows(first, e / g, 1, r, e, 1.f);
  }
  for (const model::ParamInfo& q : D.infos())
    MCPP_CHECK_HINT(used.count(q.name),
                    "train the dense model with the MoE model's layout (both with linear "
                    "biases, or both with --disable-bias-linear)",
                    "--moe-use-upcycling: the dense checkpoint's {} has no place in the MoE "
                    "model",
                    q.name);
  std::string kept_list;
  for (const std::string& n : kept) kept_list += (kept_list.empty() ? "" : ", ") + n;
  log::info("> upcycling {} (iteration {}, FFN {}) into {} experts of FFN {} (granularity {}, "
            "weights x {:.6g}); initialised, not from the dense model: {}",
            dense_dir, dense.state.iteration, dc.ffn_hidden_size, mc.moe.num_experts, I, g,
            double(scale), kept_list.empty() ? "nothing" : kept_list);
  checkpoint::TrainingState st;
  st.iteration = 1;  // Megatron saves the upcycled model as iteration 1
  st.rng_seed = uint64_t(a.seed);
  st.num_floating_point_operations_so_far = dense.state.num_floating_point_operations_so_far;
  st.config = {{"upcycled_from", dense_dir}};
  checkpoint::SaveOptions so;
  so.model = mc, so.save_rng = false;
  checkpoint::save_checkpoint(*a.save, moe, nullptr, st, so);
}

}  // namespace

void upcycle_dense_checkpoint(const Args& a, const model::TransformerConfig& rank_cfg,
                              comm::Communicator& world) {
  // Rank 0 converts; an error there reaches every rank (none waits for a save that failed).
  std::string err;
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      upcycle(a, rank_cfg);
    } catch (const Error& e) {
      err = e.summary(), failure = std::current_exception();
    }
  }
  const std::string e0 = parallel::all_gather_strings(world, err)[0];
  if (failure) std::rethrow_exception(failure);
  if (!e0.empty())
    throw Error(fmt::format("--moe-use-upcycling failed on rank 0: {}", e0),
                "rank 0's error above says what to change");
  log::info("  upcycled checkpoint saved to {}", *a.save);
}

}  // namespace mcpp::training
