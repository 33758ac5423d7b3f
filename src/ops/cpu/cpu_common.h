// Helpers shared by the CPU backend (src/ops/cpu/*.cpp): argument checks with
// messages that name the op and the tensor, dtype dispatch (f32/f64 through a
// template), and a vectorisable f32 exp.
//
// Every op validates its arguments before touching memory: a shape mistake in
// model code should be an mcpp::Error naming the op, not a silent overrun.
#pragma once
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "base/error.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cpu {

// Below this many elements of work a parallel region costs more than it saves.
inline constexpr int64_t kParallelGrain = 1 << 14;

// Argument checks for one op call; `op` prefixes every message.
struct Check {
  const char* op;

  void stream(const Stream& s) const {
    MCPP_CHECK_HINT(s.device == Device::CPU, "pass Stream::cpu() or call mcpp::ops:: (dispatch)",
                    "{}: the CPU backend was called with a CUDA stream", op);
  }
  void defined(const Tensor& t, const char* name) const {
    MCPP_CHECK(t.defined(), "{}: tensor '{}' is undefined", op, name);
    MCPP_CHECK(t.device() == Device::CPU, "{}: tensor '{}' ({}) is not a CPU tensor", op, name,
               t.str());
  }
  // Returns the tensor's dtype, which must be f32 or f64.
  DType floating(const Tensor& t, const char* name) const {
    defined(t, name);
    MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64,
               "{}: tensor '{}' is {}, the CPU backend computes in f32 or f64", op, name, t.str());
    return t.dtype();
  }
  void dtype(const Tensor& t, const char* name, DType expected) const {
    defined(t, name);
    MCPP_CHECK(t.dtype() == expected, "{}: tensor '{}' is {}, expected dtype {}", op, name, t.str(),
               dtype_name(expected));
  }
  void index(const Tensor& t, const char* name) const {
    defined(t, name);
    MCPP_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64,
               "{}: tensor '{}' is {}, expected i32 or i64 indices", op, name, t.str());
  }
  void shape(const Tensor& t, const char* name, const Shape& expected) const {
    MCPP_CHECK(t.shape() == expected, "{}: tensor '{}' has shape {}, expected {}", op, name,
               shape_str(t.shape()), shape_str(expected));
  }
  // Per-row statistics: any shape with `rows` elements ([T], or x's shape without H).
  void rows(const Tensor& t, const char* name, int64_t rows) const {
    MCPP_CHECK(t.numel() == rows,
               "{}: tensor '{}' has shape {} ({} elements), expected {} (one "
               "per row)",
               op, name, shape_str(t.shape()), t.numel(), rows);
  }
  void numel(const Tensor& t, const char* name, int64_t n) const {
    MCPP_CHECK(t.numel() == n, "{}: tensor '{}' has shape {} ({} elements), expected {} elements",
               op, name, shape_str(t.shape()), t.numel(), n);
  }
  void min_dim(const Tensor& t, const char* name, int64_t d) const {
    MCPP_CHECK(t.dim() >= d, "{}: tensor '{}' has shape {}, expected at least {} dimensions", op,
               name, shape_str(t.shape()), d);
  }
};

// Calls f(T{}) with T = float or double according to `dt` (checked by Check::floating).
template <class F>
decltype(auto) dispatch_float(DType dt, F&& f) {
  if (dt == DType::F32) return f(float{});
  return f(double{});
}
// Calls f(I{}) with I = int32_t or int64_t according to `dt` (checked by Check::index).
template <class F>
decltype(auto) dispatch_index(DType dt, F&& f) {
  if (dt == DType::I32) return f(int32_t{});
  return f(int64_t{});
}

// exp for the hot loops (softmax over the vocabulary, SiLU, GELU's tanh). glibc's
// expf does not vectorise without -ffast-math, and the CE loss alone evaluates exp
// 2 x T x V times per step, so f32 uses Cephes' expf polynomial (<= 2 ulp) written so
// that GCC vectorises it under `omp simd`. NaN propagates; results below ~1e-38
// flush to e^-87 (harmless for softmax, where they vanish against the row max term).
inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float n = (x * 1.44269504088896341f + kShift) - kShift;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // Cody-Waite split of ln 2
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  return y * std::bit_cast<float>((int32_t(n) + 127) << 23);
}
inline double exp_fast(double x) { return std::exp(x); }

// tanh through exp: 1 - 2 / (e^{2u} + 1). Absolute error ~1e-7 in f32 (relative error
// grows near 0, but GELU and its derivative only use 1 + tanh and 1 - tanh^2).
inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f); }
inline double tanh_fast(double u) { return std::tanh(u); }

}  // namespace mcpp::ops::cpu
