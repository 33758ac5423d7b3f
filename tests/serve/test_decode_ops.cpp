// The inference ops on the CPU (ops/cpu/decode.cpp): decode_attention against the
// generation op it serves (attention_kv_cache_forward at Sq = 1 and 3, itself checked
// against a naive reference in tests/inference), on a batch whose sequences sit at different
// positions with grouped queries; argmax_rows against inference::argmax, ties included;
// linear_decode against a double-precision loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>

#include "base/philox.h"
#include "inference/sampling.h"
#include "ops/ops.h"

using namespace mcpp;

namespace decode_ops_test {

Tensor random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = Philox::normal(seed, 0, uint64_t(i));
  return t;
}

TEST(DecodeAttention, MatchesKvCacheOp) {
  Stream& s = Stream::cpu();
  for (auto [S, NH, NG, HD] : {std::tuple{1, 8, 2, 16}, {1, 4, 4, 8}, {1, 6, 1, 32}, {3, 8, 2, 16}}) {
    ops::AttentionDims d;
    d.S = S, d.B = 3, d.NH = NH, d.NG = NG, d.HD = HD;
    const int64_t Tmax = 40;
    const Shape cache{d.B, Tmax, d.NG, d.HD};
    // Caches full of earlier keys/values; each sequence decodes at its own position.
    Tensor kc = random(cache, 1), vc = random(cache, 2);
    Tensor kc2 = kc.clone(), vc2 = vc.clone();
    Tensor qkv = random({d.S, d.B, d.qkv_width()}, 3);
    Tensor pos = Tensor::empty({d.B}, DType::I64);
    const int64_t p[] = {0, 17, Tmax - S};
    for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
    const double scale = 1.0 / std::sqrt(double(HD));
    Tensor ref = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F64);
    ops::attention_kv_cache_forward(qkv, d, pos, scale, kc, vc, ref, s);  // appends, attends
    Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F64);
    for (int64_t i = 0; i < out.numel(); ++i) out.data<double>()[i] = NAN;
    ops::decode_attention(qkv, d, pos, scale, kc, vc, out, s);  // over the appended cache
    for (int64_t i = 0; i < out.numel(); ++i)
      ASSERT_NEAR(out.data<double>()[i], ref.data<double>()[i], 1e-12) << "element " << i;
    // The op itself only reads the cache: a stale cache (before the append) gives another
    // answer for the sequences whose new row it did not see.
    Tensor stale = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F64);
    ops::decode_attention(qkv, d, pos, scale, kc2, vc2, stale, s);
    double diff = 0;
    for (int64_t i = 0; i < stale.numel(); ++i)
      diff = std::max(diff, std::abs(stale.data<double>()[i] - ref.data<double>()[i]));
    EXPECT_GT(diff, 1e-3);
  }
}

TEST(DecodeAttention, RejectsBadInput) {
  Stream& s = Stream::cpu();
  ops::AttentionDims d;
  d.S = 1, d.B = 1, d.NH = 2, d.NG = 1, d.HD = 4;
  Tensor kc = Tensor::zeros({1, 5, 1, 4}, DType::F32), vc = kc.clone();
  Tensor qkv = Tensor::zeros({1, d.qkv_width()}, DType::F32);
  Tensor out = Tensor::zeros({1, 8}, DType::F32);
  Tensor pos = Tensor::zeros({1}, DType::I64);
  pos.data<int64_t>()[0] = 5;  // == Tmax: outside the cache
  EXPECT_THROW(ops::decode_attention(qkv, d, pos, 0.5, kc, vc, out, s), Error);
  pos.data<int64_t>()[0] = 4;
  EXPECT_NO_THROW(ops::decode_attention(qkv, d, pos, 0.5, kc, vc, out, s));
  d.S = 2;  // qkv holds one row
  EXPECT_THROW(ops::decode_attention(qkv, d, pos, 0.5, kc, vc, out, s), Error);
}

TEST(ArgmaxRows, FirstLargestAsTheSampler) {
  Stream& s = Stream::cpu();
  const int64_t R = 4, Vp = 64, V = 50;
  Tensor x = Tensor::empty({R, Vp}, DType::F32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(Philox::normal(9, 0, uint64_t(i)));
  float* r1 = x.data<float>() + Vp;
  r1[7] = r1[31] = 100.f;  // a tie: the lower index wins
  x.data<float>()[2 * Vp + 60] = 1000.f;  // beyond V: never chosen
  float* r3 = x.data<float>() + 3 * Vp;
  r3[0] = NAN, r3[12] = 50.f;  // a NaN never wins
  Tensor ids = Tensor::empty({R}, DType::I64);
  for (int64_t r = 0; r < R; ++r) ids.data<int64_t>()[r] = -1;
  ops::argmax_rows(x, V, ids, s);
  for (int64_t r = 0; r < 3; ++r) {
    std::span<const float> row(x.data<float>() + r * Vp, size_t(Vp));
    EXPECT_EQ(ids.data<int64_t>()[r], inference::argmax(row, V)) << "row " << r;
  }
  EXPECT_EQ(ids.data<int64_t>()[1], 7);
  EXPECT_EQ(ids.data<int64_t>()[3], 12);
  EXPECT_THROW(ops::argmax_rows(x, Vp + 1, ids, s), Error);
}

// y = x w^T + b + residual, f64 (exact enough to compare at 1e-12) and f32.
TEST(LinearDecode, MatchesNaiveSum) {
  Stream& s = Stream::cpu();
  const int64_t T = 3, N = 7, K = 5;
  auto as = [&](const Tensor& t, DType dt) {
    Tensor o = Tensor::empty(t.shape(), dt);
    ops::copy(t, o, s);
    return o;
  };
  for (DType dt : {DType::F64, DType::F32})
    for (int variant = 0; variant < 3; ++variant) {  // plain, bias, bias + residual
      Tensor x = random({T, K}, 21), w = random({N, K}, 22), b = random({N}, 23),
             r = random({T, N}, 24);
      Tensor xd = as(x, dt), wd = as(w, dt), bd = as(b, dt), rd = as(r, dt);
      Tensor y = Tensor::empty({T, N}, dt);
      ops::linear_decode(xd, wd, variant >= 1 ? bd : Tensor(), variant == 2 ? rd : Tensor(), y, s);
      Tensor yd = as(y, DType::F64);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double e = 0;
          for (int64_t k = 0; k < K; ++k)
            e += x.data<double>()[t * K + k] * w.data<double>()[n * K + k];
          if (variant >= 1) e += b.data<double>()[n];
          if (variant == 2) e += r.data<double>()[t * N + n];
          EXPECT_NEAR(yd.data<double>()[t * N + n], e, dt == DType::F64 ? 1e-12 : 1e-5)
              << dtype_name(dt) << " variant " << variant << " at " << t << "," << n;
        }
    }
  // The residual must not alias y (the GPU kernel reads it while other blocks write y).
  Tensor x = random({T, K}, 1), w = random({N, K}, 2), y = random({T, N}, 3);
  EXPECT_THROW(ops::linear_decode(x, w, Tensor(), y, y, s), Error);
}

// linear_swiglu_decode against silu(x w_gate^T + b_gate) * (x w_up^T + b_up) in double.
TEST(LinearSwigluDecode, MatchesNaiveSum) {
  Stream& s = Stream::cpu();
  const int64_t T = 2, F = 3, K = 4;
  Tensor x = random({T, K}, 41), w = random({2 * F, K}, 42), b = random({2 * F}, 43);
  Tensor fc1 = Tensor::empty({T, 2 * F}, DType::F64), y = Tensor::empty({T, F}, DType::F64);
  ops::linear_swiglu_decode(x, w, b, fc1, y, s);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < F; ++j) {
      double g = b.data<double>()[j], u = b.data<double>()[F + j];
      for (int64_t k = 0; k < K; ++k) {
        g += x.data<double>()[t * K + k] * w.data<double>()[j * K + k];
        u += x.data<double>()[t * K + k] * w.data<double>()[(F + j) * K + k];
      }
      EXPECT_NEAR(y.data<double>()[t * F + j], g / (1 + std::exp(-g)) * u, 1e-12) << t << "," << j;
    }
}

// rope_attention_decode: rope_decode then attention_kv_cache_forward, bit for bit.
TEST(RopeAttentionDecode, IsRopeThenKvCacheAttention) {
  Stream& s = Stream::cpu();
  ops::AttentionDims d;
  d.S = 1, d.B = 3, d.NH = 8, d.NG = 2, d.HD = 16;
  const int64_t Tmax = 24;
  Tensor kc = random({d.B, Tmax, d.NG, d.HD}, 51), vc = random({d.B, Tmax, d.NG, d.HD}, 52);
  Tensor qkv = random({d.S, d.B, d.qkv_width()}, 53);
  Tensor pos = Tensor::empty({d.B}, DType::I64);
  const int64_t p[] = {0, 9, Tmax - 1};
  for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
  Tensor kc2 = kc.clone(), vc2 = vc.clone(), q2 = qkv.clone();
  Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F64), out2 = out.clone();
  ops::rope_attention_decode(qkv, d, 12, 500.0, pos, 0.3, kc, vc, out, s);
  ops::rope_decode(q2, d, 12, 500.0, pos, q2, s);
  ops::attention_kv_cache_forward(q2, d, pos, 0.3, kc2, vc2, out2, s);
  for (auto [a, e] : {std::pair{&out, &out2}, {&kc, &kc2}, {&vc, &vc2}})
    EXPECT_EQ(std::memcmp(a->raw(), e->raw(), a->nbytes()), 0);
  // Rows of a prefill are not a decode step.
  d.S = 2;
  Tensor q3 = random({d.S, d.B, d.qkv_width()}, 54), o3 = random({d.S, d.B, d.NH * d.HD}, 55);
  EXPECT_THROW(ops::rope_attention_decode(q3, d, 12, 500.0, pos, 0.3, kc, vc, o3, s), Error);
}

}  // namespace decode_ops_test
