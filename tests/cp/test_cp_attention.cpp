// The context-parallel attention blocks (ops::attention_block_forward/backward) and their
// log-sum-exp merge, in one process: a sequence cut into 2*CP chunks as the CP split
// does, every rank's visible (query chunk, key chunk) blocks run and merged, must give
// the output, lse and gradients of the full causal attention_forward/backward (itself
// checked against a naive reference and finite differences in tests/ops_attention), with
// dropout on (the mask is drawn at global coordinates). The non-causal block is checked
// against fp64 finite differences directly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../ops_attention/attention_test_util.h"
#include "parallel/context_parallel/cp_attention.h"

namespace cp_attention_test {

using namespace attn_test;
using mcpp::Stream;
namespace ops = mcpp::ops;

struct Case {
  int64_t CP, C, B, NH, NG, HD;
  double p;
};

Tensor zeros(const mcpp::Shape& s) { return Tensor::zeros(s, DType::F64); }

// Rows [c*C, c*C + C) of a sequence-first [S*B, W] tensor.
Tensor chunk_rows(const Tensor& t, int64_t c, int64_t C, int64_t B) {
  return t.narrow(c * C * B, C * B);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::abs(a.data<double>()[i] - b.data<double>()[i]));
  return m;
}

void expect_blocks_match_full(const Case& c) {
  Stream& st = Stream::cpu();
  const int64_t S = 2 * c.CP * c.C, B = c.B, C = c.C;
  AttentionDims full = dims(S, B, c.NH, c.NG, c.HD);
  const int64_t W = full.qkv_width(), O = c.NH * c.HD;
  const Tensor qkv = randn<double>({S * B, W}, 21);
  const Tensor dout = randn<double>({S * B, O}, 22);
  const double scale = 1.0 / std::sqrt(double(c.HD));
  const DropoutKey key{5, 77};

  Tensor out_ref = Tensor::empty({S * B, O}, DType::F64);
  Tensor lse_ref = Tensor::empty({B, c.NH, S}, DType::F64);
  ops::attention_forward(qkv, full, scale, c.p, key, out_ref, lse_ref, st);
  Tensor dqkv_ref = Tensor::empty(qkv.shape(), DType::F64);
  ops::attention_backward(dout, qkv, out_ref, lse_ref, full, scale, c.p, key, dqkv_ref, st);

  // Every global chunk's rows as its CP rank computes them; gradients summed over ranks.
  Tensor out = zeros({S * B, O}), dqkv = zeros(qkv.shape());
  double lse_err = 0;
  for (int64_t r = 0; r < c.CP; ++r) {
    const int64_t mine[2] = {r, 2 * c.CP - 1 - r};
    for (int64_t qa : mine) {
      Tensor o = zeros({C * B, O});
      Tensor l = Tensor::empty({B, c.NH, C}, DType::F64);
      ops::fill(l, -std::numeric_limits<double>::infinity(), st);
      Tensor o_i = Tensor::empty({C * B, O}, DType::F64), l_i = Tensor::empty(l.shape(), DType::F64);
      AttentionDims d = dims(C, B, c.NH, c.NG, c.HD);
      d.S_global = S;
      for (int64_t kc = 0; kc <= qa; ++kc) {  // the ring visits every earlier chunk
        d.q_offset = qa * C, d.k_offset = kc * C;
        ops::attention_block_forward(chunk_rows(qkv, qa, C, B), chunk_rows(qkv, kc, C, B), d,
                                     kc == qa, scale, c.p, key, o_i, l_i, st);
        ops::attention_lse_merge(o_i, l_i, d, o, l, st);
      }
      // Backward with the merged (final) output and lse.
      for (int64_t kc = 0; kc <= qa; ++kc) {
        d.q_offset = qa * C, d.k_offset = kc * C;
        Tensor dq = chunk_rows(dqkv, qa, C, B), dkv = chunk_rows(dqkv, kc, C, B);
        ops::attention_block_backward(chunk_rows(dout, qa, C, B), chunk_rows(qkv, qa, C, B),
                                      chunk_rows(qkv, kc, C, B), o, l, d, kc == qa, scale, c.p,
                                      key, dq, dkv, st);
      }
      Tensor dst = chunk_rows(out, qa, C, B);
      ops::copy(o, dst, st);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < c.NH; ++h)
          for (int64_t i = 0; i < C; ++i)
            lse_err = std::max(lse_err, std::abs(l.data<double>()[(b * c.NH + h) * C + i] -
                                                 lse_ref.data<double>()[(b * c.NH + h) * S +
                                                                        qa * C + i]));
    }
  }
  EXPECT_LT(max_abs_diff(out, out_ref), 1e-12);
  EXPECT_LT(lse_err, 1e-12);
  EXPECT_LT(max_abs_diff(dqkv, dqkv_ref), 1e-11);
  double norm = 0;
  for (int64_t i = 0; i < dqkv_ref.numel(); ++i) norm = std::max(norm, std::abs(dqkv_ref.data<double>()[i]));
  EXPECT_GT(norm, 1e-3);  // not vacuous
}

TEST(ContextParallelAttention, BlocksMatchFullAttentionCP2) {
  expect_blocks_match_full({2, 5, 2, 2, 2, 8, 0});
}
TEST(ContextParallelAttention, BlocksMatchFullAttentionCP4GQADropout) {
  expect_blocks_match_full({4, 3, 2, 4, 2, 8, 0.2});
}
TEST(ContextParallelAttention, BlocksMatchFullAttentionLongChunksDropout) {
  // Chunks longer than one 64-row tile, so the tiled kernel's padding and diagonal meet.
  expect_blocks_match_full({2, 70, 1, 2, 1, 16, 0.1});
}

// A non-causal block (queries of a later chunk against an earlier chunk's keys): the
// gradients w.r.t. both inputs against central differences of L = sum(R * out).
TEST(ContextParallelAttention, NonCausalBlockGradientMatchesFiniteDifferences) {
  Stream& st = Stream::cpu();
  const int64_t C = 7, B = 2, NH = 4, NG = 2, HD = 8;
  AttentionDims d = dims(C, B, NH, NG, HD);
  d.S_global = 4 * C, d.q_offset = 3 * C, d.k_offset = C;
  const int64_t W = d.qkv_width(), O = NH * HD;
  Tensor q = randn<double>({C * B, W}, 31), kv = randn<double>({C * B, W}, 32);
  const Tensor R = randn<double>({C * B, O}, 33);
  const double scale = 0.4, p = 0.15;
  const DropoutKey key{3, 9};
  Tensor out = Tensor::empty({C * B, O}, DType::F64), lse = Tensor::empty({B, NH, C}, DType::F64);
  auto loss = [&] {
    ops::attention_block_forward(q, kv, d, false, scale, p, key, out, lse, st);
    double L = 0;
    for (int64_t i = 0; i < out.numel(); ++i) L += out.data<double>()[i] * R.data<double>()[i];
    return L;
  };
  loss();
  Tensor dq = zeros(q.shape()), dkv = zeros(kv.shape());
  ops::attention_block_backward(R, q, kv, out, lse, d, false, scale, p, key, dq, dkv, st);
  double max_err = 0, max_grad = 0;
  for (Tensor* x : {&q, &kv}) {
    const Tensor& g = x == &q ? dq : dkv;
    for (int64_t i = 0; i < x->numel(); i += 3) {
      double* v = x->data<double>() + i;
      const double v0 = *v, eps = 1e-5;
      *v = v0 + eps;
      const double lp = loss();
      *v = v0 - eps;
      const double lm = loss();
      *v = v0;
      const double fd = (lp - lm) / (2 * eps);
      max_err = std::max(max_err, std::abs(fd - g.data<double>()[i]));
      max_grad = std::max(max_grad, std::abs(fd));
    }
  }
  EXPECT_GT(max_grad, 1e-3);
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad));
}

// The merge is order-free: folding blocks (a, b) or (b, a) gives the same result, and a
// block whose rows saw no key (lse = -inf) changes nothing.
TEST(ContextParallelAttention, MergeIsSymmetricAndIgnoresEmptyBlocks) {
  Stream& st = Stream::cpu();
  AttentionDims d = dims(3, 2, 2, 2, 4);
  const int64_t n = d.S * d.B * d.NH * d.HD;
  const Tensor oa = randn<double>({n}, 41), ob = randn<double>({n}, 42);
  const Tensor la = randn<double>({d.B, d.NH, d.S}, 43), lb = randn<double>({d.B, d.NH, d.S}, 44);
  auto fold = [&](const Tensor& o1, const Tensor& l1, const Tensor& o2, const Tensor& l2) {
    Tensor o = zeros({n}), l = Tensor::empty(la.shape(), DType::F64);
    ops::fill(l, -std::numeric_limits<double>::infinity(), st);
    ops::attention_lse_merge(o1, l1, d, o, l, st);
    ops::attention_lse_merge(o2, l2, d, o, l, st);
    return std::make_pair(o, l);
  };
  const auto [o1, l1] = fold(oa, la, ob, lb);
  const auto [o2, l2] = fold(ob, lb, oa, la);
  EXPECT_LT(max_abs_diff(o1, o2), 1e-14);
  EXPECT_LT(max_abs_diff(l1, l2), 1e-14);
  // lse = log(exp(la) + exp(lb)) element by element.
  for (int64_t i = 0; i < la.numel(); ++i)
    EXPECT_NEAR(l1.data<double>()[i],
                std::log(std::exp(la.data<double>()[i]) + std::exp(lb.data<double>()[i])), 1e-13);
  Tensor empty_l = Tensor::empty(la.shape(), DType::F64);
  ops::fill(empty_l, -std::numeric_limits<double>::infinity(), st);
  const auto [o3, l3] = fold(oa, la, ob, empty_l);
  EXPECT_LT(max_abs_diff(o3, oa), 1e-15);
  EXPECT_LT(max_abs_diff(l3, la), 1e-15);
}


// The ring's fused steps (parallel/context_parallel/cp_attention.h's ring_step): over every
// rank r and every ring step j, each step's rectangle of local chunks covers exactly the
// visible (query chunk, key chunk) pairs -- every pair with kc <= qa once, none with kc >
// qa -- and is causal exactly when it holds a chunk against itself; its dims name the
// rows, the lse stride and the first chunks' positions.
TEST(ContextParallelAttention, RingStepsCoverEveryVisibleChunkPairOnce) {
  namespace cpa = mcpp::parallel::context_parallel;
  for (int64_t P = 2; P <= 6; ++P) {
    const int64_t n = 2 * P, C = 16;
    std::vector<int> seen(size_t(n * n), 0);
    auto chunk = [&](int64_t r, int k) { return k == 0 ? r : n - 1 - r; };
    ops::AttentionDims local;
    local.S = 2 * C, local.B = 1, local.NH = 2, local.NG = 1, local.HD = 8;
    for (int64_t r = 0; r < P; ++r)
      for (int64_t j = 0; j < P; ++j) {
        const cpa::RingStep st = cpa::ring_step(r, j);
        bool self = false;
        for (int x = st.x0; x < st.x0 + st.nx; ++x)
          for (int y = st.y0; y < st.y0 + st.ny; ++y) {
            const int64_t qa = chunk(r, x), kc = chunk(j, y);
            if (qa == kc) self = true;
            // A pair with kc > qa may sit in the causal diagonal's upper triangle only.
            if (kc > qa) {
              EXPECT_TRUE(st.causal && r == j && x == 0 && y == 1) << P << " " << r << " " << j;
              continue;
            }
            ++seen[size_t(qa * n + kc)];
          }
        EXPECT_EQ(st.causal, self) << P << " " << r << " " << j;
        const ops::AttentionDims d = cpa::ring_step_dims(local, P, r, j);
        EXPECT_EQ(d.S, st.nx * C);
        EXPECT_EQ(d.kv_rows(), st.ny * C);
        EXPECT_EQ(d.lse_stride(), 2 * C);
        EXPECT_EQ(d.lse_span(), (local.B * local.NH - 1) * 2 * C + st.nx * C);
        EXPECT_EQ(d.q_offset, chunk(r, st.x0) * C);
        EXPECT_EQ(d.k_offset, chunk(j, st.y0) * C);
        EXPECT_EQ(d.S_global, n * C);
      }
    for (int64_t qa = 0; qa < n; ++qa)
      for (int64_t kc = 0; kc < n; ++kc)
        EXPECT_EQ(seen[size_t(qa * n + kc)], kc <= qa ? 1 : 0) << "CP " << P << " pair " << qa << "," << kc;
  }
}

// The CPU keeps square chunk blocks: a rectangular block there is refused by name.
TEST(ContextParallelAttention, CpuRefusesRectangularBlocks) {
  ops::AttentionDims d;
  d.S = 8, d.S_kv = 4, d.lse_ld = 8, d.B = 1, d.NH = 2, d.NG = 1, d.HD = 4;
  EXPECT_FALSE(ops::attention_block_rect_supported(DType::F32, d, false, 0.0, Stream::cpu()));
  Tensor q = Tensor::zeros({8, d.qkv_width()}, DType::F32), kv = Tensor::zeros({4, d.qkv_width()}, DType::F32);
  Tensor out = Tensor::zeros({8, 8}, DType::F32), lse = Tensor::zeros({16}, DType::F32);
  try {
    ops::attention_block_forward(q, kv, d, false, 0.5, 0.0, {1, 2}, out, lse, Stream::cpu());
    ADD_FAILURE() << "the CPU ran a rectangular block";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("8 query and 4 key rows"), std::string::npos) << e.what();
  }
}

}  // namespace cp_attention_test
