// CPU RoPE (mcpp::ops::cpu::rope_forward/backward): a direct per-element reference,
// finite differences, passthrough of value heads and of dims >= rot_dim, round trip.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"

using namespace attn_test;
namespace cpu = mcpp::ops::cpu;
using mcpp::Stream;

namespace rope_test {

// Direct formula for element (s, b, g, slot, c) of the rotated tensor.
double rope_ref(const Tensor& x, const AttentionDims& d, int64_t rot_dim, double base,
                int64_t s_offset, int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  const double* p = x.data<double>() + s * d.B * W + b * W + (g * (G + 2) + slot) * d.HD;
  if (slot == G + 1 || c >= rot_dim) return p[c];
  const int64_t half = rot_dim / 2, i = c % half;
  const double angle = double(s + s_offset) / std::pow(base, double(2 * i) / double(rot_dim));
  if (c < half) return p[c] * std::cos(angle) - p[c + half] * std::sin(angle);
  return p[c] * std::cos(angle) + p[c - half] * std::sin(angle);
}

Tensor rope(const Tensor& x, const AttentionDims& d, int64_t rot_dim, double base, int64_t off) {
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  cpu::rope_forward(x, d, rot_dim, base, off, y, Stream::cpu());
  return y;
}


TEST(Rope, MatchesDirectFormula) {
  for (int64_t rot_dim : {16, 8}) {  // full rotation and rotary_percent = 0.5
    SCOPED_TRACE(rot_dim);
    const AttentionDims d = dims(37, 2, 4, 2, 16);
    const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 20);
    const int64_t off = 5;
    const Tensor y = rope(x, d, rot_dim, 10000.0, off);
    const int64_t G = 2;
    double err = 0;
    int64_t i = 0;
    for (int64_t s = 0; s < d.S; ++s)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t g = 0; g < d.NG; ++g)
          for (int64_t slot = 0; slot < G + 2; ++slot)
            for (int64_t c = 0; c < d.HD; ++c, ++i)
              err = std::max(err, std::abs(y.data<double>()[i] - rope_ref(x, d, rot_dim, 10000.0,
                                                                          off, s, b, g, slot, c)));
    EXPECT_LT(err, 1e-13);
  }
}

TEST(Rope, PassesThroughValuesAndUnrotatedDims) {
  const AttentionDims d = dims(9, 1, 2, 1, 16);  // slots: q0 q1 k v
  const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 21);
  const Tensor y = rope(x, d, 6, 500.0, 0);
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t slot = 0; slot < 4; ++slot)
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t i = s * 64 + slot * 16 + c;
        const bool same = slot == 3 || c >= 6 || s == 0;  // position 0: angle 0
        if (same)
          EXPECT_EQ(y.data<double>()[i], x.data<double>()[i]) << s << " " << slot << " " << c;
        else
          EXPECT_NE(y.data<double>()[i], x.data<double>()[i]) << s << " " << slot << " " << c;
      }
}

TEST(Rope, GradientMatchesFiniteDifferences) {
  const AttentionDims d = dims(6, 1, 2, 1, 8);  // 192 elements, each checked
  Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 22);
  const Tensor R = randn<double>(x.shape(), 23);
  Tensor dx = Tensor::empty(x.shape(), DType::F64);
  cpu::rope_backward(R, d, 6, 100.0, 3, dx, Stream::cpu());
  auto loss = [&]() {
    const Tensor y = rope(x, d, 6, 100.0, 3);
    double L = 0;
    for (int64_t i = 0; i < y.numel(); ++i) L += y.data<double>()[i] * R.data<double>()[i];
    return L;
  };
  const double eps = 1e-4;
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = p[i];
    p[i] = x0 + eps;
    const double lp = loss();
    p[i] = x0 - eps;
    const double lm = loss();
    p[i] = x0;
    ASSERT_NEAR((lp - lm) / (2 * eps), dx.data<double>()[i], 1e-9) << "element " << i;
  }
}

TEST(Rope, BackwardInvertsForwardInPlace) {
  for (bool f32 : {false, true}) {
    SCOPED_TRACE(f32 ? "f32" : "f64");
    const AttentionDims d = dims(300, 2, 4, 4, 32);
    const Tensor x64 = randn<double>({d.S, d.B, d.qkv_width()}, 24);
    Tensor x = f32 ? convert<float, double>(x64) : x64.clone();
    cpu::rope_forward(x, d, 32, 10000.0, 1000, x, Stream::cpu());  // aliasing in == out
    cpu::rope_backward(x, d, 32, 10000.0, 1000, x, Stream::cpu());
    double err = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double v = f32 ? double(x.data<float>()[i]) : x.data<double>()[i];
      err = std::max(err, std::abs(v - x64.data<double>()[i]));
    }
    EXPECT_LT(err, f32 ? 1e-5 : 1e-13);
  }
}

TEST(Rope, RejectsOddRotDim) {
  const AttentionDims d = dims(4, 1, 2, 1, 8);
  Tensor x = Tensor::zeros({4, 1, d.qkv_width()}, DType::F32);
  EXPECT_THROW(cpu::rope_forward(x, d, 5, 10000.0, 0, x, Stream::cpu()), mcpp::Error);
  EXPECT_THROW(cpu::rope_forward(x, d, 10, 10000.0, 0, x, Stream::cpu()), mcpp::Error);
}

}  // namespace rope_test
