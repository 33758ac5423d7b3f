// RoPE's inverse frequencies, written once for both backends: the CPU ops (ops/cpu/rope.cpp)
// and every CUDA kernel that forms a RoPE angle (ops/cuda/rope.cu, the decode path's
// decode_rope.cuh) call rope_inv_freq, so all of them rotate by the same frequencies.
//
// Plain RoPE: inv_freq_i = base^(-2i / rot_dim), i < rot_dim / 2, in double.
// Llama 3.x scaling (Megatron's RotaryEmbedding._apply_scaling, Hugging Face's "llama3"
// rope type), by the wavelength w = 2 pi / inv_freq against the original context L:
//   w < L / high_freq_factor   unchanged (high frequencies: position detail)
//   w > L / low_freq_factor    inv_freq / factor (low frequencies: stretched to the new context)
//   otherwise                  (1 - a) inv_freq / factor + a inv_freq,
//                              a = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
// YaRN (yarn_inv_freq below) replaces the Llama 3.x rule when freqs.yarn is set, and its
// concentration factor freqs.mscale multiplies every cos and sin (1 otherwise: exact).
// Megatron and Hugging Face evaluate it in fp32 on an fp32 inv_freq; here it is double, as
// the angles are (the more faithful reference; a frequency may differ from theirs in its
// last fp32 bit, and one lying exactly on a region boundary could land on the other side).
// Linear position interpolation, after any scaling (Megatron applies both, --use-rope-scaling
// to inv_freq, the interpolation to the positions): inv_freq / interpolation. Megatron's
// get_freqs_non_repeated multiplies the positions by 1 / factor instead; the angle
// p * inv_freq / factor is the same number, rounded differently (in double here, fp32
// there). Dividing by the unset factor 1.0 is exact, so plain RoPE keeps every bit.
#pragma once
#include <cmath>
#include <cstdint>

#include "base/error.h"
#include "ops/types.h"

#ifdef __CUDACC__
#define MCPP_ROPE_HD __host__ __device__
#else
#define MCPP_ROPE_HD
#endif

namespace mcpp::ops {

// YaRN's inverse frequency of rotary pair i < dim / 2 (Megatron's YarnRotaryEmbedding,
// Hugging Face's rope type "yarn"), in double. It blends interpolation inter_i = extra_i /
// factor (extra_i = base^(-2i / dim)) for the long wavelengths with extrapolation for the
// short ones. The pair whose wavelength spans `rot` turns over the original context L sits at
//   corr(rot) = dim ln(L / (2 pi rot)) / (2 ln base)
// (solve L / (2 pi base^(2i / dim)) = rot for i); pairs below low = corr(beta_fast) rotate
// more than beta_fast times and keep extra_i, pairs above high = corr(beta_slow) take
// inter_i, a linear ramp in between (low floored and high ceiled with round_to_int, then
// clamped to [0, dim - 1]):
//   ramp_i = clamp((i - low) / (high - low), 0, 1),  inv_i = inter_i ramp_i + extra_i (1 - ramp_i)
MCPP_ROPE_HD inline double yarn_inv_freq(double base, double factor, int64_t original_max_positions,
                                         double beta_fast, double beta_slow, bool round_to_int,
                                         int64_t i, int64_t dim) {
  const double extra = ::pow(base, -2.0 * double(i) / double(dim));
  const double inter = extra / factor;
  const double L = double(original_max_positions), two_pi = 2.0 * 3.14159265358979323846;
  const double denom = 2.0 * ::log(base);
  double low = double(dim) * ::log(L / (beta_fast * two_pi)) / denom;
  double high = double(dim) * ::log(L / (beta_slow * two_pi)) / denom;
  if (round_to_int) low = ::floor(low), high = ::ceil(high);
  low = low > 0.0 ? low : 0.0;
  high = high < double(dim - 1) ? high : double(dim - 1);
  if (low == high) high += 0.001;  // Megatron's _yarn_linear_ramp_mask: no division by zero
  double ramp = (double(i) - low) / (high - low);
  ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
  const double mask = 1.0 - ramp;  // Megatron's inv_freq_mask: 1 where extrapolated
  return inter * (1.0 - mask) + extra * mask;
}

// YaRN's attention scaling (Megatron's _yarn_get_mscale): 0.1 m ln(scale) + 1 above scale 1.
inline double yarn_get_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// YaRN's concentration factor, which multiplies cos and sin (Megatron's
// _yarn_get_concentration_factor with both mscales given, as its flags always give them;
// Hugging Face's attention_factor when config.json names none).
inline double yarn_concentration(double factor, double mscale, double mscale_all_dim) {
  return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim);
}

// Base and Llama 3.x or YaRN scaling, before the interpolation.
MCPP_ROPE_HD inline double rope_scaled_inv_freq(const RopeFreqs& f, int64_t i, int64_t rot_dim) {
  if (f.yarn)
    return yarn_inv_freq(f.base, f.factor, f.original_max_positions, f.beta_fast, f.beta_slow,
                         f.yarn_round_to_int, i, rot_dim);
  const double inv_freq = ::pow(f.base, -2.0 * double(i) / double(rot_dim));
  if (!f.scaled) return inv_freq;
  const double L = double(f.original_max_positions);
  const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
  if (wavelen < L / f.high_freq_factor) return inv_freq;
  if (wavelen > L / f.low_freq_factor) return inv_freq / f.factor;
  const double a = (L / wavelen - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  return (1.0 - a) * inv_freq / f.factor + a * inv_freq;
}

MCPP_ROPE_HD inline double rope_inv_freq(const RopeFreqs& f, int64_t i, int64_t rot_dim) {
  return rope_scaled_inv_freq(f, i, rot_dim) / f.interpolation;
}

// The ops' argument check: a positive base and interpolation factor; with scaling a positive
// factor, 0 < low < high (the smoothing divides by their difference) and a positive original
// context.
inline void check_rope_freqs(const RopeFreqs& f, const char* op) {
  MCPP_CHECK(std::isfinite(f.base) && f.base > 0,
             "{}: rotary base {} must be positive (--rotary-base)", op, f.base);
  MCPP_CHECK_HINT(std::isfinite(f.interpolation) && f.interpolation > 0,
                  "give --rotary-seq-len-interpolation-factor N >= 1",
                  "{}: RoPE position interpolation factor {} must be positive", op,
                  f.interpolation);
  MCPP_CHECK(std::isfinite(f.mscale) && f.mscale > 0,
             "{}: RoPE concentration factor {} must be positive (--mscale, --mscale-all-dim)", op,
             f.mscale);
  MCPP_CHECK(!(f.yarn && f.scaled), "{}: YaRN and Llama 3.x RoPE scaling are exclusive", op);
  if (f.yarn) {
    // corr() divides by ln(base) and takes ln(L / (2 pi beta)).
    MCPP_CHECK_HINT(f.base > 1 && std::isfinite(f.factor) && f.factor > 0 &&
                        f.original_max_positions > 0 && std::isfinite(f.beta_fast) &&
                        f.beta_fast > 0 && std::isfinite(f.beta_slow) && f.beta_slow > 0,
                    "check --rotary-base, --rotary-scaling-factor, "
                    "--yarn-original-max-position-embeddings, --yarn-beta-fast and "
                    "--yarn-beta-slow",
                    "{}: YaRN needs base > 1 ({}) and a positive factor ({}), original context "
                    "({}), beta_fast ({}) and beta_slow ({})",
                    op, f.base, f.factor, f.original_max_positions, f.beta_fast, f.beta_slow);
    return;
  }
  if (!f.scaled) return;
  MCPP_CHECK_HINT(std::isfinite(f.factor) && f.factor > 0, "give --rope-scaling-factor > 0",
                  "{}: RoPE scaling factor {} must be positive", op, f.factor);
  MCPP_CHECK(std::isfinite(f.high_freq_factor) && f.low_freq_factor > 0 &&
                 f.low_freq_factor < f.high_freq_factor && f.original_max_positions > 0,
             "{}: RoPE scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and a "
             "positive original_max_position_embeddings ({})",
             op, f.low_freq_factor, f.high_freq_factor, f.original_max_positions);
}

}  // namespace mcpp::ops
