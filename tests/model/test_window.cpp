// Sliding-window attention (--window-size L,0, --window-attn-skip-freq) on the CPU, f64:
//   * the attention op with a window's key starts against a naive O(S^2) reference written
//     here with an explicit band mask (q - L <= k <= q), combined with documents;
//   * the whole model: a one-layer RoPE model's per-token loss with the window equals the
//     full-attention model's on the slice of tokens the window sees (RoPE depends on
//     relative positions only, and one layer's keys depend on their own token only), also
//     with --reset-attention-mask; a window covering the sequence is bitwise the plain
//     model; fp64 finite differences through a model with window and full layers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_attention/attention_test_util.h"
#include "model/gpt_model.h"
#include "tiny_model.h"

namespace window_test {

using namespace attn_test;
using mcpp::Stream;
namespace ops = mcpp::ops;
namespace model = mcpp::model;

// Documents of sample b end where (s * 5 + b) % 7 == 0 (doc start per row), or none.
std::vector<int64_t> doc_starts(int64_t B, int64_t S, bool docs) {
  std::vector<int64_t> ks(size_t(B * S), 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0;
    for (int64_t s = 0; s < S; ++s) {
      ks[size_t(b * S + s)] = docs ? doc : 0;
      if ((s * 5 + b) % 7 == 0) doc = s + 1;
    }
  }
  return ks;
}

// Plain softmax attention where (b, q) sees k iff k <= q, q - k <= L and k >= doc(b, q).
Reference naive_band_attention(const Tensor& qkv, const AttentionDims& d, int64_t L,
                               const std::vector<int64_t>& doc, double scale) {
  const int64_t S = d.S, B = d.B, NH = d.NH, G = NH / d.NG, HD = d.HD, W = d.qkv_width();
  const double* x = qkv.data<double>();
  auto at = [&](int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
    return x[s * B * W + b * W + (g * (G + 2) + slot) * HD + c];
  };
  Reference r;
  r.out.assign(size_t(S * B * NH * HD), 0.0);
  r.lse.assign(size_t(B * NH * S), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t q = 0; q < S; ++q) {
        const int64_t g = h / G;
        std::vector<double> sc(size_t(S), 0.0);
        std::vector<bool> seen(size_t(S), false);
        double m = -INFINITY;
        for (int64_t k = 0; k < S; ++k) {
          seen[size_t(k)] = k <= q && q - k <= L && k >= doc[size_t(b * S + q)];
          if (!seen[size_t(k)]) continue;
          double acc = 0;
          for (int64_t c = 0; c < HD; ++c) acc += at(q, b, g, h % G, c) * at(k, b, g, G, c);
          sc[size_t(k)] = scale * acc;
          m = std::max(m, sc[size_t(k)]);
        }
        double l = 0;
        for (int64_t k = 0; k < S; ++k)
          if (seen[size_t(k)]) l += std::exp(sc[size_t(k)] - m);
        r.lse[size_t((b * NH + h) * S + q)] = m + std::log(l);
        for (int64_t k = 0; k < S; ++k) {
          if (!seen[size_t(k)]) continue;
          const double prob = std::exp(sc[size_t(k)] - m) / l;
          for (int64_t c = 0; c < HD; ++c)
            r.out[size_t((q * B + b) * NH * HD + h * HD + c)] += prob * at(k, b, g, G + 1, c);
        }
      }
  return r;
}

void expect_op_matches_band(bool docs) {
  Stream& st = Stream::cpu();
  AttentionDims d = dims(70, 2, 4, 2, 8);  // two 64-row tiles
  const int64_t L = docs ? 3 : 9;          // the documents are at most 7 long
  const std::vector<int64_t> doc = doc_starts(d.B, d.S, docs);
  d.key_start = Tensor::empty({d.B, d.S}, DType::I64);  // the model's rule, max(doc, q - L)
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t q = 0; q < d.S; ++q)
      d.key_start.data<int64_t>()[b * d.S + q] = std::max(doc[size_t(b * d.S + q)], q - L);
  const Tensor qkv = randn<double>({d.S * d.B, d.qkv_width()}, 81);
  const double scale = 0.35;
  Tensor out = Tensor::empty({d.S * d.B, d.NH * d.HD}, DType::F64);
  Tensor lse = Tensor::empty({d.B, d.NH, d.S}, DType::F64);
  ops::attention_forward(qkv, d, scale, 0.0, {1, 1}, out, lse, st);
  const Reference r = naive_band_attention(qkv, d, L, doc, scale);
  double eo = 0, el = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    eo = std::max(eo, std::abs(out.data<double>()[i] - r.out[size_t(i)]));
  for (int64_t i = 0; i < lse.numel(); ++i)
    el = std::max(el, std::abs(lse.data<double>()[i] - r.lse[size_t(i)]));
  EXPECT_LT(eo, 1e-12);
  EXPECT_LT(el, 1e-12);
  // The band changed the result (the reference with an unbounded window differs).
  const Reference wide = naive_band_attention(qkv, d, d.S, doc, scale);
  double diff = 0;
  for (size_t i = 0; i < wide.out.size(); ++i)
    diff = std::max(diff, std::abs(wide.out[i] - r.out[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(SlidingWindow, OpMatchesNaiveBandMask) { expect_op_matches_band(false); }
TEST(SlidingWindow, OpMatchesNaiveBandAndDocumentMask) { expect_op_matches_band(true); }

// ---- the whole model ---------------------------------------------------------------------

model::MicroBatch one_hot_batch(const std::vector<int64_t>& toks, const std::vector<int64_t>& lab,
                                size_t from, size_t to, size_t at) {
  const int64_t S = int64_t(to - from);
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({1, S}, DType::I64);
  mb.labels = Tensor::empty({1, S}, DType::I64);
  mb.loss_mask = Tensor::zeros({1, S}, DType::F32);
  for (int64_t s = 0; s < S; ++s) {
    mb.tokens.data<int64_t>()[s] = toks[from + size_t(s)];
    mb.labels.data<int64_t>()[s] = lab[from + size_t(s)];
  }
  mb.loss_mask.data<float>()[at - from] = 1.f;
  return mb;
}

// One layer, RoPE: with the window (and documents), the loss at q equals the plain model's
// on tokens [max(doc(q), q - L), q] alone.
void expect_window_equals_slices(bool docs) {
  const int64_t S = 12, L = 3;
  model::TransformerConfig full = model::test::tiny(true, 1, 0.0);
  full.seq_length = S, full.max_position_embeddings = S;
  model::TransformerConfig win = full;
  win.window_left = L;
  model::GPTModel mw(win), mf(full);
  model::test::perturb_norms(mw.params());
  ops::copy(mw.params().flat_params(), mf.params().flat_params(), Stream::cpu());
  std::vector<int64_t> toks, lab;
  for (int64_t s = 0; s < S; ++s) toks.push_back((s * 7 + 3) % 16), lab.push_back((s * 5 + 1) % 16);
  const std::vector<int64_t> doc = doc_starts(1, S, docs);
  model::StepKeys k;
  k.training = false;
  double most = 0;
  for (int64_t q = 0; q < S; ++q) {
    model::MicroBatch mb = one_hot_batch(toks, lab, 0, size_t(S), size_t(q));
    if (docs) mb.key_start = Tensor::from(doc, {1, S});
    const double lw = mw.forward(mb, k);
    mw.backward(1.0);
    const size_t from = size_t(std::max(doc[size_t(q)], q - L));
    const double lr = mf.forward(one_hot_batch(toks, lab, from, size_t(q) + 1, size_t(q)), k);
    mf.backward(1.0);
    EXPECT_NEAR(lw, lr, 1e-11 * std::max(1.0, std::abs(lr))) << "q " << q;
    // And not the plain model's loss on the whole prefix once the window cuts it.
    const double lp = mf.forward(mb, k);
    mf.backward(1.0);
    if (int64_t(from) > (docs ? doc[size_t(q)] : 0)) most = std::max(most, std::abs(lp - lw));
  }
  EXPECT_GT(most, 1e-4);
}

TEST(SlidingWindow, ModelEqualsPlainModelOnWindowSlices) { expect_window_equals_slices(false); }
TEST(SlidingWindow, ModelWithDocumentsEqualsPlainModelOnSlices) {
  expect_window_equals_slices(true);
}

// A window that covers the sequence changes nothing, bit for bit.
TEST(SlidingWindow, WindowCoveringTheSequenceIsBitwisePlain) {
  for (bool llama : {false, true}) {
    model::TransformerConfig c = model::test::tiny(llama, 2, 0.1);
    model::TransformerConfig w = c;
    w.window_left = c.seq_length - 1;
    w.window_pattern = {1, 0};
    model::GPTModel mc(c), mw(w);
    const auto mb = model::test::random_batch(2, c.seq_length, c.padded_vocab_size, 5);
    model::StepKeys k;
    k.iteration = 2;
    mc.params().zero_grads(), mw.params().zero_grads();
    const double lc = mc.forward(mb, k), lw = mw.forward(mb, k);
    mc.backward(1.0), mw.backward(1.0);
    EXPECT_EQ(lc, lw);
    const Tensor &gc = mc.params().flat_grads(), &gw = mw.params().flat_grads();
    ASSERT_EQ(gc.numel(), gw.numel());
    int64_t differ = 0;
    for (int64_t i = 0; i < gc.numel(); ++i) differ += gc.data<double>()[i] != gw.data<double>()[i];
    EXPECT_EQ(differ, 0);
  }
}

// fp64 finite differences through a window layer and a full layer (dropout on, keyed).
TEST(SlidingWindow, GradientsMatchFiniteDifferences) {
  for (bool llama : {false, true}) {
    model::TransformerConfig c = model::test::tiny(llama, 2, 0.1);
    c.window_left = 2, c.window_pattern = {1, 0};
    model::test::expect_model_finite_differences(c, c.padded_vocab_size);
  }
}

}  // namespace window_test
