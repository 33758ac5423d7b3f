// The two FP8 formats of Hopper (OCP FP8, as NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
//   E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is
//                NaN, so the largest finite value is 1.75 * 2^8 = 448; smallest subnormal 2^-9.
//   E5M2:        1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like (Inf and NaN);
//                largest finite 1.75 * 2^15 = 57344; smallest subnormal 2^-16.
// fp8_round(v, fmt) is the value v becomes when cast to the format and back: round to
// nearest, ties to even (on the mantissa grid, subnormals included), saturating to +-max
// (the __NV_SATFINITE conversion Transformer Engine uses: Inf too), NaN kept. Computed in
// T (float or double): every FP8 value is exact in both. fp8_decode(bits) is the format's
// definition from its bit fields, kept apart so tests can check the rounding against it.
#pragma once
#include <cmath>
#include <cstdint>

#include "base/philox.h"  // MCPP_HD

namespace mcpp::ops {

enum class Fp8Format : int { E4M3 = 0, E5M2 = 1 };

MCPP_HD double fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0 : 57344.0; }

template <typename T>
MCPP_HD T fp8_round_generic(T v, Fp8Format f) {
  if (v != v) return v;                              // NaN
  const int M = f == Fp8Format::E4M3 ? 3 : 2;        // mantissa bits
  const int emin = f == Fp8Format::E4M3 ? -6 : -14;  // exponent of the smallest normal
  const T maxv = T(fp8_max(f));
  const T a = std::fabs(v);
  if (a >= maxv) return std::copysign(maxv, v);  // saturate, Inf included
  if (a == T(0)) return v;
  int e = 0;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): a's exponent is e - 1
  int ex = e - 1;
  if (ex < emin) ex = emin;  // subnormals share the smallest normal's quantum
  const T q = std::ldexp(T(1), ex - M);
  // a / q is exact (q a power of two); nearbyint rounds half to even in the default mode.
  T r = std::nearbyint(a / q) * q;
  if (r > maxv) r = maxv;  // a tie just below max rounds up past it: E4M3 has no 480
  return std::copysign(r, v);
}

// fp8_round_generic for f32 on the host, with bit operations in place of frexp, ldexp and
// nearbyint (library calls on the host, ~2/3 of the CPU FP8 emulation's time). The same
// value for every input (test_fp8.cpp sweeps the sign, every exponent and the mantissa bits
// that decide the rounding): the exponent is read from the bits (f32 subnormals lie far below
// both formats' smallest normal, so they take the clamped quantum as before); a * 2^(M - ex)
// is exact (a power-of-two scaling into [0, 2^(M+1))), and adding and subtracting 2^23 rounds
// it to the nearest integer, ties to even, as nearbyint does in the default rounding mode.
inline float fp8_round_f32(float v, Fp8Format f) {
  // Branch-free (selects only), so that loops over tensors vectorise: every input takes the
  // arithmetic path, and NaN, saturation and zero are chosen after it.
  uint32_t bits;
  __builtin_memcpy(&bits, &v, 4);
  const uint32_t mag = bits & 0x7FFFFFFFu;
  const int M = f == Fp8Format::E4M3 ? 3 : 2;
  const int emin = f == Fp8Format::E4M3 ? -6 : -14;
  const float maxv = f == Fp8Format::E4M3 ? 448.f : 57344.f;
  float a;
  __builtin_memcpy(&a, &mag, 4);
  int ex = int(mag >> 23) - 127;  // 128 for Inf and NaN: their results are replaced below
  ex = ex < emin ? emin : ex;
  const uint32_t inv_q_bits = uint32_t(127 + M - ex) << 23, q_bits = uint32_t(127 + ex - M) << 23;
  float inv_q, q;
  __builtin_memcpy(&inv_q, &inv_q_bits, 4);
  __builtin_memcpy(&q, &q_bits, 4);
  const float x = a * inv_q;
  float r = ((x + 8388608.f) - 8388608.f) * q;  // 0 stays 0
  r = r > maxv ? maxv : r;
  r = a >= maxv ? maxv : r;  // saturate, Inf included
  uint32_t rb;
  __builtin_memcpy(&rb, &r, 4);
  rb |= bits & 0x80000000u;  // copysign
  rb = mag > 0x7F800000u ? bits : rb;  // NaN kept
  float out;
  __builtin_memcpy(&out, &rb, 4);
  return out;
}

template <typename T>
MCPP_HD T fp8_round(T v, Fp8Format f) {
#ifndef __CUDA_ARCH__
  if constexpr (sizeof(T) == 4) return fp8_round_f32(v, f);
#endif
  return fp8_round_generic(v, f);
}

// The blockwise recipe (Transformer Engine's Float8BlockScaling, DeepSeek-V3 style): the scale
// of one block from the block's own amax (max |v| over the block, NaNs skipped, as fmaxf
// does), as TE's compute_scale_from_amax with the recipe's defaults (epsilon 0, power-of-2
// scales): an amax of 0, Inf or NaN gives 1 (a block of zeros stays zeros; an Inf block
// saturates); else fp8_max / amax rounded to nearest in f32, FLT_MAX if that overflows
// (TE: the input type's largest value, bf16's 0x7f7f or f32's: both become 2^127 below),
// then truncated to the power of two at or below it (its exponent bits kept), so that
// x * scale and q * (1 / scale) are exact. scale_inv = 1 / scale is the GEMM's factor.
MCPP_HD float fp8_block_scale(float amax, Fp8Format f) {
  if (!(amax > 0.f) || amax == INFINITY) return 1.f;  // 0, NaN (!(NaN > 0)), Inf
#ifdef __CUDA_ARCH__
  float s = __fdiv_rn(float(fp8_max(f)), amax);  // IEEE division whatever the flags
#else
  float s = float(fp8_max(f)) / amax;
#endif
  if (s == INFINITY) s = 3.40282347e38f;  // FLT_MAX
#ifdef __CUDA_ARCH__
  return __uint_as_float(__float_as_uint(s) & 0xFF800000u);
#else
  uint32_t b;
  __builtin_memcpy(&b, &s, 4);
  b &= 0xFF800000u;
  __builtin_memcpy(&s, &b, 4);
  return s;
#endif
}
// The block size of the blockwise recipe: 1x128 (activations, gradients: along the GEMM's
// K), 128x128 (weights).
constexpr int kFp8Block = 128;

// The scale_inv layout cuBLASLt's block-scaled FP8 GEMMs read (Transformer Engine's
// "GEMM-ready" layout), for an FP8 operand [R, K] stored K-major (K the GEMM's reduction
// dimension): 1x128 blocks (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): [ceil(K/128), R4],
// block (r, kb) at kb * R4 + r with R4 = R rounded up to 4 (the rows fastest); 128x128
// blocks (..._BLK128x128_32F): [ceil(R/128), KB4], block (rb, kb) at rb * KB4 + kb with KB4
// = ceil(K/128) rounded up to 4. The padding (16-byte rows) is never read as a scale.
MCPP_HD int64_t fp8_block_count(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }
MCPP_HD int64_t fp8_round4(int64_t n) { return (n + 3) / 4 * 4; }
// scale_inv's [rows, cols] for an operand [R, K]; tile: 128x128 blocks.
MCPP_HD void fp8_block_scale_dims(int64_t R, int64_t K, bool tile, int64_t* rows, int64_t* cols) {
  *rows = tile ? fp8_block_count(R) : fp8_block_count(K);
  *cols = tile ? fp8_round4(fp8_block_count(K)) : fp8_round4(R);
}

// The value of an FP8 code (NaN for NaN codes, +-Inf for E5M2's infinities).
inline double fp8_decode(uint8_t bits, Fp8Format f) {
  const int M = f == Fp8Format::E4M3 ? 3 : 2, E = 7 - M, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const int s = bits >> 7, e = (bits >> M) & ((1 << E) - 1), m = bits & ((1 << M) - 1);
  const double sign = s ? -1.0 : 1.0;
  if (f == Fp8Format::E4M3 && e == 15 && m == 7) return std::nan("");
  if (f == Fp8Format::E5M2 && e == 31) return m ? std::nan("") : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - M);
  return sign * std::ldexp(double((1 << M) + m), e - bias - M);
}

}  // namespace mcpp::ops
