// CPU attention (mcpp::ops::cpu::attention_forward/backward) against a naive O(S^2)
// reference, f64 central finite differences, and the parallel invariances of its dropout.
// The tests call the cpu:: functions directly so that they do not need the dispatcher.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"

using namespace attn_test;
namespace cpu = mcpp::ops::cpu;
using mcpp::Stream;

namespace attention_test {

struct Fwd {
  Tensor out, lse;
};

template <typename T>
Fwd forward(const Tensor& qkv, const AttentionDims& d, double scale, double p, DropoutKey key) {
  Fwd f{Tensor::empty({d.S, d.B, d.NH * d.HD}, mcpp::dtype_of<T>()),
        Tensor::empty({d.B, d.NH, d.S}, mcpp::dtype_of<T>())};
  cpu::attention_forward(qkv, d, scale, p, key, f.out, f.lse, Stream::cpu());
  return f;
}

template <typename T>
Tensor backward(const Tensor& dout, const Tensor& qkv, const Fwd& f, const AttentionDims& d,
                double scale, double p, DropoutKey key) {
  Tensor dqkv = Tensor::empty(qkv.shape(), mcpp::dtype_of<T>());
  // Garbage first: the op must overwrite every element.
  for (int64_t i = 0; i < dqkv.numel(); ++i) dqkv.data<T>()[i] = T(NAN);
  cpu::attention_backward(dout, qkv, f.out, f.lse, d, scale, p, key, dqkv, Stream::cpu());
  return dqkv;
}

struct Case {
  const char* name;
  int64_t S, B, NH, NG, HD;
  double p;
};

void expect_matches_reference(const Case& c) {
  SCOPED_TRACE(c.name);
  const AttentionDims d = dims(c.S, c.B, c.NH, c.NG, c.HD);
  const Tensor qkv = randn<double>({d.S, d.B, d.qkv_width()}, 1);
  const double scale = 1.0 / std::sqrt(double(d.HD));
  const DropoutKey key{42, 7};
  const Fwd f = forward<double>(qkv, d, scale, c.p, key);
  const Reference r = naive_attention(to_vec(qkv), d, scale, c.p, key);
  double max_out = 0, max_lse = 0;
  for (int64_t i = 0; i < f.out.numel(); ++i)
    max_out = std::max(max_out, std::abs(f.out.data<double>()[i] - r.out[size_t(i)]));
  for (int64_t i = 0; i < f.lse.numel(); ++i)
    max_lse = std::max(max_lse, std::abs(f.lse.data<double>()[i] - r.lse[size_t(i)]));
  EXPECT_LT(max_out, 1e-12);
  EXPECT_LT(max_lse, 1e-12);
}


// S = 77 and 130: several 64-row tiles, the last one partial. HD = 12 is not a multiple
// of the SIMD width, so the padded columns are exercised.
TEST(Attention, ForwardMatchesNaiveMHA) { expect_matches_reference({"MHA", 77, 2, 3, 3, 16, 0}); }
TEST(Attention, ForwardMatchesNaiveGQA) { expect_matches_reference({"GQA", 130, 2, 8, 2, 12, 0}); }
TEST(Attention, ForwardMatchesNaiveMQA) { expect_matches_reference({"MQA", 77, 1, 4, 1, 8, 0}); }
TEST(Attention, ForwardMatchesNaiveDropout) {
  expect_matches_reference({"GQA dropout", 77, 2, 4, 2, 8, 0.1});
}
TEST(Attention, ForwardShortSequence) { expect_matches_reference({"S=5", 5, 3, 2, 1, 4, 0}); }

TEST(Attention, LseIsLogSumExpOfScaledScores) {
  // Direct check of one row, independent of the reference helper: lse[b, h, q] =
  // log sum_{k <= q} exp(scale * q.k).
  const AttentionDims d = dims(70, 1, 2, 1, 8);
  const Tensor qkv = randn<double>({d.S, d.B, d.qkv_width()}, 2);
  const double scale = 0.3;
  const Fwd f = forward<double>(qkv, d, scale, 0.0, {});
  const double* x = qkv.data<double>();
  const int64_t W = d.qkv_width(), h = 1, G = 2;
  for (int64_t q : {0, 1, 63, 64, 69}) {
    double sum = 0;
    for (int64_t k = 0; k <= q; ++k) {
      double dot = 0;
      for (int64_t c = 0; c < d.HD; ++c) dot += x[q * W + h * d.HD + c] * x[k * W + G * d.HD + c];
      sum += std::exp(scale * dot);
    }
    EXPECT_NEAR(f.lse.data<double>()[h * d.S + q], std::log(sum), 1e-12) << "q=" << q;
  }
}


// d/dqkv of L(qkv) = sum(out * R) by central differences at `samples` positions,
// compared with attention_backward(dout = R).
void expect_gradient_matches_fd(const Case& c, int samples) {
  SCOPED_TRACE(c.name);
  const AttentionDims d = dims(c.S, c.B, c.NH, c.NG, c.HD);
  Tensor qkv = randn<double>({d.S, d.B, d.qkv_width()}, 3);
  const Tensor R = randn<double>({d.S, d.B, d.NH * d.HD}, 4);
  const double scale = 1.0 / std::sqrt(double(d.HD));
  const DropoutKey key{9, 11};
  const Fwd f = forward<double>(qkv, d, scale, c.p, key);
  const Tensor dqkv = backward<double>(R, qkv, f, d, scale, c.p, key);

  auto loss = [&]() {
    const Fwd g = forward<double>(qkv, d, scale, c.p, key);
    double L = 0;
    for (int64_t i = 0; i < g.out.numel(); ++i) L += g.out.data<double>()[i] * R.data<double>()[i];
    return L;
  };
  const double eps = 1e-5;
  double* x = qkv.data<double>();
  double max_err = 0, max_grad = 0;
  for (int sidx = 0; sidx < samples; ++sidx) {
    // Spread the samples over the tensor: positions late in the sequence, every slot.
    const int64_t i = int64_t(mcpp::Philox::u32(5, 5, uint64_t(sidx)) % uint64_t(qkv.numel()));
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = loss();
    x[i] = x0 - eps;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * eps);
    max_err = std::max(max_err, std::abs(fd - dqkv.data<double>()[i]));
    max_grad = std::max(max_grad, std::abs(fd));
  }
  EXPECT_GT(max_grad, 1e-3);  // the check is not vacuous
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad));
  for (int64_t i = 0; i < dqkv.numel(); ++i) ASSERT_TRUE(std::isfinite(dqkv.data<double>()[i]));
}


TEST(Attention, GradientMatchesFiniteDifferencesMHA) {
  expect_gradient_matches_fd({"MHA", 70, 2, 2, 2, 8, 0}, 120);
}
TEST(Attention, GradientMatchesFiniteDifferencesGQA) {
  expect_gradient_matches_fd({"GQA", 70, 1, 4, 2, 8, 0}, 120);
}
TEST(Attention, GradientMatchesFiniteDifferencesMQADropout) {
  expect_gradient_matches_fd({"MQA dropout", 70, 1, 3, 1, 8, 0.1}, 120);
}
TEST(Attention, GradientMatchesFiniteDifferencesGQADropout) {
  expect_gradient_matches_fd({"GQA dropout", 70, 2, 4, 2, 12, 0.1}, 120);
}


// The group slice [g0, g0 + ng) of qkv-shaped x (per-group blocks of (G+2)*HD).
Tensor slice_groups(const Tensor& x, const AttentionDims& d, int64_t g0, int64_t ng) {
  const int64_t G = d.NH / d.NG, gw = (G + 2) * d.HD;
  Tensor y = Tensor::empty({d.S, d.B, ng * gw}, DType::F64);
  for (int64_t sb = 0; sb < d.S * d.B; ++sb)
    for (int64_t c = 0; c < ng * gw; ++c)
      y.data<double>()[sb * ng * gw + c] = x.data<double>()[sb * d.NG * gw + g0 * gw + c];
  return y;
}


TEST(Attention, DropoutIsInvariantToBatchSplit) {
  const AttentionDims d = dims(70, 4, 4, 2, 8);
  const int64_t W = d.qkv_width(), O = d.NH * d.HD;
  const Tensor qkv = randn<double>({d.S, d.B, W}, 6);
  const Tensor dout = randn<double>({d.S, d.B, O}, 7);
  const double scale = 0.35, p = 0.1;
  const DropoutKey key{3, 99};
  const Fwd whole = forward<double>(qkv, d, scale, p, key);
  const Tensor dwhole = backward<double>(dout, qkv, whole, d, scale, p, key);
  // Samples [2*half, 2*half + 2) of a [S, 4, width] tensor.
  auto half_of = [&](const Tensor& x, int64_t width, int64_t half) {
    Tensor y = Tensor::empty({d.S, 2, width}, DType::F64);
    for (int64_t s = 0; s < d.S; ++s)
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t c = 0; c < width; ++c)
          y.data<double>()[(s * 2 + b) * width + c] =
              x.data<double>()[(s * 4 + 2 * half + b) * width + c];
    return y;
  };
  // Each half of the batch as its own [S, B/2, ...] call with b_offset, as DP ranks do.
  for (int64_t half = 0; half < 2; ++half) {
    AttentionDims dh = dims(d.S, 2, d.NH, d.NG, d.HD);
    dh.b_offset = 2 * half;
    const Tensor qh = half_of(qkv, W, half), gh = half_of(dout, O, half);
    const Fwd part = forward<double>(qh, dh, scale, p, key);
    const Tensor dpart = backward<double>(gh, qh, part, dh, scale, p, key);
    const Tensor want_out = half_of(whole.out, O, half), want_d = half_of(dwhole, W, half);
    for (int64_t i = 0; i < want_out.numel(); ++i)
      ASSERT_EQ(part.out.data<double>()[i], want_out.data<double>()[i]) << "half " << half;
    for (int64_t i = 0; i < want_d.numel(); ++i)
      ASSERT_EQ(dpart.data<double>()[i], want_d.data<double>()[i]) << "half " << half;
  }
  // The mask really depends on b_offset: the second half drawn without it differs.
  const AttentionDims dh = dims(d.S, 2, d.NH, d.NG, d.HD);
  const Fwd wrong = forward<double>(half_of(qkv, W, 1), dh, scale, p, key);
  const Tensor want_out = half_of(whole.out, O, 1);
  double diff = 0;
  for (int64_t i = 0; i < want_out.numel(); ++i)
    diff = std::max(diff, std::abs(wrong.out.data<double>()[i] - want_out.data<double>()[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(Attention, DropoutIsInvariantToHeadSplit) {
  // Full: NH=8 in NG=4 groups. TP shard 1 of 2: heads 4..7 = groups 2, 3.
  const AttentionDims d = dims(70, 2, 8, 4, 8);
  const Tensor qkv = randn<double>({d.S, d.B, d.qkv_width()}, 8);
  const Tensor dout = randn<double>({d.S, d.B, d.NH * d.HD}, 9);
  const double scale = 0.35, p = 0.1;
  const DropoutKey key{5, 17};
  const Fwd whole = forward<double>(qkv, d, scale, p, key);
  const Tensor dwhole = backward<double>(dout, qkv, whole, d, scale, p, key);

  AttentionDims ds = dims(d.S, d.B, 4, 2, d.HD);
  ds.h_offset = 4;
  ds.NH_global = 8;
  const Tensor qs = slice_groups(qkv, d, 2, 2);
  const int64_t O = d.NH * d.HD, Os = 4 * d.HD;
  Tensor gs = Tensor::empty({d.S, d.B, Os}, DType::F64);
  for (int64_t sb = 0; sb < d.S * d.B; ++sb)
    for (int64_t c = 0; c < Os; ++c)
      gs.data<double>()[sb * Os + c] = dout.data<double>()[sb * O + 4 * d.HD + c];
  const Fwd part = forward<double>(qs, ds, scale, p, key);
  const Tensor dpart = backward<double>(gs, qs, part, ds, scale, p, key);
  const Tensor dwhole_shard = slice_groups(dwhole, d, 2, 2);

  for (int64_t sb = 0; sb < d.S * d.B; ++sb)
    for (int64_t c = 0; c < Os; ++c)
      ASSERT_EQ(part.out.data<double>()[sb * Os + c],
                whole.out.data<double>()[sb * O + 4 * d.HD + c]);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t s = 0; s < d.S; ++s)
        ASSERT_EQ(part.lse.data<double>()[(b * 4 + h) * d.S + s],
                  whole.lse.data<double>()[(b * 8 + 4 + h) * d.S + s]);
  for (int64_t i = 0; i < dpart.numel(); ++i)
    ASSERT_EQ(dpart.data<double>()[i], dwhole_shard.data<double>()[i]);

  // Without h_offset the shard would draw heads 0..3's mask: a different output.
  ds.h_offset = 0;
  const Fwd wrong = forward<double>(qs, ds, scale, p, key);
  double diff = 0;
  for (int64_t i = 0; i < wrong.out.numel(); ++i)
    diff = std::max(diff, std::abs(wrong.out.data<double>()[i] - part.out.data<double>()[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(Attention, FloatAgreesWithDouble) {
  // HD = 40: f32 pads to 48 (3 vectors), f64 uses 5 vectors (a 4 + 1 column split).
  for (double p : {0.0, 0.1}) {
    SCOPED_TRACE(p);
    const AttentionDims d = dims(150, 2, 4, 2, 40);
    const Tensor q64 = randn<double>({d.S, d.B, d.qkv_width()}, 10);
    const Tensor g64 = randn<double>({d.S, d.B, d.NH * d.HD}, 11);
    const Tensor q32 = convert<float, double>(q64), g32 = convert<float, double>(g64);
    const double scale = 1.0 / std::sqrt(40.0);
    const DropoutKey key{1, 2};
    const Fwd f64 = forward<double>(q64, d, scale, p, key);
    const Fwd f32 = forward<float>(q32, d, scale, p, key);
    const Tensor d64 = backward<double>(g64, q64, f64, d, scale, p, key);
    const Tensor d32 = backward<float>(g32, q32, f32, d, scale, p, key);
    auto max_diff = [](const Tensor& a, const Tensor& b) {
      double m = 0;
      for (int64_t i = 0; i < a.numel(); ++i)
        m = std::max(m, std::abs(a.data<double>()[i] - double(b.data<float>()[i])));
      return m;
    };
    EXPECT_LT(max_diff(f64.out, f32.out), 2e-5);
    EXPECT_LT(max_diff(f64.lse, f32.lse), 2e-5);
    EXPECT_LT(max_diff(d64, d32), 1e-4);
  }
}

TEST(Attention, RejectsBadArguments) {
  const AttentionDims d = dims(8, 1, 4, 3, 8);  // NG does not divide NH
  Tensor qkv = Tensor::zeros({8, 1, 3 * 3 * 8}, DType::F32);
  Tensor out = Tensor::zeros({8, 1, 32}, DType::F32), lse = Tensor::zeros({1, 4, 8}, DType::F32);
  EXPECT_THROW(cpu::attention_forward(qkv, d, 0.3, 0.0, {}, out, lse, Stream::cpu()), mcpp::Error);
  const AttentionDims d2 = dims(8, 1, 4, 2, 8);
  Tensor qkv2 = Tensor::zeros({8, 1, d2.qkv_width()}, DType::F32);
  Tensor lse64 = Tensor::zeros({1, 4, 8}, DType::F64);
  EXPECT_THROW(cpu::attention_forward(qkv2, d2, 0.3, 0.0, {}, out, lse64, Stream::cpu()),
               mcpp::Error);
  EXPECT_NO_THROW(cpu::attention_forward(qkv2, d2, 0.3, 0.0, {}, out, lse, Stream::cpu()));
}

}  // namespace attention_test
