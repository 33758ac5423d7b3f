#include "model/moe/moe_layer.h"

#include "model/moe/transfer.h"
#include "ops/graph.h"
#include "ops/ops.h"
#include "parallel/expert_parallel/token_dispatch.h"
#include "parallel/host_collectives.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model::moe {

namespace ep = parallel::expert_parallel;

namespace {

// The dispatch group: the TP group under sequence parallelism (each rank holds a sequence
// shard); none otherwise (TP 1, or generation, where every TP rank holds every token).
comm::Communicator* dispatch_group(const StepContext& cx) { return cx.sp ? cx.tp_comm : nullptr; }

// The group the experts are split over (ETP > 1): the ETP group when it is smaller than TP,
// else the TP group; null when the experts are whole. FP8 reduces a split tensor's amax
// over it (model/moe/experts.h).
comm::Communicator* expert_tp_group(const TransformerConfig& c, comm::Communicator* etp,
                                    const StepContext& cx) {
  if (c.moe_etp() <= 1) return nullptr;
  return etp ? etp : cx.tp_comm;
}

// The rows a rank sends to the experts (host): the permute's source token, the unpermute's
// CSR (offsets, rows), rows per expert, and per row (token * k + slot), -1 for padding.
struct RowSet {
  std::vector<int64_t> src, off, rows, counts, slot;
};

// Every row of the routing (the group's T tokens; ETP = TP, or TP 1).
RowSet all_rows(const Routing& r) {
  RowSet o{r.row_token, r.tok_offsets, r.tok_rows, r.counts, {}};
  o.slot.resize(r.row_token.size());
  for (size_t n = 0; n < o.slot.size(); ++n)
    o.slot[n] = r.row_slot[n] >= 0 ? r.row_token[n] * r.k + r.row_slot[n] : -1;
  return o;
}

// ETP 1 at TP > 1: the rows of this rank's own tokens [t0, t0 + Tl) of the group's routing,
// in its order (expert-major, tokens ascending), tokens renumbered from 0. Each TP rank's
// experts are whole, so a token's rows need no other TP rank (Megatron's ETP-1 hand-over).
RowSet own_rows(const Routing& r, int64_t t0, int64_t Tl) {
  RowSet o;
  o.counts.assign(r.counts.size(), 0);
  o.off.assign(size_t(Tl + 1), 0);
  int64_t n = 0;
  for (size_t e = 0; e < r.counts.size(); ++e)
    for (int64_t end = n + r.counts[e]; n < end; ++n) {
      const int64_t t = r.row_token[size_t(n)] - t0;
      if (t < 0 || t >= Tl) continue;
      const int32_t q = r.row_slot[size_t(n)];
      o.src.push_back(t), o.slot.push_back(q >= 0 ? (t + t0) * r.k + q : -1);
      ++o.counts[e], ++o.off[size_t(t + 1)];
    }
  for (int64_t t = 0; t < Tl; ++t) o.off[size_t(t + 1)] += o.off[size_t(t)];
  o.rows.assign(o.src.size(), 0);
  std::vector<int64_t> fill(o.off.begin(), o.off.end() - 1);
  for (size_t i = 0; i < o.src.size(); ++i) o.rows[size_t(fill[size_t(o.src[i])]++)] = int64_t(i);
  return o;
}

}  // namespace

int64_t max_rows(const TransformerConfig& c, int64_t T) {
  return ops::moe_route_max_rows(route_spec(c.moe), T, c.sp() ? c.tp_size : 1);
}

void MoeLayer::add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params) {
  Router::add_params(c, layer, params);
  GroupedExperts::add_params(c, layer, params);
  if (c.moe.shared_ffn_hidden_size > 0) SharedExperts::add_params(c, layer, params);
}

void MoeLayer::add_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out) {
  Router::add_buffers(c, layer, out);
}

MoeLayer::MoeLayer(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c), layer_(layer), router_(c, layer, store), experts_(c, layer, store),
      place_(routing_place_from_env()) {
  if (c.moe.shared_ffn_hidden_size > 0) shared_ = std::make_unique<SharedExperts>(c, layer, store);
  stats_.tokens_per_expert.assign(size_t(c.moe.num_experts), 0.0);
}

void MoeStats::restart() {
  std::fill(tokens_per_expert.begin(), tokens_per_expert.end(), 0.0);
  aux_loss = {}, z_loss = 0, forwards = 0, seen.clear();
  global_sum.clear(), global_mean.clear(), dev_global_mean.clear(), global_steps = 0;
  dev_global_sum = Tensor();
}

void MoeLayer::count_host(const Routing& r, const StepContext& cx) const {
  const auto& m = cfg_->moe;
  stats_.last_aux_loss = {r.aux_loss, r.seq_aux_loss, r.global_aux_loss};
  stats_.last_z_loss = r.z_loss;
  if (!cx.keys.training || !stats_.seen.insert({cx.keys.iteration, cx.keys.sample_offset}).second)
    return;
  for (int64_t e = 0; e < m.num_experts; ++e)
    stats_.tokens_per_expert[size_t(e)] += r.tokens_per_expert[size_t(e)];
  using B = TransformerConfig::Moe::Balance;
  const B types[3] = {B::AuxLoss, B::SeqAuxLoss, B::GlobalAuxLoss};
  for (size_t i = 0; i < 3; ++i)
    if (m.coeff(types[i]) > 0) stats_.aux_loss[i] += stats_.last_aux_loss[i] / m.coeff(types[i]);
  if (m.z_loss_coeff > 0) stats_.z_loss += r.z_loss / m.z_loss_coeff;
  ++stats_.forwards;
}

void MoeLayer::global_mean(std::vector<double>& counts, const StepContext& cx) const {
  const MoeStats::Key key{cx.keys.iteration, cx.keys.sample_offset};
  if (auto it = stats_.global_mean.find(key); it != stats_.global_mean.end()) {
    counts = it->second;  // a recomputed forward: the first forward's mean
    return;
  }
  if (dp_cp_ && dp_cp_->size() > 1) parallel::sum_over(*dp_cp_, counts);
  if (stats_.global_sum.empty()) stats_.global_sum.assign(counts.size(), 0.0);
  const double n = double(++stats_.global_steps);
  for (size_t e = 0; e < counts.size(); ++e)
    stats_.global_sum[e] += counts[e], counts[e] = stats_.global_sum[e] / n;
  stats_.global_mean[key] = counts;
}

void MoeLayer::set_expert_tensor_parallel_group(comm::Communicator* etp) {
  etp_ = etp && etp->size() > 1 ? etp : nullptr;
}

MoeLayer::Span MoeLayer::span(const StepContext& cx) const {
  comm::Communicator* group = dispatch_group(cx);
  const int64_t etp = cfg_->moe_etp();
  Span sp;
  if (!group || etp >= group->size()) {  // ETP = TP (or TP 1): the dispatch group's tokens
    sp.group = group, sp.tokens = cx.T, sp.all = true, sp.complete = false;
    return sp;
  }
  // ETP < TP: the expert grid puts ETP consecutive TP ranks in one ETP group, whose
  // sequence shards are consecutive too.
  const int64_t tp_rank = group->rank();
  sp.tokens = etp * cx.Tl, sp.t0 = tp_rank / etp * sp.tokens, sp.all = false;
  sp.complete = etp == 1;
  if (etp > 1) {
    MCPP_CHECK(etp_ && etp_->size() == etp && etp_->rank() == tp_rank % etp,
               "MoE layer {}: ETP {} at TP {} needs its expert-tensor-parallel group (TP rank "
               "{})", layer_, etp, group->size(), tp_rank);
    sp.group = etp_;
  }
  return sp;
}

void MoeLayer::set_expert_parallel_group(comm::Communicator* ep) {
  const int64_t n = ep ? ep->size() : 1;
  MCPP_CHECK(n == cfg_->moe.ep_size && (!ep || ep->rank() == cfg_->moe.ep_rank),
             "MoE layer {}: an EP group of {} ranks (this one {}) for a model built for EP {} "
             "(rank {})",
             layer_, n, ep ? ep->rank() : 0, cfg_->moe.ep_size, cfg_->moe.ep_rank);
  ep_ = n > 1 ? ep : nullptr;
}

// keep_activation (--keep-mlp-activations, as the dense MLP's): the layer keeps the permuted
// input xp and the experts' fc2 input for backward; otherwise the backward gathers xp again
// from the layer's input (its norm's output, kept anyway) and recomputes fc2's input
// (experts.h). Same bits, k + k I/H rows of H fewer per token kept (Mixtral-style, micro-batch
// 16: 805 MB a layer). Under expert parallelism xp is only the forward's send buffer.
void MoeLayer::saved_specs(const Dims& d, bool keep_activation, MlpSaved& sb,
                           const TensorVisitor& v) const {
  auto& s = static_cast<Saved&>(sb);
  const int64_t E = cfg_->moe.num_experts, Nmax = max_rows(*cfg_, d.T);
  const bool epp = cfg_->moe.ep_size > 1;
  Router::saved_specs(*cfg_, d, s.router, v);
  v(s.logits_all, {d.T, E}, Router::router_dtype(*cfg_), d.sp);
  v(s.x_full, {d.T, d.H}, d.dt, d.sp);
  v(s.xp, {Nmax, d.H}, d.dt, keep_activation && !epp);
  v(s.probs, {Nmax}, d.sdt, true);
  const int64_t Ne = Nmax * cfg_->moe.ep_size;  // the experts' rows: every EP rank's, at most
  v(s.xe, {Ne, d.H}, d.dt, epp);
  v(s.pe, {Ne}, d.sdt, epp);
  GroupedExperts::saved_specs(*cfg_, Ne, d.dt, keep_activation, s.experts, v);
  if (shared_) shared_->saved_specs(d, keep_activation, s.shared, v);
}

MoeLayer::Scratch& MoeLayer::scratch(Workspace& ws) const {
  if (!ws.moe) ws.moe = std::make_shared<Scratch>();
  w_ = static_cast<Scratch*>(ws.moe.get());
  return *w_;
}

void MoeLayer::scratch_list(const Dims& d, Workspace& ws, const TensorVisitor& v) const {
  scratch(ws);
  const int64_t E = cfg_->moe.num_experts, Nmax = max_rows(*cfg_, d.T);
  const DType rd = Router::router_dtype(*cfg_);
  v(w_->yp, {Nmax, d.H}, d.dt, true);
  v(w_->gp, {Nmax, d.H}, d.dt, true);
  v(w_->dxp, {Nmax, d.H}, d.dt, true);
  v(w_->dp, {Nmax}, d.sdt, true);
  v(w_->y_full, {d.T, d.H}, d.dt, true);
  v(w_->g_full, {d.T, d.H}, d.dt, d.sp);
  v(w_->dx_full, {d.T, d.H}, d.dt, true);
  v(w_->dx_local, {d.Tl, d.H}, d.dt, true);
  v(w_->sh_y, {d.Tl, d.H}, d.dt, shared_ != nullptr);
  v(w_->dlogits_all, {d.T, E}, rd, true);
  v(w_->dlogits, {d.Tl, E}, rd, d.sp);
  const bool epp = cfg_->moe.ep_size > 1;
  const int64_t Ne = Nmax * cfg_->moe.ep_size;
  v(w_->ye, {Ne, d.H}, d.dt, epp);
  v(w_->ge, {Ne, d.H}, d.dt, epp);
  v(w_->dxe, {Ne, d.H}, d.dt, epp);
  v(w_->dpe, {Ne}, d.sdt, epp);
  v(w_->tall, {d.T * cfg_->moe.ep_size, d.H}, d.dt, epp && !cfg_->moe.alltoall);
  GroupedExperts::scratch_specs(*cfg_, Ne, d.dt, d.sdt, w_->experts, v);
  if (shared_) shared_->scratch_specs(d, w_->shared, ws, v);
}

void MoeLayer::scratch_specs(const Dims& d, bool /*uses_scratch_activation*/, Workspace& ws,
                             const TensorVisitor& v) const {
  scratch_list(d, ws, v);
}

void MoeLayer::forward(const Tensor& x, MlpSaved& sb, const Tensor* residual, Tensor& y,
                       Workspace& ws, const StepContext& cx) const {
  auto& s = static_cast<Saved&>(sb);
  const auto& m = cfg_->moe;
  Stream& st = cx.stream();
  // This layer's own scratch, for these sizes (a no-op once allocated).
  allocate([&](const TensorVisitor& v) { scratch_list(cx, ws, v); }, cx.dev, false);
  comm::Communicator* group = dispatch_group(cx);
  const int64_t T = cx.T;
  MCPP_CHECK(m.ep_size == 1 || ep_, "MoE layer {}: EP {} without an EP group", layer_, m.ep_size);
  // EP x TP (ETP = TP, sequence parallel): the TP group routes its gathered tokens, then
  // the all-to-all (or all-gather) runs over the EP group (ranks of one TP rank), each
  // rank's experts compute their ETP shard, and the TP reduce-scatter of the combine sums
  // the shards. ETP 1: each rank's own tokens only, to whole experts and back.
  MCPP_CHECK(!ep_ || !cx.tp_comm || group,
             "MoE layer {}: expert parallelism with TP > 1 needs sequence parallelism", layer_);
  // --moe-shared-expert-overlap: the shared expert from here on a side stream, beside the
  // router, the routing's wait for its counts and the routed experts; joined before its
  // output is added, in the order of the serial path (the same bits).
  ops::SideStream side(st, shared_ && m.shared_expert_overlap);
  if (shared_ && m.shared_expert_overlap) {
    StepContext sc = cx;
    sc.st = &side.stream();
    shared_->forward(x, s.shared, w_->sh_y, w_->shared, ws, sc);
  }
  auto add_shared = [&] {
    if (!shared_) return;
    if (m.shared_expert_overlap) side.join();
    else shared_->forward(x, s.shared, w_->sh_y, w_->shared, ws, cx);
    ops::add(y, w_->sh_y, y, st);
  };
  // Router: this rank's logits, then the group's (every member routes all T tokens).
  router_.forward(x, s.router, cx);
  const Tensor* logits = &s.router.logits;
  if (group) {
    ep::dispatch(s.router.logits, s.logits_all, group, st);
    logits = &s.logits_all;
  }
  const Span sp = span(cx);
  s.on_device = routes_on_device(cx, sp.all);
  if (s.on_device) {
    route_device(*logits, s, cx);
  } else {
    s.logits = to_host(*logits, st);
    const std::vector<double> bias = router_.expert_bias();
    // The aux counts over the CP group, global_aux_loss's over DP x CP (routing.h).
    AuxLossGroup cp;
    if (cx.cp_comm) {
      cp.ranks = cx.cp_comm->size();
      cp.sum = [&](std::vector<double>& v) { parallel::sum_over(*cx.cp_comm, v); };
    }
    if (m.coeff(TransformerConfig::Moe::Balance::GlobalAuxLoss) > 0) {
      cp.global_ranks = dp_cp_ ? dp_cp_->size() : 1;
      cp.global = [&](std::vector<double>& v) { global_mean(v, cx); };
    }
    s.routing = route(m, s.logits.data(), T, cx.B, bias.empty() ? nullptr : bias.data(),
                      group ? group->size() : 1, cp, cx.keys.training);
    count_host(s.routing, cx);
  }
  const Routing& r = s.routing;

  // The span's tokens on this rank (the TP group's at ETP = TP, the ETP group's at ETP < TP,
  // its own at ETP 1), and where their outputs go: y itself when complete (ETP 1), else
  // partial sums over the ETP shards that the combine over sp.group reduce-scatters.
  Tensor xsub;
  const Tensor* xf = &x;
  if (sp.group) {
    xsub = s.x_full.narrow(0, sp.tokens);
    ep::dispatch(x, xsub, sp.group, st);
    xf = &xsub;
  }
  Tensor yn = sp.complete ? y : w_->y_full.narrow(0, sp.tokens);

  if (ep_ && !m.alltoall) {  // the all-gather dispatcher over the EP group
    allgather_forward(*xf, sp.t0, sp.tokens, yn, s, cx);
    if (!sp.complete) ep::combine(yn, y, sp.group, st);
    add_shared();
    if (residual) ops::add(y, *residual, y, st);
    return;
  }

  // Dispatch: the span's tokens, permuted into expert-grouped rows with their weights.
  int64_t N = 0;
  Tensor p;
  if (s.on_device) {  // route_device built the index; the weights follow their rows
    N = s.n_rows;
    p = s.probs.narrow(0, N);
    ops::moe_gather(s.d_prob, s.d_row_slot, p, st);  // padding rows (slot -1): 0
  } else {
    RowSet rs = sp.all ? all_rows(r) : own_rows(r, sp.t0, sp.tokens);
    N = s.n_rows = int64_t(rs.src.size());
    s.src = index_tensor(rs.src, cx.dev, st);
    s.off = index_tensor(rs.off, cx.dev, st);
    s.rows = index_tensor(rs.rows, cx.dev, st);
    s.row_counts = std::move(rs.counts);
    s.row_slot = std::move(rs.slot);
    std::vector<double> pr(static_cast<size_t>(N), 0.0);
    for (int64_t n = 0; n < N; ++n)
      if (s.row_slot[size_t(n)] >= 0) pr[size_t(n)] = r.prob[size_t(s.row_slot[size_t(n)])];
    p = s.probs.narrow(0, N);
    from_host(pr, p, st);
  }
  // xp: kept, or in the backward-only scratch dxp (the backward gathers it again)
  Tensor xp = (s.xp.defined() ? s.xp : w_->dxp).narrow(0, N), yp = w_->yp.narrow(0, N);
  ops::gather_rows(*xf, s.src, xp, st);

  // Experts, then the combine: each token sums its rows (its k experts' weighted outputs).
  if (ep_) {  // the rows to the ranks owning their experts, the outputs back
    s.plan = ep::plan_alltoall(s.row_counts, ep_, st);
    const int64_t Ne = s.plan.rows_out;
    Tensor xe = s.xe.narrow(0, Ne), pe = s.pe.narrow(0, Ne), ye = w_->ye.narrow(0, Ne);
    ep::dispatch_alltoall(xp, xe, s.plan, ep_, st);
    ep::dispatch_alltoall(p, pe, s.plan, ep_, st);
    if (Ne > 0)
      experts_.forward(xe, pe, s.plan.tokens_per_local_expert, s.experts, ye, w_->experts, cx,
                       expert_tp_group(*cfg_, etp_, cx));
    ep::combine_alltoall(ye, yp, s.plan, ep_, st);
  } else if (N > 0) {
    experts_.forward(xp, p, s.row_counts, s.experts, yp, w_->experts, cx,
                     expert_tp_group(*cfg_, etp_, cx));
  }
  ops::moe_unpermute(yp, s.off, s.rows, yn, st);
  // No SP (generation): the TP ranks' ETP shards summed; whole experts (ETP 1) are not.
  if (!group && cx.tp_comm && cfg_->moe_etp() > 1) parallel::reduce_from_tp(yn, *cx.tp_comm, st);
  if (!sp.complete) ep::combine(yn, y, sp.group, st);
  add_shared();
  if (residual) ops::add(y, *residual, y, st);
}

void MoeLayer::backward(const Tensor& dy, const Tensor& x, MlpSaved& sb, Tensor& dx,
                        Workspace& ws, const StepContext& cx) {
  auto& s = static_cast<Saved&>(sb);
  const auto& m = cfg_->moe;
  Stream& st = cx.stream();
  scratch(ws);
  comm::Communicator* group = dispatch_group(cx);
  MCPP_CHECK(group || !cx.tp_comm, "MoeLayer::backward at TP {} needs --sequence-parallel",
             cfg_->tp_size);
  const Routing& r = s.routing;
  const int64_t T = cx.T, E = m.num_experts, k = m.topk, N = s.n_rows;
  const Span sp = span(cx);  // as in the forward

  // Shared experts first: they write dx (=), and the routed experts' part goes to dx_local
  // and is added; without them the routed experts' part is written straight into dx. The
  // router's part is added last. --moe-shared-expert-overlap: the shared experts on a side
  // stream, joined before the add.
  ops::SideStream side(st, shared_ && m.shared_expert_overlap);
  if (shared_) {
    StepContext sc = cx;
    sc.st = &side.stream();
    shared_->backward(dy, x, s.shared, dx, w_->shared, ws, sc);
  }
  Tensor& routed = shared_ ? w_->dx_local : dx;

  // Combine's dual, the unpermute's dual (a permute), the experts, the permute's dual.
  const Tensor* g = &dy;
  Tensor gsub, dxn = sp.complete ? routed : w_->dx_full.narrow(0, sp.tokens);
  if (sp.group) {
    gsub = w_->g_full.narrow(0, sp.tokens);
    ep::combine_backward(dy, gsub, sp.group, st);
    g = &gsub;
  }
  // d(loss)/dp per (token, slot), for the router below (the host routing's).
  std::vector<double> dprob, dl;
  if (!s.on_device) dprob.assign(size_t(T * k), 0.0), dl.resize(size_t(T * E));
  if (ep_ && !m.alltoall) {
    allgather_backward(*g, dxn, s, dprob, cx);
    if (!sp.complete) ep::dispatch_backward(dxn, routed, sp.group, st);  // shards summed
    side.join();
    if (shared_) ops::add(dx, w_->dx_local, dx, st);
  } else {
    Tensor p = s.probs.narrow(0, N);
    Tensor gp = w_->gp.narrow(0, N), dxp = w_->dxp.narrow(0, N), dp = w_->dp.narrow(0, N);
    // The permuted input, kept or gathered again as the forward gathered it (into the
    // forward-only scratch yp); expert parallelism reads the received rows xe instead.
    Tensor xp = (s.xp.defined() ? s.xp : w_->yp).narrow(0, N);
    if (!s.xp.defined() && !ep_ && N > 0)
      ops::gather_rows(sp.group ? s.x_full.narrow(0, sp.tokens) : x, s.src, xp, st);
    ops::gather_rows(*g, s.src, gp, st);
    if (ep_) {  // the combine's dual, the experts, the dispatch's dual
      const int64_t Ne = s.plan.rows_out;
      Tensor xe = s.xe.narrow(0, Ne), pe = s.pe.narrow(0, Ne), ge = w_->ge.narrow(0, Ne);
      Tensor dxe = w_->dxe.narrow(0, Ne), dpe = w_->dpe.narrow(0, Ne);
      ep::combine_alltoall_backward(gp, ge, s.plan, ep_, st);
      if (Ne > 0)
        experts_.backward(ge, xe, pe, s.plan.tokens_per_local_expert, s.experts, dxe, dpe,
                          w_->experts, cx, expert_tp_group(*cfg_, etp_, cx));
      ep::dispatch_alltoall_backward(dxe, dxp, s.plan, ep_, st);
      ep::dispatch_alltoall_backward(dpe, dp, s.plan, ep_, st);
    } else if (N > 0) {
      experts_.backward(gp, xp, p, s.row_counts, s.experts, dxp, dp, w_->experts, cx,
                        expert_tp_group(*cfg_, etp_, cx));
    }
    // d(loss)/dp of tokens outside the span stays 0 here (their ETP group sets it).
    ops::moe_unpermute(dxp, s.off, s.rows, dxn, st);
    if (!sp.complete) ep::dispatch_backward(dxn, routed, sp.group, st);
    side.join();
    if (shared_) ops::add(dx, w_->dx_local, dx, st);
    if (s.on_device) {  // each (token, slot)'s d(loss)/dp from its row (dropped: 0)
      Tensor dprob_d = Tensor::empty({T * k}, s.d_prob.dtype(), cx.dev);
      ops::moe_gather(dp, s.d_slot_row, dprob_d, st);
      s.d_prob = dprob_d;  // the forward's weights are not needed any more
    } else {
      const std::vector<double> dpv = to_host(dp, st);
      for (int64_t n = 0; n < N; ++n)
        if (s.row_slot[size_t(n)] >= 0) dprob[size_t(s.row_slot[size_t(n)])] = dpv[size_t(n)];
    }
  }

  // Router: through the routing into the logits, with the aux / z-loss gradients of this
  // rank's own rows.
  const double aux_scale =
      (cx.keys.loss_tokens > 0    ? double(cx.Sg * cx.B) / cx.keys.loss_tokens
       : cx.keys.global_batch > 0 ? double(cx.B) / double(cx.keys.global_batch)
                                  : 1.0) *
      cx.keys.loss_scale;
  const int64_t r0 = group ? int64_t(group->rank()) * cx.Tl : 0;
  if (s.on_device) {
    const Tensor& logits = group ? s.logits_all : s.router.logits;
    ops::moe_route_backward(logits, s.d_idx, s.d_prob, s.d_aux_counts, spec(cx), cx.B,
                            aux_scale, r0, r0 + cx.Tl, w_->dlogits_all, st);
  } else {
    route_backward(m, r, s.logits.data(), dprob.data(), aux_scale, r0, r0 + cx.Tl, cx.B,
                   dl.data());
    from_host(dl, w_->dlogits_all, st);
  }
  Tensor& dlogits = group ? w_->dlogits : w_->dlogits_all;
  ep::dispatch_backward(w_->dlogits_all, dlogits, group, st);
  router_.backward(dlogits, x, s.router, dx, cx);
}

// ---- expert parallelism, the all-gather dispatcher ---------------------------------------

namespace {

// A f64 tensor with v on s's device (the routing exchange).
Tensor f64_tensor(const std::vector<double>& v, Device dev, Stream& st) {
  return ops::on_device(Tensor::from(v, {int64_t(v.size())}), dev, st);
}

}  // namespace

void MoeLayer::allgather_forward(const Tensor& x, int64_t t0, int64_t T, Tensor& out, Saved& s,
                                 const StepContext& cx) const {
  const auto& m = cfg_->moe;
  Stream& st = cx.stream();
  const Routing& r = s.routing;
  const int64_t k = m.topk, EPn = ep_->size(), El = m.local_experts();
  const int64_t e0 = m.first_expert(), Tg = EPn * T;
  s.ag_t0 = t0, s.ag_tokens = T;

  // Every EP rank's routing: per (token, slot) the expert (-1 when dropped) and the weight.
  std::vector<double> mine(static_cast<size_t>(T * k * 2));
  for (int64_t i = 0; i < T * k; ++i) {
    const size_t ri = size_t(t0 * k + i);
    mine[size_t(2 * i)] = r.kept[ri] ? double(r.idx[ri]) : -1.0;
    mine[size_t(2 * i + 1)] = r.prob[ri];
  }
  Tensor all = Tensor::empty({Tg * k * 2}, DType::F64, cx.dev);
  ep_->all_gather(f64_tensor(mine, cx.dev, st), all, st);
  const std::vector<double> rt = to_host(all, st);

  // This rank's experts' rows over the gathered tokens: expert-major, tokens ascending
  // (the serial order), and each gathered token's rows for the combine.
  std::vector<int64_t> src, off(static_cast<size_t>(Tg + 1), 0), rows;
  std::vector<double> pr;
  s.ag_counts.assign(size_t(El), 0);
  s.ag_slot.clear();
  for (int64_t j = 0; j < El; ++j)
    for (int64_t t = 0; t < Tg; ++t)
      for (int64_t q = 0; q < k; ++q)
        if (rt[size_t(2 * (t * k + q))] == double(e0 + j)) {
          src.push_back(t), s.ag_slot.push_back(t * k + q), pr.push_back(rt[size_t(2 * (t * k + q) + 1)]);
          ++s.ag_counts[size_t(j)], ++off[size_t(t + 1)];
        }
  for (int64_t t = 0; t < Tg; ++t) off[size_t(t + 1)] += off[size_t(t)];
  rows.assign(src.size(), 0);
  {
    std::vector<int64_t> fill(off.begin(), off.end() - 1);
    for (size_t n = 0; n < src.size(); ++n) rows[size_t(fill[size_t(src[n])]++)] = int64_t(n);
  }
  const int64_t Ne = int64_t(src.size());
  s.ag_src = index_tensor(src, cx.dev, st);
  s.ag_off = index_tensor(off, cx.dev, st);
  s.ag_rows = index_tensor(rows, cx.dev, st);

  // Gather the tokens, run this rank's experts on their rows, combine per gathered token,
  // and reduce-scatter: each rank gets its tokens' sums over every rank's experts.
  Tensor tall = w_->tall.narrow(0, Tg);
  ep::dispatch(x, tall, ep_, st);
  if (Ne > 0) {
    Tensor xe = s.xe.narrow(0, Ne), pe = s.pe.narrow(0, Ne), ye = w_->ye.narrow(0, Ne);
    ops::gather_rows(tall, s.ag_src, xe, st);
    from_host(pr, pe, st);
    experts_.forward(xe, pe, s.ag_counts, s.experts, ye, w_->experts, cx,
                     expert_tp_group(*cfg_, etp_, cx));
    ops::moe_unpermute(ye, s.ag_off, s.ag_rows, tall, st);
  } else {
    ops::fill(tall, 0.0, st);
  }
  ep::combine(tall, out, ep_, st);
}

void MoeLayer::allgather_backward(const Tensor& g, Tensor& dx, Saved& s,
                                  std::vector<double>& dprob, const StepContext& cx) {
  const auto& m = cfg_->moe;
  Stream& st = cx.stream();
  const int64_t T = s.ag_tokens, t0 = s.ag_t0, k = m.topk, EPn = ep_->size(), Tg = EPn * T;
  const int64_t Ne = int64_t(s.ag_slot.size());
  Tensor tall = w_->tall.narrow(0, Tg);
  ep::combine_backward(g, tall, ep_, st);  // every rank's output gradients
  std::vector<double> dp_all(static_cast<size_t>(Tg * k), 0.0);
  if (Ne > 0) {
    Tensor xe = s.xe.narrow(0, Ne), pe = s.pe.narrow(0, Ne), ge = w_->ge.narrow(0, Ne);
    Tensor dxe = w_->dxe.narrow(0, Ne), dpe = w_->dpe.narrow(0, Ne);
    ops::gather_rows(tall, s.ag_src, ge, st);
    experts_.backward(ge, xe, pe, s.ag_counts, s.experts, dxe, dpe, w_->experts, cx,
                      expert_tp_group(*cfg_, etp_, cx));
    ops::moe_unpermute(dxe, s.ag_off, s.ag_rows, tall, st);
    const std::vector<double> dpv = to_host(dpe, st);
    for (int64_t n = 0; n < Ne; ++n) dp_all[size_t(s.ag_slot[size_t(n)])] = dpv[size_t(n)];
  } else {
    ops::fill(tall, 0.0, st);
  }
  ep::dispatch_backward(tall, dx, ep_, st);  // to the tokens' ranks, summed
  Tensor dmine = Tensor::empty({T * k}, DType::F64, cx.dev);
  ep_->reduce_scatter(f64_tensor(dp_all, cx.dev, st), dmine, st);
  const std::vector<double> dm = to_host(dmine, st);
  std::copy(dm.begin(), dm.end(), dprob.begin() + t0 * k);  // tokens [t0, t0 + T) of the group
}

}  // namespace mcpp::model::moe
