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
MCPP_HD T fp8_round(T v, Fp8Format f) {
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
