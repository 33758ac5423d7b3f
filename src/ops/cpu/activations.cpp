// GELU (tanh form and exact), SwiGLU, squared ReLU and the gated units with offset and clamp
// (glu_*: quick-GEGLU, SwiGLU) on the CPU; one dtype per call, f32 or f64.
//   gelu, gelu_erf, squared_relu: x, y, dy, dx: any shape, same numel.  y, dx overwritten (=)
//   swiglu, glu: x, dx: [..., 2F] = [gate | up]; y, dy: [..., F]. y, dx overwritten (=)
//   swiglu_backward_recompute: swiglu_backward and swiglu_forward in one pass over x.
// f32 evaluates exp/tanh with the vectorisable exp_fast (cpu_common.h); f64 with libm,
// so the f64 path stays the accurate reference for gradient checks. The exact GELU takes
// libm's erf and exp in either precision.
#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

// sqrt(2/pi) and the cubic coefficient of Megatron's openai_gelu / bias_gelu.
constexpr double kGeluC = 0.7978845608028654, kGeluA = 0.044715;

}  // namespace

namespace {

// y[i] = f(x[i]) for an element-wise activation: f(R x) -> R, R the dtype's type.
template <class F>
void map_forward(const char* op, const Tensor& x, Tensor& y, Stream& s, F f) {
  const Check c{op};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.numel(y, "y", x.numel());
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    R* Y = y.data<R>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) Y[i] = f(X[i]);
  });
}

// dx[i] = dy[i] * f'(x[i]): grad(R x) -> R.
template <class F>
void map_backward(const char* op, const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s,
                  F grad) {
  const Check c{op};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(dx, "dx", dt);
  c.numel(dy, "dy", x.numel()), c.numel(dx, "dx", x.numel());
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>();
    R* DX = dx.data<R>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) DX[i] = DY[i] * grad(X[i]);
  });
}

}  // namespace

// ---- GELU ------------------------------------------------------------------------------

void gelu_forward(const Tensor& x, Tensor& y, Stream& s) {
  map_forward("gelu_forward", x, y, s, [](auto v) {
    using R = decltype(v);
    const R t = tanh_fast(R(kGeluC) * (v + R(kGeluA) * v * v * v));
    return R(0.5) * v * (R(1) + t);
  });
}

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2),  t = tanh(c (x + a x^3)).
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  map_backward("gelu_backward", dy, x, dx, s, [](auto v) {
    using R = decltype(v);
    const R v2 = v * v;
    const R t = tanh_fast(R(kGeluC) * (v + R(kGeluA) * v2 * v));
    return R(0.5) * (R(1) + t) +
           R(0.5) * v * (R(1) - t * t) * R(kGeluC) * (R(1) + R(3 * kGeluA) * v2);
  });
}

// ---- the exact GELU ------------------------------------------------------------------

namespace {
constexpr double kInvSqrt2 = 0.7071067811865476, kInvSqrt2Pi = 0.3989422804014327;
}  // namespace

// y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 (libm's erf in the dtype's precision).
void gelu_erf_forward(const Tensor& x, Tensor& y, Stream& s) {
  map_forward("gelu_erf_forward", x, y, s, [](auto v) {
    using R = decltype(v);
    return R(0.5) * v * (R(1) + std::erf(v * R(kInvSqrt2)));
  });
}

// d/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
void gelu_erf_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  map_backward("gelu_erf_backward", dy, x, dx, s, [](auto v) {
    using R = decltype(v);
    return R(0.5) * (R(1) + std::erf(v * R(kInvSqrt2))) +
           v * R(kInvSqrt2Pi) * std::exp(R(-0.5) * v * v);
  });
}

// ---- squared ReLU ----------------------------------------------------------------------

// y = relu(x)^2 (Primer, So et al. 2021; Megatron's squared_relu).
void squared_relu_forward(const Tensor& x, Tensor& y, Stream& s) {
  map_forward("squared_relu_forward", x, y, s, [](auto v) {
    using R = decltype(v);
    const R r = v > R(0) ? v : R(0);
    return r * r;
  });
}

// d/dx = 2 relu(x) (0 at x = 0, as torch's autograd of pow(relu(x), 2)).
void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  map_backward("squared_relu_backward", dy, x, dx, s, [](auto v) {
    using R = decltype(v);
    return R(2) * (v > R(0) ? v : R(0));
  });
}

// ---- SwiGLU ----------------------------------------------------------------------------

namespace {

// Checks x [..., 2F] against y [..., F] and returns (T rows, F).
std::pair<int64_t, int64_t> swiglu_dims(const Check& c, const Tensor& x, const Tensor& y,
                                        const char* yname) {
  c.min_dim(x, "x", 1);
  MCPP_CHECK(x.size(-1) % 2 == 0,
             "{}: x has shape {}: its last dimension must be 2F ([gate | "
             "up])",
             c.op, shape_str(x.shape()));
  const int64_t F = x.size(-1) / 2;
  Shape want = x.shape();
  want.back() = F;
  c.shape(y, yname, want);
  return {F ? x.numel() / (2 * F) : 0, F};
}

// The element rules, shared by the three ops below so that they agree bit for bit.
// y = silu(g) u, silu(g) = g sigmoid(g).
template <typename R>
inline R swiglu_value(R g, R u) {
  return g / (R(1) + exp_fast(-g)) * u;
}
// silu(g) = g s, s = sigmoid(g); silu'(g) = s (1 + g (1 - s)).
// dgate = dy up silu'(gate), dup = dy silu(gate).
template <typename R>
inline void swiglu_grad(R dy, R g, R u, R& dgate, R& dup) {
  const R sg = R(1) / (R(1) + exp_fast(-g));
  dgate = dy * u * sg * (R(1) + g * (R(1) - sg));
  dup = dy * g * sg;
}

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& y, Stream& s) {
  const Check c{"swiglu_forward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  const auto [T, F] = swiglu_dims(c, x, y, "y");
  dispatch_float(dt, [&, T = T, F = F](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    R* Y = y.data<R>();
#pragma omp parallel for schedule(static) if (T * F > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      const R *gate = X + t * 2 * F, *up = gate + F;
      R* yr = Y + t * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) yr[f] = swiglu_value(gate[f], up[f]);
    }
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, Stream& s) {
  const Check c{"swiglu_backward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(dx, "dx", dt);
  const auto [T, F] = swiglu_dims(c, x, dy, "dy");
  c.shape(dx, "dx", x.shape());
  dispatch_float(dt, [&, T = T, F = F](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>();
    R* DX = dx.data<R>();
#pragma omp parallel for schedule(static) if (T * F > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      const R *gate = X + t * 2 * F, *up = gate + F, *dyr = DY + t * F;
      R *dgate = DX + t * 2 * F, *dup = dgate + F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) swiglu_grad(dyr[f], gate[f], up[f], dgate[f], dup[f]);
    }
  });
}

// Both of the above from one read of x: the MLP backward, which needs the activation
// again for fc2's weight gradient. The same element functions, so the same bits.
void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               Stream& s) {
  const Check c{"swiglu_backward_recompute"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(dx, "dx", dt), c.dtype(y, "y", dt);
  const auto [T, F] = swiglu_dims(c, x, dy, "dy");
  c.shape(dx, "dx", x.shape()), c.shape(y, "y", dy.shape());
  dispatch_float(dt, [&, T = T, F = F](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>();
    R *DX = dx.data<R>(), *Y = y.data<R>();
#pragma omp parallel for schedule(static) if (T * F > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      const R *gate = X + t * 2 * F, *up = gate + F, *dyr = DY + t * F;
      R *dgate = DX + t * 2 * F, *dup = dgate + F, *yr = Y + t * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) {
        const R g = gate[f], u = up[f];
        yr[f] = swiglu_value(g, u);
        swiglu_grad(dyr[f], g, u, dgate[f], dup[f]);
      }
    }
  });
}

// ---- gated units with offset and clamp (quick-GEGLU, SwiGLU; Megatron's glu()) -----------

namespace {

// The element rules of glu_forward / glu_backward: the gate through silu (kQuick false) or
// quick_gelu (x sigmoid(1.702 x)), the up half plus the offset; with kClamp the clamp as
// torch.clamp's (a NaN stays NaN: no comparison holds for it), its gradient passed at the
// bounds and 0 outside. SwiGLU's expressions are swiglu_value's and swiglu_grad's: without
// offset and clamp the compiler contracts them alike, and the bits are theirs (the clamp's
// masks are kept out of that case, where they would change how the products fuse).
template <typename R, bool kQuick, bool kClamp>
struct GluRule {
  R off, c;
  static R slope(R g) {
    if constexpr (kQuick)
      return R(1.702) * g;
    else
      return g;
  }
  R gate(R v) const {
    if constexpr (kClamp) v = v > c ? c : v;
    return v;
  }
  R up(R v) const {
    if constexpr (kClamp) {
      v = v < -c ? -c : v;
      v = v > c ? c : v;
    }
    return v;
  }
  // y = act(g) (u + offset), act(g) = g sigmoid(k g).
  R value(R gt, R ut) const {
    const R g = gate(gt), u = up(ut);
    return g / (R(1) + exp_fast(-slope(g))) * (off == R(0) ? u : u + off);
  }
  // act'(g) = s (1 + k g (1 - s)), s = sigmoid(k g).
  void grad(R dy, R gt, R ut, R& dgate, R& dup) const {
    const R g = gate(gt), u = up(ut);
    const R s = R(1) / (R(1) + exp_fast(-slope(g)));
    const R dg = dy * (off == R(0) ? u : u + off) * s * (R(1) + slope(g) * (R(1) - s));
    const R du = dy * g * s;
    if constexpr (kClamp) {
      dgate = gt <= c ? dg : R(0);
      dup = ut >= -c && ut <= c ? du : R(0);
    } else {
      dgate = dg, dup = du;
    }
  }
};

// f(rule) with act's GluRule<R, quick-GEGLU, clamped>.
template <typename R, typename Fn>
void with_glu_rule(MlpAct a, Fn&& f) {
  const R off = R(a.glu.offset), c = R(a.glu.clamp);
  const bool q = a.kind == MlpActivation::QuickGeglu, cl = a.glu.clamped();
  if (q && cl) return f(GluRule<R, true, true>{off, c});
  if (q) return f(GluRule<R, true, false>{off, c});
  if (cl) return f(GluRule<R, false, true>{off, c});
  f(GluRule<R, false, false>{off, c});
}

void check_glu(const char* op, MlpAct a) {
  MCPP_CHECK(a.gated(), "{}: the activation is not a gated unit (SwiGLU or quick-GEGLU)", op);
}

}  // namespace

void glu_forward(const Tensor& x, MlpAct act, Tensor& y, Stream& s) {
  const Check c{"glu_forward"};
  c.stream(s);
  check_glu(c.op, act);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  const auto [T, F] = swiglu_dims(c, x, y, "y");
  dispatch_float(dt, [&, T = T, F = F](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    R* Y = y.data<R>();
    with_glu_rule<R>(act, [&](auto rule) {
#pragma omp parallel for schedule(static) if (T * F > kParallelGrain)
      for (int64_t t = 0; t < T; ++t) {
        const R *gate = X + t * 2 * F, *up = gate + F;
        R* yr = Y + t * F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) yr[f] = rule.value(gate[f], up[f]);
      }
    });
  });
}

void glu_backward(const Tensor& dy, const Tensor& x, MlpAct act, Tensor& dx, Stream& s) {
  const Check c{"glu_backward"};
  c.stream(s);
  check_glu(c.op, act);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(dx, "dx", dt);
  const auto [T, F] = swiglu_dims(c, x, dy, "dy");
  c.shape(dx, "dx", x.shape());
  dispatch_float(dt, [&, T = T, F = F](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>();
    R* DX = dx.data<R>();
    with_glu_rule<R>(act, [&](auto rule) {
#pragma omp parallel for schedule(static) if (T * F > kParallelGrain)
      for (int64_t t = 0; t < T; ++t) {
        const R *gate = X + t * 2 * F, *up = gate + F, *dyr = DY + t * F;
        R *dgate = DX + t * 2 * F, *dup = dgate + F;
#pragma omp simd
        for (int64_t f = 0; f < F; ++f) rule.grad(dyr[f], gate[f], up[f], dgate[f], dup[f]);
      }
    });
  });
}

}  // namespace mcpp::ops::cpu
