// Attention dropout inside flash_attention.cu's kernels: the keep bits of a warp's 16 x 64
// score tile in the mma.sync m16n8k16 C-fragment layout, drawn from Philox at the global
// (b, h, q, k) index exactly as the CPU op (ops/cpu/attention.cpp, AttnDropout) and
// attention.cu's CUDA-core kernel draw them (see flash_attention.cu's opening comment).
#pragma once
#include <cstdint>

#include "base/philox.h"

namespace mcpp::ops::cuda {

// The dropout mask's key and global coordinates.
struct FaDrop {
  uint64_t seed, stream;
  uint32_t threshold;  // keep iff (u32 >> 8) >= threshold  <=>  uniform >= p
  float scale;         // 1 / (1 - p)
  int64_t b_off, h_off, NHg, q_off, k_off, Sg;
  bool aligned;        // global index = 4j + (local key & 3): a key group is one block

  __device__ __forceinline__ uint64_t index(int64_t b, int64_t h, int64_t q, int64_t k) const {
    return uint64_t((((b + b_off) * NHg + h + h_off) * Sg + q + q_off) * Sg + k + k_off);
  }
  __device__ __forceinline__ uint32_t keep(uint32_t u) const { return (u >> 8) >= threshold; }
  // The Philox block holding global index i (Philox::u32's counter for i).
  __device__ __forceinline__ void block(uint64_t i, uint32_t w[4]) const {
    const uint64_t ctr = i >> 2;
    w[0] = uint32_t(ctr), w[1] = uint32_t(ctr >> 32), w[2] = uint32_t(stream),
    w[3] = uint32_t(stream >> 32);
    Philox::block(w, uint32_t(seed), uint32_t(seed >> 32));
  }
};

// Keep bits of a warp's 16 x 64 score tile in the mma C layout, rows = queries (forward,
// dQ): bit (r * 8 + n) * 2 + c is element (row0 + 8r, k0 + 8n + 2tq + c), row0 = this
// lane's first row. Lanes tq and tq ^ 1 hold the two halves of the aligned key group
// k0 + 8n + 4 (tq >> 1) + 0..3 of the same rows: each draws the blocks of half the n and
// hands the partner its half.
__device__ __forceinline__ uint32_t keep_bits_rows_q(const FaDrop& D, int64_t b, int64_t h,
                                                     int64_t row0, int64_t k0, int tq) {
  uint32_t mine = 0;
  if (D.aligned) {
    const int par = tq & 1;
    uint32_t other = 0;
    // One block at a time (unroll 1): unrolled, the blocks run side by side and take
    // 40-110 more registers, which spills in the head-dim-128 kernels.
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int nn = 0; nn < 4; ++nn) {
        const int n = 2 * nn + par;
        uint32_t w[4];
        D.block(D.index(b, h, row0 + 8 * r, k0 + 8 * n + 4 * (tq >> 1)), w);
        const int bit = (r * 8 + n) * 2;
        const uint32_t lo = D.keep(w[0]) | D.keep(w[1]) << 1, hi = D.keep(w[2]) | D.keep(w[3]) << 1;
        mine |= (par ? hi : lo) << bit;
        other |= (par ? lo : hi) << bit;
      }
    mine |= __shfl_xor_sync(0xffffffffu, other, 1);
  } else {
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int n = 0; n < 8; ++n)
#pragma unroll 1
        for (int c = 0; c < 2; ++c) {
          const uint64_t i = D.index(b, h, row0 + 8 * r, k0 + 8 * n + 2 * tq + c);
          mine |= D.keep(Philox::u32(D.seed, D.stream, i)) << ((r * 8 + n) * 2 + c);
        }
  }
  return mine;
}

// The same for dK/dV's transposed tile, rows = keys: bit (r * 8 + n) * 2 + c is element
// (query q0 + 8n + 2tq + c, key key0 + 8r), key0 = kbase + (gr & 3), kbase = the warp's
// aligned group start (k0 + 16 warp + (gr & ~3)). The four lanes gr & ~3 .. + 3 (same tq)
// hold the four keys of each group: lane i draws the blocks of n = 2i, 2i + 1 and sends
// lane t the bits of key offset t (one byte per lane, four shuffles).
__device__ __forceinline__ uint32_t keep_bits_rows_k(const FaDrop& D, int64_t b, int64_t h,
                                                     int64_t kbase, int64_t q0, int gr, int tq,
                                                     int lane) {
  uint32_t mine = 0;
  const int i = gr & 3;
  if (D.aligned) {
    uint32_t out = 0;  // byte t, bit j: key offset t of block j = (nn * 2 + c) * 2 + r
#pragma unroll 1
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll 1
      for (int c = 0; c < 2; ++c)
#pragma unroll 1
        for (int r = 0; r < 2; ++r) {
          const int j = (nn * 2 + c) * 2 + r;
          uint32_t w[4];
          D.block(D.index(b, h, q0 + 8 * (2 * i + nn) + 2 * tq + c, kbase + 8 * r), w);
#pragma unroll
          for (int t = 0; t < 4; ++t) out |= D.keep(w[t]) << (8 * t + j);
        }
#pragma unroll
    for (int src = 0; src < 4; ++src) {
      const uint32_t v = __shfl_sync(0xffffffffu, out, lane + 4 * (src - i)) >> (8 * i);
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int j = (nn * 2 + c) * 2 + r, n = 2 * src + nn;
            mine |= ((v >> j) & 1u) << ((r * 8 + n) * 2 + c);
          }
    }
  } else {
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int n = 0; n < 8; ++n)
#pragma unroll 1
        for (int c = 0; c < 2; ++c) {
          const uint64_t idx = D.index(b, h, q0 + 8 * n + 2 * tq + c, kbase + i + 8 * r);
          mine |= D.keep(Philox::u32(D.seed, D.stream, idx)) << ((r * 8 + n) * 2 + c);
        }
  }
  return mine;
}

__device__ __forceinline__ bool kept(uint32_t bits, int n, int e) {
  return (bits >> (((e >> 1) * 8 + n) * 2 + (e & 1))) & 1u;
}

}  // namespace mcpp::ops::cuda
