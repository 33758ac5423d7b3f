// The blockwise FP8 recipe on the CPU (catalogue.inc, "FP8 blockwise"): quantise and
// dequantise each block of 1x128, 128x1 or 128x128 elements with its own power-of-two scale
// (ops/fp8_grid.h fp8_block_scale, Transformer Engine's Float8BlockScaling). The emulation
// the CPU trains with and the reference the CUDA casts are tested against. Blocks are
// independent: parallel over blocks, bitwise the same for any thread count.
#include <algorithm>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

void fp8_block_quantize(const Tensor& x, Fp8Format fmt, int64_t br, int64_t bc, Tensor& y,
                        Tensor& scale_inv, Stream& s) {
  const Check c{"fp8_block_quantize"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.numel(y, "y", x.numel());
  MCPP_CHECK(br >= 1 && bc >= 1, "fp8_block_quantize: block {}x{} is empty", br, bc);
  const int64_t C = x.dim() == 0 ? 1 : x.size(-1), R = C ? x.numel() / C : 0;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  float* si = nullptr;
  if (scale_inv.defined()) {
    c.dtype(scale_inv, "scale_inv", DType::F32);
    c.numel(scale_inv, "scale_inv", nbr * nbc);
    si = scale_inv.data<float>();
  }
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
#pragma omp parallel for schedule(static) if (R * C > kParallelGrain)
    for (int64_t b = 0; b < nbr * nbc; ++b) {
      const int64_t r0 = b / nbc * br, c0 = b % nbc * bc;
      const int64_t r1 = std::min(R, r0 + br), c1 = std::min(C, c0 + bc);
      // The amax in f32 as the GPU's (of f32 or bf16 values: exact), NaNs skipped as fmaxf
      // skips them (amax itself is never NaN, so a comparison does what fmaxf does).
      float amax = 0.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = c0; j < c1; ++j) {
          const float a = float(std::fabs(xp[r * C + j]));
          amax = a > amax ? a : amax;
        }
      const float sc = fp8_block_scale(amax, fmt), inv = 1.f / sc;  // powers of two: exact
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = c0; j < c1; ++j)
          yp[r * C + j] = fp8_round(T(xp[r * C + j] * T(sc)), fmt) * T(inv);
      if (si) si[b] = inv;
    }
  });
}

// The CPU backend has no FP8 storage path: its blockwise training is the emulation above.
void fp8_block_cast(const Tensor&, Fp8Format, bool, Tensor&, Tensor&, Tensor&, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false,
                  "--fp8-recipe blockwise on --device cpu runs the emulation "
                  "(fp8_block_quantize)",
                  "fp8_block_cast: FP8 tensors are a CUDA-backend path");
}
void fp8_block_gemm(const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&, bool,
                    const Tensor&, const Tensor&, bool, Tensor&, Stream&) {
  MCPP_CHECK_HINT(false,
                  "--fp8-recipe blockwise on --device cpu runs the emulation "
                  "(fp8_block_quantize)",
                  "fp8_block_gemm: FP8 GEMMs are a CUDA-backend path");
}

}  // namespace mcpp::ops::cpu
