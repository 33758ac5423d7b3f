// Shared by the FP8 unit tests (test_fp8*.cpp), on f64 tensors: random inputs, the
// emulation's quantise-dequantise and scale rules written out, finite differences and a
// relative error.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "ops/fp8_grid.h"
#include "tensor/tensor.h"

namespace mcpp::fp8_test {

inline Stream& S() { return Stream::cpu(); }

// <G, A @ B^T> for A [T, k], B [n, k], G [T, n].
inline double contract(const Tensor& G, const Tensor& A, const Tensor& B) {
  const int64_t T = A.size(0), k = A.size(1), n = B.size(0);
  // Pointers hoisted: the finite differences call this ~10^4 times.
  const double *a = A.data<double>(), *b = B.data<double>(), *g = G.data<double>();
  double s = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j) {
      double y = 0;
      for (int64_t i = 0; i < k; ++i) y += a[t * k + i] * b[j * k + i];
      s += g[t * n + j] * y;
    }
  return s;
}

// Normal(0, scale) values (f64), from a seeded std::mt19937_64.
inline Tensor randn(const Shape& s, uint64_t seed, double scale) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0, scale);
  Tensor t = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(gen);
  return t;
}

// v quantised with scale s: fp8_round(v * s) * (1 / s), the f32 scale and its f32 inverse
// as the op uses them.
inline Tensor q(const Tensor& v, double s, ops::Fp8Format f) {
  Tensor o = v.clone();
  const float sf = float(s), inv = 1.0f / sf;
  for (int64_t i = 0; i < o.numel(); ++i)
    o.data<double>()[i] = ops::fp8_round(o.data<double>()[i] * double(sf), f) * double(inv);
  return o;
}

// max |v| as fp8_amax records it: rounded up to f32.
inline float amax(const Tensor& v) {
  double m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(v.data<double>()[i]));
  float f = float(m);
  return double(f) < m ? std::nextafter(f, INFINITY) : f;
}
// A [n, k] @ B [m, k]^T -> [n, m] in f64, plain loops (the references' GEMM).
inline Tensor mm_t(const Tensor& A, const Tensor& B) {
  const int64_t n = A.size(0), k = A.size(1), m = B.size(0);
  Tensor y = Tensor::empty({n, m}, DType::F64);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < m; ++j) {
      const double *a = A.data<double>() + t * k, *b = B.data<double>() + j * k;
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += a[i] * b[i];
      y.data<double>()[t * m + j] = s;
    }
  return y;
}

// A^T of a 2-D f64 tensor.
inline Tensor transpose(const Tensor& A) {
  const int64_t n = A.size(0), m = A.size(1);
  Tensor y = Tensor::empty({m, n}, DType::F64);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) y.data<double>()[j * n + i] = A.data<double>()[i * m + j];
  return y;
}

// The scale fp8_scale_update makes of an amax (margin 0).
inline double scale_of(double fp8_max, float a) { return double(float(fp8_max / double(a))); }

// Central differences of f in every element of x (f64; x is perturbed in place and restored).
inline Tensor fd(Tensor x, const std::function<double()>& f, double h = 1e-4) {
  Tensor g = Tensor::empty(x.shape(), DType::F64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& e = x.data<double>()[i];
    const double e0 = e;
    e = e0 + h;
    const double fp = f();
    e = e0 - h;
    const double fm = f();
    e = e0;
    g.data<double>()[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// max |a - b| / max |b| over f64 tensors of the same size.
inline double max_rel(const Tensor& a, const Tensor& b) {
  double d = 0, m = 1e-300;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
    m = std::max(m, std::fabs(b.data<double>()[i]));
  }
  return d / m;
}

}  // namespace mcpp::fp8_test
