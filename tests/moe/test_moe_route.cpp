// The routing ops (catalogue.inc, ---- MoE routing) on the CPU in f64 against the host
// routing (model/moe/routing.h, itself checked by finite differences in test_moe): for every
// score function, pre-softmax, group-limited top-k, the expert bias and the scaling factor,
// the selected experts and their weights, the dispatch index (rows per expert, each row's
// token, each token's rows), the aux / seq-aux / z-loss values and the routing backward
// (d(loss)/d(prob) through the Jacobian plus the aux and z gradients of a token range).
// Logits are drawn from a coarse grid so that exact ties occur: both must break them alike.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "base/philox.h"
#include "model/moe/moe_layer.h"
#include "model/moe/routing.h"
#include "ops/ops.h"

using namespace mcpp;
using model::TransformerConfig;
namespace moe = model::moe;
using Balance = TransformerConfig::Moe::Balance;

namespace {

struct Case {
  std::string name;
  TransformerConfig::Moe m;
  bool bias = false;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  auto base = [](int64_t E, int64_t k) {
    TransformerConfig::Moe m;
    m.num_experts = E, m.topk = k, m.ffn_hidden_size = 4, m.aux_loss_coeff = 1e-2;
    return m;
  };
  v.push_back({"softmax_post_aux_z", base(8, 2)});
  v.back().m.z_loss_coeff = 1e-3;
  v.push_back({"softmax_pre_scaled", base(8, 3)});
  v.back().m.pre_softmax = true, v.back().m.topk_scaling_factor = 2.5;
  v.push_back({"softmax_seq_aux_groups", base(16, 4)});
  v.back().m.balance = Balance::SeqAuxLoss, v.back().m.num_groups = 4, v.back().m.group_topk = 2;
  v.push_back({"sigmoid_bias_groups_scaled", base(16, 6)});
  auto& s = v.back().m;
  s.sigmoid = true, s.num_groups = 8, s.group_topk = 3, s.topk_scaling_factor = 2.0;
  s.z_loss_coeff = 1e-3, v.back().bias = true;
  v.push_back({"sigmoid_top1_seq_aux", base(8, 1)});
  v.back().m.sigmoid = true, v.back().m.balance = Balance::SeqAuxLoss;
  v.push_back({"no_balance", base(4, 2)});
  v.back().m.balance = Balance::None;
  return v;
}

Tensor f64(const std::vector<double>& v) { return Tensor::from(v, {int64_t(v.size())}); }
std::vector<int64_t> i64v(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

}  // namespace

TEST(MoeRouteOps, F64MatchesHostRouting) {
  const int64_t S = 24, B = 3, T = S * B;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto& m = c.m;
    const int64_t E = m.num_experts, k = m.topk;
    std::vector<double> l(size_t(T * E)), bias;
    // A grid of 0.25: many exact ties between a token's experts.
    for (int64_t i = 0; i < T * E; ++i)
      l[size_t(i)] = 0.25 * double(int64_t(Philox::u32(9, 1, uint64_t(i)) % 13) - 6);
    if (c.bias)
      for (int64_t e = 0; e < E; ++e) bias.push_back(0.125 * double(e % 3));
    std::vector<float> bias_f(bias.begin(), bias.end());
    const moe::Routing r = moe::route(m, l.data(), T, B, c.bias ? bias.data() : nullptr);
    const ops::MoeRouteSpec spec = moe::route_spec(m);

    Tensor logits = Tensor::from(l, {T, E});
    Tensor tb = c.bias ? Tensor::from(bias_f, {E}) : Tensor();
    Tensor idx = Tensor::empty({T, k}, DType::I64), prob = Tensor::empty({T, k}, DType::F64);
    ops::moe_route_topk(logits, tb, spec, idx, prob, Stream::cpu());
    for (int64_t i = 0; i < T * k; ++i) {
      ASSERT_EQ(idx.data<int64_t>()[i], r.idx[size_t(i)]) << "slot " << i;
      EXPECT_NEAR(prob.data<double>()[i], r.prob[size_t(i)], 1e-14) << "slot " << i;
    }

    Tensor counts = Tensor::empty({E}, DType::I64), src = Tensor::empty({T * k}, DType::I64);
    Tensor row_slot = Tensor::empty({T * k}, DType::I64), slot_row = Tensor::empty({T * k}, DType::I64);
    Tensor off = Tensor::empty({T + 1}, DType::I64), rows = Tensor::empty({T * k}, DType::I64);
    ops::moe_route_index(idx, E, counts, src, row_slot, slot_row, off, rows, Stream::cpu());
    EXPECT_EQ(i64v(counts), r.counts);
    EXPECT_EQ(i64v(src), r.row_token);
    EXPECT_EQ(i64v(off), r.tok_offsets);
    EXPECT_EQ(i64v(rows), r.tok_rows);
    for (int64_t n = 0; n < T * k; ++n) {
      EXPECT_EQ(row_slot.data<int64_t>()[n], r.row_token[size_t(n)] * k + r.row_slot[size_t(n)]);
      EXPECT_EQ(slot_row.data<int64_t>()[row_slot.data<int64_t>()[n]], n);
    }
    // The weights in row order (what the experts scale by).
    Tensor pr = Tensor::empty({T * k}, DType::F64);
    ops::moe_gather(prob, row_slot, pr, Stream::cpu());
    for (int64_t n = 0; n < T * k; ++n)
      EXPECT_EQ(pr.data<double>()[n], r.prob[size_t(r.row_token[size_t(n)] * k + r.row_slot[size_t(n)])]);

    const int64_t G = spec.seq_aux ? B : 1;
    Tensor aux_counts = Tensor::empty({G * E}, DType::F64), losses = Tensor::empty({2}, DType::F64);
    ops::moe_route_stats(logits, spec, B, aux_counts, losses, Stream::cpu());
    if (spec.aux) {
      for (int64_t i = 0; i < G * E; ++i) EXPECT_EQ(aux_counts.data<double>()[i], r.aux_counts[size_t(i)]);
      EXPECT_NEAR(losses.data<double>()[0] * m.aux_loss_coeff, r.aux_loss, 1e-14 * std::abs(r.aux_loss) + 1e-300);
      EXPECT_GT(r.aux_loss, 0);
    } else {
      EXPECT_EQ(losses.data<double>()[0], 0.0);
    }
    EXPECT_NEAR(losses.data<double>()[1] * m.z_loss_coeff, r.z_loss, 1e-14 * std::abs(r.z_loss) + 1e-300);

    // Backward: random d(loss)/d(prob), the aux / z gradients of tokens [r0, r1) only.
    std::vector<double> dp(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) dp[size_t(i)] = Philox::normal(11, 2, uint64_t(i));
    const int64_t r0 = T / 3, r1 = T - 5;
    const double aux_scale = 0.375;
    std::vector<double> dl_ref(size_t(T * E));
    moe::route_backward(m, r, l.data(), dp.data(), aux_scale, r0, r1, B, dl_ref.data());
    Tensor dl = Tensor::empty({T, E}, DType::F64);
    ops::moe_route_backward(logits, idx, Tensor::from(dp, {T, k}), aux_counts, spec, B, aux_scale,
                            r0, r1, dl, Stream::cpu());
    double worst = 0, mag = 0;
    for (int64_t i = 0; i < T * E; ++i) {
      worst = std::max(worst, std::abs(dl.data<double>()[i] - dl_ref[size_t(i)]));
      mag = std::max(mag, std::abs(dl_ref[size_t(i)]));
    }
    EXPECT_GT(mag, 1e-3);
    EXPECT_LE(worst, 1e-13 * mag);
  }
}

// Rejected arguments name the op and what is wrong.
TEST(MoeRouteOps, BadArgumentsAreErrors) {
  ops::MoeRouteSpec spec;
  spec.E = 4, spec.k = 5;
  Tensor logits = Tensor::zeros({6, 4}, DType::F64);
  Tensor idx = Tensor::empty({6, 5}, DType::I64), prob = Tensor::empty({6, 5}, DType::F64);
  try {
    ops::moe_route_topk(logits, Tensor(), spec, idx, prob, Stream::cpu());
    FAIL() << "top-5 of 4 experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_route_topk"), std::string::npos) << e.what();
  }
  spec.k = 2;
  Tensor idx32 = Tensor::empty({6, 2}, DType::I32), p2 = Tensor::empty({6, 2}, DType::F64);
  EXPECT_THROW(ops::moe_route_topk(logits, Tensor(), spec, idx32, p2, Stream::cpu()), Error);
}
