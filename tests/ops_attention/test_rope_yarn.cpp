// YaRN (ops::yarn_inv_freq, ops::yarn_concentration and RopeFreqs::yarn / ::mscale in the CPU
// rope ops): the frequencies and the concentration factor against fixtures written by
// tests/golden/yarn/make_yarn_fixtures.py (the formulas in Python's math module); the ops
// against a direct rotation at those frequencies, cos and sin times the factor, at
// contiguous, per-token and decode positions; backward as the forward's adjoint; a factor
// of 1 leaving the rotation bit for bit; bad parameters refused.
#include <gtest/gtest.h>

#include <cmath>

#include "../golden/yarn/yarn_fixtures.h"
#include "attention_test_util.h"
#include "ops/rope_math.h"

using namespace attn_test;
namespace cpu = mcpp::ops::cpu;
using mcpp::Stream;
using mcpp::ops::RopeFreqs;

namespace rope_yarn_test {

// A Qwen2.5-style YaRN at head dim 64: base 1e6, factor 4 over an original context of 2048.
RopeFreqs qwen_like() {
  RopeFreqs f(1e6);
  f.yarn = true, f.factor = 4, f.original_max_positions = 2048;
  f.mscale = mcpp::ops::yarn_concentration(4, 1, 0);
  return f;
}

// Element (s, b, g, slot, c) of qkv rotated at position t: the frequencies from the fixture
// formula's pieces re-derived here (extrapolated below low, interpolated above high), cos
// and sin times m.
double rotated(const Tensor& x, const AttentionDims& d, int64_t rot_dim, const RopeFreqs& f,
               double t, int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  const double* p = x.data<double>() + s * d.B * W + b * W + (g * (G + 2) + slot) * d.HD;
  if (slot == G + 1 || c >= rot_dim) return p[c];
  const int64_t half = rot_dim / 2, i = c % half;
  const double a = t * mcpp::ops::yarn_inv_freq(f.base, f.factor, f.original_max_positions,
                                                f.beta_fast, f.beta_slow, f.yarn_round_to_int,
                                                i, rot_dim);
  const double cs = f.mscale * std::cos(a), sn = f.mscale * std::sin(a);
  if (c < half) return p[c] * cs - p[c + half] * sn;
  return p[c] * cs + p[c - half] * sn;
}

template <typename Pos>
double max_err(const Tensor& y, const Tensor& x, const AttentionDims& d, int64_t rot_dim,
               const RopeFreqs& f, Pos pos) {
  const int64_t G = d.NH / d.NG;
  double err = 0;
  int64_t k = 0;
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t g = 0; g < d.NG; ++g)
        for (int64_t slot = 0; slot < G + 2; ++slot)
          for (int64_t c = 0; c < d.HD; ++c, ++k)
            err = std::max(err, std::abs(y.data<double>()[k] -
                                         rotated(x, d, rot_dim, f, pos(s, b), s, b, g, slot, c)));
  return err;
}

TEST(RopeYarn, InvFreqMatchesTheFixtures) {
  for (const auto& k : yarn_fixtures::kCases) {
    SCOPED_TRACE(k.name);
    RopeFreqs f(k.base);
    f.yarn = true, f.factor = k.factor, f.original_max_positions = k.L;
    f.beta_fast = k.beta_fast, f.beta_slow = k.beta_slow, f.yarn_round_to_int = k.round_to_int;
    for (int64_t i = 0; i < k.dim / 2; ++i) {
      const double want = k.inv_freq[i];
      EXPECT_NEAR(mcpp::ops::rope_inv_freq(f, i, k.dim), want, 1e-13 * want) << "pair " << i;
    }
    // The short wavelengths extrapolate (the plain frequency), the long ones are divided by
    // the factor.
    EXPECT_DOUBLE_EQ(mcpp::ops::rope_inv_freq(f, 0, k.dim), 1.0);
    const double last = std::pow(k.base, -double(k.dim - 2) / double(k.dim));
    EXPECT_NEAR(mcpp::ops::rope_inv_freq(f, k.dim / 2 - 1, k.dim), last / k.factor,
                1e-14 * last);
  }
  // Rounding the correction range matters: the unrounded case's bounds are fractional.
  const auto& k = yarn_fixtures::kCases[1];
  RopeFreqs f(k.base);
  f.yarn = true, f.factor = k.factor, f.original_max_positions = k.L;
  f.beta_fast = k.beta_fast, f.beta_slow = k.beta_slow, f.yarn_round_to_int = true;
  double most = 0;
  for (int64_t i = 0; i < k.dim / 2; ++i)
    most = std::max(most, std::abs(mcpp::ops::rope_inv_freq(f, i, k.dim) / k.inv_freq[i] - 1));
  EXPECT_GT(most, 1e-3);
}

TEST(RopeYarn, ConcentrationMatchesTheFixtures) {
  for (const auto& r : yarn_fixtures::kConcentration)
    EXPECT_NEAR(mcpp::ops::yarn_concentration(r[0], r[1], r[2]), r[3], 1e-15 * r[3])
        << r[0] << " " << r[1] << " " << r[2];
}

TEST(RopeYarn, CpuOpsMatchDirectRotation) {
  const RopeFreqs f = qwen_like();
  ASSERT_GT(f.mscale, 1.1);  // the factor is part of what is checked
  const AttentionDims d = dims(7, 2, 4, 2, 64);
  const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 50);
  const int64_t off = 6000;  // past the original context
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  cpu::rope_forward(x, d, 64, f, off, y, Stream::cpu());
  auto at = [&](int64_t s, int64_t) { return double(s + off); };
  EXPECT_LT(max_err(y, x, d, 64, f, at), 1e-11);
  // Neither plain RoPE nor YaRN's frequencies without the factor.
  RopeFreqs unscaled = f;
  unscaled.mscale = 1;
  EXPECT_GT(max_err(y, x, d, 64, unscaled, at), 0.05);
  RopeFreqs plain(1e6);
  plain.mscale = f.mscale;
  EXPECT_GT(max_err(y, x, d, 64, plain, at), 0.1);
  // Per-token positions (--reset-position-ids) and a decode step's per-sequence positions.
  Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
  for (int64_t k = 0; k < d.S * d.B; ++k) pos.data<int64_t>()[k] = 3000 + 41 * k;
  cpu::rope_positions(x, d, 64, f, pos, false, y, Stream::cpu());
  EXPECT_LT(max_err(y, x, d, 64, f,
                    [&](int64_t s, int64_t b) { return double(3000 + 41 * (s * d.B + b)); }),
            1e-11);
  AttentionDims d1 = d;
  d1.S = 1;
  const Tensor x1 = x.narrow(0, 1).clone();
  Tensor p1 = Tensor::empty({d.B}, DType::I64), y1 = Tensor::empty(x1.shape(), DType::F64);
  for (int64_t b = 0; b < d.B; ++b) p1.data<int64_t>()[b] = 7777 + 500 * b;
  cpu::rope_decode(x1, d1, 64, f, p1, y1, Stream::cpu());
  EXPECT_LT(
      max_err(y1, x1, d1, 64, f, [&](int64_t, int64_t b) { return double(7777 + 500 * b); }),
      1e-11);
}

TEST(RopeYarn, BackwardIsTheAdjointOfForward) {
  // With the factor the rotation is no longer orthogonal: the backward must be m R^T, the
  // adjoint, not the inverse.
  const RopeFreqs f = qwen_like();
  const AttentionDims d = dims(5, 2, 4, 2, 64);
  const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 51);
  const Tensor r = randn<double>(x.shape(), 52);
  Tensor y = Tensor::empty(x.shape(), DType::F64), dx = Tensor::empty(x.shape(), DType::F64);
  cpu::rope_forward(x, d, 64, f, 5000, y, Stream::cpu());
  cpu::rope_backward(r, d, 64, f, 5000, dx, Stream::cpu());
  double lhs = 0, rhs = 0;
  for (int64_t k = 0; k < x.numel(); ++k) {
    lhs += y.data<double>()[k] * r.data<double>()[k];
    rhs += x.data<double>()[k] * dx.data<double>()[k];
  }
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs));
  // Per-token positions likewise.
  Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
  for (int64_t k = 0; k < d.S * d.B; ++k) pos.data<int64_t>()[k] = 100 * k;
  cpu::rope_positions(x, d, 64, f, pos, false, y, Stream::cpu());
  cpu::rope_positions(r, d, 64, f, pos, true, dx, Stream::cpu());
  lhs = rhs = 0;
  for (int64_t k = 0; k < x.numel(); ++k) {
    lhs += y.data<double>()[k] * r.data<double>()[k];
    rhs += x.data<double>()[k] * dx.data<double>()[k];
  }
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs));
}

TEST(RopeYarn, FactorOneKeepsEveryBit) {
  // mscale 1 multiplies exactly: plain RoPE's ops give the bits they gave before YaRN.
  const AttentionDims d = dims(6, 2, 4, 2, 32);
  const Tensor x = convert<float, double>(randn<double>({d.S, d.B, d.qkv_width()}, 53));
  RopeFreqs one(10000.0);
  one.mscale = 1.0;
  Tensor a = Tensor::empty(x.shape(), DType::F32), b = a.clone();
  cpu::rope_forward(x, d, 32, RopeFreqs(10000.0), 77, a, Stream::cpu());
  cpu::rope_forward(x, d, 32, one, 77, b, Stream::cpu());
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * 4), 0);
  // And YaRN at factor 1 is plain RoPE's frequencies (interpolation equals extrapolation).
  RopeFreqs y(10000.0);
  y.yarn = true, y.factor = 1;
  for (int64_t i = 0; i < 16; ++i)
    EXPECT_DOUBLE_EQ(mcpp::ops::rope_inv_freq(y, i, 32), std::pow(10000.0, -double(i) / 16.0));
  EXPECT_EQ(mcpp::ops::yarn_concentration(1, 1, 0), 1.0);
}

TEST(RopeYarn, RejectsBadParameters) {
  const AttentionDims d = dims(2, 1, 2, 1, 8);
  Tensor x = Tensor::zeros({2, 1, d.qkv_width()}, DType::F32);
  auto bad = [&](auto edit) {
    RopeFreqs f = qwen_like();
    edit(f);
    EXPECT_THROW(cpu::rope_forward(x, d, 8, f, 0, x, Stream::cpu()), mcpp::Error);
  };
  bad([](RopeFreqs& f) { f.factor = 0; });
  bad([](RopeFreqs& f) { f.original_max_positions = 0; });
  bad([](RopeFreqs& f) { f.beta_fast = -1; });
  bad([](RopeFreqs& f) { f.beta_slow = NAN; });
  bad([](RopeFreqs& f) { f.base = 1; });  // ln(base) = 0 divides
  bad([](RopeFreqs& f) { f.mscale = 0; });
  bad([](RopeFreqs& f) { f.scaled = true; });  // with Llama 3.x scaling
  RopeFreqs ok = qwen_like();
  EXPECT_NO_THROW(cpu::rope_forward(x, d, 8, ok, 0, x, Stream::cpu()));
}

}  // namespace rope_yarn_test
