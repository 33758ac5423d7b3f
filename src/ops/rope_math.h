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

// Base and Llama 3.x scaling, before the interpolation.
MCPP_ROPE_HD inline double rope_scaled_inv_freq(const RopeFreqs& f, int64_t i, int64_t rot_dim) {
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
