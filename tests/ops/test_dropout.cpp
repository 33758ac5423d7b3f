// Dropout: the mask is DropoutMask's 16-bit uniform of the global index (checked element
// by element against the scalar reference, base/philox.h), identical when the tensor is computed whole or in blocks with offsets,
// keeps about 1 - p, and backward applies the same mask.
#include <algorithm>
#include <cmath>

#include "base/philox.h"
#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace dropout_test {
const ops::DropoutKey kKey{1234, 99};

TEST(Dropout, MaskIsPhiloxOfGlobalIndex) {
  const int64_t d0 = 3, d1 = 2, d2 = 37;
  const double p = 0.3;
  Tensor x = randn({d0, d1, d2}, 1), res = randn({d0, d1, d2}, 2);
  Tensor out = Tensor::empty({d0, d1, d2}, DType::F64);
  cpu::dropout_add_forward(x, res, p, kKey, ops::GlobalIndex3::whole(d0, d1, d2), out, S());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep =
        DropoutMask::u16(kKey.seed, kKey.stream, uint64_t(i)) >= DropoutMask::threshold(p);
    const double want =
        res.data<double>()[i] + (keep ? x.data<double>()[i] * DropoutMask::keep_scale(p) : 0.0);
    ASSERT_NEAR(out.data<double>()[i], want, 1e-15) << i;
  }
}

TEST(Dropout, BlocksWithOffsetsMatchWhole) {
  // Global [S=8, B=4, H=70]; split S in halves (SP/CP) and H in halves (TP), and take
  // a B sub-range (DP micro-batch) to exercise all three offsets.
  const int64_t S_ = 8, B = 4, H = 70;
  const double p = 0.25;
  Tensor x = randn({S_, B, H}, 1, 1.0, DType::F32);
  Tensor whole = Tensor::empty({S_, B, H}, DType::F32);
  const auto g = ops::GlobalIndex3::whole(S_, B, H);
  cpu::dropout_add_forward(x, Tensor(), p, kKey, g, whole, S());
  for (int64_t s0 : {int64_t(0), S_ / 2})
    for (int64_t h0 : {int64_t(0), H / 2 + 1}) {
      const int64_t b0 = 1, nb = 2, hn = h0 ? H - h0 : H / 2 + 1;
      Tensor xl = Tensor::empty({S_ / 2, nb, hn}, DType::F32);
      for (int64_t s = 0; s < S_ / 2; ++s)
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t h = 0; h < hn; ++h)
            xl.data<float>()[(s * nb + b) * hn + h] =
                x.data<float>()[((s + s0) * B + b + b0) * H + h + h0];
      ops::GlobalIndex3 gl{{s0, b0, h0}, {S_, B, H}};
      Tensor ol = Tensor::empty(xl.shape(), DType::F32);
      cpu::dropout_add_forward(xl, Tensor(), p, kKey, gl, ol, S());
      for (int64_t s = 0; s < S_ / 2; ++s)
        for (int64_t b = 0; b < nb; ++b)
          for (int64_t h = 0; h < hn; ++h)
            ASSERT_EQ(ol.data<float>()[(s * nb + b) * hn + h],
                      whole.data<float>()[((s + s0) * B + b + b0) * H + h + h0])
                << s << " " << b << " " << h;
    }
  Tensor big = Tensor::empty({2, 2, 10}, DType::F32), ob = Tensor::empty({2, 2, 10}, DType::F32);
  ops::GlobalIndex3 outside{{0, 0, 5}, {2, 2, 10}};
  EXPECT_THROW(cpu::dropout_add_forward(big, Tensor(), p, kKey, outside, ob, S()), Error);
  EXPECT_THROW(cpu::dropout_add_forward(big, Tensor(), p, kKey, ops::GlobalIndex3{}, ob, S()),
               Error);
}

TEST(Dropout, KeepFractionAndBackwardUsesSameMask) {
  const int64_t d0 = 64, d1 = 4, d2 = 1500;  // rows longer than one random-bits chunk
  const double p = 0.1;
  const auto g = ops::GlobalIndex3::whole(d0, d1, d2);
  Tensor ones = Tensor::empty({d0, d1, d2}, DType::F32);
  cpu::fill(ones, 1.0, S());
  Tensor out = Tensor::empty(ones.shape(), DType::F32),
         dx = Tensor::empty(ones.shape(), DType::F32);
  cpu::dropout_add_forward(ones, Tensor(), p, kKey, g, out, S());
  int64_t kept = 0;
  const float sc = float(DropoutMask::keep_scale(p));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float v = out.data<float>()[i];
    ASSERT_TRUE(v == 0.0f || v == sc) << v;
    kept += v != 0.0f;
  }
  const double frac = double(kept) / double(out.numel());
  EXPECT_NEAR(frac, 1 - p, 4 * std::sqrt(p * (1 - p) / double(out.numel())));
  // Backward of ones in place reproduces the forward output exactly.
  cpu::fill(dx, 1.0, S());
  cpu::dropout_backward(dx, p, kKey, g, dx, S());
  EXPECT_EQ(max_abs_diff(dx, out), 0.0);
  // Another key draws another mask.
  Tensor other = Tensor::empty(ones.shape(), DType::F32);
  cpu::dropout_add_forward(ones, Tensor(), p, ops::DropoutKey{1234, 100}, g, other, S());
  EXPECT_GT(max_abs_diff(other, out), 0.0);
}

TEST(Dropout, ZeroProbabilityIsPlainAddInPlace) {
  Tensor x = randn({2, 3, 4}, 1), res = randn({2, 3, 4}, 2);
  Tensor want = plus(x, res);
  cpu::dropout_add_forward(x, res, 0.0, kKey, ops::GlobalIndex3{}, res, S());  // out aliases
  EXPECT_EQ(max_abs_diff(res, want), 0.0);
  Tensor dx = Tensor::empty({2, 3, 4}, DType::F64);
  cpu::dropout_backward(x, 0.0, kKey, ops::GlobalIndex3{}, dx, S());
  EXPECT_EQ(max_abs_diff(dx, x), 0.0);
  Tensor two_d = randn({6, 4}, 3);
  EXPECT_THROW(cpu::dropout_backward(two_d, 0.1, kKey, ops::GlobalIndex3{}, two_d, S()), Error);
  EXPECT_THROW(cpu::dropout_add_forward(x, res, 1.5, kKey, ops::GlobalIndex3{}, res, S()), Error);
}

// random_normal: element i is Philox::normal of its global index; a block with offsets (and a
// CP rank's two chunks) draws the whole tensor's values; f32 is the f64 value rounded; the
// sample looks standard normal.
TEST(RandomNormal, PhiloxNormalOfTheGlobalIndexInEveryBlock) {
  const int64_t d0 = 8, d1 = 3, d2 = 5;
  const auto g = ops::GlobalIndex3::whole(d0, d1, d2);
  Tensor whole = Tensor::empty({d0, d1, d2}, DType::F64);
  cpu::random_normal(kKey, g, whole, S());
  for (int64_t i = 0; i < whole.numel(); ++i)
    ASSERT_EQ(whole.data<double>()[i], Philox::normal(kKey.seed, kKey.stream, uint64_t(i))) << i;
  // rows 2-3 and 6-7 (a CP rank's chunks: split at 2, jump 2), samples 1-2, columns 1-4
  ops::GlobalIndex3 part{{2, 1, 1}, {d0, d1, d2}};
  part.split0 = 2, part.jump0 = 2;
  Tensor blk = Tensor::empty({4, 2, 4}, DType::F32);
  cpu::random_normal(kKey, part, blk, S());
  const int64_t rows[4] = {2, 3, 6, 7};
  for (int64_t i0 = 0; i0 < 4; ++i0)
    for (int64_t i1 = 0; i1 < 2; ++i1)
      for (int64_t i2 = 0; i2 < 4; ++i2)
        ASSERT_EQ(blk.data<float>()[(i0 * 2 + i1) * 4 + i2],
                  float(whole.data<double>()[(rows[i0] * d1 + i1 + 1) * d2 + i2 + 1]));
  Tensor big = Tensor::empty({4000, 2, 16}, DType::F64);
  cpu::random_normal(ops::DropoutKey{7, 8}, ops::GlobalIndex3::whole(4000, 2, 16), big, S());
  double m = 0, v = 0;
  const double n = double(big.numel());
  for (int64_t i = 0; i < big.numel(); ++i) m += big.data<double>()[i];
  m /= n;
  for (int64_t i = 0; i < big.numel(); ++i) v += std::pow(big.data<double>()[i] - m, 2);
  EXPECT_NEAR(m, 0.0, 5 / std::sqrt(n));
  EXPECT_NEAR(v / n, 1.0, 5 * std::sqrt(2 / n));
  ops::GlobalIndex3 outside{{0, 0, 2}, {d0, d1, d2}};
  EXPECT_THROW(cpu::random_normal(kKey, outside, blk, S()), Error);
}

// uniform_scale (the routers' input jitter): y = x * (lo + (hi - lo) u), u Philox's uniform of
// the element's global index; a block with offsets scales by the whole tensor's factors; y may
// alias x; the factors fill [lo, hi).
TEST(UniformScale, FactorIsPhiloxUniformOfTheGlobalIndex) {
  const int64_t d0 = 6, d1 = 2, d2 = 9;
  Tensor x = randn({d0, d1, d2}, 5), y = Tensor::empty({d0, d1, d2}, DType::F64);
  cpu::uniform_scale(x, 0.9, 1.1, kKey, ops::GlobalIndex3::whole(d0, d1, d2), y, S());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = Philox::uniform(kKey.seed, kKey.stream, uint64_t(i));
    const double want = x.data<double>()[i] * (0.9 + (1.1 - 0.9) * u);
    ASSERT_NEAR(y.data<double>()[i], want, 1e-15 * std::fabs(want)) << i;  // (FMA contraction)
  }
  ops::GlobalIndex3 part{{3, 1, 2}, {d0, d1, d2}};  // rows 3-5, sample 1, columns 2-8
  Tensor xb = Tensor::empty({3, 1, 7}, DType::F64);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t h = 0; h < 7; ++h)
      xb.data<double>()[r * 7 + h] = x.data<double>()[((r + 3) * d1 + 1) * d2 + h + 2];
  cpu::uniform_scale(xb, 0.9, 1.1, kKey, part, xb, S());  // in place
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t h = 0; h < 7; ++h)
      ASSERT_EQ(xb.data<double>()[r * 7 + h], y.data<double>()[((r + 3) * d1 + 1) * d2 + h + 2]);
  Tensor ones = Tensor::empty({500, 2, 8}, DType::F64), f = Tensor::empty({500, 2, 8}, DType::F64);
  cpu::fill(ones, 1.0, S());
  cpu::uniform_scale(ones, 0.5, 1.5, kKey, ops::GlobalIndex3::whole(500, 2, 8), f, S());
  double lo = 2, hi = 0, mean = 0;
  for (int64_t i = 0; i < f.numel(); ++i) {
    const double v = f.data<double>()[i];
    lo = std::min(lo, v), hi = std::max(hi, v), mean += v / double(f.numel());
  }
  EXPECT_GE(lo, 0.5);
  EXPECT_LT(hi, 1.5);
  EXPECT_LT(lo, 0.51);
  EXPECT_GT(hi, 1.49);
  EXPECT_NEAR(mean, 1.0, 0.02);
}

}  // namespace dropout_test
