// --rotary-interleaved (ops/rope_interleave.h): the permutation, its inverse, and the identity
// the model relies on: P^-1 . rope . P is Megatron's interleaved RoPE (pairs (2i, 2i + 1)),
// checked per element against the direct formula; value heads and dims >= rot_dim untouched.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"
#include "ops/rope_interleave.h"

using namespace attn_test;
namespace cpu = mcpp::ops::cpu;
using mcpp::Stream;

namespace rope_interleave_test {

mcpp::ops::RopePermuteDims pdims(const AttentionDims& d, int64_t rot_dim) {
  mcpp::ops::RopePermuteDims p;
  p.groups = d.NG, p.heads_per_group = d.NH / d.NG, p.head_dim = d.HD, p.rot_dim = rot_dim;
  return p;
}

// Megatron's interleaved rotation of element c of (s, b, g, slot): _rotate_half with
// rotary_interleaved and the frequencies repeated pairwise.
double interleaved_ref(const Tensor& x, const AttentionDims& d, int64_t rot_dim, double base,
                       int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  const double* p = x.data<double>() + s * d.B * W + b * W + (g * (G + 2) + slot) * d.HD;
  if (slot == G + 1 || c >= rot_dim) return p[c];
  const int64_t i = c / 2;
  const double angle = double(s) / std::pow(base, double(2 * i) / double(rot_dim));
  if (c % 2 == 0) return p[c] * std::cos(angle) - p[c + 1] * std::sin(angle);
  return p[c] * std::cos(angle) + p[c - 1] * std::sin(angle);
}


TEST(RopeInterleave, PermutedRopeIsMegatronsInterleavedRope) {
  for (int64_t rot_dim : {16, 8}) {  // whole heads and rotary_percent 0.5
    SCOPED_TRACE(rot_dim);
    const AttentionDims d = dims(9, 2, 4, 2, 16);
    const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 31);
    Tensor p = Tensor::empty(x.shape(), x.dtype()), q = Tensor::empty(x.shape(), x.dtype());
    cpu::rope_deinterleave(x, pdims(d, rot_dim), false, p, Stream::cpu());
    cpu::rope_forward(p, d, rot_dim, 10000.0, 0, p, Stream::cpu());
    cpu::rope_deinterleave(p, pdims(d, rot_dim), true, q, Stream::cpu());
    const int64_t G = d.NH / d.NG;
    double err = 0;
    int64_t i = 0;
    for (int64_t s = 0; s < d.S; ++s)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t g = 0; g < d.NG; ++g)
          for (int64_t slot = 0; slot < G + 2; ++slot)
            for (int64_t c = 0; c < d.HD; ++c, ++i)
              err = std::max(err, std::abs(q.data<double>()[i] -
                                           interleaved_ref(x, d, rot_dim, 1e4, s, b, g, slot, c)));
    EXPECT_LT(err, 1e-13);
  }
}

TEST(RopeInterleave, InverseUndoesAndValuesPassThrough) {
  const AttentionDims d = dims(5, 3, 6, 3, 8);
  const auto pd = pdims(d, 6);
  const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 7);
  Tensor p = Tensor::empty(x.shape(), x.dtype()), back = Tensor::empty(x.shape(), x.dtype());
  cpu::rope_deinterleave(x, pd, false, p, Stream::cpu());
  cpu::rope_deinterleave(p, pd, true, back, Stream::cpu());
  const int64_t G = d.NH / d.NG, n = x.numel();
  int64_t moved = 0;
  for (int64_t e = 0; e < n; ++e) {
    ASSERT_EQ(back.data<double>()[e], x.data<double>()[e]) << e;
    const int64_t c = e % d.HD, slot = (e / d.HD) % (G + 2);
    if (slot == G + 1 || c >= 6 || c == 0 || c == 5) {  // values, the tail, fixed points
      ASSERT_EQ(p.data<double>()[e], x.data<double>()[e]) << e;
    } else {
      moved += p.data<double>()[e] != x.data<double>()[e];
    }
  }
  EXPECT_GT(moved, 0);
  // P itself: output dim 1 of a head is input dim 2, output dim 3 input dim 1 (rot_dim 6).
  EXPECT_EQ(p.data<double>()[1], x.data<double>()[2]);
  EXPECT_EQ(p.data<double>()[3], x.data<double>()[1]);
}

TEST(RopeInterleave, RejectsBadArguments) {
  const AttentionDims d = dims(2, 1, 2, 1, 8);
  Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 3);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  EXPECT_THROW(cpu::rope_deinterleave(x, pdims(d, 5), false, y, Stream::cpu()), mcpp::Error);
  EXPECT_THROW(cpu::rope_deinterleave(x, pdims(d, 10), false, y, Stream::cpu()), mcpp::Error);
  EXPECT_THROW(cpu::rope_deinterleave(x, pdims(d, 8), false, x, Stream::cpu()), mcpp::Error);
  Tensor z = Tensor::empty({3}, x.dtype());
  EXPECT_THROW(cpu::rope_deinterleave(x, pdims(d, 8), false, z, Stream::cpu()), mcpp::Error);
}

}  // namespace rope_interleave_test
