// Attention dropout inside flash_attention.cu's kernels: the keep bits of a warp's 16 x 64
// score tile in the mma.sync m16n8k16 C-fragment layout, drawn at the global (b, h, q, k)
// index exactly as the CPU op (ops/cpu/attention.cpp, AttnDropout) and attention.cu's
// CUDA-core kernel draw them: DropoutMask of base/philox.h, eight 16-bit uniforms per
// Philox-4x32-7 block (see flash_attention.cu's opening comment).
#pragma once
#include <cstdint>

#include "base/philox.h"
#include "ops/types.h"

namespace mcpp::ops::cuda {

// __byte_perm (byte n of the result = byte (s >> 4n) & 7 of y:x), also on the host.
__host__ __device__ __forceinline__ uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t(v >> (8 * ((s >> (4 * n)) & 7)) & 0xFFu) << (8 * n);
  return r;
#endif
}

// The dropout mask's key and global coordinates. The Philox work is most of the cost of
// dropout here, so its round keys come precomputed from the kernel parameters (a
// constant-bank operand of the XOR, no add per round) and the first round's product of
// the stream word is folded in (set_key).
struct FaDrop {
  static constexpr int R = DropoutMask::kRounds;
  uint64_t seed, stream;
  uint32_t rk0[R], rk1[R];  // round r's key words: seed words + r (W0, W1)
  uint32_t x0, x1, s_lo;    // round 0: hi(M1 stream_lo) ^ rk0[0], stream_hi ^ rk1[0], lo(M1 stream_lo)
  uint32_t threshold;       // keep iff u16 >= threshold  <=>  u16 / 2^16 >= p
  uint32_t thr2, maj;       // keep_msbs's operands for this threshold (set_threshold)
  float scale;              // DropoutMask::keep_scale(p)
  int64_t b_off, h_off, NHg, q_off, k_off, Sg;
  bool aligned;  // global index = 8j + (local key & 7): an aligned group of 8 keys is one block

  __host__ void set_key(uint64_t sd, uint64_t st) {
    seed = sd, stream = st;
    for (int r = 0; r < R; ++r)
      rk0[r] = uint32_t(sd) + uint32_t(r) * Philox::kW0,
      rk1[r] = uint32_t(sd >> 32) + uint32_t(r) * Philox::kW1;
    const uint64_t p1 = uint64_t(Philox::kM1) * uint32_t(st);
    x0 = uint32_t(p1 >> 32) ^ rk0[0], x1 = uint32_t(st >> 32) ^ rk1[0], s_lo = uint32_t(p1);
  }
  // keep_msbs's two forms: at most half the uniforms dropped (t <= 2^15), a half is kept
  // when its top bit is set or its low 15 bits reach t; else when its top bit is set and
  // its low 15 bits reach t - 2^15. thr2 puts that bound in both halves, maj picks OR / AND.
  __host__ void set_threshold(uint32_t t) {
    threshold = t;
    const bool low = t <= 0x8000u;
    thr2 = (low ? t : t - 0x8000u) * 0x10001u;
    maj = low ? 0xFFFFFFFFu : 0u;
  }
  // Everything from the op's arguments: the key, threshold, keep scale, global offsets
  // and the aligned-path test. The one place the flash and the CP block kernels set it
  // up, so both always draw the mask the CPU op draws.
  __host__ void setup(const AttentionDims& d, double p, DropoutKey key) {
    set_key(key.seed, key.stream);
    set_threshold(DropoutMask::threshold(p));
    scale = float(DropoutMask::keep_scale(p));
    b_off = d.b_offset, h_off = d.h_offset, q_off = d.q_offset, k_off = d.k_offset;
    NHg = d.NH_global > 0 ? d.NH_global : d.NH;
    Sg = d.S_global > 0 ? d.S_global : d.S;
    aligned = Sg % 8 == 0 && k_off % 8 == 0;
  }
  __host__ __device__ __forceinline__ uint64_t index(int64_t b, int64_t h, int64_t q, int64_t k) const {
    return uint64_t((((b + b_off) * NHg + h + h_off) * Sg + q + q_off) * Sg + k + k_off);
  }
  // The eight keep bits of DropoutMask::block at counter ctr (global indices 8 ctr ..
  // 8 ctr + 7; bit e = element 8 ctr + e kept).
  __device__ __forceinline__ uint32_t keep8(uint64_t ctr) const {
    uint32_t w0, w1, w2, w3;
    words(ctr, w0, w1, w2, w3);
    return keep8_of(msb_bytes(keep_msbs(w0), keep_msbs(w1)),
                    msb_bytes(keep_msbs(w2), keep_msbs(w3)));
  }
  // The block's four words (word t: the 16-bit uniforms of elements 2t, 2t + 1 in its low
  // and high halves).
  __device__ __forceinline__ void words(uint64_t ctr, uint32_t& w0, uint32_t& w1, uint32_t& w2,
                                        uint32_t& w3) const {
    const uint64_t q0 = uint64_t(Philox::kM0) * uint32_t(ctr);
    uint32_t c0 = x0 ^ uint32_t(ctr >> 32), c1 = s_lo, c2 = uint32_t(q0 >> 32) ^ x1,
             c3 = uint32_t(q0);
#pragma unroll
    for (int r = 1; r < R; ++r) {
      const uint64_t p0 = uint64_t(Philox::kM0) * c0, p1 = uint64_t(Philox::kM1) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ rk0[r], n2 = uint32_t(p0 >> 32) ^ c3 ^ rk1[r];
      c0 = n0, c1 = uint32_t(p1), c2 = n2, c3 = uint32_t(p0);
    }
    w0 = c0, w1 = c1, w2 = c2, w3 = c3;
  }
  // A word's two keep bits, both halves at once: bit 15 (element 2t) and bit 31 (element
  // 2t + 1); the other bits are garbage. s = (w | 0x80008000) - thr2 borrows nothing across
  // the halves (each half of the minuend is at least 2^15 >= its bound), so bit 15 of a half
  // of s says its low 15 bits reach the bound; the majority of w, s and maj is then
  // top | reach (maj all ones) or top & reach (maj zero): three integer operations for two
  // compares, where the two compares and their bits took seven.
  __host__ __device__ __forceinline__ uint32_t keep_msbs(uint32_t w) const {
    const uint32_t s = (w | 0x80008000u) - thr2;
    return (w & s) | ((w | s) & maj);
  }
  // Two words' keep bits as the top bits of four bytes: byte 0, 1 = word a's elements 0, 1,
  // byte 2, 3 = word b's.
  __host__ __device__ static __forceinline__ uint32_t msb_bytes(uint32_t ka, uint32_t kb) {
    return byte_perm(ka, kb, 0x7531);
  }
  // A block's eight keep bits (bit e = element e) from msb_bytes of words 0, 1 and 2, 3:
  // the top bits to bits 0, 8, 16, 24 and 4, 12, 20, 28, then one product gathers them into
  // bits 21 .. 28 (every partial product lands on its own bit: no carries).
  __host__ __device__ static __forceinline__ uint32_t keep8_of(uint32_t p01, uint32_t p23) {
    const uint32_t z = ((p01 >> 7) & 0x01010101u) | ((p23 >> 3) & 0x10101010u);
    return ((z * 0x00204081u) >> 21) & 0xFFu;
  }
  __device__ __forceinline__ uint32_t keep1(uint64_t i) const {
    return DropoutMask::u16(seed, stream, i) >= threshold;
  }
};

// In each byte, bit m of the low nibble to bit 2m and bit m of the high nibble to bit
// 2m + 1 (two swaps of bit groups, four bytes at once).
__host__ __device__ __forceinline__ uint32_t interleave_nibbles(uint32_t x) {
  uint32_t t = (x >> 2 ^ x) & 0x0C0C0C0Cu;
  x ^= t | t << 2;
  t = (x >> 1 ^ x) & 0x22222222u;
  return x ^ (t | t << 1);
}
// keep_bits_rows_q's gathering: block m's msb_bytes p into bit m of each byte of acc ...
__host__ __device__ __forceinline__ uint32_t gather_block(uint32_t acc, uint32_t p, int m) {
  return acc | ((p >> (7 - m)) & (0x01010101u << m));
}
// ... and, once the four blocks are in (o01: words 0, 1; o23: words 2, 3), its `out`:
// byte t = word t's bits, bit 2m + c = element c of block m (kept_q's order in a byte).
__host__ __device__ __forceinline__ uint32_t rows_q_out(uint32_t o01, uint32_t o23) {
  return interleave_nibbles(byte_perm(o01 | o01 >> 4, o23 | o23 >> 4, 0x6420));
}

// keep_bits_rows_q's layout: the bit of C-fragment element e (row half e >> 1, column
// e & 1) of n-tile n.
__host__ __device__ constexpr int kept_q_bit(int n, int e) {
  return 8 * (n & 3) + 4 * (e >> 1) + 2 * (n >> 2) + (e & 1);
}
__device__ __forceinline__ bool kept_q(uint32_t bits, int n, int e) {
  return (bits >> kept_q_bit(n, e)) & 1u;
}

// Keep bits of a warp's 16 x 64 score tile in the mma C layout, rows = queries (forward,
// dQ), in the layout kept_q reads: element (row0 + 8r, k0 + 8n + 2tq + c) is bit
// 8 (n & 3) + 4r + 2 (n >> 2) + c, row0 = this lane's first row. The four lanes tq = 0..3
// of a row group hold the aligned key group k0 + 8n + 0..7 of the same rows (two keys
// each, one 32-bit word of its Philox block: word t = keys 2t, 2t + 1), one block: lane tq
// draws the blocks m = 2r + nn of n = tq + 4 nn, and byte t of its `out` holds partner t's
// two bits of each (bits 2m, 2m + 1); each lane then takes byte tq of the four partners'
// words (four shuffles, three byte permutes) -- byte s of the result is what lane s drew,
// which is why the layout orders the bits by n & 3 first. The blocks' bits are gathered
// word by word first (o01, o23: bit m of byte 2t' + c = element c of word t' of block m,
// from keep_msbs and msb_bytes, one shift and one masked OR a block and word pair), and
// `out` is made of them once a tile (a nibble interleave in each byte).
// store0, store1 (aligned path only; may be null): where the blocks of rows row0 and
// row0 + 8 go for the backward, byte n = keys k0 + 8n .. + 7 (the forward's FaMaskBuf rows
// at key k0: mask_row_q).
template <bool UNROLL = false>
__device__ __forceinline__ uint32_t keep_bits_rows_q(const FaDrop& D, int64_t b, int64_t h,
                                                     int64_t row0, int64_t k0, int tq,
                                                     int lane, uint8_t* store0 = nullptr,
                                                     uint8_t* store1 = nullptr) {
  uint32_t mine = 0;
  if (D.aligned) {
    // Counters of (row0, k0) and (row0 + 8, k0); the blocks step by one per 8 keys.
    const uint64_t c0 = D.index(b, h, row0, k0) >> 3, c1 = D.index(b, h, row0 + 8, k0) >> 3;
    uint32_t o01 = 0, o23 = 0;
    // UNROLL: the four blocks side by side (more registers: the head-dim-128 and the
    // backward kernels would spill, so they draw one block at a time).
    auto draw = [&](int m) {
      const int r = m >> 1, n = tq + 4 * (m & 1);
      uint32_t w0, w1, w2, w3;
      D.words((r ? c1 : c0) + uint64_t(n), w0, w1, w2, w3);
      const uint32_t p01 = FaDrop::msb_bytes(D.keep_msbs(w0), D.keep_msbs(w1)),
                     p23 = FaDrop::msb_bytes(D.keep_msbs(w2), D.keep_msbs(w3));
      o01 = gather_block(o01, p01, m);
      o23 = gather_block(o23, p23, m);
      if (uint8_t* row = r ? store1 : store0) row[n] = uint8_t(FaDrop::keep8_of(p01, p23));
    };
    if constexpr (UNROLL) {
#pragma unroll
      for (int m = 0; m < 4; ++m) draw(m);
    } else {
#pragma unroll 1
      for (int m = 0; m < 4; ++m) draw(m);
    }
    const uint32_t out = rows_q_out(o01, o23);
    const int base = lane & ~3;
    const uint32_t v0 = __shfl_sync(0xffffffffu, out, base),
                   v1 = __shfl_sync(0xffffffffu, out, base | 1),
                   v2 = __shfl_sync(0xffffffffu, out, base | 2),
                   v3 = __shfl_sync(0xffffffffu, out, base | 3);
    const uint32_t sel = uint32_t(tq) | uint32_t(tq + 4) << 4;
    mine = __byte_perm(__byte_perm(v0, v1, sel), __byte_perm(v2, v3, sel), 0x5410);
  } else {
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int n = 0; n < 8; ++n)
#pragma unroll 1
        for (int c = 0; c < 2; ++c)
          mine |= D.keep1(D.index(b, h, row0 + 8 * r, k0 + 8 * n + 2 * tq + c))
                  << kept_q_bit(n, 2 * r + c);
  }
  return mine;
}

// dK/dV's transposed tile, rows = keys: element (query q0 + 8n + 2tq + c, key kw + gr + 8r),
// C-fragment element e = 2r + c of n-tile n, kw = k0 + 16 warp (a multiple of 8), is bit
// kept_k_bit(n, e) = 8 (2c + r) + n. The eight lanes gr = 0..7 (same tq) hold the eight
// keys of each aligned group kw + 8r + 0..7 for the same queries, one block per (query,
// r): lane gr holds the four blocks of n = gr -- `blocks`, byte m = 2c + r is the block of
// (query q0 + 8 gr + 2 tq + c, keys kw + 8r .. + 7). Each lane reads the eight partners'
// words (eight shuffles) and takes bit gr of every byte: bit t of byte m of partner n's
// word lands on bit 8m + n (one shift, mask and shifted OR per partner; the four bytes are
// four 8 x 8 bit transposes done side by side).
__host__ __device__ constexpr int kept_k_bit(int n, int e) {
  return 8 * (2 * (e & 1) + (e >> 1)) + n;
}
__device__ __forceinline__ bool kept_k(uint32_t bits, int n, int e) {
  return (bits >> kept_k_bit(n, e)) & 1u;
}
__device__ __forceinline__ uint32_t rows_k_from_blocks(uint32_t blocks, int gr, int tq) {
  uint32_t mine = 0;
#pragma unroll
  for (int n = 0; n < 8; ++n)
    mine |= ((__shfl_sync(0xffffffffu, blocks, 4 * n + tq) >> gr) & 0x01010101u) << n;
  return mine;
}

// The blocks drawn (aligned path; `drawn` is rows_k_from_blocks's `blocks`, for the dQ
// kernel: FaMaskBuf), or element by element (the rest; drawn stays 0).
__device__ __forceinline__ uint32_t keep_bits_rows_k(const FaDrop& D, int64_t b, int64_t h,
                                                     int64_t kw, int64_t q0, int gr, int tq,
                                                     uint32_t& drawn) {
  uint32_t mine = 0;
  drawn = 0;
  if (D.aligned) {
    // Global row (b, h, q) of this lane's first query q0 + 8 gr + 2 tq.
    const uint64_t row = uint64_t(((b + D.b_off) * D.NHg + h + D.h_off) * D.Sg + q0 + 8 * gr +
                                  2 * tq + D.q_off),
                   kb = uint64_t(kw + D.k_off), Sg = uint64_t(D.Sg);
#pragma unroll 1
    for (int m = 0; m < 4; ++m) {
      const int c = m >> 1, r = m & 1;
      drawn |= D.keep8(((row + uint64_t(c)) * Sg + kb) / 8 + uint64_t(r)) << (8 * m);
    }
    mine = rows_k_from_blocks(drawn, gr, tq);
  } else {
#pragma unroll 1
    for (int r = 0; r < 2; ++r)
#pragma unroll 1
      for (int n = 0; n < 8; ++n)
#pragma unroll 1
        for (int c = 0; c < 2; ++c)
          mine |= D.keep1(D.index(b, h, q0 + 8 * n + 2 * tq + c, kw + gr + 8 * r))
                  << kept_k_bit(n, 2 * r + c);
  }
  return mine;
}

// The keep bits of a call's causal scores in device memory (FaMaskBuf): a byte per eight
// keys (bit e of byte j = key 8j + e) of each row (b, h, q), only the key tiles a causal
// row reaches: row q of query tile t = q / 64 holds the 8 (t + 1) bytes of keys 0 .. 64 (t +
// 1) - 1, and the rows of (b, h) follow one another tile by tile (256 nt (nt + 1) bytes,
// nt = ceil(S / 64); half of a square layout). A 64-key tile of a row is one aligned 8-byte
// word. Used on the aligned path only (S_global, k_off and S multiples of 8). Who writes it:
// the forward when the caller keeps a buffer from forward to backward (the model's layers:
// AttentionDims::keep_bits), and both backward kernels read it, one draw per layer and
// step; else the dK/dV kernel, for the dQ kernel. Its size: ops::flash_dropout_mask_bytes
// (attention_backend.h), which the memory plan can call without CUDA.
struct FaMaskBuf {
  // The byte offset of row (bh = b NH + h, q).
  __device__ __forceinline__ static int64_t row(int64_t S, int64_t bh, int64_t q) {
    const int64_t nt = (S + 63) / 64, t = q >> 6;
    return bh * 256 * nt * (nt + 1) + 256 * t * (t + 1) + (q & 63) * 8 * (t + 1);
  }
};

// The buffer row of (bh, row), or null when row >= S or there is no buffer.
__device__ __forceinline__ uint8_t* mask_row_q(uint8_t* mask, int64_t S, int64_t bh,
                                               int64_t row) {
  return mask && row < S ? mask + FaMaskBuf::row(S, bh, row) : nullptr;
}

// dK/dV side, reading: the blocks keep_bits_rows_k would draw, from the buffer (two bytes,
// keys kw .. kw + 15, for each of the lane's two queries; 0 past S), in its `drawn`
// layout (rows_k_from_blocks makes the keep bits of them).
__device__ __forceinline__ uint32_t load_mask_blocks_k(const uint8_t* mask, int64_t S, int64_t bh,
                                                     int64_t kw, int64_t q0, int gr, int tq) {
  uint32_t blocks = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int64_t q = q0 + 8 * gr + 2 * tq + c;
    if (q < S)
      blocks |= uint32_t(*reinterpret_cast<const uint16_t*>(mask + FaMaskBuf::row(S, bh, q) +
                                                            kw / 8))
                << (16 * c);
  }
  return blocks;
}

// dK/dV side: this lane's drawn blocks (keep_bits_rows_k's `drawn`) into the buffer: two
// bytes (keys kw .. kw + 15, kw a multiple of 16, in a tile at or left of q's) for each of
// its two queries. Columns past S land in the row's padding; rows past S are not written.
__device__ __forceinline__ void store_mask(uint8_t* mask, int64_t S, int64_t bh, int64_t q,
                                           int64_t kw, uint32_t drawn) {
#pragma unroll
  for (int c = 0; c < 2; ++c)
    if (q + c < S)
      *reinterpret_cast<uint16_t*>(mask + FaMaskBuf::row(S, bh, q + c) + kw / 8) =
          uint16_t((drawn >> (16 * c)) & 0xFFFFu);
}

// dQ side: the keep bits of rows row0, row0 + 8 and keys k0 .. k0 + 63 (k0 a multiple of
// 64, at or left of the rows' tile) in keep_bits_rows_q's layout (kept_q), read from the
// buffer.
__device__ __forceinline__ uint32_t load_mask_rows_q(const uint8_t* mask, int64_t S, int64_t bh,
                                                     int64_t row0, int64_t k0, int tq) {
  uint32_t mine = 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 8 * r;
    if (row >= S) continue;
    const uint64_t v =
        *reinterpret_cast<const uint64_t*>(mask + FaMaskBuf::row(S, bh, row) + k0 / 8);
    const uint64_t w = v >> (2 * tq);
#pragma unroll
    for (int n = 0; n < 8; ++n) mine |= uint32_t((w >> (8 * n)) & 3u) << kept_q_bit(n, 2 * r);
  }
  return mine;
}

}  // namespace mcpp::ops::cuda
