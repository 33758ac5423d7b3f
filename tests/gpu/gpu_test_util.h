// Helpers for the CUDA op tests: every CUDA op is checked against the CPU op
// (mcpp::ops::cpu, f32) on random data. Inputs for a bf16/f16 run are rounded to that
// dtype first, so both backends see the same numbers; outputs are compared by
// ||gpu - cpu|| / ||cpu|| with a per-dtype tolerance. GPU outputs are poisoned with NaN
// before each call, so an element the kernel forgot to write fails the comparison.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "base/philox.h"
#include "model/params.h"
#include "ops/cuda/device.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace mcpp::test {

namespace cpu = mcpp::ops::cpu;
namespace gpu = mcpp::ops::cuda;

inline Stream& CS() { return Stream::cpu(); }
inline Stream& GS() { return gpu::default_stream(); }

// GPU tests (ctest label gpu) run on the GPU machine only (scripts/gpu-check.sh); on a
// machine without a GPU they fail rather than skip, so a skip is never counted as a pass.
#define MCPP_REQUIRE_GPU()                                                                     \
  do {                                                                                         \
    if (!::mcpp::ops::cuda::device_available())                                                \
      GTEST_FAIL() << "no CUDA device: GPU tests run on the GPU machine (scripts/gpu-check.sh)"; \
    ::mcpp::ops::cuda::init_device();                            \
  } while (0)

// Uniform in [lo, hi), f32, from Philox (seeded, platform-independent).
inline Tensor rand_f32(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = static_cast<float*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = lo + (hi - lo) * Philox::uniform(seed, 77, uint64_t(i));
  return t;
}

// f32 values rounded to dt and back (identity for f32).
inline Tensor rounded(const Tensor& t, DType dt) {
  if (dt == DType::F32) return t;
  Tensor o = t.clone();
  float* p = static_cast<float*>(o.raw());
  for (int64_t i = 0; i < o.numel(); ++i)
    p[i] = dt == DType::BF16 ? bf16_to_float(float_to_bf16(p[i])) : f16_to_float(float_to_f16(p[i]));
  return o;
}

// Random CPU f32 tensor already representable in dt.
inline Tensor rand_in(const Shape& shape, uint64_t seed, DType dt, float lo = -1.f,
                      float hi = 1.f) {
  return rounded(rand_f32(shape, seed, lo, hi), dt);
}

inline Tensor to_gpu(const Tensor& c, DType dt) {
  Tensor g = Tensor::empty(c.shape(), dt, Device::CUDA);
  gpu::copy(c, g, GS());
  return g;
}
inline Tensor gpu_nan(const Shape& shape, DType dt) {
  Tensor g = Tensor::empty(shape, dt, Device::CUDA);
  gpu::fill(g, std::nan(""), GS());
  return g;
}
// Whether a and b (on either device) hold the same dtype, numel and bytes.
inline bool equal_bits(const Tensor& a, const Tensor& b) {
  auto host = [](const Tensor& t) {
    if (t.device() != Device::CUDA) return t;
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    gpu::copy(t, h, GS());
    return h;
  };
  const Tensor x = host(a), y = host(b);
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}
// A CUDA tensor of c's values (and dtype) starting `offset` elements into its allocation:
// an unaligned view for offset 1.
inline Tensor gpu_at(const Tensor& c, int64_t offset) {
  Tensor g =
      Tensor::empty({c.numel() + offset}, c.dtype(), Device::CUDA).narrow(offset, c.numel());
  gpu::copy(c, g, GS());
  return g;
}
// The optimizer tests' registry: parameters of 300,007 elements (decayed: a vector path with
// a tail) and 4,099 (not decayed), in dt on dev with fp32 gradients, initialised from 99.
inline model::ParamStore optimizer_test_params(DType dt, Device dev) {
  model::ParamStore ps;
  for (int64_t numel : {int64_t(300007), int64_t(4099)}) {
    model::ParamInfo info;
    info.name = "p" + std::to_string(numel);
    info.global_shape = info.local_shape = {numel};
    info.init_std = 0.5;
    info.weight_decay = numel > 5000;
    ps.add(info);
  }
  ps.allocate(dt, DType::F32, dev, 0, 1);
  ps.initialize(99);
  return ps;
}

inline Tensor to_cpu(const Tensor& g) {
  Tensor c = Tensor::empty(g.shape(), g.dtype() == DType::I32 || g.dtype() == DType::I64
                                          ? g.dtype() : DType::F32);
  gpu::copy(g, c, GS());
  return c;
}

// ||a - b|| / max(||b||, tiny); NaN anywhere gives +inf.
inline double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  const float* x = static_cast<const float*>(a.raw());
  const float* y = static_cast<const float*>(b.raw());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return INFINITY;
    double d = double(x[i]) - double(y[i]);
    num += d * d;
    den += double(y[i]) * double(y[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double tol(DType dt) {
  switch (dt) {
    case DType::F32: return 2e-5;
    case DType::F16: return 4e-3;
    default: return 1.6e-2;
  }
}

// EXPECT that a GPU tensor matches a CPU f32 reference.
#define EXPECT_CLOSE(gpu_t, cpu_ref, dt)                                                   \
  EXPECT_LE(::mcpp::test::rel_err(::mcpp::test::to_cpu(gpu_t), cpu_ref), ::mcpp::test::tol(dt)) \
      << #gpu_t << " vs CPU, dtype " << ::mcpp::dtype_name(dt) << " "

}  // namespace mcpp::test
