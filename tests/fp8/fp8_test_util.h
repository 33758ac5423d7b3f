// Shared by the FP8 unit tests (test_fp8*.cpp): finite differences and a relative error
// over f64 tensors.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>

#include "tensor/tensor.h"

namespace mcpp::fp8_test {

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
