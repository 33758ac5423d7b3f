// Document masking (--reset-attention-mask, --reset-position-ids) on the CPU:
//   * the attention op with key_start against a naive O(S^2) reference (fp64, dropout on)
//     and against fp64 finite differences;
//   * the context-parallel blocks with the document mask, merged, against the full op
//     (blocks where a row sees no key at all);
//   * rope_positions against rope_forward at the same positions;
//   * the whole model: a sample packing two documents gives the sum of the losses, and the
//     sum of the parameter gradients, of the two documents run alone (GPT-2: learned
//     positions; Llama: RoPE), which is what "attention never crosses a document" means.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../model/tiny_model.h"
#include "../ops_attention/attention_test_util.h"
#include "model/gpt_model.h"

namespace documents_test {

using namespace attn_test;
using mcpp::Stream;
namespace ops = mcpp::ops;

// key_start [B, S]: documents of sample b end at the positions where (s * 7 + b * 3) % 11 == 0.
Tensor make_key_start(int64_t B, int64_t S) {
  Tensor ks = Tensor::empty({B, S}, DType::I64);
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0;
    for (int64_t s = 0; s < S; ++s) {
      ks.data<int64_t>()[b * S + s] = doc;
      if ((s * 7 + b * 3) % 11 == 0) doc = s + 1;  // an EOD at s
    }
  }
  return ks;
}

// The textbook formula with the document mask: row q of sample b sees keys [ks(b,q), q].
Reference naive_doc_attention(const Tensor& qkv, const AttentionDims& d, const Tensor& ks,
                              double scale, double p, DropoutKey key) {
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
        const int64_t g = h / G, k0 = ks.data<int64_t>()[b * S + q];
        std::vector<double> sc(size_t(S), -INFINITY);
        double m = -INFINITY;
        for (int64_t k = k0; k <= q; ++k) {
          double acc = 0;
          for (int64_t c = 0; c < HD; ++c) acc += at(q, b, g, h % G, c) * at(k, b, g, G, c);
          sc[size_t(k)] = scale * acc;
          m = std::max(m, sc[size_t(k)]);
        }
        double l = 0;
        for (int64_t k = k0; k <= q; ++k) l += std::exp(sc[size_t(k)] - m);
        r.lse[size_t((b * NH + h) * S + q)] = m + std::log(l);
        for (int64_t k = k0; k <= q; ++k) {
          double prob = std::exp(sc[size_t(k)] - m) / l;
          const uint64_t idx = uint64_t(((b * NH + h) * S + q) * S + k);
          if (p > 0) prob = mcpp::DropoutMask::uniform(key.seed, key.stream, idx) >= p
                       ? prob * mcpp::DropoutMask::keep_scale(p) : 0;
          for (int64_t c = 0; c < HD; ++c)
            r.out[size_t((q * B + b) * NH * HD + h * HD + c)] += prob * at(k, b, g, G + 1, c);
        }
      }
  return r;
}

TEST(DocumentMask, ForwardMatchesNaiveReference) {
  Stream& st = Stream::cpu();
  AttentionDims d = dims(70, 2, 4, 2, 8);  // 70 rows: two 64-row tiles
  d.key_start = make_key_start(d.B, d.S);
  const Tensor qkv = randn<double>({d.S * d.B, d.qkv_width()}, 51);
  const double scale = 0.35, p = 0.1;
  const DropoutKey key{7, 3};
  Tensor out = Tensor::empty({d.S * d.B, d.NH * d.HD}, DType::F64);
  Tensor lse = Tensor::empty({d.B, d.NH, d.S}, DType::F64);
  ops::attention_forward(qkv, d, scale, p, key, out, lse, st);
  const Reference r = naive_doc_attention(qkv, d, d.key_start, scale, p, key);
  double eo = 0, el = 0;
  for (int64_t i = 0; i < out.numel(); ++i) eo = std::max(eo, std::abs(out.data<double>()[i] - r.out[size_t(i)]));
  for (int64_t i = 0; i < lse.numel(); ++i) el = std::max(el, std::abs(lse.data<double>()[i] - r.lse[size_t(i)]));
  EXPECT_LT(eo, 1e-12);
  EXPECT_LT(el, 1e-12);
  // Not the causal attention: the mask changed the result.
  AttentionDims causal = d;
  causal.key_start = Tensor();
  Tensor out_c = Tensor::empty(out.shape(), DType::F64), lse_c = Tensor::empty(lse.shape(), DType::F64);
  ops::attention_forward(qkv, causal, scale, p, key, out_c, lse_c, st);
  double diff = 0;
  for (int64_t i = 0; i < out.numel(); ++i) diff = std::max(diff, std::abs(out.data<double>()[i] - out_c.data<double>()[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(DocumentMask, GradientMatchesFiniteDifferences) {
  Stream& st = Stream::cpu();
  AttentionDims d = dims(23, 2, 2, 1, 8);
  d.key_start = make_key_start(d.B, d.S);
  Tensor qkv = randn<double>({d.S * d.B, d.qkv_width()}, 52);
  const Tensor R = randn<double>({d.S * d.B, d.NH * d.HD}, 53);
  const double scale = 0.4, p = 0.15;
  const DropoutKey key{2, 8};
  Tensor out = Tensor::empty(R.shape(), DType::F64), lse = Tensor::empty({d.B, d.NH, d.S}, DType::F64);
  auto loss = [&] {
    ops::attention_forward(qkv, d, scale, p, key, out, lse, st);
    double L = 0;
    for (int64_t i = 0; i < out.numel(); ++i) L += out.data<double>()[i] * R.data<double>()[i];
    return L;
  };
  loss();
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F64);
  ops::attention_backward(R, qkv, out, lse, d, scale, p, key, dqkv, st);
  double max_err = 0, max_grad = 0;
  for (int64_t i = 0; i < qkv.numel(); i += 2) {
    double* v = qkv.data<double>() + i;
    const double v0 = *v, eps = 1e-5;
    *v = v0 + eps;
    const double lp = loss();
    *v = v0 - eps;
    const double lm = loss();
    *v = v0;
    const double fd = (lp - lm) / (2 * eps);
    max_err = std::max(max_err, std::abs(fd - dqkv.data<double>()[i]));
    max_grad = std::max(max_grad, std::abs(fd));
  }
  EXPECT_GT(max_grad, 1e-3);
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad));
}

// CP's blocks with the document mask: a query chunk may see no key of an earlier chunk
// (its document starts later); merged, the blocks give the full masked attention.
TEST(DocumentMask, ContextParallelBlocksMatchFullAttention) {
  Stream& st = Stream::cpu();
  const int64_t CP = 2, C = 6, B = 2, NH = 2, NG = 2, HD = 4, S = 2 * CP * C;
  AttentionDims full = dims(S, B, NH, NG, HD);
  full.key_start = make_key_start(B, S);
  const int64_t W = full.qkv_width(), O = NH * HD;
  const Tensor qkv = randn<double>({S * B, W}, 61), dout = randn<double>({S * B, O}, 62);
  const double scale = 0.5, p = 0.1;
  const DropoutKey key{4, 4};
  Tensor out_ref = Tensor::empty({S * B, O}, DType::F64), lse_ref = Tensor::empty({B, NH, S}, DType::F64);
  ops::attention_forward(qkv, full, scale, p, key, out_ref, lse_ref, st);
  Tensor dqkv_ref = Tensor::empty(qkv.shape(), DType::F64);
  ops::attention_backward(dout, qkv, out_ref, lse_ref, full, scale, p, key, dqkv_ref, st);

  auto rows = [&](const Tensor& t, int64_t c) { return t.narrow(c * C * B, C * B); };
  Tensor out = Tensor::zeros({S * B, O}, DType::F64), dqkv = Tensor::zeros(qkv.shape(), DType::F64);
  for (int64_t qa = 0; qa < 2 * CP; ++qa) {
    AttentionDims d = dims(C, B, NH, NG, HD);
    d.S_global = S, d.q_offset = qa * C;
    d.key_start = Tensor::empty({B, C}, DType::I64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < C; ++i)
        d.key_start.data<int64_t>()[b * C + i] = full.key_start.data<int64_t>()[b * S + qa * C + i];
    Tensor o = Tensor::zeros({C * B, O}, DType::F64), l = Tensor::empty({B, NH, C}, DType::F64);
    ops::fill(l, -std::numeric_limits<double>::infinity(), st);
    Tensor oi = Tensor::empty(o.shape(), DType::F64), li = Tensor::empty(l.shape(), DType::F64);
    for (int64_t kc = 0; kc <= qa; ++kc) {
      d.k_offset = kc * C;
      ops::attention_block_forward(rows(qkv, qa), rows(qkv, kc), d, kc == qa, scale, p, key, oi, li, st);
      for (int64_t i = 0; i < oi.numel(); ++i) ASSERT_TRUE(std::isfinite(oi.data<double>()[i]));
      ops::attention_lse_merge(oi, li, d, o, l, st);
    }
    for (int64_t kc = 0; kc <= qa; ++kc) {
      d.k_offset = kc * C;
      Tensor dq = rows(dqkv, qa), dkv = rows(dqkv, kc);
      ops::attention_block_backward(rows(dout, qa), rows(qkv, qa), rows(qkv, kc), o, l, d,
                                    kc == qa, scale, p, key, dq, dkv, st);
    }
    Tensor dst = rows(out, qa);
    ops::copy(o, dst, st);
  }
  double eo = 0, eg = 0;
  for (int64_t i = 0; i < out.numel(); ++i) eo = std::max(eo, std::abs(out.data<double>()[i] - out_ref.data<double>()[i]));
  for (int64_t i = 0; i < dqkv.numel(); ++i) eg = std::max(eg, std::abs(dqkv.data<double>()[i] - dqkv_ref.data<double>()[i]));
  EXPECT_LT(eo, 1e-12);
  EXPECT_LT(eg, 1e-11);
}

TEST(DocumentMask, RopePositionsMatchesRopeAtTheSamePositions) {
  Stream& st = Stream::cpu();
  AttentionDims d = dims(1, 1, 4, 2, 8);
  const int64_t S = 9, B = 2, W = d.qkv_width();
  const Tensor x = randn<double>({S * B, W}, 71);
  Tensor pos = Tensor::empty({S, B}, DType::I64);
  for (int64_t i = 0; i < S * B; ++i) pos.data<int64_t>()[i] = (i * 5) % 7;
  AttentionDims dall = d;
  dall.S = S, dall.B = B;
  for (bool inverse : {false, true}) {
    Tensor y = Tensor::empty(x.shape(), DType::F64);
    ops::rope_positions(x, dall, 6, 10000.0, pos, inverse, y, st);
    for (int64_t r = 0; r < S * B; ++r) {  // row r alone, by the offset form
      Tensor ref = Tensor::empty({1, W}, DType::F64);
      if (inverse)
        ops::rope_backward(x.narrow(r, 1), d, 6, 10000.0, pos.data<int64_t>()[r], ref, st);
      else
        ops::rope_forward(x.narrow(r, 1), d, 6, 10000.0, pos.data<int64_t>()[r], ref, st);
      for (int64_t c = 0; c < W; ++c)
        ASSERT_NEAR(y.data<double>()[r * W + c], ref.data<double>()[c], 1e-14) << "row " << r;
    }
  }
}

// ---- the whole model ---------------------------------------------------------------------

namespace model = mcpp::model;

model::MicroBatch tokens_batch(const std::vector<int64_t>& toks, int64_t V) {
  const int64_t S = int64_t(toks.size());
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({1, S}, DType::I64);
  mb.labels = Tensor::empty({1, S}, DType::I64);
  mb.loss_mask = Tensor::empty({1, S}, DType::F32);
  for (int64_t s = 0; s < S; ++s) {
    mb.tokens.data<int64_t>()[s] = toks[size_t(s)];
    mb.labels.data<int64_t>()[s] = (toks[size_t(s)] * 3 + 1) % V;
    mb.loss_mask.data<float>()[s] = 1.f;
  }
  return mb;
}

void expect_packed_equals_separate(bool llama) {
  model::TransformerConfig c = model::test::tiny(llama, 2, 0.0);
  c.seq_length = 8, c.max_position_embeddings = 8;
  const std::vector<int64_t> a = {3, 7, 1}, b = {9, 2, 5, 11, 4};
  std::vector<int64_t> packed = a;
  packed.insert(packed.end(), b.begin(), b.end());
  model::StepKeys k;
  k.training = false;

  model::GPTModel m(c);
  model::MicroBatch mp = tokens_batch(packed, c.padded_vocab_size);
  mp.position_ids = Tensor::from(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4}, {1, 8});
  mp.key_start = Tensor::from(std::vector<int64_t>{0, 0, 0, 3, 3, 3, 3, 3}, {1, 8});
  m.params().zero_grads();
  const double lp = m.forward(mp, k);
  m.backward(1.0);
  const Tensor gp = m.params().flat_grads().clone();

  m.params().zero_grads();
  double ls = m.forward(tokens_batch(a, c.padded_vocab_size), k);
  m.backward(1.0);
  ls += m.forward(tokens_batch(b, c.padded_vocab_size), k);
  m.backward(1.0);
  const Tensor& gs = m.params().flat_grads();
  EXPECT_NEAR(lp, ls, 1e-12 * std::abs(ls));
  double err = 0, norm = 0;
  for (int64_t i = 0; i < gs.numel(); ++i) {
    err = std::max(err, std::abs(gp.data<double>()[i] - gs.data<double>()[i]));
    norm = std::max(norm, std::abs(gs.data<double>()[i]));
  }
  EXPECT_GT(norm, 1e-3);
  EXPECT_LT(err, 1e-12 * std::max(1.0, norm));

  // Without the document fields the packed sample is one sequence: a different loss.
  model::MicroBatch plain = tokens_batch(packed, c.padded_vocab_size);
  EXPECT_GT(std::abs(m.forward(plain, k) - ls), 1e-6);
  m.backward(1.0);
}

TEST(DocumentMask, PackedSampleEqualsSeparateDocumentsGPT) { expect_packed_equals_separate(false); }
TEST(DocumentMask, PackedSampleEqualsSeparateDocumentsLlama) { expect_packed_equals_separate(true); }

}  // namespace documents_test
