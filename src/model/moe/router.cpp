#include "model/moe/router.h"

#include <cmath>

#include "base/philox.h"
#include "model/moe/transfer.h"
#include "ops/ops.h"

namespace mcpp::model::moe {

void Router::add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params) {
  // Duplicated on every TP rank; it sees the rank's sequence shard under SP, so its gradient
  // is a partial sum over TP (finalize_model_grads all-reduces it, as Megatron's router
  // weight marked sequence_parallel).
  params.push_back(make_param(layer_param_name(layer, "mlp.router.weight"),
                              {c.moe.num_experts, c.hidden_size}, TpSplit::None, Init::Normal,
                              c.init_method_std, true, layer, c.tp_size, c.sp()));
  // --add-bias-linear: TopKRouter's bias [E], drawn by init_method as the weight (normal, not
  // zero), not decayed, marked sequence_parallel as the weight.
  if (c.add_bias_linear)
    params.push_back(make_param(layer_param_name(layer, "mlp.router.bias"), {c.moe.num_experts},
                                TpSplit::None, Init::Normal, c.init_method_std, false, layer,
                                c.tp_size, c.sp()));
}

void Router::add_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out) {
  if (!c.moe.expert_bias) return;
  BufferInfo b;
  b.name = layer_param_name(layer, "mlp.router.expert_bias");
  b.global_shape = {c.moe.num_experts};
  b.dtype = DType::F32, b.layer = layer, b.init = Init::Zeros;
  out.push_back(std::move(b));
}

DType Router::router_dtype(const TransformerConfig& c) {
  return c.moe.router_dtype_given ? c.moe.router_dtype : c.dtype;
}

Router::Router(const TransformerConfig& c, int layer, const ParamStore* store)
    : w_(ParamStore::view(store, layer_param_name(layer, "mlp.router.weight"))),
      b_(ParamStore::view(store, layer_param_name(layer, "mlp.router.bias"))),
      dtype_(router_dtype(c)),
      layer_(layer),
      random_(c.moe.force_load_balancing || c.moe.force_biased_given),
      jitter_(c.moe.input_jitter_eps) {
  const std::string bn = layer_param_name(layer, "mlp.router.expert_bias");
  if (store && store->has_buffer(bn)) bias_ = store->buffer(bn);
  MCPP_CHECK_HINT(!(c.device == Device::CUDA && dtype_ == DType::F64),
                  "use --moe-router-dtype fp32 on the GPU",
                  "--moe-router-dtype fp64 on CUDA is not implemented yet (the GEMMs run in "
                  "bf16, f16 or f32 there)");
  MCPP_CHECK_HINT(!(c.device == Device::CPU && dtype_ != DType::F32 && dtype_ != DType::F64),
                  "use --moe-router-dtype fp32 or fp64", "router dtype {} on the CPU",
                  dtype_name(dtype_));
}

void Router::saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                         const TensorVisitor& v) {
  const DType rd = router_dtype(c);
  v(s.x_cast, {d.Tl, d.H}, rd, rd != d.dt);
  v(s.x_jit, {d.Tl, d.H}, d.dt, c.moe.input_jitter_eps > 0);
  v(s.logits, {d.Tl, c.moe.num_experts}, rd, true);
}

namespace {
// A parameter in the router dtype (undefined stays undefined).
Tensor in_dtype(const Tensor& t, DType dt, Stream& st) {
  if (!t.defined() || t.dtype() == dt) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  ops::copy(t, c, st);
  return c;
}
// grad += t, t in another dtype (the router dtype's gradient into the parameter's).
void add_into(Tensor& grad, const Tensor& t, Stream& st) {
  Tensor tg = Tensor::empty(grad.shape(), grad.dtype(), grad.device());
  ops::copy(t, tg, st);
  ops::add(grad, tg, grad, st);
}
}  // namespace

void Router::jitter(const Tensor& x, Tensor& y, const StepContext& cx) const {
  const Tensor x3 = x.view({cx.Sl, cx.B, cx.H});
  Tensor y3 = y.view({cx.Sl, cx.B, cx.H});
  ops::uniform_scale(x3, 1.0 - jitter_, 1.0 + jitter_,
                     dropout_key(*cx.cfg, cx.keys, layer_, DropoutSite::RouterJitter), cx.g, y3,
                     cx.stream());
}

// With random logits the gating GEMM's output would be overwritten: it is not run (the
// backward needs only x, or its cast, and W).
void Router::forward(const Tensor& x_in, Saved& s, const StepContext& cx) const {
  Stream& st = cx.stream();
  if (jitter_ > 0) {
    ensure(s.x_jit, x_in.shape(), x_in.dtype(), x_in.device());  // generation: no specs
    jitter(x_in, s.x_jit, cx);
  }
  const Tensor& x = jitter_ > 0 ? s.x_jit : x_in;
  if (dtype_ == x.dtype()) {
    if (!random_) ops::linear_forward(x, w_.w, in_dtype(b_.w, dtype_, st), s.logits, st);
  } else {
    // Megatron's --moe-router-dtype: the GEMM in fp32/fp64 on upcast input, weight and bias
    // (router_gating_linear).
    ops::copy(x, s.x_cast, st);
    if (!random_)
      ops::linear_forward(s.x_cast, in_dtype(w_.w, dtype_, st), in_dtype(b_.w, dtype_, st),
                          s.logits, st);
  }
  if (random_) random_logits(s.logits, cx);
}

void Router::random_logits(Tensor& logits, const StepContext& cx) const {
  const auto& m = cx.cfg->moe;
  const int64_t E = m.num_experts, rows = logits.size(0);
  Stream& st = cx.stream();
  MCPP_CHECK(rows == cx.Sl * cx.B, "Router: {} logit rows for a shard of {} x {} tokens", rows,
             cx.Sl, cx.B);
  ops::GlobalIndex3 g = cx.g;  // the tokens' (s, b) as the hidden dropout's, then e
  g.offset[2] = 0, g.global[2] = E;
  Tensor l3 = logits.view({cx.Sl, cx.B, E});
  ops::random_normal(dropout_key(*cx.cfg, cx.keys, layer_, DropoutSite::RouterLogits), g, l3, st);
  if (!m.force_biased_given) return;
  // The bias [E]: per micro-batch (index: its first sample's, x E) or per layer (a key
  // without the iteration, index e).
  const bool per_layer = m.force_biased < 0;
  StepKeys k = cx.keys;
  if (per_layer) k.iteration = -1;
  const ops::DropoutKey key = dropout_key(*cx.cfg, k, layer_, DropoutSite::RouterBias);
  const uint64_t first = per_layer ? 0 : uint64_t(cx.keys.sample_offset) * uint64_t(E);
  std::vector<double> b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    b[size_t(e)] = std::abs(m.force_biased) * Philox::normal(key.seed, key.stream,
                                                             first + uint64_t(e));
  Tensor bias = Tensor::empty({1, E}, logits.dtype(), logits.device());
  from_host(b, bias, st);
  Tensor ones = Tensor::empty({rows, 1}, logits.dtype(), logits.device());
  ops::fill(ones, 1.0, st);
  ops::gemm(false, false, 1.0, ones, bias, 1.0, logits, st);  // logits[t, :] += bias
}

void Router::backward(const Tensor& dlogits, const Tensor& x, const Saved& s, Tensor& dx,
                      const StepContext& cx) {
  Stream& st = cx.stream();
  if (jitter_ > 0) {  // the GEMM's gradients on x_j, then dx += (dlogits W) u
    const Tensor& xj = s.x_jit;
    Tensor dxj = Tensor::empty(xj.shape(), xj.dtype(), xj.device());
    if (dtype_ == xj.dtype()) {
      ops::linear_backward(dlogits, xj, w_.w, dxj, false, w_.g, b_.g, st);
    } else {
      ops::fill(dxj, 0.0, st);
      cast_backward(dlogits, s, dxj, st);
    }
    jitter(dxj, dxj, cx);
    ops::add(dx, dxj, dx, st);
    return;
  }
  if (dtype_ == x.dtype()) {  // (b_.g undefined without the bias: no bias gradient)
    ops::linear_backward(dlogits, x, w_.w, dx, /*accumulate_dx=*/true, w_.g, b_.g, st);
    return;
  }
  cast_backward(dlogits, s, dx, st);
}

// The router-dtype GEMM's backward: dx += dxc (in the model's dtype), dW += dw, db += db.
void Router::cast_backward(const Tensor& dlogits, const Saved& s, Tensor& dx, Stream& st) {
  auto zeros = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, dtype_, dx.device());
    ops::fill(t, 0.0, st);  // (Tensor::zeros is host-only)
    return t;
  };
  Tensor dw = zeros(w_.w.shape()), db = b_.w.defined() ? zeros(b_.w.shape()) : Tensor();
  Tensor dxc = Tensor::empty(s.x_cast.shape(), dtype_, dx.device());
  ops::linear_backward(dlogits, s.x_cast, in_dtype(w_.w, dtype_, st), dxc, false, dw, db, st);
  add_into(dx, dxc, st);
  add_into(w_.g, dw, st);
  if (db.defined()) add_into(b_.g, db, st);
}

std::vector<double> Router::expert_bias() const {
  if (!bias_.defined()) return {};
  return to_host(bias_, ops::default_stream(bias_.device()));
}

void Router::set_expert_bias(const std::vector<double>& b) const {
  Tensor dst = bias_;
  from_host(b, dst, ops::default_stream(bias_.device()));
}

}  // namespace mcpp::model::moe
