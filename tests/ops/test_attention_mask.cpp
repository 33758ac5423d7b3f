// The attention-dropout mask (DropoutMask, base/philox.h: 16-bit uniforms, eight per
// Philox-4x32-7 block): its statistics over 1e7 elements, and its definition through
// whole blocks against the per-element draw the CUDA kernels' fallback uses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/philox.h"

namespace mcpp {
namespace attention_mask_test {

constexpr uint64_t kSeed = 0x5EEDull * 1000003ull, kStream = 0xA77E11ull;
constexpr int64_t kN = 10'000'000;  // a multiple of 8

// u16 of elements [first, first + kN), block by block.
std::vector<uint16_t> draw(uint64_t first) {
  std::vector<uint16_t> u(static_cast<size_t>(kN));
  for (int64_t j = 0; j < kN / 8; ++j) {
    uint32_t w[4];
    DropoutMask::block(kSeed, kStream, first / 8 + uint64_t(j), w);
    for (int e = 0; e < 8; ++e) u[size_t(8 * j + e)] = uint16_t(DropoutMask::pick(w, e));
  }
  return u;
}

TEST(DropoutMask, KeptFractionIsOneMinusPWithinFiveSigma) {
  const std::vector<uint16_t> u = draw(uint64_t(1) << 40);  // far from counter 0
  for (double p : {0.01, 0.1, 0.25, 0.5, 0.9}) {
    const uint32_t t = DropoutMask::threshold(p);
    int64_t kept = 0;
    for (uint16_t v : u) kept += v >= t;
    const double q = 1.0 - double(t) / 65536.0;  // the quantised keep probability
    const double sigma = std::sqrt(double(kN) * q * (1 - q));
    SCOPED_TRACE(::testing::Message() << "p=" << p << " kept " << kept << " of " << kN);
    EXPECT_LT(std::fabs(double(kept) - double(kN) * q), 5 * sigma);
    // The quantisation moves p by less than 2^-16; the scale makes E[keep * scale] = 1.
    EXPECT_LE(std::fabs((1 - q) - p), 1.0 / 65536.0);
    EXPECT_NEAR(q * DropoutMask::keep_scale(p), 1.0, 1e-15);
  }
}

TEST(DropoutMask, NeighboursAreUncorrelated) {
  // Elements sharing a 32-bit word (i, i + 1), a block (i, i + 2) and adjacent blocks
  // (i, i + 8): the fraction of (disjoint) pairs both kept at p = 0.5 is q^2 within 5 sigma.
  const std::vector<uint16_t> u = draw(0);
  const uint32_t t = DropoutMask::threshold(0.5);
  for (int lag : {1, 2, 4, 8}) {
    int64_t both = 0, n = 0;
    for (int64_t i = 0; i + lag < kN; i += 2 * lag) both += (u[size_t(i)] >= t) & (u[size_t(i + lag)] >= t), ++n;
    const double q2 = 0.25, sigma = std::sqrt(double(n) * q2 * (1 - q2));
    EXPECT_LT(std::fabs(double(both) - double(n) * q2), 5 * sigma) << "lag " << lag;
  }
  // The mean of the 16-bit values: (2^16 - 1) / 2 within 5 sigma (uniform over 0..65535).
  double sum = 0;
  for (uint16_t v : u) sum += v;
  const double sd = std::sqrt((65536.0 * 65536.0 - 1) / 12.0 / double(kN));
  EXPECT_LT(std::fabs(sum / double(kN) - 32767.5), 5 * sd);
}

TEST(DropoutMask, PerElementDrawIsTheBlocksDraw) {
  const std::vector<uint16_t> u = draw(8 * 12345);
  for (int64_t i = 0; i < 4096; ++i)
    ASSERT_EQ(DropoutMask::u16(kSeed, kStream, uint64_t(8 * 12345 + i)), u[size_t(i)]) << i;
  EXPECT_EQ(DropoutMask::uniform(kSeed, kStream, 8 * 12345 + 5), float(u[5]) / 65536.0f);
  // p = 0 keeps everything, p just below 1 nothing (scale 0, no division by zero).
  EXPECT_EQ(DropoutMask::threshold(0.0), 0u);
  EXPECT_EQ(DropoutMask::keep_scale(0.0), 1.0);
  EXPECT_EQ(DropoutMask::threshold(0.99999999), 65536u);
  EXPECT_EQ(DropoutMask::keep_scale(0.99999999), 0.0);
}

TEST(DropoutMask, SevenRoundsArePhiloxsFirstSevenRounds) {
  // Philox::block<7> then three more rounds (keys advanced by 7 W) is Philox::block<10>.
  uint32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
  const uint32_t k0 = 0xA4093822u, k1 = 0x299F31D0u;
  Philox::block<7>(a, k0, k1);
  Philox::block<3>(a, k0 + 7 * Philox::kW0, k1 + 7 * Philox::kW1);
  Philox::block(b, k0, k1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]);
  uint32_t c[4] = {1, 2, 3, 4};
  Philox::block<7>(c, k0, k1);
  EXPECT_NE(c[0], b[0]);
}

}  // namespace attention_mask_test
}  // namespace mcpp
