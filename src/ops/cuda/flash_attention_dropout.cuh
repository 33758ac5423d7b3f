// Attention dropout inside flash_attention.cu's kernels: the keep bits of a warp's 16 x 64
// score tile in the mma.sync m16n8k16 C-fragment layout, drawn from Philox at the global
// (b, h, q, k) index exactly as the CPU op (ops/cpu/attention.cpp, AttnDropout) and
// attention.cu's CUDA-core kernel draw them (see flash_attention.cu's opening comment).
#pragma once
#include <cstdint>

#include "base/philox.h"

namespace mcpp::ops::cuda {

// The dropout mask's key and global coordinates. The Philox work is most of the cost of
// dropout here (10 rounds per block), so its round keys come precomputed from the kernel
// parameters (a constant-bank operand of the XOR, no add per round) and the first round's
// product of the stream word is folded in (set_key).
struct FaDrop {
  uint64_t seed, stream;
  uint32_t rk0[10], rk1[10];  // round r's key words: seed words + r (W0, W1)
  uint32_t x0, x1, s_lo;      // round 0: hi(M1 stream_lo) ^ rk0[0], stream_hi ^ rk1[0], lo(M1 stream_lo)
  uint32_t threshold;  // keep iff (u32 >> 8) >= threshold  <=>  uniform >= p
  float scale;         // 1 / (1 - p)
  int64_t b_off, h_off, NHg, q_off, k_off, Sg;
  bool aligned;        // global index = 4j + (local key & 3): a key group is one block

  __host__ void set_key(uint64_t sd, uint64_t st) {
    seed = sd, stream = st;
    for (int r = 0; r < 10; ++r)
      rk0[r] = uint32_t(sd) + uint32_t(r) * Philox::kW0,
      rk1[r] = uint32_t(sd >> 32) + uint32_t(r) * Philox::kW1;
    const uint64_t p1 = uint64_t(Philox::kM1) * uint32_t(st);
    x0 = uint32_t(p1 >> 32) ^ rk0[0], x1 = uint32_t(st >> 32) ^ rk1[0], s_lo = uint32_t(p1);
  }
  __host__ __device__ __forceinline__ uint64_t index(int64_t b, int64_t h, int64_t q, int64_t k) const {
    return uint64_t((((b + b_off) * NHg + h + h_off) * Sg + q + q_off) * Sg + k + k_off);
  }
  __device__ __forceinline__ uint32_t keep(uint32_t u) const { return (u >> 8) >= threshold; }
  // The Philox block holding global index i: Philox::block on the counter
  // (i >> 2, stream) under the seed (Philox::u32's four lanes), written out round by round.
  __host__ __device__ __forceinline__ void block(uint64_t i, uint32_t w[4]) const {
    const uint64_t ctr = i >> 2;
    const uint64_t q0 = uint64_t(Philox::kM0) * uint32_t(ctr);
    uint32_t c0 = x0 ^ uint32_t(ctr >> 32), c1 = s_lo, c2 = uint32_t(q0 >> 32) ^ x1,
             c3 = uint32_t(q0);
#pragma unroll
    for (int r = 1; r < 10; ++r) {
      const uint64_t p0 = uint64_t(Philox::kM0) * c0, p1 = uint64_t(Philox::kM1) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ rk0[r], n2 = uint32_t(p0 >> 32) ^ c3 ^ rk1[r];
      c0 = n0, c1 = uint32_t(p1), c2 = n2, c3 = uint32_t(p0);
    }
    w[0] = c0, w[1] = c1, w[2] = c2, w[3] = c3;
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
    // Global index of (row0 + 8r, k0 + 4 (tq >> 1)); the blocks step by 8 keys.
    const uint64_t base0 = D.index(b, h, row0, k0 + 4 * (tq >> 1)),
                   base1 = D.index(b, h, row0 + 8, k0 + 4 * (tq >> 1));
    // One block at a time (unroll 1): unrolled, the blocks run side by side and take
    // 40-110 more registers, which spills in the head-dim-128 kernels.
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int nn = 0; nn < 4; ++nn) {
        const int n = 2 * nn + par;
        uint32_t w[4];
        D.block((r ? base1 : base0) + uint64_t(8 * n), w);
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
    // Global row (b, h, q) of this lane's first query q0 + 16i + 2tq, and the keys' offset.
    const uint64_t row = uint64_t(((b + D.b_off) * D.NHg + h + D.h_off) * D.Sg + q0 + 16 * i +
                                  2 * tq + D.q_off),
                   kb = uint64_t(kbase + D.k_off), Sg = uint64_t(D.Sg);
#pragma unroll 1
    for (int nn = 0; nn < 2; ++nn)
#pragma unroll 1
      for (int c = 0; c < 2; ++c)
#pragma unroll 1
        for (int r = 0; r < 2; ++r) {
          const int j = (nn * 2 + c) * 2 + r;
          uint32_t w[4];
          D.block((row + uint64_t(8 * nn + c)) * Sg + kb + uint64_t(8 * r), w);
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
