// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based RNG. The value at counter c under key k is a pure
// function of (k, c), so any rank can draw exactly the numbers of its shard of a
// global tensor: this is what makes initialisation and dropout parallel-invariant.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define MCPP_HD __host__ __device__ __forceinline__
#else
#define MCPP_HD inline
#endif

namespace mcpp {

struct Philox {
  static constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  static constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

  // Four 32-bit outputs for a 128-bit counter (c0..c3) under a 64-bit key, after R rounds
  // (10 everywhere but the attention-dropout mask, DropoutMask below).
  template <int R = 10>
  MCPP_HD static void block(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < R; ++r) {
      uint64_t p0 = uint64_t(kM0) * c[0];
      uint64_t p1 = uint64_t(kM1) * c[2];
      uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
      uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
      uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
      c[0] = n0, c[1] = lo1, c[2] = n2, c[3] = lo0;
      k0 += kW0, k1 += kW1;
    }
  }
  // One 32-bit value for element `index` of stream `stream` under `seed`.
  // Elements 4i..4i+3 share one Philox block; lanes pick its outputs.
  MCPP_HD static uint32_t u32(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t c[4] = {uint32_t(index >> 2), uint32_t(index >> 34), uint32_t(stream),
                     uint32_t(stream >> 32)};
    block(c, uint32_t(seed), uint32_t(seed >> 32));
    return c[index & 3];
  }
  // Uniform in [0, 1) with 24 bits of resolution (exact in float).
  MCPP_HD static float uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return float(u32(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
  }
  // Standard normal via Box-Muller on two independent lanes (index*2, index*2+1).
  MCPP_HD static double normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t a = u32(seed, stream, 2 * index), b = u32(seed, stream, 2 * index + 1);
    double u1 = (double(a) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
    double u2 = double(b) * (1.0 / 4294967296.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// Every dropout mask: attention dropout (the CPU op ops/cpu/attention.cpp, the CUDA
// kernels of flash_attention.cu and attention.cu, the context-parallel block kernels) and
// the hidden and embedding dropout (ops/cpu/dropout.cpp, ops/cuda/dropout.cu). Element i
// (its global index: (b, h, q, k) for attention, (s, b, h) for hidden dropout; types.h) is
// kept iff its 16-bit uniform u16(i) >= threshold(p), i.e. u16 / 2^16 >= p. The masks are
// drawn in the forward and again in the backward (attention's has B NH S^2 elements a
// layer), so their cost is cut twice against Philox::u32:
//  - 16-bit uniforms: the eight indices 8j..8j+7 share the Philox block at counter j (word
//    (i >> 1) & 3, half i & 1), eight elements per block instead of four. p is quantised to
//    threshold / 2^16 (p = 0.1: 0.1000061); keep_scale = 1 / (1 - threshold / 2^16), so
//    the expectation of a kept-and-scaled value is exactly the value.
//  - Philox-4x32-7: Salmon et al. (SC'11, "Parallel random numbers: as easy as 1, 2, 3",
//    Table 2) find 7 rounds the fewest with which Philox4x32 passes all of TestU01's
//    BigCrush (the 10-round default adds a safety margin; C++26's philox4x32 keeps 10 and
//    notes no known defect at 7). A dropout mask needs far less than BigCrush; seeds and
//    init stay at 10 rounds.
// (At 10 rounds and four elements a block, the hidden dropout's GPU kernels took as long
// in the backward, two passes over the activations, as in the forward, three: bound by
// the Philox work, not by memory.)
// tests/ops/test_attention_mask.cpp checks the kept fraction over 1e7 elements for several p.
struct DropoutMask {
  static constexpr int kRounds = 7;
  // keep iff u16 >= threshold; 65536 keeps nothing (p > 65535/65536).
  static uint32_t threshold(double p) { return uint32_t(std::ceil(p * 65536.0)); }
  static double keep_scale(double p) {
    const uint32_t t = threshold(p);
    return t >= 65536u ? 0.0 : 65536.0 / double(65536u - t);
  }
  // The Philox block of elements 8j..8j+7 (counter j, the stream, the seed as key).
  MCPP_HD static void block(uint64_t seed, uint64_t stream, uint64_t j, uint32_t w[4]) {
    w[0] = uint32_t(j), w[1] = uint32_t(j >> 32), w[2] = uint32_t(stream),
    w[3] = uint32_t(stream >> 32);
    Philox::block<kRounds>(w, uint32_t(seed), uint32_t(seed >> 32));
  }
  // Uniform e of the blocks stored one after another from w (e = 0..7: w's own block).
  MCPP_HD static uint32_t pick(const uint32_t* w, int e) {
    return (w[e >> 1] >> (16 * (e & 1))) & 0xFFFFu;
  }
  MCPP_HD static uint32_t u16(uint64_t seed, uint64_t stream, uint64_t i) {
    uint32_t w[4];
    block(seed, stream, i >> 3, w);
    return pick(w, int(i & 7));
  }
  // u16 / 2^16: keep iff uniform >= p is the same rule as u16 >= threshold(p).
  MCPP_HD static float uniform(uint64_t seed, uint64_t stream, uint64_t i) {
    return float(u16(seed, stream, i)) * (1.0f / 65536.0f);
  }
};

// FNV-1a of a name: turns "decoder.layers.3.mlp.linear_fc1.weight" into a stream id.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return h;
}

}  // namespace mcpp
