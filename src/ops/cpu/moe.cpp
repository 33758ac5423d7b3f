// MoE token permutation and probability ops (catalogue.inc, ---- MoE), CPU reference.
// Row loops are parallel over output rows; each output element is written by one thread
// and summed in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <utility>
#include <vector>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

void gather_rows(const Tensor& x, const Tensor& src, Tensor& y, Stream& s) {
  const Check c{"gather_rows"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.dtype(src, "src", DType::I64);
  const int64_t N = src.numel(), H = N ? y.numel() / N : 0, T = H ? x.numel() / H : 0;
  c.numel(y, "y", N * H);
  const int64_t* si = src.data<int64_t>();
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* in = x.data<F>();
    F* out = y.data<F>();
#pragma omp parallel for schedule(static) if (N * H > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      MCPP_CHECK(si[n] >= 0 && si[n] < T, "gather_rows: row {} of {}", si[n], T);
      std::copy(in + si[n] * H, in + (si[n] + 1) * H, out + n * H);
    }
  });
}

void moe_unpermute(const Tensor& y, const Tensor& offsets, const Tensor& rows, Tensor& out,
                   Stream& s) {
  const Check c{"moe_unpermute"};
  c.stream(s);
  const DType dt = c.floating(out, "out");
  c.dtype(y, "y", dt);
  c.dtype(offsets, "offsets", DType::I64);
  c.dtype(rows, "rows", DType::I64);
  const int64_t T = offsets.numel() - 1, H = T > 0 ? out.numel() / T : 0;
  c.numel(out, "out", T * H);
  const int64_t* off = offsets.data<int64_t>();
  const int64_t* ri = rows.data<int64_t>();
  const int64_t N = H ? y.numel() / H : 0;
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* in = y.data<F>();
    F* o = out.data<F>();
#pragma omp parallel for schedule(static) if (T * H > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      F* dst = o + t * H;
      std::fill(dst, dst + H, F(0));
      for (int64_t i = off[t]; i < off[t + 1]; ++i) {
        MCPP_CHECK(ri[i] >= 0 && ri[i] < N, "moe_unpermute: row {} of {}", ri[i], N);
        const F* r = in + ri[i] * H;
        for (int64_t h = 0; h < H; ++h) dst[h] += r[h];
      }
    }
  });
}

void moe_scale_rows(const Tensor& x, const Tensor& p, Tensor& y, Stream& s) {
  const Check c{"moe_scale_rows"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.dtype(p, "p", dt);
  const int64_t N = p.numel(), F_ = N ? x.numel() / N : 0;
  c.numel(y, "y", N * F_);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* in = x.data<F>();
    const F* pp = p.data<F>();
    F* out = y.data<F>();
#pragma omp parallel for schedule(static) if (N * F_ > kParallelGrain)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F_; ++f) out[n * F_ + f] = in[n * F_ + f] * pp[n];
  });
}

void moe_row_dot(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  const Check c{"moe_row_dot"};
  c.stream(s);
  const DType dt = c.floating(a, "a");
  c.dtype(b, "b", dt);
  c.dtype(out, "out", dt);
  const int64_t N = out.numel(), F_ = N ? a.numel() / N : 0;
  c.numel(b, "b", N * F_);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* x = a.data<F>();
    const F* w = b.data<F>();
    F* o = out.data<F>();
#pragma omp parallel for schedule(static) if (N * F_ > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      F acc = 0;
      for (int64_t f = 0; f < F_; ++f) acc += x[n * F_ + f] * w[n * F_ + f];
      o[n] = acc;
    }
  });
}

// ---- the experts' activation with the probabilities: the reference is the composition of
// the unfused ops (activations.cpp, the two above), so the fused op is those bits by
// construction; the CUDA kernels are checked against it.

namespace {

// fc1 [N, W] (W = 2F for the gated units, F otherwise) and the F of ap / dap [N, F];
// N = p.numel().
std::pair<int64_t, int64_t> act_scale_dims(const Check& c, const Tensor& fc1, const Tensor& p,
                                           int64_t fc1_mult, const Tensor& out,
                                           const char* oname) {
  const int64_t N = p.numel(), F = N ? out.numel() / N : 0;
  c.numel(out, oname, N * F);
  c.numel(fc1, "fc1", fc1_mult * N * F);
  return {N, F};
}

void act_forward(const Tensor& fc1, MlpAct a, Tensor& act, Stream& s) {
  if (a.plain_swiglu()) return swiglu_forward(fc1, act, s);
  if (a.gated()) return cpu::glu_forward(fc1, a, act, s);  // (not ops::, found by ADL)
  if (a.kind == MlpActivation::SquaredRelu) return squared_relu_forward(fc1, act, s);
  if (a.kind == MlpActivation::GeluErf) return gelu_erf_forward(fc1, act, s);
  gelu_forward(fc1, act, s);
}

void act_backward(const Tensor& dact, const Tensor& fc1, MlpAct a, Tensor& dx, Stream& s) {
  if (a.plain_swiglu()) return swiglu_backward(dact, fc1, dx, s);
  if (a.gated()) return cpu::glu_backward(dact, fc1, a, dx, s);
  if (a.kind == MlpActivation::SquaredRelu) return squared_relu_backward(dact, fc1, dx, s);
  if (a.kind == MlpActivation::GeluErf) return gelu_erf_backward(dact, fc1, dx, s);
  gelu_backward(dact, fc1, dx, s);
}

}  // namespace

void moe_act_scale_forward(const Tensor& fc1, const Tensor& p, MlpAct a, Tensor& ap,
                           Stream& s) {
  const Check c{"moe_act_scale_forward"};
  c.stream(s);
  const DType dt = c.floating(fc1, "fc1");
  c.dtype(ap, "ap", dt);
  c.dtype(p, "p", dt);
  const int64_t m = a.gated() ? 2 : 1;
  const auto [N, F] = act_scale_dims(c, fc1, p, m, ap, "ap");
  if (N * F == 0) return;
  Tensor act = Tensor::empty({N, F}, dt);  // [N, F]
  act_forward(fc1.view({N, m * F}), a, act, s);
  moe_scale_rows(act, p, ap, s);
}

void moe_act_scale_backward(const Tensor& dap, const Tensor& fc1, const Tensor& p, MlpAct a,
                            Tensor& dfc1, Tensor& dp, Tensor& ap, Stream& s) {
  const Check c{"moe_act_scale_backward"};
  c.stream(s);
  const DType dt = c.floating(fc1, "fc1");
  c.dtype(dap, "dap", dt), c.dtype(p, "p", dt), c.dtype(dfc1, "dfc1", dt), c.dtype(dp, "dp", dt);
  const int64_t m = a.gated() ? 2 : 1;
  const auto [N, F] = act_scale_dims(c, fc1, p, m, dap, "dap");
  c.numel(dfc1, "dfc1", fc1.numel());
  c.numel(dp, "dp", N);
  if (ap.defined()) c.dtype(ap, "ap", dt), c.numel(ap, "ap", N * F);
  if (N == 0) return;
  const Shape fc1_shape{N, m * F};
  Tensor act = Tensor::empty({N, F}, dt), dact = Tensor::empty({N, F}, dt);  // [N, F] x2
  act_forward(fc1.view(fc1_shape), a, act, s);
  moe_row_dot(dap, act, dp, s);
  moe_scale_rows(dap, p, dact, s);
  Tensor dx = dfc1.view(fc1_shape);
  act_backward(dact, fc1.view(fc1_shape), a, dx, s);
  if (ap.defined()) moe_scale_rows(act, p, ap, s);  // last: ap may alias dap
}

// ---- the experts' fc2 bias times the probabilities

void moe_bias_scale_forward(const Tensor& b, const Tensor& p, Tensor& y, Stream& s) {
  const Check c{"moe_bias_scale_forward"};
  c.stream(s);
  const DType dt = c.floating(y, "y");
  c.dtype(b, "b", dt), c.dtype(p, "p", dt);
  const int64_t N = p.numel(), H = b.numel();
  c.numel(y, "y", N * H);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F *bb = b.data<F>(), *pp = p.data<F>();
    F* o = y.data<F>();
#pragma omp parallel for schedule(static) if (N * H > kParallelGrain)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) o[n * H + h] += pp[n] * bb[h];
  });
}

void moe_bias_scale_backward(const Tensor& dy, const Tensor& b, const Tensor& p, Tensor& db,
                             Tensor& dp, Stream& s) {
  const Check c{"moe_bias_scale_backward"};
  c.stream(s);
  const DType dt = c.floating(dy, "dy");
  c.dtype(b, "b", dt), c.dtype(p, "p", dt), c.dtype(db, "db", dt), c.dtype(dp, "dp", dt);
  const int64_t N = p.numel(), H = b.numel();
  c.numel(dy, "dy", N * H), c.numel(db, "db", H), c.numel(dp, "dp", N);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F *g = dy.data<F>(), *bb = b.data<F>(), *pp = p.data<F>();
    F *dbb = db.data<F>(), *dpp = dp.data<F>();
#pragma omp parallel for schedule(static) if (N * H > kParallelGrain)
    for (int64_t h = 0; h < H; ++h) {  // rows in order: each column's sum is one thread's
      F acc = 0;
      for (int64_t n = 0; n < N; ++n) acc += pp[n] * g[n * H + h];
      dbb[h] += acc;
    }
#pragma omp parallel for schedule(static) if (N * H > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      F acc = 0;
      for (int64_t h = 0; h < H; ++h) acc += g[n * H + h] * bb[h];
      dpp[n] += acc;
    }
  });
}

}  // namespace mcpp::ops::cpu
