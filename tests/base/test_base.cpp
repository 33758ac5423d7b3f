#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/error.h"
#include "base/philox.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace base_test {

using namespace mcpp;

TEST(Error, CarriesHintAndLocation) {
  try {
    MCPP_CHECK_HINT(1 == 2, "do the right thing", "value {} is wrong", 42);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("value 42 is wrong"), std::string::npos);
    EXPECT_NE(w.find("HINT: do the right thing"), std::string::npos);
    EXPECT_NE(w.find("test_base.cpp"), std::string::npos);
  }
}

// Known-answer vectors of Random123's philox4x32_10 (kat_vectors).
TEST(Philox, KnownAnswers) {
  uint32_t c[4] = {0, 0, 0, 0};
  Philox::block(c, 0, 0);
  EXPECT_EQ(c[0], 0x6627e8d5u);
  EXPECT_EQ(c[1], 0xe169c58du);
  EXPECT_EQ(c[2], 0xbc57ac4cu);
  EXPECT_EQ(c[3], 0x9b00dbd8u);
  uint32_t d[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  Philox::block(d, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(d[0], 0x408f276du);
  EXPECT_EQ(d[1], 0x41c83b0eu);
  EXPECT_EQ(d[2], 0xa20bc7c6u);
  EXPECT_EQ(d[3], 0x6d5451fdu);
  uint32_t e[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  Philox::block(e, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(e[0], 0xd16cfe09u);
  EXPECT_EQ(e[1], 0x94fdccebu);
  EXPECT_EQ(e[2], 0x5001e420u);
  EXPECT_EQ(e[3], 0x24126ea1u);
}

TEST(Philox, NormalMoments) {
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = Philox::normal(7, 3, i);
    s += x, s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

TEST(DType, Bf16RoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)), 0x3f81);  // above tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x7f, 0);
  EXPECT_EQ(float_to_bf16(bits_float(0x7f800001u)) & 0x7f, 0x40);  // sNaN stays NaN
  EXPECT_EQ(float_to_bf16(bits_float(0x00010000u)), 0x0001);       // subnormal
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7fffffu)), 0x7f80);       // max float -> inf
  EXPECT_EQ(bf16_to_float(0x4049), bits_float(0x40490000u));
}

TEST(DType, F16RoundToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even -> 0
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie -> even 2
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);        // tie, even
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);    // tie, odd up
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00, 0x7e00);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite f16 round-trips exactly
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(float_to_f16(f16_to_float(uint16_t(h))), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_float(0xfc00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3}, DType::F32);
  Tensor n = t.narrow(1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 3}));
  n.data<float>()[0] = 5;
  EXPECT_EQ(t.data<float>()[3], 5);
  Tensor v = t.view({-1});
  EXPECT_EQ(v.numel(), 12);
  EXPECT_THROW(t.view({5, 3}), Error);
  EXPECT_THROW(t.narrow(3, 2), Error);
  EXPECT_THROW(t.data<double>(), Error);
}

}  // namespace base_test
