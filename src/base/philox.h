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

  // Four 32-bit outputs for a 128-bit counter (c0..c3) under a 64-bit key.
  MCPP_HD static void block(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; ++r) {
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

// FNV-1a of a name: turns "decoder.layers.3.mlp.linear_fc1.weight" into a stream id.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  return h;
}

}  // namespace mcpp
