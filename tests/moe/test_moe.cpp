// Mixture of experts on the CPU, against independent references:
//   * the routing (every score function, group-limited top-k, scaling, capacity) against
//     hand-computed values, and its backward (with the aux / seq-aux / global-aux / z losses,
//     alone and several at once) against f64 central finite differences of the routed
//     objective;
//   * the permute / unpermute ops against their definition (and each other's adjoint);
//   * whole tiny MoE models (f64, dropout on) against finite differences of
//     LM loss + aux losses: SwiGLU and GELU experts, shared experts with and without the
//     gate, interleaved dense / MoE layers, capacity with padding, zero-token experts and
//     all tokens routed to one expert;
//   * the flags: --moe-layer-freq expressions and the start-up errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "../inference/inference_test_util.h"
#include "base/philox.h"
#include "checkpoint/moe_metadata.h"
#include "inference/generator.h"
#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"
#include "model/memory_estimate.h"
#include "model/moe/routing.h"
#include "moe_layer_harness.h"
#include "moe_test_util.h"
#include "ops/ops.h"
#include "training/arguments.h"
#include "training/flops.h"
#include "training/memory_plan.h"
#include "training/validate_moe.h"

using namespace mcpp;
using model::TransformerConfig;
namespace moe = model::moe;
using test::moe_layers;
using Balance = TransformerConfig::Moe::Balance;
using Score = TransformerConfig::Moe::Score;

namespace {

std::vector<double> random_logits(int64_t n, uint64_t seed, double scale = 1.5) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * Philox::normal(seed, 7, uint64_t(i));
  return v;
}

TransformerConfig::Moe moe_cfg(int64_t E, int64_t k) {
  TransformerConfig::Moe m;
  m.num_experts = E, m.topk = k, m.ffn_hidden_size = 4;
  return m;
}

// The routed objective the backward differentiates: sum_{t,j} w[t,j] p[t,j] + the aux losses
// + z.
double objective(const TransformerConfig::Moe& m, const std::vector<double>& l, int64_t T,
                 int64_t B, const std::vector<double>& w, const double* bias, int64_t blocks) {
  auto r = moe::route(m, l.data(), T, B, bias, blocks);
  double f = r.aux_loss + r.seq_aux_loss + r.global_aux_loss + r.z_loss;
  for (size_t i = 0; i < r.prob.size(); ++i) f += w[i] * r.prob[i];
  return f;
}

void routing_fd(const TransformerConfig::Moe& m, int64_t T, int64_t B,
                const std::vector<double>* bias = nullptr, int64_t blocks = 1) {
  const int64_t E = m.num_experts, k = m.topk;
  auto l = random_logits(T * E, 5 + uint64_t(E * 10 + k));
  std::vector<double> w(static_cast<size_t>(T * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = Philox::normal(2, 3, i);
  const double* b = bias ? bias->data() : nullptr;
  auto r = moe::route(m, l.data(), T, B, b, blocks);
  std::vector<double> dl(static_cast<size_t>(T * E));
  moe::route_backward(m, r, l.data(), w.data(), 1.0, 0, T, B, dl.data());
  const double h = 1e-6;
  double worst = 0;
  for (int64_t i = 0; i < T * E; ++i) {
    auto lp = l, lm = l;
    lp[size_t(i)] += h, lm[size_t(i)] -= h;
    const double fd = (objective(m, lp, T, B, w, b, blocks) - objective(m, lm, T, B, w, b, blocks)) /
                      (2 * h);
    EXPECT_NEAR(dl[size_t(i)], fd, 1e-7 * std::max(1.0, std::abs(fd))) << "logit " << i;
    worst = std::max(worst, std::abs(dl[size_t(i)]));
  }
  EXPECT_GT(worst, 1e-4);  // the gradient is not trivially zero
}

}  // namespace

// ---- routing values ----------------------------------------------------------------------

TEST(MoeRouting, SoftmaxPostTopkValues) {
  auto m = moe_cfg(4, 2);
  std::vector<double> l = {1.0, 2.0, 3.0, 0.0};
  auto r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.idx[0], 2);
  EXPECT_EQ(r.idx[1], 1);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.prob[0], e / (e + 1), 1e-15);  // softmax([3, 2])
  EXPECT_NEAR(r.prob[1], 1 / (e + 1), 1e-15);
  m.topk_scaling_factor = 2.5;
  r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_NEAR(r.prob[0], 2.5 * e / (e + 1), 1e-14);
}

TEST(MoeRouting, PreSoftmaxAndSigmoidValues) {
  auto m = moe_cfg(3, 1);
  m.pre_softmax = true;
  std::vector<double> l = {0.0, std::log(3.0), 0.0};  // softmax = [0.2, 0.6, 0.2]
  auto r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.idx[0], 1);
  EXPECT_NEAR(r.prob[0], 0.6, 1e-15);  // no renormalisation
  m.pre_softmax = false, m.score = Score::Sigmoid, m.topk = 2;
  r = moe::route(m, l.data(), 1, 1, nullptr);
  const double s1 = 1 / (1 + 1 / 3.0), s0 = 0.5;  // sigmoid(log 3) = 0.75
  EXPECT_EQ(r.idx[0], 1);
  EXPECT_EQ(r.idx[1], 0);  // tie between experts 0 and 2: the lower index
  EXPECT_NEAR(r.prob[0], s1 / (s1 + s0), 1e-12);
  // The expert bias changes the choice but not the weights (unbiased scores).
  std::vector<double> bias = {0.0, 0.0, 1.0};
  r = moe::route(m, l.data(), 1, 1, bias.data());
  EXPECT_EQ(r.idx[0], 2);
  EXPECT_EQ(r.idx[1], 1);
  EXPECT_NEAR(r.prob[0], s0 / (s1 + s0), 1e-12);
}

TEST(MoeRouting, GroupLimitedTopk) {
  // 4 experts in 2 groups; group 0 = {0: 5, 1: -5}, group 1 = {2: 1, 3: 1}; k 2, one group,
  // group score = its top-2 sum: group 0 = 0, group 1 = 2 -> experts 2 and 3 although 0 is best.
  auto m = moe_cfg(4, 2);
  m.num_groups = 2, m.group_topk = 1;
  std::vector<double> l = {5.0, -5.0, 1.0, 1.0};
  auto r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.idx[0], 2);
  EXPECT_EQ(r.idx[1], 3);
  m.num_groups = 0, m.group_topk = 0;
  r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.idx[0], 0);
}

TEST(MoeRouting, AuxLossFormula) {
  // aux = coeff * E / (k T^2) * sum_e c_e * sum_t s[t,e], by hand for T = 2, E = 2, k = 1.
  auto m = moe_cfg(2, 1);
  m.pre_softmax = true, m.aux_loss_coeff = {0.1}, m.z_loss_coeff = 0.01;
  std::vector<double> l = {0.0, std::log(3.0), std::log(4.0), 0.0};  // s = [.25 .75], [.8 .2]
  auto r = moe::route(m, l.data(), 2, 1, nullptr);
  const double c0 = 1, c1 = 1;  // token 0 -> expert 1, token 1 -> expert 0
  const double expect = 0.1 * 2 / (1 * 4.0) * (c0 * (0.25 + 0.8) + c1 * (0.75 + 0.2));
  EXPECT_NEAR(r.aux_loss, expect, 1e-14);
  const double z0 = std::log(4.0), z1 = std::log(5.0);
  EXPECT_NEAR(r.z_loss, 0.01 * (z0 * z0 + z1 * z1) / 2, 1e-14);
}

// sqrtsoftplus: s = sqrt(softplus(l)) chosen and renormalised as sigmoid's scores, by hand;
// softplus in its overflow-free form (l = +-800 give sqrt(800) and 0, not inf or NaN).
TEST(MoeRouting, SqrtSoftplusValues) {
  auto m = moe_cfg(3, 2);
  m.score = Score::SqrtSoftplus, m.aux_loss_coeff = {0.1};
  std::vector<double> l = {0.0, std::log(std::exp(2.0) - 1.0), -1.0};  // softplus: log 2, 2
  auto r = moe::route(m, l.data(), 1, 1, nullptr);
  const double s0 = std::sqrt(std::log(2.0)), s1 = std::sqrt(2.0);
  const double s2 = std::sqrt(std::log(1.0 + std::exp(-1.0)));
  ASSERT_EQ(r.idx[0], 1);
  ASSERT_EQ(r.idx[1], 0);
  EXPECT_NEAR(r.prob[0], s1 / (s1 + s0), 1e-15);
  EXPECT_NEAR(r.prob[1], s0 / (s1 + s0), 1e-15);
  // The aux scores: s normalised over all experts.
  EXPECT_NEAR(r.aux_scores[2], s2 / (s0 + s1 + s2), 1e-15);
  // The expert bias chooses, the unbiased scores weigh.
  std::vector<double> bias = {0.0, 0.0, 1.0};
  r = moe::route(m, l.data(), 1, 1, bias.data());
  EXPECT_EQ(r.idx[0], 2);
  EXPECT_NEAR(r.prob[0], s2 / (s2 + s1), 1e-15);
  // Top-1: the score itself, not renormalised.
  m.topk = 1;
  r = moe::route(m, l.data(), 1, 1, nullptr);
  EXPECT_NEAR(r.prob[0], s1, 1e-15);
  // Far logits.
  std::vector<double> far = {800.0, -800.0, 0.0};
  m.topk = 2;
  r = moe::route(m, far.data(), 1, 1, nullptr);
  EXPECT_NEAR(r.prob[0], std::sqrt(800.0) / (std::sqrt(800.0) + s0), 1e-14);
  EXPECT_EQ(r.aux_scores[1], 0.0);
  std::vector<double> dl(3), dp = {1.0, -0.5};
  moe::route_backward(m, r, far.data(), dp.data(), 1.0, 0, 1, 1, dl.data());
  for (double g : dl) EXPECT_TRUE(std::isfinite(g));
  EXPECT_EQ(dl[1], 0.0);  // d sqrt(softplus)/dl -> 0 where softplus underflows
}

// global_aux_loss's counts: the running mean over micro-batches of the counts summed over the
// DP x CP group (AuxLossGroup::global; here a stand-in: two ranks with these tokens, after a
// first micro-batch whose summed counts were `prior`), T the group's; by hand. Without the
// group it is one rank's one micro-batch, which is aux_loss exactly (loss and gradient).
TEST(MoeRouting, GlobalAuxLossRunningMeanByHand) {
  const int64_t T = 10, E = 4, k = 2, B = 2;
  auto m = moe_cfg(E, k);
  m.balance = {Balance::GlobalAuxLoss}, m.aux_loss_coeff = {0.3};
  const auto l = random_logits(T * E, 31);
  const std::vector<double> prior = {7, 1, 9, 3};
  moe::AuxLossGroup g;
  g.global_ranks = 2;
  g.global = [&](std::vector<double>& c) {
    for (int64_t e = 0; e < E; ++e) c[size_t(e)] = (prior[size_t(e)] + 2 * c[size_t(e)]) / 2;
  };
  const auto r = moe::route(m, l.data(), T, B, nullptr, 1, g);
  auto ma = m;
  ma.balance = {Balance::AuxLoss};
  const auto ra = moe::route(ma, l.data(), T, B, nullptr);  // aux_loss: this rank's counts
  ASSERT_EQ(r.global_counts.size(), size_t(E));
  double L = 0;
  for (int64_t e = 0; e < E; ++e) {
    const double mean = (prior[size_t(e)] + 2 * ra.aux_counts[size_t(e)]) / 2;
    EXPECT_EQ(r.global_counts[size_t(e)], mean) << e;
    for (int64_t t = 0; t < T; ++t) L += mean * ra.aux_scores[size_t(t * E + e)];
  }
  const double Tg = double(T * 2);
  EXPECT_NEAR(r.global_aux_loss, 0.3 * double(E) / (double(k) * Tg * Tg) * L, 1e-15);
  EXPECT_EQ(r.aux_loss, 0.0);
  EXPECT_EQ(ra.global_aux_loss, 0.0);
  // One micro-batch of one rank: global_aux_loss is aux_loss.
  const auto r1 = moe::route(m, l.data(), T, B, nullptr);
  EXPECT_EQ(r1.global_aux_loss, ra.aux_loss);
  std::vector<double> dp(size_t(T * k)), d1(size_t(T * E)), da(size_t(T * E));
  for (size_t i = 0; i < dp.size(); ++i) dp[i] = Philox::normal(4, 5, i);
  moe::route_backward(m, r1, l.data(), dp.data(), 0.5, 0, T, B, d1.data());
  moe::route_backward(ma, ra, l.data(), dp.data(), 0.5, 0, T, B, da.data());
  EXPECT_EQ(d1, da);
  // Evaluation counts nothing and has no global_aux_loss (Megatron: no aux loss without grad).
  int calls = 0;
  g.global = [&](std::vector<double>&) { ++calls; };
  const auto re = moe::route(m, l.data(), T, B, nullptr, 1, g, /*training=*/false);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(re.global_aux_loss, 0.0);
  EXPECT_TRUE(re.global_counts.empty());
}

TEST(MoeRouting, CapacityDropPolicies) {
  // 4 tokens, 2 experts, k 1, capacity factor 0.5 -> cap = ceil(4/2*0.5) = 1 per expert.
  auto m = moe_cfg(2, 1);
  m.pre_softmax = true, m.capacity_factor = 0.5;
  // Every token prefers expert 0, with rising confidence.
  std::vector<double> l = {1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0};
  auto r = moe::route(m, l.data(), 4, 1, nullptr);
  EXPECT_EQ(r.capacity, 1);
  ASSERT_EQ(r.counts[0], 1);
  EXPECT_EQ(r.row_token[0], 3);  // probs: the most confident token survives
  EXPECT_EQ(r.kept[0] + r.kept[1] + r.kept[2], 0);
  EXPECT_EQ(r.prob[0], 0.0);
  m.drop_by_position = true;
  r = moe::route(m, l.data(), 4, 1, nullptr);
  EXPECT_EQ(r.row_token[0], 0);  // position: the earliest survives
  EXPECT_EQ(r.counts[1], 0);     // an expert that receives nothing
  m.pad_to_capacity = true;
  r = moe::route(m, l.data(), 4, 1, nullptr);
  ASSERT_EQ(r.counts[1], 1);  // padded with the earliest token not routed there, p = 0
  EXPECT_EQ(r.row_token[1], 0);
  EXPECT_EQ(r.row_slot[1], -1);
  // Capacity per block (one SP rank's tokens): 2 blocks of 2 tokens, cap 1 each.
  m.pad_to_capacity = false, m.drop_by_position = false;
  r = moe::route(m, l.data(), 4, 1, nullptr, 2);
  EXPECT_EQ(r.capacity, 1);
  ASSERT_EQ(r.counts[0], 2);
  EXPECT_EQ(r.row_token[0], 1);
  EXPECT_EQ(r.row_token[1], 3);
}

// --moe-router-padding-for-fp8 (pad multiple 16): every expert's rows of each block become a
// multiple of 16 with the block's earliest tokens not routed there (Megatron's
// pad_routing_map), at probability 0; the routed rows and the expert-bias counts unchanged.
TEST(MoeRouting, Fp8PaddingPadsEachExpertWithTheEarliestOtherTokens) {
  auto m = moe_cfg(4, 2);
  const int64_t T = 40, blocks = 2, Tb = T / blocks;
  auto l = random_logits(T * 4, 21);
  const auto plain = moe::route(m, l.data(), T, 1, nullptr, blocks);
  m.pad_multiple = 16;
  const auto r = moe::route(m, l.data(), T, 1, nullptr, blocks);
  EXPECT_EQ(r.idx, plain.idx);
  EXPECT_EQ(r.prob, plain.prob);
  EXPECT_EQ(r.tokens_per_expert, plain.tokens_per_expert);
  int64_t n = 0, padded = 0;
  for (int64_t e = 0; e < 4; ++e) {
    // Rows of expert e, block by block (tokens ascending inside the expert).
    std::vector<std::vector<int64_t>> routed(blocks), pad(blocks);
    for (int64_t i = 0; i < r.counts[size_t(e)]; ++i, ++n) {
      const int64_t t = r.row_token[size_t(n)];
      (r.row_slot[size_t(n)] < 0 ? pad : routed)[size_t(t / Tb)].push_back(t);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t have = int64_t(routed[size_t(b)].size()), add = int64_t(pad[size_t(b)].size());
      EXPECT_EQ((have + add) % 16, 0) << "expert " << e << " block " << b;
      EXPECT_LT(add, 16);
      // The padding tokens: the earliest of the block that are not routed to e.
      std::vector<int64_t> expect;
      for (int64_t t = b * Tb; t < (b + 1) * Tb && int64_t(expect.size()) < add; ++t)
        if (std::find(routed[size_t(b)].begin(), routed[size_t(b)].end(), t) ==
            routed[size_t(b)].end())
          expect.push_back(t);
      std::vector<int64_t> got = pad[size_t(b)];
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, expect) << "expert " << e << " block " << b;
      padded += add;
    }
  }
  EXPECT_EQ(n, int64_t(r.row_token.size()));
  EXPECT_GT(padded, 0);
  EXPECT_EQ(int64_t(r.row_token.size()), int64_t(plain.row_token.size()) + padded);
}

// Megatron's sinkhorn against its fixed point: rows sum to 1/T and columns to 1/E, and a
// 2 x 2 cost [a b; c d] ends at [x, 1/2 - x; 1/2 - x, x] with x / (1/2 - x) = sqrt(ad / bc)
// (the scaling keeps the cross ratio).
TEST(MoeRouting, SinkhornReachesTheDoublyStochasticFixedPoint) {
  const std::vector<double> l2 = {0.3, -0.7, 1.1, 0.2};
  const auto p2 = moe::sinkhorn(l2.data(), 2, 2);
  const double rho = std::exp(l2[0] + l2[3] - l2[1] - l2[2]);
  const double x = std::sqrt(rho) / (2 * (1 + std::sqrt(rho)));
  EXPECT_NEAR(p2[0], x, 1e-4);
  EXPECT_NEAR(p2[3], x, 1e-4);
  EXPECT_NEAR(p2[1], 0.5 - x, 1e-4);
  const int64_t T = 12, E = 5;
  const auto l = random_logits(T * E, 41, 2.0);
  const auto p = moe::sinkhorn(l.data(), T, E);
  for (int64_t e = 0; e < E; ++e) {
    double c = 0;
    for (int64_t t = 0; t < T; ++t) c += p[size_t(t * E + e)];
    EXPECT_NEAR(c, 1.0 / double(E), 1e-6) << "column " << e;  // exact after the d1 update
  }
  for (int64_t t = 0; t < T; ++t) {
    double r = 0;
    for (int64_t e = 0; e < E; ++e) r += p[size_t(t * E + e)];
    EXPECT_NEAR(r, 1.0 / double(T), 2e-3 / double(T)) << "row " << t;
  }
}

// Eight tokens that all prefer expert 0, the earlier ones less: top-1 of the sigmoid (the
// evaluation path) sends all eight to it; sinkhorn in training sends the earliest ones to
// expert 1, balancing the two. Weights: sigmoid of the chosen logit either way; per block.
TEST(MoeRouting, SinkhornBalancesWhereTopkDoesNot) {
  auto m = moe_cfg(2, 1);
  m.balance = {Balance::Sinkhorn};
  const int64_t T = 8;
  std::vector<double> l;
  for (int64_t t = 0; t < T; ++t) l.push_back(2.0 + 0.1 * double(t)), l.push_back(0.0);
  auto eval = moe::route(m, l.data(), T, 1, nullptr, 1, {}, /*training=*/false);
  EXPECT_EQ(eval.counts, (std::vector<int64_t>{8, 0}));
  auto r = moe::route(m, l.data(), T, 1, nullptr);
  EXPECT_EQ(r.counts, (std::vector<int64_t>{4, 4}));
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(r.idx[size_t(t)], t < 4 ? 1 : 0) << t;
    const double a = 1 / (1 + std::exp(-l[size_t(2 * t + r.idx[size_t(t)])]));
    EXPECT_NEAR(r.prob[size_t(t)], a, 1e-15) << t;
  }
  // Two blocks (two SP ranks' tokens) normalise separately: each balances its own four.
  auto b2 = moe::route(m, l.data(), T, 1, nullptr, 2);
  EXPECT_EQ(b2.counts, (std::vector<int64_t>{4, 4}));
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(b2.idx[size_t(t)], t % 4 < 2 ? 1 : 0) << t;
  // Top-2: softmax weights of the chosen experts, not renormalised.
  auto m2 = moe_cfg(4, 2);
  m2.balance = {Balance::Sinkhorn};
  const auto l4 = random_logits(6 * 4, 17);
  auto r2 = moe::route(m2, l4.data(), 6, 1, nullptr);
  for (int64_t t = 0; t < 6; ++t) {
    double z = 0;
    for (int64_t e = 0; e < 4; ++e) z += std::exp(l4[size_t(t * 4 + e)]);
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_NEAR(r2.prob[size_t(t * 2 + j)], std::exp(l4[size_t(t * 4 + r2.idx[size_t(t * 2 + j)])]) / z,
                  1e-14);
  }
}

// ---- routing gradients -------------------------------------------------------------------

TEST(MoeRoutingGrad, SoftmaxWithAuxLoss) {
  auto m = moe_cfg(6, 2);
  m.aux_loss_coeff = {0.3};
  routing_fd(m, 8, 2);
}
TEST(MoeRoutingGrad, PreSoftmaxTop1WithAuxAndZLoss) {
  auto m = moe_cfg(5, 1);
  m.pre_softmax = true, m.aux_loss_coeff = {0.2}, m.z_loss_coeff = 0.05;
  routing_fd(m, 6, 3);
}
TEST(MoeRoutingGrad, SigmoidScaledWithAuxAndZLoss) {
  auto m = moe_cfg(6, 3);
  m.score = Score::Sigmoid, m.topk_scaling_factor = 2.5, m.aux_loss_coeff = {0.4};
  m.z_loss_coeff = 0.1;
  routing_fd(m, 8, 2);
}
TEST(MoeRoutingGrad, SigmoidTop1) {
  auto m = moe_cfg(4, 1);
  m.score = Score::Sigmoid, m.aux_loss_coeff = {0.1};
  routing_fd(m, 6, 2);
}
TEST(MoeRoutingGrad, SigmoidExpertBiasGroupLimited) {
  auto m = moe_cfg(8, 4);
  m.score = Score::Sigmoid, m.num_groups = 4, m.group_topk = 2, m.expert_bias = true;
  m.aux_loss_coeff = {0.2};
  std::vector<double> bias = {0.3, -0.2, 0.0, 0.1, -0.4, 0.2, 0.0, 0.05};
  routing_fd(m, 6, 2, &bias);
}
TEST(MoeRoutingGrad, SeqAuxLoss) {
  auto m = moe_cfg(4, 2);
  m.balance = {Balance::SeqAuxLoss}, m.aux_loss_coeff = {0.5};
  routing_fd(m, 12, 3);
}
TEST(MoeRoutingGrad, SinkhornTop2WithZLossAndTop1) {
  auto m = moe_cfg(6, 2);
  m.balance = {Balance::Sinkhorn}, m.z_loss_coeff = 0.1;
  routing_fd(m, 8, 2);
  m.topk = 1;
  routing_fd(m, 8, 2, nullptr, 2);
}
TEST(MoeRoutingGrad, SqrtSoftplusScaledWithAuxAndZLoss) {
  auto m = moe_cfg(6, 3);
  m.score = Score::SqrtSoftplus, m.topk_scaling_factor = 2.5, m.aux_loss_coeff = {0.4};
  m.z_loss_coeff = 0.1;
  routing_fd(m, 8, 2);
}
TEST(MoeRoutingGrad, SqrtSoftplusTop1WithSeqAuxLoss) {
  auto m = moe_cfg(4, 1);
  m.score = Score::SqrtSoftplus, m.balance = {Balance::SeqAuxLoss}, m.aux_loss_coeff = {0.3};
  routing_fd(m, 6, 2);
}
TEST(MoeRoutingGrad, SqrtSoftplusExpertBiasGroupLimited) {
  auto m = moe_cfg(8, 4);
  m.score = Score::SqrtSoftplus, m.num_groups = 4, m.group_topk = 2, m.expert_bias = true;
  m.aux_loss_coeff = {0.2};
  std::vector<double> bias = {0.3, -0.2, 0.0, 0.1, -0.4, 0.2, 0.0, 0.05};
  routing_fd(m, 6, 2, &bias);
  m.topk = 2, m.group_topk = 1;  // k = 2: one group's top two
  routing_fd(m, 6, 2, &bias);
}
// Several load-balancing types at once (Megatron's lists): every score function by finite
// differences, and the gradient is the sum of each type's alone (the routing's own part
// counted once: d(loss)/d(prob) given to one of them).
TEST(MoeRoutingGrad, EveryAuxLossTypeAtOnceIsTheSumOfEachAlone) {
  const int64_t T = 12, B = 3, E = 6, k = 2;
  for (Score sc : {Score::Softmax, Score::Sigmoid, Score::SqrtSoftplus}) {
    SCOPED_TRACE(int(sc));
    auto m = moe_cfg(E, k);
    m.score = sc, m.z_loss_coeff = 0.05;
    m.balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss, Balance::None};
    m.aux_loss_coeff = {0.2, 0.3, 0.7, 0.9};  // none's coefficient means nothing
    routing_fd(m, T, B);
    const auto l = random_logits(T * E, 77);
    std::vector<double> dp(size_t(T * k)), zero(size_t(T * k), 0.0);
    for (size_t i = 0; i < dp.size(); ++i) dp[i] = Philox::normal(6, 1, i);
    auto grad = [&](const TransformerConfig::Moe& mm, const std::vector<double>& w,
                    double* loss) {
      const auto r = moe::route(mm, l.data(), T, B, nullptr);
      if (loss) *loss = r.aux_loss + r.seq_aux_loss + r.global_aux_loss;
      std::vector<double> g(size_t(T * E));
      moe::route_backward(mm, r, l.data(), w.data(), 0.25, 2, T - 1, B, g.data());
      return g;
    };
    double all_loss = 0, one = 0, sum_loss = 0;
    const auto all = grad(m, dp, &all_loss);
    std::vector<double> sum(size_t(T * E), 0.0);
    const Balance types[3] = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
    for (int i = 0; i < 3; ++i) {
      auto mi = m;
      mi.balance = {types[i]}, mi.aux_loss_coeff = {m.aux_loss_coeff[size_t(i)]};
      mi.z_loss_coeff = i == 0 ? m.z_loss_coeff : 0.0;
      const auto g = grad(mi, i == 0 ? dp : zero, &one);
      EXPECT_GT(one, 0.0) << i;
      sum_loss += one;
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += g[j];
    }
    EXPECT_NEAR(all_loss, sum_loss, 1e-15 * sum_loss);
    double worst = 0, mag = 0;
    for (size_t j = 0; j < sum.size(); ++j)
      worst = std::max(worst, std::abs(all[j] - sum[j])), mag = std::max(mag, std::abs(sum[j]));
    EXPECT_GT(mag, 1e-3);
    EXPECT_LE(worst, 1e-14 * mag);
  }
}
TEST(MoeRoutingGrad, CapacityDroppingAndPadding) {
  auto m = moe_cfg(4, 2);
  m.capacity_factor = 0.75, m.aux_loss_coeff = {0.1};
  routing_fd(m, 8, 2);
  m.pad_to_capacity = true, m.drop_by_position = true;
  routing_fd(m, 8, 2, nullptr, 2);
}

// ---- ops ---------------------------------------------------------------------------------

TEST(MoeOps, PermuteUnpermuteAreAdjoint) {
  // <permute(x), y> == <x, unpermute(y)> for a routing with repeated and missing tokens.
  const int64_t T = 5, H = 3;
  std::vector<int64_t> src = {2, 0, 2, 4, 1, 2};  // token 3 never routed
  std::vector<int64_t> off = {0, 1, 2, 5, 5, 6}, rows = {1, 4, 0, 2, 5, 3};
  Tensor x = Tensor::empty({T, H}, DType::F64), y = Tensor::empty({6, H}, DType::F64);
  for (int64_t i = 0; i < T * H; ++i) x.data<double>()[i] = Philox::normal(1, 1, uint64_t(i));
  for (int64_t i = 0; i < 6 * H; ++i) y.data<double>()[i] = Philox::normal(1, 2, uint64_t(i));
  Tensor px = Tensor::empty({6, H}, DType::F64), uy = Tensor::empty({T, H}, DType::F64);
  Stream& st = Stream::cpu();
  ops::gather_rows(x, Tensor::from(src, {6}), px, st);
  ops::moe_unpermute(y, Tensor::from(off, {T + 1}), Tensor::from(rows, {6}), uy, st);
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t h = 0; h < H; ++h)
      EXPECT_EQ(px.data<double>()[n * H + h], x.data<double>()[src[size_t(n)] * H + h]);
  for (int64_t h = 0; h < H; ++h) EXPECT_EQ(uy.data<double>()[3 * H + h], 0.0);
  EXPECT_NEAR(ops::dot(px, y, st), ops::dot(x, uy, st), 1e-12);
}

namespace {

// fc1 [N, W] ~ 1.5 N(0,1), p [N] in [0, 1) with rows 1 and N-2 zero, dap [N, F] ~ N(0,1).
struct ActScaleIn {
  Tensor fc1, p, dap;
};
ActScaleIn act_scale_inputs(int64_t N, int64_t F, bool swiglu, DType dt, uint64_t seed) {
  const int64_t W = (swiglu ? 2 : 1) * F;
  ActScaleIn in{Tensor::empty({N, W}, dt), Tensor::empty({N}, dt), Tensor::empty({N, F}, dt)};
  for (int64_t i = 0; i < N * W; ++i)
    set_float(in.fc1, i, 1.5 * Philox::normal(seed, 1, uint64_t(i)));
  for (int64_t i = 0; i < N * F; ++i) set_float(in.dap, i, Philox::normal(seed, 2, uint64_t(i)));
  for (int64_t n = 0; n < N; ++n)
    set_float(in.p, n, n == 1 || n == N - 2 ? 0.0 : Philox::uniform(seed, 3, uint64_t(n)));
  return in;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

using ops::MlpActivation;
constexpr MlpActivation kActs[] = {MlpActivation::Swiglu, MlpActivation::Gelu,
                                   MlpActivation::SquaredRelu};
const char* act_name(MlpActivation a) {
  return a == MlpActivation::Swiglu ? "swiglu" : a == MlpActivation::Gelu ? "gelu" : "relu2";
}
void act_forward(MlpActivation a, const Tensor& x, Tensor& y, Stream& st) {
  if (a == MlpActivation::Swiglu)
    ops::swiglu_forward(x, y, st);
  else if (a == MlpActivation::Gelu)
    ops::gelu_forward(x, y, st);
  else
    ops::squared_relu_forward(x, y, st);
}
void act_backward(MlpActivation a, const Tensor& dy, const Tensor& x, Tensor& dx, Stream& st) {
  if (a == MlpActivation::Swiglu)
    ops::swiglu_backward(dy, x, dx, st);
  else if (a == MlpActivation::Gelu)
    ops::gelu_backward(dy, x, dx, st);
  else
    ops::squared_relu_backward(dy, x, dx, st);
}

}  // namespace

TEST(MoeOps, ActScaleIsTheUnfusedComposition) {
  // The fused ops against the activation, moe_scale_rows and moe_row_dot in turn: the same
  // bits (the CUDA kernels are held to these ops, tests/moe/test_moe_gpu.cpp).
  Stream& st = Stream::cpu();
  const int64_t N = 7, F = 5;
  for (DType dt : {DType::F32, DType::F64})
    for (MlpActivation a : kActs) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + act_name(a));
      const ActScaleIn in = act_scale_inputs(N, F, a == MlpActivation::Swiglu, dt, 5);
      Tensor act = Tensor::empty({N, F}, dt), ap_ref = Tensor::empty({N, F}, dt);
      act_forward(a, in.fc1, act, st);
      ops::moe_scale_rows(act, in.p, ap_ref, st);
      Tensor ap = Tensor::empty({N, F}, dt);
      ops::moe_act_scale_forward(in.fc1, in.p, a, ap, st);
      EXPECT_TRUE(same_bits(ap, ap_ref));
      for (int64_t f = 0; f < F; ++f) EXPECT_EQ(get_float(ap, 1 * F + f), 0.0);

      Tensor dp_ref = Tensor::empty({N}, dt), dact = Tensor::empty({N, F}, dt);
      Tensor dfc1_ref = Tensor::empty(in.fc1.shape(), dt);
      ops::moe_row_dot(in.dap, act, dp_ref, st);
      ops::moe_scale_rows(in.dap, in.p, dact, st);
      act_backward(a, dact, in.fc1, dfc1_ref, st);
      Tensor dp = Tensor::empty({N}, dt), dfc1 = Tensor::empty(in.fc1.shape(), dt), none;
      ops::moe_act_scale_backward(in.dap, in.fc1, in.p, a, dfc1, dp, none, st);
      EXPECT_TRUE(same_bits(dp, dp_ref));
      EXPECT_TRUE(same_bits(dfc1, dfc1_ref));
      for (int64_t w = 0; w < in.fc1.size(1); ++w)
        EXPECT_EQ(get_float(dfc1, 1 * in.fc1.size(1) + w), 0.0);

      // The recomputed ap (the experts' backward when the forward kept none): the forward's
      // bits, into its own tensor and in place over dap, the other outputs unchanged.
      Tensor ap2 = Tensor::empty({N, F}, dt), dp2 = Tensor::empty({N}, dt);
      Tensor dfc1_2 = Tensor::empty(in.fc1.shape(), dt);
      ops::moe_act_scale_backward(in.dap, in.fc1, in.p, a, dfc1_2, dp2, ap2, st);
      EXPECT_TRUE(same_bits(ap2, ap_ref));
      EXPECT_TRUE(same_bits(dp2, dp_ref));
      EXPECT_TRUE(same_bits(dfc1_2, dfc1_ref));
      Tensor inplace = in.dap.clone();
      ops::moe_act_scale_backward(inplace, in.fc1, in.p, a, dfc1_2, dp2, inplace, st);
      EXPECT_TRUE(same_bits(inplace, ap_ref));
      EXPECT_TRUE(same_bits(dp2, dp_ref));
      EXPECT_TRUE(same_bits(dfc1_2, dfc1_ref));
    }
}

TEST(MoeOpsGrad, ActScaleBackwardIsTheForwardsDerivative) {
  // fp64 central differences of L = sum(dap * ap(fc1, p)) against dfc1 and dp.
  Stream& st = Stream::cpu();
  const int64_t N = 4, F = 3;
  const double h = 1e-6;
  for (MlpActivation a : kActs) {
    SCOPED_TRACE(act_name(a));
    ActScaleIn in = act_scale_inputs(N, F, a == MlpActivation::Swiglu, DType::F64, 9);
    auto loss = [&] {
      Tensor ap = Tensor::empty({N, F}, DType::F64);
      ops::moe_act_scale_forward(in.fc1, in.p, a, ap, st);
      return ops::dot(ap, in.dap, st);
    };
    Tensor dp = Tensor::empty({N}, DType::F64), dfc1 = Tensor::empty(in.fc1.shape(), DType::F64);
    Tensor none;
    ops::moe_act_scale_backward(in.dap, in.fc1, in.p, a, dfc1, dp, none, st);
    auto fd = [&](Tensor& t, int64_t i) {
      double* v = t.data<double>() + i;
      const double v0 = *v;
      *v = v0 + h;
      const double lp = loss();
      *v = v0 - h;
      const double lm = loss();
      *v = v0;
      return (lp - lm) / (2 * h);
    };
    for (int64_t i = 0; i < in.fc1.numel(); ++i)
      EXPECT_NEAR(dfc1.data<double>()[i], fd(in.fc1, i), 1e-7) << "fc1 element " << i;
    for (int64_t n = 0; n < N; ++n)
      EXPECT_NEAR(dp.data<double>()[n], fd(in.p, n), 1e-7) << "row " << n;
  }
}

// ---- whole models ------------------------------------------------------------------------

namespace {

TransformerConfig tiny_moe(bool swiglu, int layers, double dropout) {
  TransformerConfig c;
  c.num_layers = layers, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 2;
  c.seq_length = 6, c.max_position_embeddings = 8, c.padded_vocab_size = 16;
  c.hidden_dropout = dropout, c.attention_dropout = dropout, c.dtype = DType::F64;
  c.init_method_std = 0.3, c.num_query_groups = 2, c.ffn_hidden_size = 12;
  c.rope = swiglu, c.rmsnorm = swiglu, c.swiglu = swiglu, c.add_bias_linear = false;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.05}, c.moe.z_loss_coeff = 0.01;
  return c;
}

model::MicroBatch batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = Philox::u32(seed, 1, uint64_t(i)) % V;
    mb.labels.data<int64_t>()[i] = Philox::u32(seed, 2, uint64_t(i)) % V;
    mb.loss_mask.data<float>()[i] = i % 5 == 2 ? 0.f : 1.f;
  }
  return mb;
}

// LM loss (sum of masked token losses) + every MoE layer's aux and z losses.
double total(model::GPTModel& m, const model::MicroBatch& mb, const model::StepKeys& k) {
  double f = m.forward(mb, k);
  for (auto* l : moe_layers(m)) f += l->stats().last_aux_sum() + l->stats().last_z_loss;
  return f;
}

// skip: parameters left out of the check (named, e.g. a straight-through one).
void model_fd(const TransformerConfig& cfg, const std::function<void(model::GPTModel&)>& setup = {},
              const std::function<bool(const std::string&)>& skip = {}) {
  model::GPTModel m(cfg);
  if (setup) setup(m);
  auto mb = batch(2, cfg.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  auto& ps = m.params();
  ps.zero_grads();
  total(m, mb, keys);
  m.backward(1.0);
  EXPECT_FALSE(moe_layers(m).empty());
  const double h = 1e-5;
  int checked = 0, skipped = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    if (skip && skip(ps.infos()[i].name)) {
      ++skipped;
      continue;
    }
    Tensor w = ps.param(i), g = ps.grad(i);
    for (uint64_t kk = 0; kk < 3; ++kk) {
      const int64_t e = int64_t(Philox::u32(9, i, kk) % uint64_t(w.numel()));
      double* x = w.data<double>() + e;
      const double x0 = *x;
      *x = x0 + h;
      const double lp = total(m, mb, keys);
      *x = x0 - h;
      const double lm = total(m, mb, keys);
      *x = x0;
      const double fd = (lp - lm) / (2 * h), an = g.data<double>()[e];
      EXPECT_NEAR(an, fd, 2e-6 * std::max(1.0, std::abs(fd))) << ps.infos()[i].name << "[" << e << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * (int(ps.infos().size()) - skipped));
}

}  // namespace

TEST(MoeModelGrad, SwigluExpertsWithAuxAndZLossAndDropout) {
  model_fd(tiny_moe(true, 2, 0.2));
}

// --fp16's loss scale (StepKeys::loss_scale) reaches the gradients the MoE layers inject
// themselves: with every aux-loss type and the z loss, a backward at loss scale 1024 (the
// LM loss's gradient scaled by it, as the trainer does) gives exactly 1024 times every
// gradient of the unscaled backward -- the router's among them, which without the scale
// would keep its unscaled aux part.
TEST(MoeModelGrad, Fp16LossScaleScalesTheAuxLossGradients) {
  auto c = tiny_moe(true, 2, 0.0);
  c.moe.balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  c.moe.aux_loss_coeff = {0.05, 0.02, 0.03};
  auto mb = batch(2, c.seq_length, 13, 11);
  std::vector<std::vector<double>> g(2);
  int64_t router = 0;
  for (int run = 0; run < 2; ++run) {  // a fresh model each (the global aux loss's mean)
    model::GPTModel m(c);
    auto& ps = m.params();
    const double scale = run == 0 ? 1.0 : 1024.0;
    model::StepKeys keys;
    keys.iteration = 3;
    keys.loss_scale = scale;
    ps.zero_grads();
    m.forward(mb, keys);
    m.backward(scale);
    const Tensor& flat = ps.flat_grads();
    g[size_t(run)].assign(flat.data<double>(), flat.data<double>() + flat.numel());
    for (size_t i = 0; run == 0 && i < ps.infos().size(); ++i)
      router += ps.infos()[i].name.find("router") != std::string::npos;
  }
  ASSERT_GT(router, 0);
  double largest = 0;
  for (size_t e = 0; e < g[0].size(); ++e) {
    ASSERT_EQ(g[1][e], 1024.0 * g[0][e]) << "gradient element " << e;
    largest = std::max(largest, std::abs(g[0][e]));
  }
  EXPECT_GT(largest, 0.0);
}

// --calculate-per-token-loss (StepKeys::loss_tokens = N): Megatron divides every gradient
// by the global batch's loss tokens N and pre-multiplies the aux / z losses by the
// micro-batch's tokens S x B, so the gradient is (LM_sum + S B aux) / N. With N = S B / 2
// (half the tokens masked) that is exactly twice the per-micro-batch-mean backward of a
// whole batch (global_batch 0: aux at scale 1) at LM scale 1 / (S B).
TEST(MoeModelGrad, PerTokenLossScalesTheAuxLossGradientsAsMegatron) {
  auto c = tiny_moe(true, 2, 0.0);
  c.moe.balance = {Balance::AuxLoss, Balance::SeqAuxLoss};
  c.moe.aux_loss_coeff = {0.05, 0.02};
  auto mb = batch(2, c.seq_length, 13, 11);
  const double SB = double(2 * c.seq_length);
  std::vector<std::vector<double>> g(2);
  for (int run = 0; run < 2; ++run) {
    model::GPTModel m(c);
    auto& ps = m.params();
    model::StepKeys keys;
    keys.iteration = 3;
    if (run == 1) keys.loss_tokens = SB / 2;
    ps.zero_grads();
    m.forward(mb, keys);
    m.backward(run == 0 ? 1.0 / SB : 2.0 / SB);
    const Tensor& flat = ps.flat_grads();
    g[size_t(run)].assign(flat.data<double>(), flat.data<double>() + flat.numel());
  }
  for (size_t e = 0; e < g[0].size(); ++e)
    ASSERT_EQ(g[1][e], 2.0 * g[0][e]) << "gradient element " << e;
}

TEST(MoeModelGrad, GeluExpertsPreSoftmaxTop1) {
  auto c = tiny_moe(false, 1, 0.1);
  c.moe.topk = 1, c.moe.pre_softmax = true;
  model_fd(c);
}

TEST(MoeModelGrad, SharedExpertsWithAndWithoutGateInterleavedLayers) {
  auto c = tiny_moe(true, 2, 0.2);
  c.moe.layer_pattern = {0, 1};  // a dense layer, then a MoE layer
  c.moe.shared_ffn_hidden_size = 10;
  model_fd(c);
  c.moe.shared_expert_gate = true, c.moe.score = Score::Sigmoid, c.moe.topk = 3;
  c.moe.balance = {Balance::SeqAuxLoss}, c.moe.topk_scaling_factor = 1.5;
  model_fd(c);
}

// --moe-apply-probs-on-input (top-1): whole models against finite differences (sigmoid
// routing with SwiGLU experts and dropout; pre-softmax with GELU experts and their biases).
TEST(MoeModelGrad, ProbsOnInputTop1) {
  auto c = tiny_moe(true, 2, 0.2);
  c.moe.topk = 1, c.moe.score = Score::Sigmoid, c.moe.apply_probs_on_input = true;
  model_fd(c);
  auto g = tiny_moe(false, 2, 0.1);
  g.add_bias_linear = true;
  g.moe.topk = 1, g.moe.pre_softmax = true, g.moe.apply_probs_on_input = true;
  model_fd(g);
}

// The function, by a property independent of the implementation: squared-ReLU experts without
// biases are homogeneous of degree 2, so scaling a row's input by p scales its output by p^2:
// each token's output with the probability on the input is p times its output with the
// probability after the activation, p = sigmoid of its best logit (computed here from the
// router's weight, the layer's first parameter [E, H], and the harness's input).
TEST(MoeLayer, ProbsOnInputScalesTheExpertsInput) {
  TransformerConfig c = tiny_moe(false, 1, 0.0);
  c.squared_relu = true, c.moe.topk = 1, c.moe.score = Score::Sigmoid;
  const int64_t S = 6, B = 2, H = c.hidden_size, E = c.moe.num_experts;
  const auto place = moe::MoeLayer::RoutingPlace::Host;
  const test::MoeLayerRun after = test::run_moe_layer(c, nullptr, place, S, B, 5);
  c.moe.apply_probs_on_input = true;
  const test::MoeLayerRun on = test::run_moe_layer(c, nullptr, place, S, B, 5, &after.params);
  double pmin = 1, worst = 0;
  for (int64_t t = 0; t < S * B; ++t) {
    double best = -1e300;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t h = 0; h < H; ++h)
        l += after.params[size_t(e * H + h)] * Philox::normal(5, 1, uint64_t(t * H + h));
      best = std::max(best, l);
    }
    const double p = 1 / (1 + std::exp(-best));
    pmin = std::min(pmin, p);
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = size_t(t * H + h);
      worst = std::max(worst, std::abs(on.y[i] - p * after.y[i]) / (1e-3 + std::abs(on.y[i])));
    }
  }
  EXPECT_LT(worst, 1e-12);
  EXPECT_LT(pmin, 0.9);  // the probabilities are not all near 1: the property has teeth
  double differ = 0;
  for (size_t i = 0; i < on.y.size(); ++i) differ = std::max(differ, std::abs(on.y[i] - after.y[i]));
  EXPECT_GT(differ, 1e-3);
  EXPECT_EQ(on.tokens_per_expert, after.tokens_per_expert);  // the same routing
}

// sqrtsoftplus with the expert bias and every aux-loss type at once in a whole model.
TEST(MoeModelGrad, SqrtSoftplusExpertBiasAndEveryAuxLossType) {
  auto c = tiny_moe(true, 2, 0.2);
  c.moe.score = Score::SqrtSoftplus, c.moe.expert_bias = true, c.moe.topk = 3;
  c.moe.balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  c.moe.aux_loss_coeff = {0.05, 0.1, 0.2};
  model_fd(c, [](model::GPTModel& m) {
    for (auto* l : moe_layers(m)) l->router().set_expert_bias({0.1, -0.2, 0.0, 0.3});
  });
}

TEST(MoeModelGrad, SinkhornRoutingTop2AndTop1) {
  auto c = tiny_moe(true, 2, 0.2);
  c.moe.balance = {Balance::Sinkhorn}, c.moe.aux_loss_coeff = {0};
  model_fd(c);
  c.moe.topk = 1;
  model_fd(c);
}

// The FP8 router padding's rows carry probability 0: without FP8, the model's loss and
// every gradient are those of the unpadded model (f64; dropless and with capacity).
TEST(MoeModel, Fp8RouterPaddingChangesNoValueWithoutFp8) {
  for (bool capacity : {false, true}) {
    auto c = tiny_moe(true, 2, 0.2);
    if (capacity) c.moe.capacity_factor = 1.0;
    auto run = [&](int64_t pad, std::vector<Tensor>& grads, int64_t& rows) {
      auto cc = c;
      cc.moe.pad_multiple = pad;
      model::GPTModel m(cc);
      auto mb = batch(2, cc.seq_length, 13, 11);
      model::StepKeys keys;
      keys.iteration = 3;
      m.params().zero_grads();
      const double f = total(m, mb, keys);
      m.backward(1.0);
      for (size_t i = 0; i < m.params().infos().size(); ++i) grads.push_back(m.params().grad(i).clone());
      rows = 0;
      for (auto* l : moe_layers(m))
        for (double n : l->stats().tokens_per_expert) rows += int64_t(n);
      return f;
    };
    std::vector<Tensor> g0, g1;
    int64_t rows0 = 0, rows1 = 0;
    const double f0 = run(0, g0, rows0), f1 = run(16, g1, rows1);
    EXPECT_NEAR(f1, f0, 1e-12 * std::abs(f0)) << "capacity " << capacity;
    EXPECT_EQ(rows1, rows0);  // the expert-bias counts leave the padding out
    ASSERT_EQ(g0.size(), g1.size());
    for (size_t i = 0; i < g0.size(); ++i)
      for (int64_t j = 0; j < g0[i].numel(); ++j)
        EXPECT_NEAR(g1[i].data<double>()[j], g0[i].data<double>()[j],
                    1e-12 * std::max(1.0, std::abs(g0[i].data<double>()[j])))
            << "param " << i << " [" << j << "] capacity " << capacity;
  }
}

TEST(MoeModelGrad, CapacityWithPadding) {
  auto c = tiny_moe(true, 1, 0.0);
  c.moe.capacity_factor = 0.5, c.moe.pad_to_capacity = true;
  model_fd(c);
  c.moe.pad_to_capacity = false, c.moe.drop_by_position = true;
  model_fd(c);
}

TEST(MoeModelGrad, AllTokensToOneExpertOthersReceiveNothing) {
  // Sigmoid routing, k 1, an expert bias that sends every token to expert 2: experts 0, 1
  // and 3 get zero rows (no GEMM), and their gradients stay exactly zero.
  auto c = tiny_moe(true, 1, 0.1);
  c.moe.score = Score::Sigmoid, c.moe.topk = 1, c.moe.expert_bias = true;
  model_fd(c, [&](model::GPTModel& m) {
    moe_layers(m).front()->router().set_expert_bias({0.0, 0.0, 100.0, 0.0});
  });
  model::GPTModel m(c);
  moe_layers(m).front()->router().set_expert_bias({0.0, 0.0, 100.0, 0.0});
  auto mb = batch(2, c.seq_length, 13, 11);
  model::StepKeys keys;
  m.params().zero_grads();
  m.forward(mb, keys);
  m.backward(1.0);
  const auto& tpe = moe_layers(m).front()->stats().tokens_per_expert;
  EXPECT_EQ(tpe[2], double(c.seq_length * 2));
  EXPECT_EQ(tpe[0] + tpe[1] + tpe[3], 0.0);
  for (int e : {0, 1, 3})
    for (const char* w : {"linear_fc1.weight", "linear_fc2.weight"}) {
      Tensor g = m.params().grad(model::layer_param_name(0, "mlp.experts.") + w + std::to_string(e));
      EXPECT_EQ(ops::sum_squares(g, Stream::cpu()), 0.0);
    }
  Tensor g2 = m.params().grad(model::layer_param_name(0, "mlp.experts.linear_fc1.weight2"));
  EXPECT_GT(ops::sum_squares(g2, Stream::cpu()), 0.0);
}

TEST(MoeModel, ParameterNamesAreMegatronCoreGroupedForm) {
  auto c = tiny_moe(true, 2, 0.0);
  c.moe.layer_pattern = {1, 0};
  c.moe.shared_ffn_hidden_size = 4, c.moe.shared_expert_gate = true, c.moe.expert_bias = true;
  model::GPTModel m(c);
  const auto& ps = m.params();
  for (const char* n :
       {"decoder.layers.0.mlp.router.weight", "decoder.layers.0.mlp.experts.linear_fc1.weight0",
        "decoder.layers.0.mlp.experts.linear_fc2.weight3",
        "decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
        "decoder.layers.0.mlp.shared_experts.linear_fc2.weight",
        "decoder.layers.0.mlp.shared_experts.gate_weight", "decoder.layers.1.mlp.linear_fc1.weight",
        "decoder.layers.0.pre_mlp_layernorm.weight"})
    EXPECT_TRUE(ps.has(n)) << n;
  EXPECT_TRUE(ps.has_buffer("decoder.layers.0.mlp.router.expert_bias"));
  EXPECT_FALSE(ps.has_buffer("decoder.layers.1.mlp.router.expert_bias"));
  EXPECT_EQ(ps.info("decoder.layers.0.mlp.experts.linear_fc1.weight2").expert, 2);
  EXPECT_EQ(ps.info("decoder.layers.0.mlp.experts.linear_fc1.weight2").global_shape,
            (Shape{12, 8}));
}

// ---- flags -------------------------------------------------------------------------------

TEST(MoeFlags, LayerFreq) {
  using training::parse_moe_layer_freq;
  EXPECT_EQ(parse_moe_layer_freq("1", 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<int64_t>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([0]+[1]*3)", 4), (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[1,0]*2", 4), (std::vector<int64_t>{1, 0, 1, 0}));
  EXPECT_THROW(parse_moe_layer_freq("([0]+[1]*3)", 5), Error);
  EXPECT_THROW(parse_moe_layer_freq("[2,1]", 2), Error);
  EXPECT_THROW(parse_moe_layer_freq("[1,", 2), Error);
  EXPECT_THROW(parse_moe_layer_freq("0", 2), Error);
}

namespace {

std::string start_up_error(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "32",
                                   "--num-attention-heads", "4", "--seq-length", "16",
                                   "--max-position-embeddings", "16", "--micro-batch-size", "2",
                                   "--lr", "1e-3", "--train-iters", "5", "--mock-data",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                                   "--disable-bias-linear"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  try {
    auto a = training::parse_args(argv);
    training::validate_args(a, 2);
  } catch (const Error& e) {
    return std::string(e.what()) + " HINT: " + e.hint();
  }
  return "";
}

}  // namespace

// --moe-shared-expert-overlap: Megatron's conditions (shared experts, the alltoall
// dispatcher, no recomputed shared experts) and TP 1, each refused naming the flag to add or
// drop; a dense model refuses it as every MoE flag.
TEST(MoeFlags, SharedExpertOverlapConditions) {
  const std::vector<std::string> ok = {"--num-experts", "4", "--moe-shared-expert-intermediate-size",
                                       "16", "--moe-token-dispatcher-type", "alltoall",
                                       "--moe-shared-expert-overlap"};
  EXPECT_EQ(start_up_error(ok), "");
  auto without = [&](const std::string& flag, int values) {
    std::vector<std::string> v = ok;
    auto it = std::find(v.begin(), v.end(), flag);
    v.erase(it, it + 1 + values);
    return start_up_error(v);
  };
  EXPECT_NE(without("--moe-shared-expert-intermediate-size", 1)
                .find("add --moe-shared-expert-intermediate-size"),
            std::string::npos);
  EXPECT_NE(without("--moe-token-dispatcher-type", 1).find("--moe-token-dispatcher-type alltoall"),
            std::string::npos);
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> v = ok;
    v.insert(v.end(), more.begin(), more.end());
    return start_up_error(v);
  };
  EXPECT_NE(with({"--recompute-granularity", "selective", "--recompute-modules", "shared_experts"})
                .find("drop shared_experts from --recompute-modules"),
            std::string::npos);
  EXPECT_NE(with({"--tensor-model-parallel-size", "2", "--sequence-parallel"})
                .find("--moe-shared-expert-overlap at --tensor-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--moe-shared-expert-overlap"}).find("--num-experts"),
            std::string::npos);
}

// --moe-token-dispatcher-type flex: accepted with Megatron's backends where Megatron accepts
// them (deepep and ncclep need more than one expert rank; hybridep runs on one), and it
// configures the all-to-all dispatcher's exchange; Megatron's flex checks and the dropping
// not implemented here are errors naming the flag.
TEST(MoeFlags, FlexDispatcher) {
  const std::vector<std::string> moe = {"--num-experts", "4", "--moe-token-dispatcher-type",
                                        "flex"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> v = moe;
    v.insert(v.end(), more.begin(), more.end());
    return start_up_error(v);
  };
  const std::vector<std::string> ep2 = {"--expert-model-parallel-size", "2"};
  EXPECT_EQ(with(ep2), "");  // deepep, Megatron's default backend
  EXPECT_EQ(with({"--moe-flex-dispatcher-backend", "hybridep"}), "");
  EXPECT_EQ(with({"--expert-model-parallel-size", "2", "--moe-enable-deepep"}), "");
  EXPECT_EQ(with({"--expert-model-parallel-size", "2", "--moe-flex-dispatcher-backend",
                  "ncclep"}),
            "");
  EXPECT_NE(with({}).find("deepep backend needs more than one expert rank"), std::string::npos);
  EXPECT_NE(with({"--moe-flex-dispatcher-backend", "ncclep"}).find("ncclep backend"),
            std::string::npos);
  EXPECT_NE(with({"--moe-flex-dispatcher-backend", "nvshmem"})
                .find("'nvshmem' is not one of deepep, hybridep, ncclep"),
            std::string::npos);
  EXPECT_NE(with({"--moe-enable-deepep", "--moe-flex-dispatcher-backend", "hybridep"})
                .find("only one backend"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-enable-deepep"})
                .find("add --moe-token-dispatcher-type flex"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-token-dispatcher-type", "alltoall",
                            "--moe-flex-dispatcher-backend", "hybridep"})
                .find("chooses the flex dispatcher's backend"),
            std::string::npos);
  EXPECT_NE(with({"--expert-model-parallel-size", "2", "--moe-expert-capacity-factor", "1.0"})
                .find("--moe-expert-capacity-factor with the flex dispatcher"),
            std::string::npos);
  EXPECT_NE(with({"--expert-model-parallel-size", "2", "--moe-expert-capacity-factor", "1.0",
                  "--moe-pad-expert-input-to-capacity"})
                .find("does not pad the experts' input"),
            std::string::npos);
  // What the flex dispatcher allows that the all-gather one does not (Megatron's lists).
  EXPECT_EQ(with({"--expert-model-parallel-size", "2", "--moe-shared-expert-intermediate-size",
                  "16", "--moe-shared-expert-overlap"}),
            "");
}

TEST(MoeFlags, StartUpErrorsNameTheFlag) {
  EXPECT_EQ(start_up_error({"--num-experts", "4"}), "");
  EXPECT_NE(start_up_error({"--num-experts", "3", "--expert-model-parallel-size", "2"})
                .find("not divisible by --expert-model-parallel-size"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-topk", "1"})
                .find("--moe-router-pre-softmax"),
            std::string::npos);
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-topk", "1",
                            "--moe-router-pre-softmax"}),
            "");
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-enable-expert-bias"})
                .find("sigmoid"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "8", "--moe-router-num-groups", "3",
                            "--moe-router-group-topk", "1"})
                .find("--moe-router-num-groups 3"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "8", "--moe-router-topk", "3",
                            "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"})
                .find("--moe-router-group-topk 2"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-pad-expert-input-to-capacity"})
                .find("--moe-expert-capacity-factor"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--moe-router-topk", "4"}).find("--num-experts"), std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-apply-probs-on-input"})
                .find("--moe-apply-probs-on-input works with --moe-router-topk 1 only"),
            std::string::npos);
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-topk", "1",
                            "--moe-router-score-function", "sigmoid",
                            "--moe-apply-probs-on-input"}),
            "");
  EXPECT_NE(start_up_error({"--moe-apply-probs-on-input"}).find("--num-experts"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--tensor-model-parallel-size", "2"})
                .find("--sequence-parallel"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--expert-tensor-parallel-size", "2"})
                .find("--expert-tensor-parallel-size"),
            std::string::npos);
  // ETP 1 at TP 2 (whole experts on each TP rank) is accepted (ETP 2 at TP 1 is not, above).
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                            "--sequence-parallel", "--expert-tensor-parallel-size", "1"}),
            "");
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                            "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                            "--expert-model-parallel-size", "2",
                            "--moe-token-dispatcher-type", "alltoall"}),
            "");
  // ETP 1 at TP 2, DP 1 (EDP 2): expert buckets would skip the bf16 reduction.
  EXPECT_NE(start_up_error({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                            "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                            "--bf16", "--grad-reduce-in-bf16"})
                .find("--grad-reduce-in-bf16 at data-parallel size 1"),
            std::string::npos);
  // ... and with the allgather dispatcher (Megatron's default) at EP > 1 with TP > 1.
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                            "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                            "--expert-model-parallel-size", "2"}),
            "");
  // Expert parallelism trains at TP 1 (EP folded over DP), with the distributed optimizer too.
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--expert-model-parallel-size", "2"}), "");
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--expert-model-parallel-size", "2",
                            "--use-distributed-optimizer"}),
            "");
  // Sinkhorn: no aux loss (Megatron asserts it), top-1 without pre-softmax, and the router
  // flags its routing ignores are refused.
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn"}),
            "");
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-router-topk", "1", "--moe-z-loss-coeff", "1e-3"}),
            "");
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-aux-loss-coeff", "1e-2"})
                .find("Sinkhorn routing does not support an aux loss"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-router-score-function", "sigmoid"})
                .find("--moe-router-score-function sigmoid has no effect"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-router-topk-scaling-factor", "2"})
                .find("--moe-router-topk-scaling-factor has no effect"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-expert-capacity-factor", "1.5"})
                .find("not sinkhorn"),
            std::string::npos);
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type",
                            "global_aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2",
                            "1e-3"}),
            "");
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-router-load-balancing-type",
                            "quantile_balancing"})
                .find("quantile_balancing is not implemented yet"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-layer-freq", "[1,1,1]"})
                .find("--moe-layer-freq"),
            std::string::npos);
}

// Checkpoint metadata: the score function by name and the load-balancing lists round-trip;
// metadata written before them (one "balance" number, one "aux_loss_coeff", "sigmoid" as a
// bool) loads as one-entry lists; a list of another length or an unknown type is an error.
TEST(MoeCheckpointMetadata, ListsRoundTripAndSingleFieldsStillLoad) {
  auto m = moe_cfg(8, 2);
  m.score = Score::SqrtSoftplus;
  m.balance = {Balance::SeqAuxLoss, Balance::GlobalAuxLoss, Balance::AuxLoss};
  m.aux_loss_coeff = {1e-3, 2e-2, 0.0};
  const nlohmann::json j = checkpoint::moe_config_json(m);
  const auto back = checkpoint::moe_config_from_json(j);
  EXPECT_EQ(back.score, Score::SqrtSoftplus);
  EXPECT_EQ(back.balance, m.balance);
  EXPECT_EQ(back.aux_loss_coeff, m.aux_loss_coeff);
  EXPECT_EQ(back.coeff(Balance::GlobalAuxLoss), 2e-2);
  // Written before the lists: sigmoid, seq_aux_loss (number 2) with 0.05.
  nlohmann::json old = j;
  old.erase("score_function"), old.erase("balance_types"), old.erase("aux_loss_coeffs");
  old["sigmoid"] = true, old["balance"] = 2, old["aux_loss_coeff"] = 0.05;
  const auto o = checkpoint::moe_config_from_json(old);
  EXPECT_EQ(o.score, Score::Sigmoid);
  EXPECT_EQ(o.balance, std::vector<Balance>{Balance::SeqAuxLoss});
  EXPECT_EQ(o.aux_loss_coeff, std::vector<double>{0.05});
  old["sigmoid"] = false, old["balance"] = 3;
  const auto sk = checkpoint::moe_config_from_json(old);
  EXPECT_EQ(sk.score, Score::Softmax);
  EXPECT_TRUE(sk.sinkhorn());
  nlohmann::json bad = j;
  bad["aux_loss_coeffs"] = {1e-3};
  EXPECT_THROW(checkpoint::moe_config_from_json(bad), Error);
  bad = j;
  bad["balance_types"] = {2, 9, 1};
  EXPECT_THROW(checkpoint::moe_config_from_json(bad), Error);
}

TEST(MoeFlags, FlopsCountRoutedAndSharedExperts) {
  // Megatron's formula: a MoE layer's MLP term is (k * I + Is) wide instead of F.
  training::FlopsShape d{4, 64, 256, 4, 4, 16, 32, 128, true};
  training::FlopsShape m = d;
  m.num_moe_layers = 4, m.moe_ffn_hidden_size = 256, m.moe_topk = 1;
  EXPECT_DOUBLE_EQ(training::num_floating_point_operations(m, 2),
                   training::num_floating_point_operations(d, 2));
  m.moe_topk = 2, m.moe_ffn_hidden_size = 64, m.shared_ffn_hidden_size = 128;  // 2*64+128 = F
  EXPECT_DOUBLE_EQ(training::num_floating_point_operations(m, 2),
                   training::num_floating_point_operations(d, 2));
  m.num_moe_layers = 2, m.moe_ffn_hidden_size = 256;  // two layers with 2*256+128 = 640
  const double mlp_delta = 3.0 * 2.0 * 64 * 3.0 * (640 - 256) * 2 * (2 * 32);
  EXPECT_DOUBLE_EQ(training::num_floating_point_operations(m, 2),
                   training::num_floating_point_operations(d, 2) + mlp_delta);
}

TEST(MoeModel, SavedActivationsPredictedEqualsMeasuredAndHandCount) {
  // The memory estimate (megatron plan, the start-up memory line) reads the MoE layer's
  // saved list; it must equal what a step holds, and the MoE layer's part must be the
  // stated dropless bound counted by hand: logits [T,E], weights [Tk] and fc1 [Tk,2I] (f64)
  // in place of the dense fc1 [T,2F]; with --keep-mlp-activations also the permuted input
  // [Tk,H] and the scaled activation [Tk,I] (the dense layer: its activation [T,F]).
  auto c = tiny_moe(true, 2, 0.1);
  c.moe.layer_pattern = {1, 0};
  model::GPTModel m(c);
  auto mb = batch(2, c.seq_length, 13, 11);
  model::StepKeys keys;
  m.forward(mb, keys);
  m.backward(1.0);
  const auto mem = m.activation_memory();
  const model::PipelinePart whole;
  EXPECT_EQ(mem.per_slot_max, model::saved_activation_bytes(c, whole, 0, 2, c.seq_length));
  EXPECT_EQ(mem.scratch, model::scratch_activation_bytes(c, whole, 2, c.seq_length));
  auto dense = c;
  dense.moe = {};
  const int64_t T = 2 * c.seq_length, E = 4, k = 2, H = 8, I = 6, F = 12;
  const int64_t moe_elems = T * E + T * k + T * k * 2 * I;
  EXPECT_EQ(model::saved_activation_bytes(c, whole, 0, 2, c.seq_length) -
                model::saved_activation_bytes(dense, whole, 0, 2, c.seq_length),
            8 * (moe_elems - T * 2 * F));
  c.keep_mlp_activations = dense.keep_mlp_activations = 2;
  EXPECT_EQ(model::saved_activation_bytes(c, whole, 0, 2, c.seq_length) -
                model::saved_activation_bytes(dense, whole, 0, 2, c.seq_length),
            8 * (moe_elems + T * k * H + T * k * I - T * 2 * F - T * F));
  model::GPTModel kept(c);
  kept.forward(mb, keys);
  kept.backward(1.0);
  EXPECT_EQ(kept.activation_memory().per_slot_max,
            model::saved_activation_bytes(c, whole, 0, 2, c.seq_length));
}

TEST(MoeModel, GenerationMatchesFullForwardMixedDenseAndMoeLayers) {
  // Greedy decoding with the KV cache (model/moe layers through forward_cached) against the
  // training model's full forward every step: a MoE layer then a dense one, sigmoid routing
  // with an expert bias and a gated shared expert.
  auto cfg = test::tiny_config(true, DType::F64);
  cfg.add_bias_linear = false;
  cfg.moe.num_experts = 4, cfg.moe.topk = 2, cfg.moe.ffn_hidden_size = 16;
  cfg.moe.score = Score::Sigmoid, cfg.moe.expert_bias = true, cfg.moe.layer_pattern = {1, 0};
  cfg.moe.shared_ffn_hidden_size = 16, cfg.moe.shared_expert_gate = true;
  model::GPTModel m(cfg);
  moe_layers(m).front()->router().set_expert_bias({0.1, -0.2, 0.0, 0.3});
  inference::Generator gen(m.params(), cfg);
  const int64_t B = 2, P = 4, steps = 10;
  inference::KVCache cache(cfg, cfg.max_position_embeddings, B);
  std::vector<std::vector<int64_t>> seqs(B);
  Tensor tokens = Tensor::empty({B, P}, DType::I64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < P; ++s) {
      seqs[size_t(b)].push_back(Philox::u32(9, uint64_t(b), uint64_t(s)) % 60);
      tokens.data<int64_t>()[b * P + s] = seqs[size_t(b)].back();
    }
  const Tensor* logits = &gen.forward(tokens, cache);
  for (int64_t step = 0; step < steps; ++step) {
    auto want = test::full_forward_last_logits(m, seqs);
    Tensor next = Tensor::empty({B, 1}, DType::I64);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t V = logits->size(-1);
      std::vector<double> got(logits->data<double>() + b * V, logits->data<double>() + (b + 1) * V);
      ASSERT_LE(test::rel_diff(got, want[size_t(b)]), 1e-12) << "step " << step << " seq " << b;
      const int64_t id = int64_t(std::max_element(got.begin(), got.end()) - got.begin());
      seqs[size_t(b)].push_back(id);
      next.data<int64_t>()[b] = id;
    }
    logits = &gen.forward(next, cache);
  }
}

TEST(MoeModel, RouterDtypeFp64InAnF32Model) {
  // --moe-router-dtype fp64 on an f32 model: the router GEMM runs on upcast copies and its
  // gradients come back into the f32 buffers. Against the same model computed in f64.
  auto c64 = tiny_moe(true, 1, 0.0);
  auto c32 = c64;
  c32.dtype = DType::F32, c32.moe.router_dtype = DType::F64, c32.moe.router_dtype_given = true;
  model::GPTModel m64(c64), m32(c32);
  ops::copy(m64.params().flat_params(), m32.params().flat_params(), Stream::cpu());
  ops::copy(m32.params().flat_params(), m64.params().flat_params(), Stream::cpu());
  auto mb = batch(2, c64.seq_length, 13, 11);
  model::StepKeys keys;
  m64.params().zero_grads(), m32.params().zero_grads();
  EXPECT_NEAR(m32.forward(mb, keys), m64.forward(mb, keys), 1e-4);
  m64.backward(1.0), m32.backward(1.0);
  for (const char* n : {"decoder.layers.0.mlp.router.weight",
                        "decoder.layers.0.self_attention.linear_qkv.weight"}) {
    Tensor g32 = m32.params().grad(n), g64 = m64.params().grad(n);
    Tensor g = Tensor::empty(g32.shape(), DType::F64);
    ops::copy(g32, g, Stream::cpu());
    ops::axpy(-1.0, g64, g, Stream::cpu());
    EXPECT_LE(std::sqrt(ops::sum_squares(g, Stream::cpu()) / ops::sum_squares(g64, Stream::cpu())),
              1e-4)
        << n;
  }
}

// ---- --moe-router-force-load-balancing / --moe-router-force-biased (router.h) ------------

namespace {
// The router of layer 0 of `c` on its own, f64: its logits for x [S*B, H] at (iteration,
// first sample) of a global batch of Bg samples.
Tensor router_logits(const TransformerConfig& c, const Tensor& x, int64_t S, int64_t B,
                     int64_t iteration, int64_t sample_offset, int64_t Bg) {
  model::ParamStore ps;
  std::vector<model::ParamInfo> infos;
  model::moe::Router::add_params(c, 0, infos);
  for (auto& p : infos) ps.add(p);
  ps.allocate(DType::F64, 0, 1);
  ps.initialize(3);
  model::moe::Router r(c, 0, &ps);
  model::StepKeys k;
  k.iteration = iteration, k.sample_offset = sample_offset, k.global_batch = Bg;
  const model::StepContext cx = model::make_step_context(c, S, B, k, nullptr);
  model::moe::Router::Saved s;
  model::allocate(
      [&](const model::TensorVisitor& v) { model::moe::Router::saved_specs(c, cx, s, v); },
      Device::CPU, true);
  r.forward(x, s, cx);
  return s.logits.clone();
}
Tensor normals(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = Philox::normal(seed, 0, i);
  return t;
}
double max_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  return d;
}
}  // namespace

// The logits are Philox normals of the tokens' global coordinates (s, b + first sample, e),
// whatever the input and the weights; the biased mode adds one vector, std x normals keyed by
// the micro-batch's first sample (std > 0) or by the layer alone (std < 0).
TEST(MoeForceBalance, RouterLogitsAreNormalsAtGlobalCoordinates) {
  auto c = tiny_moe(true, 1, 0.0);
  c.moe.force_load_balancing = true;
  const int64_t S = 6, B = 2, E = c.moe.num_experts, Bg = 8, b0 = 4;
  const Tensor x = normals({S * B, c.hidden_size}, 5);
  const Tensor l = router_logits(c, x, S, B, 7, b0, Bg);
  model::StepKeys k;
  k.iteration = 7;
  const auto key = model::dropout_key(c, k, 0, model::DropoutSite::RouterLogits);
  for (int64_t t = 0; t < S * B; ++t)
    for (int64_t e = 0; e < E; ++e) {
      const uint64_t gi = uint64_t(((t / B) * Bg + t % B + b0) * E + e);
      ASSERT_EQ(l.data<double>()[t * E + e], Philox::normal(key.seed, key.stream, gi)) << t;
    }
  const Tensor x2 = normals({S * B, c.hidden_size}, 6);
  EXPECT_EQ(max_diff(router_logits(c, x2, S, B, 7, b0, Bg), l), 0.0);
  EXPECT_GT(max_diff(router_logits(c, x, S, B, 8, b0, Bg), l), 0.1);  // iteration
  auto plain = c;
  plain.moe.force_load_balancing = false;
  EXPECT_GT(max_diff(router_logits(plain, x, S, B, 7, b0, Bg), l), 0.1);
  for (double std : {0.5, -0.5}) {
    auto bc = c;
    bc.moe.force_load_balancing = false;  // implied by the bias, as in Megatron
    bc.moe.force_biased_given = true, bc.moe.force_biased = std;
    auto bias_of = [&](int64_t it, int64_t first) {
      const Tensor lb = router_logits(bc, x, S, B, it, first, Bg),
                   ln = router_logits(c, x, S, B, it, first, Bg);
      std::vector<double> v(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) v[size_t(e)] = lb.data<double>()[e] - ln.data<double>()[e];
      for (int64_t t = 1; t < S * B; ++t)  // one vector for every token
        for (int64_t e = 0; e < E; ++e)
          EXPECT_NEAR(lb.data<double>()[t * E + e] - ln.data<double>()[t * E + e],
                      v[size_t(e)], 1e-12);
      return v;
    };
    const auto v = bias_of(7, b0);
    model::StepKeys kb;
    kb.iteration = std > 0 ? 7 : -1;
    const auto bk = model::dropout_key(c, kb, 0, model::DropoutSite::RouterBias);
    for (int64_t e = 0; e < E; ++e)
      EXPECT_NEAR(v[size_t(e)],
                  0.5 * Philox::normal(bk.seed, bk.stream,
                                       uint64_t(std > 0 ? b0 * E + e : e)),
                  1e-12);
    const auto other = bias_of(9, b0 + 2);  // another micro-batch of another iteration
    if (std > 0)
      EXPECT_GT(std::fabs(other[0] - v[0]) + std::fabs(other[1] - v[1]), 1e-3);
    else
      for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(other[size_t(e)], v[size_t(e)], 1e-12);
  }
}

// A router whose weights send every token to experts 0 and 1 (zero logits: the first two
// win the ties) spreads them over all four experts in the benchmark mode, about evenly.
// The loss then ignores the router weights W, and the backward is Megatron's straight-
// through one: dlogits enters the gating GEMM's backward, so W gets dlogits^T x and the
// router's input gets dlogits W on top of its true gradient. So: at W = 0 every other
// gradient is the loss's own (central finite differences); W's gradient does not depend on
// W; and the other gradients move exactly linearly in W (by dlogits W through the layers
// below), which a test at W, 2W and 0 shows.
TEST(MoeForceBalance, TokensSpreadEvenlyAndTheGradientIsStraightThrough) {
  auto c = tiny_moe(true, 1, 0.0);
  const std::string router = "decoder.layers.0.mlp.router.weight";
  auto run_counts = [&](bool force) {
    auto k = c;
    k.moe.force_load_balancing = force;
    model::GPTModel m(k);
    Tensor w = m.params().param(router);
    ops::fill(w, 0.0, Stream::cpu());
    model::StepKeys keys;
    m.forward(batch(64, k.seq_length, 13, 11), keys);
    return moe_layers(m)[0]->stats().tokens_per_expert;
  };
  const auto plain = run_counts(false), forced = run_counts(true);
  const double N = 64.0 * double(c.seq_length) * double(c.moe.topk);  // routed rows
  EXPECT_EQ(plain[2] + plain[3], 0.0);
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(forced[size_t(e)], N / 4, 4 * std::sqrt(N / 4)) << e;

  c.moe.force_load_balancing = true;
  model::GPTModel m(c);
  auto mb = batch(2, c.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  auto& ps = m.params();
  Tensor rw = ps.param(router);
  const Tensor w1 = rw.clone();
  double loss = 0;
  auto grads_at = [&](double a) {  // W = a * w1
    for (int64_t i = 0; i < rw.numel(); ++i) rw.data<double>()[i] = a * w1.data<double>()[i];
    ps.zero_grads();
    loss = total(m, mb, keys);
    m.backward(1.0);
    return ps.flat_grads().clone();
  };
  const Tensor g1 = grads_at(1), g2 = grads_at(2);
  const double l_w = loss;
  const Tensor g0 = grads_at(0);
  EXPECT_EQ(loss, l_w);  // the logits ignore the weights
  bool moved = false;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    for (int64_t e = 0; e < p.numel(); ++e) {
      const int64_t o = p.offset + e;
      const double a0 = g0.data<double>()[o], a1 = g1.data<double>()[o], a2 = g2.data<double>()[o];
      if (p.name == router) {
        ASSERT_NEAR(a1, a0, 1e-12) << router;
        ASSERT_NEAR(a2, a0, 1e-12) << router;
      } else {
        ASSERT_NEAR(a2 - a0, 2 * (a1 - a0), 1e-12 * std::max(1.0, std::fabs(a2))) << p.name;
        moved = moved || std::fabs(a1 - a0) > 1e-6;
      }
    }
  }
  EXPECT_TRUE(moved);  // the layers below the router see dlogits W
  EXPECT_GT(ops::sum_squares(ps.grad(router), Stream::cpu()), 1e-12);
  // W = 0: the loss's own gradient everywhere but W (model_fd sets up the same batch and keys)
  model_fd(
      c,
      [&](model::GPTModel& mm) {
        Tensor w = mm.params().param(router);
        ops::fill(w, 0.0, Stream::cpu());
      },
      [&](const std::string& n) { return n == router; });
}

// The two flags reach the model's configuration; a dense model refuses them, as every MoE flag.
TEST(MoeFlags, ForceLoadBalancingFlags) {
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-force-load-balancing"}), "");
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-router-force-biased", "-0.5"}), "");
  EXPECT_NE(start_up_error({"--moe-router-force-load-balancing"}).find("--num-experts"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--moe-router-force-biased", "1"}).find("--num-experts"),
            std::string::npos);
  std::vector<std::string> argv = {"--num-layers", "2", "--hidden-size", "32",
                                   "--num-attention-heads", "4", "--seq-length", "16",
                                   "--max-position-embeddings", "16", "--micro-batch-size", "2",
                                   "--lr", "1e-3", "--train-iters", "5", "--mock-data",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                                   "--num-experts", "4", "--moe-router-force-load-balancing",
                                   "--moe-router-force-biased", "-0.25"};
  auto a = training::parse_args(argv);
  training::validate_args(a, 1);
  const auto c = training::model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(c.moe.force_load_balancing);
  EXPECT_TRUE(c.moe.force_biased_given);
  EXPECT_EQ(c.moe.force_biased, -0.25);
}

// --moe-input-jitter-eps: the router reads its input times a fixed (keyed) factor per
// element, so the model is a deterministic function of its weights: every gradient against
// central finite differences of LM + aux + z losses (f64, dropout on), with the router in the
// model's dtype; the jitter moves the loss.
TEST(MoeModelGrad, InputJitterFiniteDifferences) {
  auto c = tiny_moe(true, 2, 0.2);
  c.moe.input_jitter_eps = 0.3;
  model_fd(c);
  auto plain = c;
  plain.moe.input_jitter_eps = 0;
  model::GPTModel a(c), b(plain);
  ops::copy(a.params().flat_params(), b.params().flat_params(), Stream::cpu());
  const auto mb = batch(2, c.seq_length, 13, 11);
  model::StepKeys k;
  EXPECT_GT(std::fabs(total(a, mb, k) - total(b, mb, k)), 1e-6);
}

TEST(MoeFlags, InputJitterEps) {
  EXPECT_EQ(start_up_error({"--num-experts", "4", "--moe-input-jitter-eps", "0.01"}), "");
  EXPECT_NE(start_up_error({"--moe-input-jitter-eps", "0.01"}).find("--num-experts"),
            std::string::npos);
  EXPECT_NE(start_up_error({"--num-experts", "4", "--moe-input-jitter-eps", "0"})
                .find("--moe-input-jitter-eps 0 must be positive"),
            std::string::npos);
}
