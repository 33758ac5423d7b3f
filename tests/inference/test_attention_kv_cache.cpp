// attention_kv_cache_forward against a naive reference and against the training
// attention_forward: a sequence fed through the cache in chunks gives the same output
// as causal attention over the whole sequence at once; sequences of one batch at
// different positions each attend to their own prefix.
#include <gtest/gtest.h>

#include <cmath>

#include "base/philox.h"
#include "ops/ops.h"

using namespace mcpp;

namespace attention_kv_cache_test {

template <typename T>
Tensor random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype_of<T>());
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(Philox::normal(seed, 0, uint64_t(i)));
  return t;
}

// Naive causal GQA attention of qkv [S, B, NG, G+2, HD] -> [S, B, NH*HD], in double; with
// window >= 0 query s sees keys [s - window, s] only.
std::vector<double> naive(const Tensor& qkv, const ops::AttentionDims& d, double scale,
                          int64_t window = -1) {
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  std::vector<double> out(size_t(d.S * d.B * d.NH * d.HD));
  auto at = [&](int64_t s, int64_t b, int64_t g, int64_t j, int64_t c) {
    const int64_t e = (s * d.B + b) * W + (g * (G + 2) + j) * d.HD + c;
    return qkv.dtype() == DType::F64 ? qkv.data<double>()[e] : double(qkv.data<float>()[e]);
  };
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.NH; ++h) {
        const int64_t g = h / G;
        std::vector<double> p(size_t(s + 1), 0.0);
        const int64_t k0 = window >= 0 ? std::max<int64_t>(0, s - window) : 0;
        double mx = -INFINITY, z = 0;
        for (int64_t k = k0; k <= s; ++k) {
          double dot = 0;
          for (int64_t c = 0; c < d.HD; ++c) dot += at(s, b, g, h % G, c) * at(k, b, g, G, c);
          p[size_t(k)] = dot * scale, mx = std::max(mx, p[size_t(k)]);
        }
        for (int64_t k = k0; k <= s; ++k) z += p[size_t(k)] = std::exp(p[size_t(k)] - mx);
        for (int64_t c = 0; c < d.HD; ++c) {
          double acc = 0;
          for (int64_t k = k0; k <= s; ++k) acc += p[size_t(k)] * at(k, b, g, G + 1, c);
          out[size_t(((s * d.B + b) * d.NH + h) * d.HD + c)] = acc / z;
        }
      }
  return out;
}

Tensor positions(std::vector<int64_t> p) {
  Tensor t = Tensor::empty({int64_t(p.size())}, DType::I64);
  for (size_t i = 0; i < p.size(); ++i) t.data<int64_t>()[i] = p[i];
  return t;
}

template <typename T>
void check_chunks(int64_t NH, int64_t NG, double tol) {
  ops::AttentionDims full;
  full.S = 11, full.B = 2, full.NH = NH, full.NG = NG, full.HD = 8;
  full.NH_global = NH, full.S_global = full.S;
  const int64_t W = full.qkv_width(), S = full.S, B = full.B;
  const double scale = 1.0 / std::sqrt(8.0);
  Tensor qkv = random<T>({S, B, W}, NH * 10 + NG);
  auto want = naive(qkv, full, scale);

  // The training op on the whole sequence agrees with the reference.
  Tensor out_full = Tensor::empty({S, B, NH * 8}, dtype_of<T>());
  Tensor lse = Tensor::empty({B, NH, S}, dtype_of<T>());
  ops::attention_forward(qkv, full, scale, 0.0, {}, out_full, lse, Stream::cpu());

  // Through the cache in chunks 4, 1, 1, 5 (prefill, two decode steps, a longer append).
  Tensor kc = Tensor::empty({B, 16, NG, 8}, dtype_of<T>()), vc = kc.clone();
  Tensor out = Tensor::empty({S, B, NH * 8}, dtype_of<T>());
  int64_t p0 = 0;
  for (int64_t n : {4, 1, 1, 5}) {
    ops::AttentionDims d = full;
    d.S = n;
    Tensor q = qkv.narrow(p0, n), o = out.narrow(p0, n);
    ops::attention_kv_cache_forward(q, d, positions({p0, p0}), scale, kc, vc, o, Stream::cpu());
    p0 += n;
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    ASSERT_NEAR(double(out.data<T>()[i]), want[size_t(i)], tol) << i;
    ASSERT_NEAR(double(out_full.data<T>()[i]), want[size_t(i)], tol) << i;
  }
  // The cache holds the keys and values of every position.
  const int64_t G = NH / NG;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < NG; ++g)
        for (int64_t c = 0; c < 8; ++c) {
          const int64_t src = (s * B + b) * W + (g * (G + 2) + G) * 8 + c;
          const int64_t dst = ((b * 16 + s) * NG + g) * 8 + c;
          ASSERT_EQ(kc.data<T>()[dst], qkv.data<T>()[src]);
          ASSERT_EQ(vc.data<T>()[dst], qkv.data<T>()[src + 8]);
        }
}

TEST(AttentionKVCache, ChunksMatchNaiveF64MHA) { check_chunks<double>(4, 4, 1e-12); }
TEST(AttentionKVCache, ChunksMatchNaiveF64GQA) { check_chunks<double>(6, 2, 1e-12); }
TEST(AttentionKVCache, ChunksMatchNaiveF32GQA) { check_chunks<float>(4, 2, 2e-6); }
TEST(AttentionKVCache, ChunksMatchNaiveF32MQA) { check_chunks<float>(4, 1, 2e-6); }

// Three sequences of different lengths decode in one call, each at its own position:
// every row equals the same sequence run alone (B = 1) through its own cache, bit for
// bit, and the other slots' rows are untouched.
TEST(AttentionKVCache, PerSequencePositionsMatchEachSequenceAlone) {
  using T = double;
  ops::AttentionDims d1;
  d1.B = 1, d1.NH = 4, d1.NG = 2, d1.HD = 8;
  const int64_t W = d1.qkv_width(), Tmax = 12, B = 3;
  const std::vector<int64_t> len{5, 2, 9};  // prompt lengths before the decode step
  const double scale = 0.3;
  Tensor batch_k = Tensor::empty({B, Tmax, 2, 8}, DType::F64), batch_v = batch_k.clone();
  std::vector<Tensor> solo_out;
  Tensor step = random<T>({1, B, W}, 77);  // one new row per sequence
  for (int64_t b = 0; b < B; ++b) {
    // Alone: prefill len[b] rows, then the decode row.
    Tensor prompt = random<T>({len[size_t(b)], 1, W}, 100 + uint64_t(b));
    Tensor kc = Tensor::empty({1, Tmax, 2, 8}, DType::F64), vc = kc.clone();
    ops::AttentionDims d = d1;
    d.S = len[size_t(b)];
    Tensor o = Tensor::empty({d.S, 1, 32}, DType::F64);
    ops::attention_kv_cache_forward(prompt, d, positions({0}), scale, kc, vc, o, Stream::cpu());
    // The batch's slot b receives the same prefill.
    Tensor bk = batch_k.narrow(b, 1), bv = batch_v.narrow(b, 1);
    ops::attention_kv_cache_forward(prompt, d, positions({0}), scale, bk, bv, o, Stream::cpu());
    d.S = 1;
    Tensor row = Tensor::empty({1, 1, W}, DType::F64);
    std::copy(step.data<T>() + b * W, step.data<T>() + (b + 1) * W, row.data<T>());
    solo_out.push_back(Tensor::empty({1, 1, 32}, DType::F64));
    ops::attention_kv_cache_forward(row, d, positions({len[size_t(b)]}), scale, kc, vc,
                                    solo_out.back(), Stream::cpu());
  }
  ops::AttentionDims d = d1;
  d.S = 1, d.B = B;
  Tensor out = Tensor::empty({1, B, 32}, DType::F64);
  ops::attention_kv_cache_forward(step, d, positions(len), scale, batch_k, batch_v, out,
                                  Stream::cpu());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < 32; ++c)
      ASSERT_EQ(out.data<T>()[b * 32 + c], solo_out[size_t(b)].data<T>()[c]) << b << " " << c;
  // The sequences' outputs differ (the equality above is not between identical rows).
  EXPECT_NE(solo_out[1].data<T>()[0], solo_out[2].data<T>()[0]);
}

// A sliding window (AttentionDims::window_left): the sequence fed through the cache in
// chunks (a prefill longer than the window, decode steps, a longer append) gives the naive
// band-masked attention; decode_attention over the filled cache gives the same rows; and
// the window changes the rows past it (so the comparison is not with the plain attention).
template <typename T>
void check_window_chunks(int64_t window, double tol) {
  ops::AttentionDims full;
  full.S = 13, full.B = 2, full.NH = 4, full.NG = 2, full.HD = 8;
  const int64_t W = full.qkv_width(), S = full.S, B = full.B;
  const double scale = 1.0 / std::sqrt(8.0);
  Tensor qkv = random<T>({S, B, W}, 31 + uint64_t(window));
  const auto want = naive(qkv, full, scale, window), plain = naive(qkv, full, scale);
  Tensor kc = Tensor::empty({B, 16, 2, 8}, dtype_of<T>()), vc = kc.clone();
  Tensor out = Tensor::empty({S, B, 32}, dtype_of<T>());
  int64_t p0 = 0;
  for (int64_t n : {6, 1, 1, 5}) {
    ops::AttentionDims d = full;
    d.S = n, d.window_left = window;
    Tensor q = qkv.narrow(p0, n), o = out.narrow(p0, n);
    ops::attention_kv_cache_forward(q, d, positions({p0, p0}), scale, kc, vc, o, Stream::cpu());
    p0 += n;
  }
  double moved = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    ASSERT_NEAR(double(out.data<T>()[i]), want[size_t(i)], tol) << i;
    moved = std::max(moved, std::abs(want[size_t(i)] - plain[size_t(i)]));
  }
  EXPECT_GT(moved, 1e-3);
  // decode_attention attends the cache as it is: its last row (every key written) again.
  ops::AttentionDims d = full;
  d.S = 1, d.window_left = window;
  Tensor last = Tensor::empty({1, B, 32}, dtype_of<T>());
  ops::decode_attention(qkv.narrow(S - 1, 1), d, positions({S - 1, S - 1}), scale, kc, vc, last,
                        Stream::cpu());
  for (int64_t i = 0; i < last.numel(); ++i)
    ASSERT_EQ(last.data<T>()[i], out.data<T>()[(S - 1) * B * 32 + i]) << i;
}

TEST(AttentionKVCache, WindowMatchesNaiveBandF64) {
  check_window_chunks<double>(0, 1e-12);
  check_window_chunks<double>(3, 1e-12);
}
TEST(AttentionKVCache, WindowMatchesNaiveBandF32) { check_window_chunks<float>(4, 2e-6); }

TEST(AttentionKVCache, RejectsOverflowAndBadShapes) {
  ops::AttentionDims d;
  d.S = 3, d.B = 1, d.NH = 2, d.NG = 1, d.HD = 4;
  Tensor qkv = Tensor::zeros({3, 1, d.qkv_width()}, DType::F32);
  Tensor kc = Tensor::zeros({1, 4, 1, 4}, DType::F32), vc = kc.clone();
  Tensor out = Tensor::zeros({3, 1, 8}, DType::F32);
  EXPECT_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({2}), 1.0, kc, vc, out, Stream::cpu()),
      Error);
  Tensor bad = Tensor::zeros({1, 4, 2, 4}, DType::F32);
  EXPECT_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({0}), 1.0, bad, vc, out, Stream::cpu()),
      Error);
  EXPECT_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({0, 0}), 1.0, kc, vc, out, Stream::cpu()),
      Error);  // pos must hold B entries
  EXPECT_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({-1}), 1.0, kc, vc, out, Stream::cpu()),
      Error);
  EXPECT_NO_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({1}), 1.0, kc, vc, out, Stream::cpu()));
  d.window_left = -2;  // neither -1 (none) nor a window
  EXPECT_THROW(
      ops::attention_kv_cache_forward(qkv, d, positions({1}), 1.0, kc, vc, out, Stream::cpu()),
      Error);
}

}  // namespace attention_kv_cache_test
