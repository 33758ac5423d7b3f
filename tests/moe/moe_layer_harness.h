// One MoE layer run on its own (forward and backward of one micro-batch), for comparing where
// its routing runs (model/moe/moe_layer.h, RoutingPlace) on the CPU and the GPU, and a
// stand-in for a context-parallel group inside one process.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "base/philox.h"
#include "comm/communicator.h"
#include "model/moe/moe_layer.h"
#include "model/moe/transfer.h"
#include "model/params.h"
#include "ops/ops.h"

namespace mcpp::test {

// A group of two whose other member holds exactly this member's data: an all-reduce sum
// doubles, every other call is an error. It stands for a CP group of two ranks with the same
// tokens, which is enough to check that the aux counts are summed over the group and that T
// is the group's (host and device routing alike); on the CPU and the GPU.
class MirrorCommunicator final : public comm::Communicator {
 public:
  MirrorCommunicator() : Communicator("cp", {0, 1}, 0, std::chrono::seconds(30)) {}
  std::string_view backend() const override { return "mirror"; }
  int all_reduces = 0;

 protected:
  comm::Work start_all_reduce(Tensor& t, comm::ReduceOp op, const comm::OpDesc&,
                              Stream& s) override {
    MCPP_CHECK(op == comm::ReduceOp::Sum, "MirrorCommunicator: only sums");
    ops::add(t, t, t, s);
    ++all_reduces;
    return {};
  }
  comm::Work start_all_gather(const Tensor&, Tensor&, const comm::OpDesc&, Stream&) override {
    return none("all_gather");
  }
  comm::Work start_reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, const comm::OpDesc&,
                                  Stream&) override {
    return none("reduce_scatter");
  }
  comm::Work start_all_to_all(const Tensor&, Tensor&, const comm::OpDesc&, Stream&) override {
    return none("all_to_all");
  }
  comm::Work start_all_to_allv(const Tensor&, std::vector<int64_t>, std::vector<int64_t>,
                               Tensor&, std::vector<int64_t>, std::vector<int64_t>,
                               const comm::OpDesc&, Stream&) override {
    return none("all_to_allv");
  }
  comm::Work start_broadcast(Tensor&, int, const comm::OpDesc&, Stream&) override {
    return none("broadcast");
  }
  comm::Work start_send(const Tensor&, int, const comm::OpDesc&, Stream&) override {
    return none("send");
  }
  comm::Work start_recv(Tensor&, int, const comm::OpDesc&, Stream&) override {
    return none("recv");
  }
  comm::Work start_barrier(const comm::OpDesc&, Stream&) override { return {}; }
  [[noreturn]] void abort_job() const override { std::abort(); }
  bool can_access(Device) const override { return true; }

 private:
  static comm::Work none(const char* what) {
    MCPP_CHECK(false, "MirrorCommunicator: {} is not implemented", what);
    return {};
  }
};

// What one forward and backward of a MoE layer gave, as doubles on the host.
struct MoeLayerRun {
  std::vector<double> y, dx, grads, params;
  std::vector<double> tokens_per_expert;
  double aux_loss = 0, z_loss = 0;  // with their coefficients, this micro-batch's
  bool on_device = false;           // whether the routing ops routed it
};

// Layer 0 of c (c.device, c.dtype; c.cp_size ranks sharing the aux losses through cp, and
// global_aux_loss's DP x CP group dp_cp) with its parameters initialised from c.seed, or
// copied from `params` (a flat f64 host copy) when given; input and output gradient drawn
// from `seed`, [S*B, H] rows.
inline MoeLayerRun run_moe_layer(const model::TransformerConfig& c, comm::Communicator* cp,
                                 model::moe::MoeLayer::RoutingPlace place, int64_t S, int64_t B,
                                 uint64_t seed, const std::vector<double>* params = nullptr,
                                 comm::Communicator* dp_cp = nullptr) {
  using model::moe::from_host;
  using model::moe::to_host;
  model::ParamStore store;
  std::vector<model::ParamInfo> ps;
  model::moe::MoeLayer::add_params(c, 0, ps);
  for (auto& p : ps) store.add(p);
  std::vector<model::BufferInfo> bs;
  model::moe::MoeLayer::add_buffers(c, 0, bs);
  for (auto& b : bs) store.add_buffer(b);
  store.allocate(c.dtype, c.grad_dtype(), c.device, 0, 1);
  store.initialize(c.seed);
  Stream& st = ops::default_stream(c.device);
  if (params) from_host(*params, store.flat_params(), st);
  store.zero_grads();
  model::moe::MoeLayer layer(c, 0, &store);
  layer.set_routing_place(place);
  layer.set_global_aux_group(dp_cp);
  model::StepKeys keys;
  keys.iteration = 4;
  const model::StepContext cx = model::make_step_context(c, S, B, keys, nullptr, cp);
  auto saved = layer.new_saved();
  model::Workspace ws;
  model::allocate([&](const model::TensorVisitor& v) { layer.saved_specs(cx, false, *saved, v); },
                  c.device, true);
  const int64_t T = S * B, H = c.hidden_size;
  std::vector<double> xv(static_cast<size_t>(T * H)), dyv(xv.size());
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = Philox::normal(seed, 1, i), dyv[i] = 0.1 * Philox::normal(seed, 2, i);
  auto rows = [&] { return Tensor::empty({T, H}, c.dtype, c.device); };
  Tensor x = rows(), dy = rows(), y = rows(), dx = rows();
  from_host(xv, x, st), from_host(dyv, dy, st);
  layer.forward(x, *saved, nullptr, y, ws, cx);
  MoeLayerRun out;
  out.on_device = static_cast<model::moe::MoeLayer::Saved&>(*saved).on_device;
  layer.backward(dy, x, *saved, dx, ws, cx);
  layer.sync_stats();
  out.y = to_host(y, st), out.dx = to_host(dx, st);
  out.grads = to_host(store.flat_grads(), st), out.params = to_host(store.flat_params(), st);
  out.tokens_per_expert = layer.stats().tokens_per_expert;
  out.aux_loss = layer.stats().last_aux_sum(), out.z_loss = layer.stats().last_z_loss;
  return out;
}

}  // namespace mcpp::test
