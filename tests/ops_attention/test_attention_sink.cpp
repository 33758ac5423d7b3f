// Attention sinks (ops::attention_sink_forward / _backward, AttentionDims::sink in the KV-cache
// op) against a direct fp64 softmax with one more logit a head and no value, written here
// independently of the ops; gradients against central finite differences of the whole chain
// (attention_forward, the sink, attention_backward on the sink's out and lse).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_test_util.h"
#include "base/philox.h"
#include "ops/ops.h"

namespace attention_sink_test {

using attn_test::dims;
using attn_test::randn;
using mcpp::DType;
using mcpp::Stream;
using mcpp::Tensor;
using mcpp::ops::AttentionDims;
using mcpp::ops::DropoutKey;

// out[s, b, h*HD + c] of causal GQA attention whose head-h softmax has the extra logit z[h].
std::vector<double> sink_reference(const Tensor& qkv, const AttentionDims& d, double scale,
                                   const std::vector<double>& z, double p, DropoutKey key) {
  const int64_t S = d.S, B = d.B, NH = d.NH, G = d.NH / d.NG, HD = d.HD, W = d.qkv_width();
  const double* x = qkv.data<double>();
  auto at = [&](int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
    return x[s * B * W + b * W + (g * (G + 2) + slot) * HD + c];
  };
  std::vector<double> out(size_t(S * B * NH * HD), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t q = 0; q < S; ++q) {
        const int64_t g = h / G;
        std::vector<double> e(size_t(q + 1));
        double denom = std::exp(z[size_t(h)]);
        for (int64_t k = 0; k <= q; ++k) {
          double dot = 0;
          for (int64_t c = 0; c < HD; ++c) dot += at(q, b, g, h % G, c) * at(k, b, g, G, c);
          denom += (e[size_t(k)] = std::exp(scale * dot));
        }
        for (int64_t k = 0; k <= q; ++k) {
          double prob = e[size_t(k)] / denom;
          if (p > 0) {
            const uint64_t idx = uint64_t(((b * NH + h) * S + q) * S + k);
            prob = mcpp::DropoutMask::uniform(key.seed, key.stream, idx) >= p
                       ? prob * mcpp::DropoutMask::keep_scale(p)
                       : 0.0;
          }
          for (int64_t c = 0; c < HD; ++c)
            out[size_t((q * B + b) * NH * HD + h * HD + c)] += prob * at(k, b, g, G + 1, c);
        }
      }
  return out;
}

struct Case {
  int64_t S, B, NH, NG, HD;
  double p;
};

Tensor sinks(int64_t n, uint64_t stream) { return randn<double>({n}, stream, 1.5); }

std::vector<double> vec(const Tensor& t) { return attn_test::to_vec(t); }

Tensor full(const mcpp::Shape& shape, double v) {
  Tensor t = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = v;
  return t;
}

// The op chain the model runs: attention, then the sink.
void forward(const Tensor& qkv, const AttentionDims& d, double scale, double p, DropoutKey key,
             const Tensor& z, Tensor& out, Tensor& lse) {
  out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F64);
  lse = Tensor::empty({d.B, d.NH, d.S}, DType::F64);
  mcpp::ops::attention_forward(qkv, d, scale, p, key, out, lse, Stream::cpu());
  mcpp::ops::attention_sink_forward(out, lse, z, 0, d, Stream::cpu());
}

TEST(AttentionSink, ForwardMatchesTheSoftmaxWithOneMoreLogit) {
  for (const Case c : {Case{9, 2, 4, 2, 8, 0.0}, Case{13, 1, 6, 3, 4, 0.25}}) {
    const AttentionDims d = dims(c.S, c.B, c.NH, c.NG, c.HD);
    const Tensor qkv = randn<double>({c.S, c.B, d.qkv_width()}, 1);
    const Tensor z = sinks(c.NH, 2);
    const DropoutKey key{77, 5};
    const double scale = 1 / std::sqrt(double(c.HD));
    Tensor out, lse;
    forward(qkv, d, scale, c.p, key, z, out, lse);
    const std::vector<double> ref = sink_reference(qkv, d, scale, vec(z), c.p, key);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(out.data<double>()[i], ref[i], 1e-12) << "p " << c.p << " element " << i;
    // The lse is the sink softmax's denominator: sink-free lse joined with z.
    Tensor out0 = Tensor::empty(out.shape(), DType::F64);
    Tensor lse0 = Tensor::empty(lse.shape(), DType::F64);
    mcpp::ops::attention_forward(qkv, d, scale, c.p, key, out0, lse0, Stream::cpu());
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.NH; ++h)
        for (int64_t s = 0; s < c.S; ++s) {
          const int64_t i = (b * c.NH + h) * c.S + s;
          EXPECT_NEAR(lse.data<double>()[i],
                      std::log(std::exp(lse0.data<double>()[i]) + std::exp(z.data<double>()[h])),
                      1e-12);
        }
  }
}

// L = sum(w * out): dqkv and dz by the ops against central differences of L.
TEST(AttentionSink, GradientsMatchFiniteDifferences) {
  for (const Case c : {Case{7, 2, 4, 2, 4, 0.0}, Case{6, 1, 2, 1, 4, 0.3}}) {
    const AttentionDims d = dims(c.S, c.B, c.NH, c.NG, c.HD);
    Tensor qkv = randn<double>({c.S, c.B, d.qkv_width()}, 3, 0.7);
    Tensor z = sinks(c.NH, 4);
    const Tensor w = randn<double>({c.S, c.B, c.NH * c.HD}, 5);
    const DropoutKey key{11, 2};
    const double scale = 0.4;
    auto loss = [&] {
      Tensor out, lse;
      forward(qkv, d, scale, c.p, key, z, out, lse);
      double l = 0;
      for (int64_t i = 0; i < out.numel(); ++i) l += w.data<double>()[i] * out.data<double>()[i];
      return l;
    };
    Tensor out, lse;
    forward(qkv, d, scale, c.p, key, z, out, lse);
    Tensor dz = Tensor::zeros({c.NH}, DType::F64);
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::F64);
    mcpp::ops::attention_sink_backward(w, out, lse, z, 0, d, dz, Stream::cpu());
    mcpp::ops::attention_backward(w, qkv, out, lse, d, scale, c.p, key, dqkv, Stream::cpu());
    const double eps = 1e-6;
    auto fd = [&](double& v) {
      const double v0 = v;
      v = v0 + eps;
      const double up = loss();
      v = v0 - eps;
      const double dn = loss();
      v = v0;
      return (up - dn) / (2 * eps);
    };
    for (int64_t h = 0; h < c.NH; ++h)
      EXPECT_NEAR(dz.data<double>()[h], fd(z.data<double>()[h]), 1e-7) << "sink " << h;
    for (int64_t i = 0; i < qkv.numel(); i += 3)
      EXPECT_NEAR(dqkv.data<double>()[i], fd(qkv.data<double>()[i]), 1e-7) << "qkv " << i;
  }
}

// The sinks of heads [h0, h0 + NH) of a longer tensor, on an lse of rows lse_ld apart: the
// compact call's numbers, the gradient at [h0, h0 + NH) added to what was there, the rest and
// the lse's padding untouched.
TEST(AttentionSink, HeadOffsetAndStridedLse) {
  const AttentionDims d = dims(5, 2, 3, 3, 4);
  const Tensor qkv = randn<double>({5, 2, d.qkv_width()}, 6);
  const Tensor z_all = sinks(6, 7);
  Tensor z = Tensor::empty({3}, DType::F64);
  for (int h = 0; h < 3; ++h) z.data<double>()[h] = z_all.data<double>()[2 + h];
  Tensor out, lse;
  forward(qkv, d, 1.0, 0, {}, z, out, lse);
  AttentionDims ds = d;
  ds.lse_ld = 8;
  Tensor out2 = Tensor::empty(out.shape(), DType::F64);
  Tensor lse2 = full({2, 3, 8}, -7.0);
  Tensor lse0 = Tensor::empty({2, 3, 5}, DType::F64);
  mcpp::ops::attention_forward(qkv, d, 1.0, 0, {}, out2, lse0, Stream::cpu());
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t s = 0; s < 5; ++s)
      lse2.data<double>()[r * 8 + s] = lse0.data<double>()[r * 5 + s];
  mcpp::ops::attention_sink_forward(out2, lse2, z_all, 2, ds, Stream::cpu());
  for (int64_t i = 0; i < out.numel(); ++i)
    EXPECT_EQ(out2.data<double>()[i], out.data<double>()[i]);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t s = 0; s < 8; ++s)
      EXPECT_EQ(lse2.data<double>()[r * 8 + s], s < 5 ? lse.data<double>()[r * 5 + s] : -7.0);
  const Tensor w = randn<double>(out.shape(), 8);
  Tensor dz = Tensor::zeros({3}, DType::F64), dz_all = full({6}, 0.5);
  mcpp::ops::attention_sink_backward(w, out, lse, z, 0, d, dz, Stream::cpu());
  mcpp::ops::attention_sink_backward(w, out2, lse2, z_all, 2, ds, dz_all, Stream::cpu());
  for (int h = 0; h < 6; ++h)
    EXPECT_DOUBLE_EQ(dz_all.data<double>()[h], h < 2 ? 0.5 : 0.5 + dz.data<double>()[h - 2]);
  EXPECT_THROW(mcpp::ops::attention_sink_forward(out2, lse2, z_all, 4, ds, Stream::cpu()),
               mcpp::Error);  // heads 4..6 of a 6-head tensor
}

// A row that saw no key (lse -inf, a context-parallel block's) gets out 0 and lse = the sink.
TEST(AttentionSink, RowWithoutKeys) {
  const AttentionDims d = dims(1, 1, 1, 1, 2);
  Tensor out = full({1, 1, 2}, 3.0);
  Tensor lse = full({1, 1, 1}, -INFINITY);
  const Tensor z = full({1}, 0.25);
  mcpp::ops::attention_sink_forward(out, lse, z, 0, d, Stream::cpu());
  EXPECT_EQ(out.data<double>()[0], 0.0);
  EXPECT_EQ(out.data<double>()[1], 0.0);
  EXPECT_EQ(lse.data<double>()[0], 0.25);
}

// Generation: the KV-cache op with AttentionDims::sink gives the training chain's rows, for a
// prefill at position 0 and for a decode step after it.
TEST(AttentionSink, KvCacheMatchesTheTrainingChain) {
  const int64_t S = 6, B = 2, NH = 4, NG = 2, HD = 8, Tmax = 8;
  const AttentionDims d = dims(S, B, NH, NG, HD);
  const Tensor qkv = randn<double>({S, B, d.qkv_width()}, 9);
  const Tensor z = sinks(NH, 10);
  const double scale = 0.3;
  Tensor out, lse;
  forward(qkv, d, scale, 0, {}, z, out, lse);
  // Prefill of the first S-1 rows, then row S-1 as a decode step.
  AttentionDims dp = dims(S - 1, B, NH, NG, HD), ds = dims(1, B, NH, NG, HD);
  dp.sink = z, ds.sink = z;
  Tensor kc = Tensor::zeros({B, Tmax, NG, HD}, DType::F64);
  Tensor vc = Tensor::zeros(kc.shape(), DType::F64);
  const Tensor prompt = qkv.narrow(0, S - 1), step = qkv.narrow(S - 1, 1);
  Tensor o1 = Tensor::empty({S - 1, B, NH * HD}, DType::F64);
  Tensor o2 = Tensor::empty({1, B, NH * HD}, DType::F64);
  const Tensor pos0 = Tensor::from(std::vector<int64_t>(size_t(B), 0), {B});
  const Tensor pos1 = Tensor::from(std::vector<int64_t>(size_t(B), S - 1), {B});
  mcpp::ops::attention_kv_cache_forward(prompt, dp, pos0, scale, kc, vc, o1, Stream::cpu());
  mcpp::ops::attention_kv_cache_forward(step, ds, pos1, scale, kc, vc, o2, Stream::cpu());
  const int64_t row = B * NH * HD;
  for (int64_t i = 0; i < (S - 1) * row; ++i)
    ASSERT_NEAR(o1.data<double>()[i], out.data<double>()[i], 1e-12) << i;
  for (int64_t i = 0; i < row; ++i)
    ASSERT_NEAR(o2.data<double>()[i], out.data<double>()[(S - 1) * row + i], 1e-12) << i;
  // Without the sink the rows differ (the sink is not a no-op here).
  dp.sink = Tensor();
  mcpp::ops::attention_kv_cache_forward(prompt, dp, pos0, scale, kc, vc, o1, Stream::cpu());
  EXPECT_GT(std::abs(o1.data<double>()[0] - out.data<double>()[0]), 1e-3);
}

}  // namespace attention_sink_test
