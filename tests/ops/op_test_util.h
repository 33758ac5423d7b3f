// Helpers for the CPU op tests: seeded random tensors, comparisons, and central
// finite differences in f64. Tests call mcpp::ops::cpu:: directly (the dispatching
// entry points also need the attention/RoPE backends, which live in another file set).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <tuple>

#include "base/error.h"
#include "model/params.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace mcpp::test {

namespace cpu = mcpp::ops::cpu;

inline Stream& S() { return Stream::cpu(); }

// N(0, scale^2) entries from a seeded mt19937_64, made in f64 and converted to dt.
inline Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0, DType dt = DType::F64) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  Tensor t = Tensor::empty(shape, DType::F64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  if (dt == DType::F64) return t;
  Tensor o = Tensor::empty(shape, dt);
  cpu::copy(t, o, S());
  return o;
}

inline Tensor as(const Tensor& t, DType dt) {
  Tensor o = Tensor::empty(t.shape(), dt);
  cpu::copy(t, o, S());
  return o;
}

inline Tensor f64(const Tensor& t) { return t.dtype() == DType::F64 ? t : as(t, DType::F64); }

inline double dot(const Tensor& a, const Tensor& b) {
  Tensor x = f64(a), y = f64(b);
  EXPECT_EQ(x.numel(), y.numel());
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.data<double>()[i] * y.data<double>()[i];
  return s;
}

inline double max_abs(const Tensor& a) {
  Tensor x = f64(a);
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::abs(x.data<double>()[i]));
  return m;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  Tensor x = f64(a), y = f64(b);
  EXPECT_EQ(x.numel(), y.numel());
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    m = std::max(m, std::abs(x.data<double>()[i] - y.data<double>()[i]));
  return m;
}

// Norm-wise relative error: max |got - want| / max |want|.
inline double rel_err(const Tensor& got, const Tensor& want) {
  return max_abs_diff(got, want) / std::max(max_abs(want), 1e-300);
}

// a + b in f64 (for checking += semantics).
inline Tensor plus(const Tensor& a, const Tensor& b) {
  Tensor o = Tensor::empty(a.shape(), DType::F64);
  cpu::add(f64(a), f64(b), o, S());
  return o;
}

// Central differences of f() w.r.t. every element of the f64 tensor x (restored after).
inline Tensor numeric_grad(Tensor& x, const std::function<double()>& f, double h = 1e-6) {
  Tensor g = Tensor::zeros(x.shape(), DType::F64);
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double old = p[i];
    p[i] = old + h;
    const double fp = f();
    p[i] = old - h;
    const double fm = f();
    p[i] = old;
    g.data<double>()[i] = (fp - fm) / (2 * h);
  }
  return g;
}

constexpr double kGradTol = 1e-7;  // f64 analytic vs central differences (norm-wise)

// An optimizer's test registry: a decayed parameter "w" of nw elements and a bias-like "b"
// of nb without weight decay (Megatron's two groups), allocated in dt on the CPU (f64
// gradients for f64 models, fp32 otherwise) and initialised from seed.
inline model::ParamStore two_group_params(DType dt, int64_t nw, int64_t nb, uint64_t seed) {
  model::ParamStore ps;
  for (auto [name, numel, decay] : {std::tuple("w", nw, true), std::tuple("b", nb, false)}) {
    model::ParamInfo info;
    info.name = name;
    info.global_shape = info.local_shape = {numel};
    info.init_std = 0.5;
    info.weight_decay = decay;
    ps.add(info);
  }
  ps.allocate(dt, dt == DType::F64 ? DType::F64 : DType::F32, Device::CPU, 0, 1);
  ps.initialize(seed);
  return ps;
}

}  // namespace mcpp::test
