// AdamW on the CPU, torch.optim.AdamW semantics (decoupled weight decay, bias
// correction at 1-based step t):
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
//   param, m, v (updated in place) and grad: same numel, one dtype, f32 or f64.
//   model_param (optional, param f32): bf16/f16 = the updated param rounded to nearest even
//   with tensor/dtype.h's helpers, as cpu::copy rounds it.
// The per-step scalars are formed in f64 and the element update runs in the tensors'
// dtype, as torch does for fp32 main parameters. The gradient is read times p.grad_scale
// (clipping folded into the pass). adamw_step_split runs the same f32 element update on
// main parameters held as (bf16 model parameter, lower half): ops/split_main.h. Both take
// bf16 moments beside f32 main parameters (ops/split_main.h): widened, updated in f32,
// stored rounded to nearest even.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/cpu/cpu_common.h"
#include "ops/split_main.h"

namespace mcpp::ops::cpu {

namespace {

// The per-step scalars, formed in f64 once, and the element update in R.
template <typename R>
struct AdamWElement {
  R decay, b1, b2, c1, c2, step_size, sqrt_bc2, eps, gs;
  explicit AdamWElement(const AdamWParams& p) {
    const double bc1 = 1 - std::pow(p.beta1, double(p.step));
    const double bc2 = 1 - std::pow(p.beta2, double(p.step));
    decay = R(1 - p.lr * p.weight_decay), b1 = R(p.beta1), b2 = R(p.beta2);
    c1 = R(1 - p.beta1), c2 = R(1 - p.beta2), step_size = R(p.lr / bc1);
    sqrt_bc2 = R(std::sqrt(bc2)), eps = R(p.eps), gs = R(p.grad_scale);
  }
  void operator()(R& P, R& M, R& V, R G) const {
    const R g = G * gs;  // as scale(grad, grad_scale): one rounded product
    const R mi = b1 * M + c1 * g;
    const R vi = b2 * V + c2 * g * g;
    M = mi, V = vi;
    P = P * decay - step_size * mi / (std::sqrt(vi) / sqrt_bc2 + eps);
  }
};

// A moment's storage: R itself, or bf16 bits (uint16_t) widened to R = float.
template <typename R, typename S>
R load_moment(S x) {
  if constexpr (std::is_same_v<S, uint16_t>)
    return R(bf16_to_float(x));
  else
    return x;
}
template <typename S, typename R>
S store_moment(R x) {
  if constexpr (std::is_same_v<S, uint16_t>)
    return float_to_bf16(float(x));
  else
    return x;
}

// f(M, V) with m's and v's storage pointers: R* or, for bf16 moments beside f32 ones,
// uint16_t* (the op's checks allow bf16 only with R = float).
template <typename R, typename F>
void with_moments(Tensor& m, Tensor& v, F&& f) {
  auto with_v = [&](auto* M) {
    if constexpr (std::is_same_v<R, float>)
      if (v.dtype() == DType::BF16) return f(M, static_cast<uint16_t*>(v.raw()));
    f(M, v.data<R>());
  };
  if constexpr (std::is_same_v<R, float>)
    if (m.dtype() == DType::BF16) return with_v(static_cast<uint16_t*>(m.raw()));
  with_v(m.data<R>());
}

// m and v: `dt`, or bf16 when dt is f32.
void check_moments(const Check& c, const Tensor& m, const Tensor& v, DType dt) {
  for (auto [t, name] : {std::pair{&m, "m"}, std::pair{&v, "v"}})
    if (dt != DType::F32 || t->dtype() != DType::BF16) c.dtype(*t, name, dt);
}

void check_adamw_params(const char* op, const AdamWParams& p) {
  MCPP_CHECK(p.step >= 1, "{}: step is {}, expected >= 1 (bias correction is 1-based)", op,
             p.step);
  MCPP_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1,
             "{}: betas ({}, {}) must lie in [0, 1)", op, p.beta1, p.beta2);
  MCPP_CHECK(p.lr >= 0 && p.eps >= 0 && p.weight_decay >= 0,
             "{}: lr {}, eps {}, weight_decay {} must be non-negative", op, p.lr, p.eps,
             p.weight_decay);
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, Tensor& model_param,
                const AdamWParams& p, Stream& s) {
  const Check c{"adamw_step"};
  c.stream(s);
  const DType dt = c.floating(param, "param");
  c.dtype(grad, "grad", dt);
  check_moments(c, m, v, dt);
  const int64_t n = param.numel();
  c.numel(grad, "grad", n), c.numel(m, "m", n), c.numel(v, "v", n);
  const bool out = model_param.defined();
  if (out) {
    c.defined(model_param, "model_param");
    c.numel(model_param, "model_param", n);
    MCPP_CHECK(model_param.dtype() == DType::BF16 || model_param.dtype() == DType::F16,
               "adamw_step: model_param is {}, expected bf16 or f16 (f32 and f64 parameters "
               "are stepped in place)",
               model_param.str());
    c.dtype(param, "param (fp32 main parameters, with a model_param)", DType::F32);
  }
  check_adamw_params("adamw_step", p);
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const AdamWElement<R> step(p);
    R* P = param.data<R>();
    const R* G = grad.data<R>();
    with_moments<R>(m, v, [&](auto* M, auto* V) {
      using SM = std::remove_pointer_t<decltype(M)>;
      using SV = std::remove_pointer_t<decltype(V)>;
      // store(i, p): the model-parameter write, if any, of the updated element i.
      auto update = [&](auto store) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
        for (int64_t i = 0; i < n; ++i) {
          R mi = load_moment<R>(M[i]), vi = load_moment<R>(V[i]);
          step(P[i], mi, vi, G[i]);
          M[i] = store_moment<SM>(mi), V[i] = store_moment<SV>(vi);
          store(i, P[i]);
        }
      };
      auto* O = static_cast<uint16_t*>(out ? model_param.raw() : nullptr);
      if (!out)
        update([](int64_t, R) {});
      else if (model_param.dtype() == DType::BF16)
        update([O](int64_t i, R x) { O[i] = float_to_bf16(float(x)); });
      else
        update([O](int64_t i, R x) { O[i] = float_to_f16(float(x)); });
    });
  });
}

// ---- fp32 main parameters as (bf16 model parameter, lower half): ops/split_main.h -------

void adamw_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m, Tensor& v,
                      const AdamWParams& p, Stream& s) {
  const Check c{"adamw_step_split"};
  c.stream(s);
  c.defined(lo, "lo");
  const int64_t n = check_split_main("adamw_step_split", model_param, lo, nullptr, Device::CPU);
  c.dtype(grad, "grad", DType::F32);
  check_moments(c, m, v, DType::F32);
  c.numel(grad, "grad", n), c.numel(m, "m", n), c.numel(v, "v", n);
  check_adamw_params("adamw_step_split", p);
  const AdamWElement<float> step(p);
  auto* O = static_cast<uint16_t*>(model_param.raw());
  auto* L = lo.data<uint16_t>();
  const float* G = grad.data<float>();
  with_moments<float>(m, v, [&](auto* M, auto* V) {
    using SM = std::remove_pointer_t<decltype(M)>;
    using SV = std::remove_pointer_t<decltype(V)>;
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      float w = bits_float(split_main_join(O[i], L[i]));
      float mi = load_moment<float>(M[i]), vi = load_moment<float>(V[i]);
      step(w, mi, vi, G[i]);
      M[i] = store_moment<SM>(mi), V[i] = store_moment<SV>(vi);
      const uint32_t b = float_bits(w);
      O[i] = split_main_model(b), L[i] = uint16_t(b);
    }
  });
}

void split_main_params(const Tensor& values, Tensor& model_param, Tensor& lo, Stream& s) {
  const Check c{"split_main_params"};
  c.stream(s);
  const int64_t n = check_split_main("split_main_params", model_param, lo, &values, Device::CPU);
  const float* X = values.data<float>();
  auto* O = static_cast<uint16_t*>(model_param.raw());
  uint16_t* L = lo.defined() ? lo.data<uint16_t>() : nullptr;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = float_bits(X[i]);
    O[i] = split_main_model(b);
    if (L) L[i] = uint16_t(b);
  }
}

void join_main_params(const Tensor& model_param, const Tensor& lo, Tensor& out, Stream& s) {
  const Check c{"join_main_params"};
  c.stream(s);
  c.defined(lo, "lo");
  const int64_t n = check_split_main("join_main_params", model_param, lo, &out, Device::CPU);
  const auto* O = static_cast<const uint16_t*>(model_param.raw());
  const auto* L = lo.data<uint16_t>();
  float* Y = out.data<float>();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) Y[i] = bits_float(split_main_join(O[i], L[i]));
}

void clear_main_lo(Tensor& lo, Stream& s) {
  const Check c{"clear_main_lo"};
  c.stream(s);
  c.dtype(lo, "lo", DType::U16);
  if (lo.numel() > 0) std::memset(lo.raw(), 0, lo.nbytes());
}

}  // namespace mcpp::ops::cpu
