// The MoE layer's routing with the routing ops (catalogue.inc, ---- MoE routing): on the GPU
// the whole routing stays on the device, and the one device-to-host transfer per layer and
// micro-batch is the E row counts (with the E expert-bias counts in the same copy).
//
//   moe_route_topk    experts and weights per (token, slot)          [T,k]
//   moe_route_index   rows grouped by expert, with capacity / padding per block of tokens
//   moe_route_counts  the aux losses' counts c [R,E], aux_loss's and seq_aux_loss's summed
//                     over the CP group, global_aux_loss's over DP x CP and averaged over the
//                     global batch's micro-batches so far (all-reduces of device tensors)
//   moe_route_stats   the aux / z losses for the log (on the device until sync_stats)
//
// Context parallelism: each CP rank routes its own tokens; the counts are summed over the CP
// group before the losses and the backward read them, and T is the CP group's (spec.cp), as
// the host routing does it (routing.h, AuxLossGroup); global_aux_loss's likewise over the
// DP x CP group (spec.global_ranks).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "model/moe/moe_layer.h"
#include "model/moe/transfer.h"
#include "ops/ops.h"
#include "parallel/context_parallel/cp_mappings.h"

namespace mcpp::model::moe {

ops::MoeRouteSpec route_spec(const TransformerConfig::Moe& m) {
  ops::MoeRouteSpec r;
  using Score = TransformerConfig::Moe::Score;
  r.E = m.num_experts, r.k = m.topk, r.pre_softmax = m.pre_softmax;
  r.score = m.score == Score::Sigmoid        ? ops::MoeScore::Sigmoid
            : m.score == Score::SqrtSoftplus ? ops::MoeScore::SqrtSoftplus
                                             : ops::MoeScore::Softmax;
  r.num_groups = m.num_groups, r.group_topk = m.group_topk, r.scaling = m.topk_scaling_factor;
  r.capacity_factor = m.capacity_factor, r.drop_by_position = m.drop_by_position;
  r.pad_to_capacity = m.pad_to_capacity, r.pad_multiple = m.pad_multiple;
  using Balance = TransformerConfig::Moe::Balance;
  r.aux_coeff = m.coeff(Balance::AuxLoss), r.seq_aux_coeff = m.coeff(Balance::SeqAuxLoss);
  r.global_aux_coeff = m.coeff(Balance::GlobalAuxLoss);
  r.aux = r.aux_coeff > 0, r.seq_aux = r.seq_aux_coeff > 0, r.global_aux = r.global_aux_coeff > 0;
  r.z = m.z_loss_coeff > 0, r.z_coeff = m.z_loss_coeff;
  return r;
}

MoeLayer::RoutingPlace MoeLayer::routing_place_from_env() {
  const char* v = std::getenv("MCPP_MOE_ROUTING");
  if (!v || !*v || std::strcmp(v, "auto") == 0) return RoutingPlace::Auto;
  if (std::strcmp(v, "host") == 0) return RoutingPlace::Host;
  MCPP_CHECK_HINT(std::strcmp(v, "ops") == 0, "unset it, or set it to auto, host or ops",
                  "MCPP_MOE_ROUTING is '{}': auto (the routing ops on the GPU where they apply), "
                  "host (the fp64 host routing everywhere) or ops (the routing ops wherever "
                  "they apply, the CPU included) (docs/environment.md)",
                  v);
  return RoutingPlace::Ops;
}

ops::MoeRouteSpec MoeLayer::spec(const StepContext& cx) const {
  ops::MoeRouteSpec r = route_spec(cfg_->moe);
  r.cp = cx.cp_comm ? cx.cp_comm->size() : 1;
  // global_aux_loss counts training micro-batches only (none in evaluation, as Megatron's).
  r.global_aux = r.global_aux && cx.keys.training;
  r.global_ranks = dp_cp_ ? dp_cp_->size() : 1;
  return r;
}

bool MoeLayer::routes_on_device(const StepContext& cx, bool all_rows) const {
  const auto& m = cfg_->moe;
  if (place_ == RoutingPlace::Host) return false;
  // The routing ops cover every router but sinkhorn, and build the rows of the whole
  // routing (ETP = TP); the all-gather dispatcher at EP > 1 exchanges the host routing.
  const bool covered =
      all_rows && !(ep_ && !m.alltoall) && !m.sinkhorn();
  if (cx.dev == Device::CUDA)
    return covered && m.num_experts <= ops::kMoeRouteMaxExpertsCuda &&
           m.topk <= ops::kMoeRouteMaxTopkCuda;
  // The CPU ops compute in the logits' dtype, which must be the statistics dtype.
  return place_ == RoutingPlace::Ops && covered &&
         Router::router_dtype(*cfg_) == cfg_->stat_dtype();
}

void MoeLayer::route_device(const Tensor& logits, Saved& s, const StepContext& cx) const {
  const auto& m = cfg_->moe;
  Stream& st = cx.stream();
  const ops::MoeRouteSpec sp = spec(cx);
  // The dispatch group's ranks each route a block of the tokens (capacity per block).
  const int64_t blocks = cx.sp && cx.tp_comm ? cx.tp_comm->size() : 1;
  const int64_t T = cx.T, E = m.num_experts, k = m.topk, Nmax = max_rows(*cfg_, T);
  // f32 on CUDA (Megatron's fp32 routing precision); the logits' dtype on the CPU.
  const DType rdt = cx.dev == Device::CUDA ? DType::F32 : logits.dtype();
  auto i64 = [&](int64_t n) { return Tensor::empty({n}, DType::I64, cx.dev); };
  s.d_idx = i64(T * k), s.d_slot_row = i64(T * k), s.off = i64(T + 1);
  Tensor src = i64(Nmax), row_slot = i64(Nmax), rows = i64(Nmax);
  s.d_prob = Tensor::empty({T * k}, rdt, cx.dev);
  ops::moe_route_topk(logits, router_.expert_bias_tensor(), sp, s.d_idx, s.d_prob, st);
  Tensor counts = i64(2 * E), rows_per_expert = counts.narrow(0, E),
         bias_counts = counts.narrow(E, E);
  ops::moe_route_index(s.d_idx, s.d_prob, sp, blocks, rows_per_expert, bias_counts, src, row_slot,
                       s.d_slot_row, s.off, rows, st);
  // The one device-to-host transfer: the GEMM shapes and the all-to-all splits need the
  // rows per expert (and the expert-bias counts ride along).
  Tensor hc = Tensor::empty({2 * E}, DType::I64);
  ops::copy(counts, hc, st);
  const int64_t* h = hc.data<int64_t>();
  s.row_counts.assign(h, h + E);
  int64_t N = 0;
  for (int64_t e = 0; e < E; ++e) N += h[e];
  s.n_rows = N;
  s.src = src.narrow(0, N), s.d_row_slot = row_slot.narrow(0, N), s.rows = rows.narrow(0, N);
  s.row_slot.clear();
  s.d_aux_counts = Tensor::empty({std::max<int64_t>(1, ops::moe_aux_rows(sp, cx.B)) * E}, rdt,
                                 cx.dev);
  const bool count =
      cx.keys.training && stats_.seen.insert({cx.keys.iteration, cx.keys.sample_offset}).second;
  if (count) {
    for (int64_t e = 0; e < E; ++e) stats_.tokens_per_expert[size_t(e)] += double(h[E + e]);
    ++stats_.forwards;
  }
  if (!sp.any_aux() && !sp.z) return;
  if (!stats_.dev_sum.defined()) {
    stats_.dev_sum = Tensor::empty({4}, rdt, cx.dev);
    stats_.dev_last = Tensor::empty({4}, rdt, cx.dev);
    ops::fill(stats_.dev_sum, 0.0, st);
  }
  if (sp.any_aux()) {
    ops::moe_route_counts(logits, sp, cx.B, s.d_aux_counts, st);
    // Context parallelism: the counts of the CP group's tokens (exact: integers in f32).
    const int64_t n_cp = ops::moe_aux_global_row(sp, cx.B) * E;
    if (cx.cp_comm && n_cp > 0) {
      Tensor rows = s.d_aux_counts.narrow(0, n_cp);
      parallel::context_parallel::sum_over_cp(rows, *cx.cp_comm, st);
    }
    if (sp.global_aux) {
      Tensor row = s.d_aux_counts.narrow(n_cp, E);
      global_mean_device(row, cx);
    }
  }
  ops::moe_route_stats(logits, s.d_aux_counts, sp, cx.B, stats_.dev_last, st);
  if (count) ops::add(stats_.dev_sum, stats_.dev_last, stats_.dev_sum, st), ++stats_.dev_forwards;
}

void MoeLayer::global_mean_device(Tensor& counts, const StepContext& cx) const {
  Stream& st = cx.stream();
  const MoeStats::Key key{cx.keys.iteration, cx.keys.sample_offset};
  if (auto it = stats_.dev_global_mean.find(key); it != stats_.dev_global_mean.end()) {
    ops::copy(it->second, counts, st);  // a recomputed forward: the first forward's mean
    return;
  }
  // The counts of the DP x CP group's tokens (exact: integers in f32), their running sum,
  // its mean over the micro-batches so far.
  if (dp_cp_) parallel::context_parallel::sum_over_data_cp(counts, *dp_cp_, st);
  if (!stats_.dev_global_sum.defined()) {
    stats_.dev_global_sum = Tensor::empty({counts.numel()}, counts.dtype(), cx.dev);
    ops::fill(stats_.dev_global_sum, 0.0, st);
  }
  ops::add(stats_.dev_global_sum, counts, stats_.dev_global_sum, st);
  ops::copy(stats_.dev_global_sum, counts, st);
  ops::scale(counts, 1.0 / double(++stats_.global_steps), st);
  Tensor mean = Tensor::empty({counts.numel()}, counts.dtype(), cx.dev);
  ops::copy(counts, mean, st);
  stats_.dev_global_mean[key] = mean;
}

void MoeLayer::sync_stats() const {
  if (!stats_.dev_sum.defined()) return;
  Stream& st = ops::default_stream(stats_.dev_sum.device());
  const std::vector<double> sum = to_host(stats_.dev_sum, st), last = to_host(stats_.dev_last, st);
  const auto& m = cfg_->moe;
  using Balance = TransformerConfig::Moe::Balance;
  const Balance types[3] = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  for (size_t i = 0; i < 3; ++i) {
    stats_.aux_loss[i] += sum[i];
    stats_.last_aux_loss[i] = last[i] * m.coeff(types[i]);
  }
  stats_.z_loss += sum[3], stats_.last_z_loss = last[3] * m.z_loss_coeff;
  ops::fill(stats_.dev_sum, 0.0, st);
  stats_.dev_forwards = 0;
}

}  // namespace mcpp::model::moe
