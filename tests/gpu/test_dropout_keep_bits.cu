// The bit arithmetic by which the flash kernels turn a Philox block's eight 16-bit uniforms
// into keep bits (flash_attention_dropout.cuh: keep_msbs, msb_bytes, keep8_of,
// gather_block, rows_q_out), checked on the host against the plain rule "keep iff
// u16 >= threshold" one element at a time. The kernels' masks are checked against the CPU
// op by test_flash_dropout.cpp on the GPU; this test pins the formulas themselves for every
// threshold class (at most and above 2^15, the ends 0 and 65536) and for uniforms equal to
// the threshold or one below it.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ops/cuda/flash_attention_dropout.cuh"

namespace mcpp::ops::cuda {
namespace {

uint32_t keep(uint32_t u, uint32_t t) { return u >= t ? 1u : 0u; }
// Element c (0: low half, 1: high half) of word w.
uint32_t half(uint32_t w, int c) { return c ? w >> 16 : w & 0xFFFFu; }

std::vector<uint32_t> thresholds() {
  std::vector<uint32_t> t = {0, 1, 2, 6554, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF, 0x10000};
  std::mt19937 g(11);
  for (int i = 0; i < 200; ++i) t.push_back(g() % 0x10001u);
  return t;
}

// A block's four words: random, with halves set to t and t - 1 now and then.
void draw_block(std::mt19937& g, uint32_t t, int i, uint32_t w[4]) {
  for (int q = 0; q < 4; ++q) {
    w[q] = g();
    if ((i + q) % 5 == 0) w[q] = (w[q] & 0xFFFF0000u) | (t & 0xFFFFu);
    if ((i + q) % 7 == 0) w[q] = ((t - 1) & 0xFFFFu) << 16 | (w[q] & 0xFFFFu);
  }
}

TEST(DropoutKeepBits, KeepMsbsIsTheThresholdCompareOfBothHalves) {
  std::mt19937 g(1);
  for (uint32_t t : thresholds()) {
    FaDrop D{};
    D.set_threshold(t);
    for (int i = 0; i < 500; ++i) {
      uint32_t w[4];
      draw_block(g, t, i, w);
      for (uint32_t x : w) {
        const uint32_t k = D.keep_msbs(x);
        ASSERT_EQ(k >> 15 & 1u, keep(half(x, 0), t)) << "t " << t << " w " << x;
        ASSERT_EQ(k >> 31, keep(half(x, 1), t)) << "t " << t << " w " << x;
      }
    }
  }
}

TEST(DropoutKeepBits, Keep8OfPutsElementEOnBitE) {
  std::mt19937 g(2);
  for (uint32_t t : thresholds()) {
    FaDrop D{};
    D.set_threshold(t);
    for (int i = 0; i < 200; ++i) {
      uint32_t w[4];
      draw_block(g, t, i, w);
      uint32_t want = 0;
      for (int e = 0; e < 8; ++e) want |= keep(half(w[e >> 1], e & 1), t) << e;
      const uint32_t got = FaDrop::keep8_of(
          FaDrop::msb_bytes(D.keep_msbs(w[0]), D.keep_msbs(w[1])),
          FaDrop::msb_bytes(D.keep_msbs(w[2]), D.keep_msbs(w[3])));
      ASSERT_EQ(got, want) << "t " << t;
    }
  }
}

// keep_bits_rows_q's `out`: byte t holds word t of the four blocks m, element c at bit
// 2m + c -- the bytes the lanes exchange.
TEST(DropoutKeepBits, RowsQOutIsTheExchangedBytesLayout) {
  std::mt19937 g(3);
  for (uint32_t t : thresholds()) {
    FaDrop D{};
    D.set_threshold(t);
    for (int i = 0; i < 200; ++i) {
      uint32_t want = 0, o01 = 0, o23 = 0;
      for (int m = 0; m < 4; ++m) {
        uint32_t w[4];
        draw_block(g, t, i + m, w);
        for (int q = 0; q < 4; ++q)
          for (int c = 0; c < 2; ++c) want |= keep(half(w[q], c), t) << (8 * q + 2 * m + c);
        o01 = gather_block(o01, FaDrop::msb_bytes(D.keep_msbs(w[0]), D.keep_msbs(w[1])), m);
        o23 = gather_block(o23, FaDrop::msb_bytes(D.keep_msbs(w[2]), D.keep_msbs(w[3])), m);
      }
      ASSERT_EQ(rows_q_out(o01, o23), want) << "t " << t;
    }
  }
}

}  // namespace
}  // namespace mcpp::ops::cuda
