// The MoE layer (Megatron-Core's MoELayer) behind the MLP contract (mlp.h): router ->
// token dispatch -> grouped experts -> combine (+ shared experts).
//
//   forward:   logits = router(x)                          x [Tl,H], logits [Tl,E]
//              (idx, p) = route(dispatch(logits))          all T tokens of the group
//              xp = permute(dispatch(x))                   [N,H], rows grouped by expert
//              yp = experts(xp, p)                         probabilities after the activation
//              y  = combine(unpermute(yp)) (+ shared(x)) (+ residual)
//   backward:  the same steps reversed, each communication through its dual
//              (parallel/expert_parallel/token_dispatch.h); d(loss)/dp and the aux / z-loss
//              gradients (scaled by 1/(micro-batches x DP), Megatron's aux-loss scale in our
//              global-token normalisation) go through the routing's Jacobian into the router.
//
// Where the routing runs: on the GPU, with every row of the routing on this rank (ETP = TP)
// and not the all-gather dispatcher at EP > 1 nor sinkhorn, it runs on the device (the
// routing ops of catalogue.inc, device_routing.cpp), capacity, padding and context
// parallelism included: top-k, the expert-grouped index, the weights, the aux / z-loss
// statistics and the backward never leave the GPU, and the one device-to-host transfer per
// layer and micro-batch is the E row counts (the GEMM shapes and the all-to-all splits, as
// in Megatron). Otherwise (the CPU, ETP < TP, the all-gather dispatcher at EP > 1, sinkhorn,
// MCPP_MOE_ROUTING=host) it runs on the host in fp64 (routing.h), the reference the device
// ops are tested against.
// ETP 1 at TP > 1 (--expert-tensor-parallel-size 1): every TP rank still routes the group's
// T tokens (the same aux losses), but sends only its own tokens' rows to whole experts
// (locally, or over the EP group), gets their complete outputs back, and keeps d(loss)/dp
// of its own tokens: the router's reduce-scatter sums each token's from its one owner.
// 1 < ETP < TP: the same with the ETP group's tokens (all-gathered over it), each rank
// computing its ETP shard and the ETP group reduce-scattering the partial sums.
// With TP > 1 (sequence parallel, ETP = TP, EP = 1) the dispatch group is the TP group:
// every rank routes all T tokens of the group (the gathered logits), keeps the aux / z-loss
// gradients of its own rows, and computes its ETP shard of every expert. N, the rows, is
// at most T*k dropless (the saved buffers' stated bound), E*capacity*TP with padding.
// Expert parallelism (EP > 1, set_expert_parallel_group): each rank routes its own tokens
// (at TP > 1 its TP group's, as above), then either
//   alltoall:  the permuted rows travel to the ranks owning their experts and back
//              (parallel/expert_parallel/alltoall_dispatch.h, its duals in the backward), or
//   allgather: every rank gathers all EP ranks' tokens and routing, computes its experts'
//              outputs for all of them, and the outputs are reduce-scattered back
//              (token_dispatch.h); d(loss)/d(prob) is reduce-scattered to the tokens' ranks.
//              At TP > 1 the tokens gathered over EP are the TP group's (ETP = TP; the TP
//              combine then sums the shards) or the rank's own shard (ETP 1).
// The experts see at most EP*N rows (every rank's rows for this rank's experts, the stated
// dropless bound).
// Runtime statistics for logging and the expert-bias update live in MoeStats until
// training/moe_step.cpp collects them once per global batch.
#pragma once
#include <array>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "model/mlp.h"
#include "model/moe/experts.h"
#include "model/moe/router.h"
#include "model/moe/routing.h"
#include "model/moe/shared_experts.h"
#include "ops/moe_route.h"
#include "parallel/expert_parallel/alltoall_dispatch.h"

namespace mcpp::model::moe {

// What one global batch's training forwards saw (one layer). The aux losses' arrays hold
// aux_loss, seq_aux_loss, global_aux_loss in this order (0 where off).
struct MoeStats {
  using Key = std::pair<int64_t, int64_t>;  // (iteration, sample offset): one micro-batch
  std::vector<double> tokens_per_expert;  // [E] rows per expert, summed over forwards
  std::array<double, 3> aux_loss{};       // sums over forwards of L / coeff
  double z_loss = 0;
  int64_t forwards = 0;
  std::array<double, 3> last_aux_loss{};  // the last forward's losses (with coefficients)
  double last_z_loss = 0;
  std::set<Key> seen;  // micro-batches counted: a recomputed forward counts none twice
  // global_aux_loss (Megatron's global_tokens_per_expert and ga_steps): the sum over this
  // global batch's micro-batches of their counts summed over DP x CP [E], how many, and each
  // micro-batch's running mean as its first forward computed it (a recomputed forward reuses
  // it: the same routing, gradient and loss as without recomputation). On the host [E] f64,
  // or, with the device routing, on the device (its dtype).
  std::vector<double> global_sum;
  std::map<Key, std::vector<double>> global_mean;
  Tensor dev_global_sum;
  std::map<Key, Tensor> dev_global_mean;
  int64_t global_steps = 0;
  // The device routing keeps its losses on the device ([4]: aux_loss, seq_aux_loss,
  // global_aux_loss, z-loss without their coefficients; f32 on CUDA): the sums over forwards
  // and the last forward's; MoeLayer::sync_stats moves them into the fields above once per
  // global batch.
  Tensor dev_sum, dev_last;
  int64_t dev_forwards = 0;
  double last_aux_sum() const { return last_aux_loss[0] + last_aux_loss[1] + last_aux_loss[2]; }
  // The next global batch starts counting (once per global batch, after the expert bias
  // update and the log have read the counts).
  void restart();
};

// The router's settings for the routing ops (ops/moe_route.h).
ops::MoeRouteSpec route_spec(const TransformerConfig::Moe& m);

// The rows the permuted buffers need for T tokens (the stated bound of dropless routing).
int64_t max_rows(const TransformerConfig& c, int64_t T);

class MoeLayer final : public MlpModule {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  static void add_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out);
  MoeLayer(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved final : MlpSaved {
    Router::Saved router;
    Tensor logits_all;  // [T,E] the group's logits (TP)
    Tensor x_full;      // [T,H] the group's tokens (TP)
    Tensor xp;          // [Nmax,H] permuted input
    Tensor probs;       // [Nmax] statistics dtype
    GroupedExperts::Saved experts;
    SharedExperts::Saved shared;
    // Host: the routing and the index tensors of this micro-batch.
    std::vector<double> logits;
    Routing routing;
    Tensor src, off, rows;
    int64_t n_rows = 0;  // N, the rows this rank sends to the experts
    // Device routing (on_device; see forward): experts [T,k] i64, weights [T,k] (f32 on
    // CUDA), each row's t*k + j (-1: padding) [N] and each (token, slot)'s row (-1: dropped)
    // [T*k] (i64), and the aux loss's counts [G,E] (summed over CP).
    bool on_device = false;
    Tensor d_idx, d_prob, d_row_slot, d_slot_row, d_aux_counts;
    std::vector<int64_t> row_counts;  // rows per expert sent by this rank
    std::vector<int64_t> row_slot;    // per row: token * k + slot (group numbering), -1 padding
    // Expert parallelism: the exchange's plan and the rows on the experts' side.
    parallel::expert_parallel::AlltoallPlan plan;
    Tensor xe;  // [EP*Nmax,H] rows for this rank's experts, by local expert
    Tensor pe;  // [EP*Nmax] their probabilities
    // The all-gather dispatcher at EP > 1: the experts' rows over the gathered tokens.
    std::vector<int64_t> ag_counts;  // [El] rows per local expert
    std::vector<int64_t> ag_slot;    // per row: (gathered token * k + slot)
    Tensor ag_src, ag_off, ag_rows;  // permute / unpermute indices over EP*T tokens
    int64_t ag_t0 = 0, ag_tokens = 0;  // the group's tokens [t0, t0 + T) this rank sent
  };
  std::unique_ptr<MlpSaved> new_saved() const override { return std::make_unique<Saved>(); }
  void saved_specs(const Dims& d, bool keep_activation, MlpSaved& s,
                   const TensorVisitor& v) const override;
  void scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                     const TensorVisitor& v) const override;
  void forward(const Tensor& x, MlpSaved& s, const Tensor* residual, Tensor& y, Workspace& ws,
               const StepContext& cx) const override;
  void backward(const Tensor& dy, const Tensor& x, MlpSaved& s, Tensor& dx, Workspace& ws,
                const StepContext& cx) override;

  // The EP group (cfg.moe.ep_size ranks, this one cfg.moe.ep_rank); needed before the first
  // forward when ep_size > 1.
  void set_expert_parallel_group(comm::Communicator* ep);
  // The expert-tensor-parallel group, needed when 1 < ETP < TP (ETP consecutive TP ranks).
  void set_expert_tensor_parallel_group(comm::Communicator* etp);
  // The DP x CP group over which global_aux_loss sums its counts (Megatron's TP x DP x CP:
  // a TP group routes the same tokens on every member); null or one rank: this rank's.
  void set_global_aux_group(comm::Communicator* dp_cp) { dp_cp_ = dp_cp; }

  // Where the routing runs (see the top of this file): Auto, the routing ops on the GPU
  // where they apply and the host routing elsewhere; Host, always the host routing; Ops,
  // the routing ops wherever they apply, the CPU included (tests of the device path
  // without a GPU). A layer starts with MCPP_MOE_ROUTING's (auto | host | ops; unset:
  // auto), read when it is built.
  enum class RoutingPlace { Auto, Host, Ops };
  void set_routing_place(RoutingPlace p) { place_ = p; }
  RoutingPlace routing_place() const { return place_; }
  static RoutingPlace routing_place_from_env();

  int layer() const { return layer_; }
  const Router& router() const { return router_; }
  MoeStats& stats() const { return stats_; }
  // The device routing's losses into stats() (aux_loss, z_loss, last_*): one transfer; call
  // before reading them (a no-op for the host routing).
  void sync_stats() const;

 private:
  struct Scratch {
    Tensor yp, gp, dxp;              // [Nmax,H]
    Tensor dp;                       // [Nmax] statistics dtype
    Tensor y_full, g_full, dx_full;  // [T,H]
    Tensor dx_local, sh_y;           // [Tl,H]
    Tensor dlogits_all, dlogits;     // [T,E], [Tl,E] router dtype
    Tensor ye, ge, dxe;              // [EP*Nmax,H] expert parallelism: the experts' side
    Tensor dpe;                      // [EP*Nmax]
    Tensor tall;                     // [EP*T,H] the all-gather dispatcher's gathered rows
    GroupedExperts::Scratch experts;
    SharedExperts::Scratch shared;
  };
  void scratch_list(const Dims& d, Workspace& ws, const TensorVisitor& v) const;
  // Whether this forward routes with the routing ops: CUDA (or RoutingPlace::Ops), every
  // row of the routing on this rank (ETP = TP), not the all-gather dispatcher at EP > 1, not
  // sinkhorn, at most 256 experts and top-16 on CUDA (the others keep the host routing,
  // routing.h).
  bool routes_on_device(const StepContext& cx, bool all_rows) const;
  // The routing ops' settings for this pass (the CP group's size included).
  ops::MoeRouteSpec spec(const StepContext& cx) const;
  // The device routing of the group's logits [T,E]: fills s's device tensors, the host row
  // counts (the one transfer) and the statistics.
  void route_device(const Tensor& logits, Saved& s, const StepContext& cx) const;
  // global_aux_loss's counts: this micro-batch's [E] -> the running mean over the global
  // batch's micro-batches of their sums over the DP x CP group, once per micro-batch (a
  // recomputed forward gets the first forward's). On the host, and on the device.
  void global_mean(std::vector<double>& counts, const StepContext& cx) const;
  void global_mean_device(Tensor& counts, const StepContext& cx) const;
  // The host routing's statistics of one forward (counted once per training micro-batch).
  void count_host(const Routing& r, const StepContext& cx) const;
  // The tokens this rank sends to the experts: [t0, t0 + tokens) of the TP group's routing;
  // group: what gathers them (and reduce-scatters their outputs), null for none; all: every
  // row of the routing (ETP = TP); complete: the experts' outputs need no sum (ETP 1).
  struct Span {
    comm::Communicator* group = nullptr;
    int64_t t0 = 0, tokens = 0;
    bool all = true, complete = false;
  };
  Span span(const StepContext& cx) const;
  // The all-gather dispatcher at EP > 1: x [T,H], the routing's tokens [t0, t0 + T) (the
  // TP group's all at ETP = TP, this rank's shard at ETP 1) -> out [T,H] (their outputs of
  // every EP rank's experts: ETP shard partial sums, or complete at ETP 1); backward: g
  // [T,H] -> dx [T,H] and dprob of those tokens (written into the group's [T_group*k]).
  void allgather_forward(const Tensor& x, int64_t t0, int64_t T, Tensor& out, Saved& s,
                         const StepContext& cx) const;
  void allgather_backward(const Tensor& g, Tensor& dx, Saved& s, std::vector<double>& dprob,
                          const StepContext& cx);

  const TransformerConfig* cfg_;
  int layer_;
  Router router_;
  GroupedExperts experts_;
  std::unique_ptr<SharedExperts> shared_;
  comm::Communicator* ep_ = nullptr;
  comm::Communicator* etp_ = nullptr;  // only when 1 < ETP < TP
  comm::Communicator* dp_cp_ = nullptr;  // global_aux_loss's DP x CP group
  RoutingPlace place_ = RoutingPlace::Auto;
  // The scratch, shared by every MoE layer through the Workspace (ws.moe): nothing in it
  // outlives one forward or one backward. scratch() points w_ at it on entry.
  Scratch& scratch(Workspace& ws) const;
  mutable Scratch* w_ = nullptr;
  mutable MoeStats stats_;
};

}  // namespace mcpp::model::moe
