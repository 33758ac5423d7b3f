// FP8 ops on the CPU (catalogue.inc's FP8 section): the emulation of FP8 GEMM operands in
// f32 (f64 for f64 models) on the grid of ops/fp8_grid.h, amax recording and the
// delayed-scaling update. Elementwise and in index order: bitwise reproducible for any
// thread count (max is order-independent).
#include <cfloat>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

void fp8_quantize(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& y, Stream& s) {
  const Check c{"fp8_quantize"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.numel(y, "y", x.numel());
  c.dtype(scale, "scale", DType::F32);
  c.numel(scale, "scale", 1);
  const float sc = scale.data<float>()[0], inv = 1.0f / sc;
  const int64_t n = x.numel();
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    // f32 model: the product and the dequantisation in f32, as the GPU's cast kernel and
    // the GEMM's scale_inv do; f64 model: in f64 (exact FP8 values either way).
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) yp[i] = fp8_round(T(xp[i] * T(sc)), fmt) * T(inv);
  });
}

void fp8_amax(const Tensor& x, Tensor& amax, Stream& s) {
  const Check c{"fp8_amax"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(amax, "amax", DType::F32);
  c.numel(amax, "amax", 1);
  const int64_t n = x.numel();
  double m = 0;
  bool nan = false;
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data<T>();
#pragma omp parallel for schedule(static) reduction(max               \
                                                    : m) reduction(|| \
                                                                   : nan) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const double a = std::fabs(double(xp[i]));
      if (a != a)
        nan = true;
      else if (a > m)
        m = a;
    }
  });
  float& out = amax.data<float>()[0];
  // Rounded up to f32, so that x * (fp8_max / amax) never exceeds fp8_max by rounding.
  float mf = float(m);
  if (double(mf) < m) mf = std::nextafter(mf, INFINITY);
  if (nan || out != out)
    out = NAN;
  else if (mf > out)
    out = mf;
}

void fp8_scale_update(Tensor& history, Tensor& scale, int64_t e5m2_columns, int64_t margin,
                      bool amax_max, bool roll, Stream& s) {
  const Check c{"fp8_scale_update"};
  c.stream(s);
  c.dtype(history, "history", DType::F32);
  c.dtype(scale, "scale", DType::F32);
  MCPP_CHECK(history.dim() == 2 && history.size(1) == scale.numel(),
             "fp8_scale_update: history {} and scale {} do not match ([L, K] and [K])",
             history.str(), scale.str());
  const int64_t L = history.size(0), K = history.size(1);
  float* h = history.data<float>();
  float* sc = scale.data<float>();
  for (int64_t k = 0; k < K; ++k) {
    const double mx = fp8_max((e5m2_columns >> k) & 1 ? Fp8Format::E5M2 : Fp8Format::E4M3);
    float a = h[k];
    if (amax_max)
      for (int64_t r = 1; r < L; ++r) {
        const float v = h[r * K + k];
        a = (v != v || a != a) ? NAN : std::max(a, v);
      }
    if (std::isfinite(a) && a > 0) {
      float v = float(mx / double(a) / std::ldexp(1.0, int(margin)));
      sc[k] = std::isfinite(v) ? v : FLT_MAX;
    }
  }
  if (roll) {
    for (int64_t r = L - 1; r > 0; --r)
      for (int64_t k = 0; k < K; ++k) h[r * K + k] = h[(r - 1) * K + k];
    for (int64_t k = 0; k < K; ++k) h[k] = 0;
  }
}

// The CPU backend has no FP8 storage path: its FP8 training is the emulation above
// (model/fp8/fp8_linear.h picks it on the CPU).
void fp8_cast_transpose(const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&, Tensor&, Tensor&,
                        Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_cast_transpose: FP8 tensors are a CUDA-backend path");
}
void fp8_gemm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
              const Tensor&, bool, bool, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_gemm: FP8 GEMMs are a CUDA-backend path");
}

void fp8_cast_transpose_dbias(const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&, Tensor&,
                              Tensor&, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_cast_transpose_dbias: FP8 tensors are a CUDA-backend path");
}
void fp8_gelu_cast(const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&, Tensor&, Tensor&,
                   Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_gelu_cast: FP8 tensors are a CUDA-backend path");
}
void fp8_dgelu_cast(const Tensor&, const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&,
                    Tensor&, Tensor&, Tensor&, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_dgelu_cast: FP8 tensors are a CUDA-backend path");
}
void fp8_swiglu_cast(const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&, Tensor&, Tensor&,
                     Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_swiglu_cast: FP8 tensors are a CUDA-backend path");
}
void fp8_dswiglu_cast(const Tensor&, const Tensor&, Fp8Format, const Tensor&, Tensor&, Tensor&,
                      Tensor&, Tensor&, Tensor&, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false, "--fp8-format on --device cpu runs the emulation (fp8_quantize)",
                  "fp8_dswiglu_cast: FP8 tensors are a CUDA-backend path");
}

}  // namespace mcpp::ops::cpu
