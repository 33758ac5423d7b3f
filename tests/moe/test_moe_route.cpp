// The routing ops (catalogue.inc, ---- MoE routing) on the CPU in f64 against the host
// routing (model/moe/routing.h, itself checked by finite differences in test_moe): for every
// score function, pre-softmax, group-limited top-k, the expert bias and the scaling factor,
// the selected experts and their weights, the dispatch index (rows per expert, each row's
// token, each token's rows), the aux / seq-aux / z-loss values and the routing backward
// (d(loss)/d(prob) through the Jacobian plus the aux and z gradients of a token range).
// Logits are drawn from a coarse grid so that exact ties occur: both must break them alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/philox.h"
#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"
#include "model/moe/routing.h"
#include "moe_layer_harness.h"
#include "moe_test_util.h"
#include "ops/ops.h"

using namespace mcpp;
using model::TransformerConfig;
namespace moe = model::moe;
using test::moe_layers;
using Balance = TransformerConfig::Moe::Balance;
using Score = TransformerConfig::Moe::Score;

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
    m.num_experts = E, m.topk = k, m.ffn_hidden_size = 4, m.aux_loss_coeff = {1e-2};
    return m;
  };
  v.push_back({"softmax_post_aux_z", base(8, 2)});
  v.back().m.z_loss_coeff = 1e-3;
  v.push_back({"softmax_pre_scaled", base(8, 3)});
  v.back().m.pre_softmax = true, v.back().m.topk_scaling_factor = 2.5;
  v.push_back({"softmax_seq_aux_groups", base(16, 4)});
  v.back().m.balance = {Balance::SeqAuxLoss}, v.back().m.num_groups = 4, v.back().m.group_topk = 2;
  v.push_back({"sigmoid_bias_groups_scaled", base(16, 6)});
  auto& s = v.back().m;
  s.score = Score::Sigmoid, s.num_groups = 8, s.group_topk = 3, s.topk_scaling_factor = 2.0;
  s.z_loss_coeff = 1e-3, v.back().bias = true;
  v.push_back({"sigmoid_top1_seq_aux", base(8, 1)});
  v.back().m.score = Score::Sigmoid, v.back().m.balance = {Balance::SeqAuxLoss};
  v.push_back({"no_balance", base(4, 2)});
  v.back().m.balance = {Balance::None};
  // sqrtsoftplus (routed as sigmoid), and several load-balancing types at once.
  v.push_back({"sqrtsoftplus_bias_groups_every_aux_z", base(16, 4)});
  auto& q = v.back().m;
  q.score = Score::SqrtSoftplus, q.num_groups = 4, q.group_topk = 2, q.z_loss_coeff = 1e-3;
  q.balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  q.aux_loss_coeff = {1e-2, 2e-2, 3e-2}, v.back().bias = true;
  v.push_back({"sqrtsoftplus_top1_global_aux", base(8, 1)});
  v.back().m.score = Score::SqrtSoftplus, v.back().m.balance = {Balance::GlobalAuxLoss};
  v.push_back({"softmax_aux_and_global_aux", base(8, 2)});
  v.back().m.balance = {Balance::GlobalAuxLoss, Balance::AuxLoss};
  v.back().m.aux_loss_coeff = {2e-2, 1e-2};
  v.push_back({"sigmoid_pre_seq_aux_and_global_aux_z", base(8, 3)});
  v.back().m.score = Score::Sigmoid, v.back().m.z_loss_coeff = 1e-3;
  v.back().m.balance = {Balance::SeqAuxLoss, Balance::GlobalAuxLoss, Balance::None};
  v.back().m.aux_loss_coeff = {2e-2, 1e-2, 0.0};
  return v;
}

// The host routing's aux counts in the routing ops' rows (ops::moe_aux_rows): seq_aux_loss's
// B rows, then aux_loss's, then global_aux_loss's, where the spec asks for them.
std::vector<double> host_rows(const ops::MoeRouteSpec& spec, const moe::Routing& r) {
  std::vector<double> v;
  if (spec.seq_aux) v.insert(v.end(), r.seq_counts.begin(), r.seq_counts.end());
  if (spec.aux) v.insert(v.end(), r.aux_counts.begin(), r.aux_counts.end());
  if (spec.global_aux) v.insert(v.end(), r.global_counts.begin(), r.global_counts.end());
  return v;
}

// The stats op's losses [4] (without coefficients) against the host routing's, each type
// with its coefficient; every loss asked for is positive, the others 0.
void expect_losses(const Tensor& losses, const TransformerConfig::Moe& m, const moe::Routing& r,
                   const ops::MoeRouteSpec& spec, double tol) {
  const double* L = losses.data<double>();
  const struct {
    bool on;
    double coeff, host;
    const char* name;
  } v[4] = {{spec.aux, m.coeff(Balance::AuxLoss), r.aux_loss, "aux_loss"},
            {spec.seq_aux, m.coeff(Balance::SeqAuxLoss), r.seq_aux_loss, "seq_aux_loss"},
            {spec.global_aux, m.coeff(Balance::GlobalAuxLoss), r.global_aux_loss,
             "global_aux_loss"},
            {spec.z, m.z_loss_coeff, r.z_loss, "z_loss"}};
  for (int i = 0; i < 4; ++i) {
    if (!v[i].on) {
      EXPECT_EQ(L[i], 0.0) << v[i].name;
      EXPECT_EQ(v[i].host, 0.0) << v[i].name;
      continue;
    }
    EXPECT_GT(v[i].host, 0) << v[i].name;
    EXPECT_NEAR(L[i] * v[i].coeff, v[i].host, tol * v[i].host) << v[i].name;
  }
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
    Tensor bias_counts = Tensor::empty({E}, DType::I64);
    ops::moe_route_index(idx, prob, spec, 1, counts, bias_counts, src, row_slot, slot_row, off,
                         rows, Stream::cpu());
    EXPECT_EQ(i64v(counts), r.counts);
    EXPECT_EQ(i64v(bias_counts), r.counts);
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

    const int64_t R = ops::moe_aux_rows(spec, B);
    Tensor aux_counts = Tensor::empty({std::max<int64_t>(R, 1) * E}, DType::F64);
    Tensor losses = Tensor::empty({4}, DType::F64);
    if (spec.any_aux()) ops::moe_route_counts(logits, spec, B, aux_counts, Stream::cpu());
    ops::moe_route_stats(logits, aux_counts, spec, B, losses, Stream::cpu());
    const std::vector<double> hrows = host_rows(spec, r);
    ASSERT_EQ(int64_t(hrows.size()), R * E);
    for (int64_t i = 0; i < R * E; ++i) EXPECT_EQ(aux_counts.data<double>()[i], hrows[size_t(i)]);
    expect_losses(losses, m, r, spec, 1e-14);

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

// ---- capacity, padding and context parallelism ------------------------------------------

namespace {

struct CapCase {
  std::string name;
  TransformerConfig::Moe m;
  int64_t blocks = 1;
  std::vector<double> bias;  // the expert bias (sigmoid), empty for none
  bool grid = false;         // logits on a coarse grid (exact ties between tokens' weights)
  int64_t cp = 1;            // a CP group whose other ranks hold the same tokens
  bool drops = false, pads = false;  // what the case must exercise
};

std::vector<CapCase> cap_cases() {
  auto base = [](int64_t E, int64_t k) {
    TransformerConfig::Moe m;
    m.num_experts = E, m.topk = k, m.ffn_hidden_size = 4, m.aux_loss_coeff = {1e-2};
    m.z_loss_coeff = 1e-3;
    return m;
  };
  std::vector<CapCase> v;
  v.push_back({"probs_cf1_ties", base(8, 2)});
  v.back().m.capacity_factor = 1.0, v.back().grid = true, v.back().drops = true;
  v.push_back({"probs_pad_to_capacity_3_blocks", base(8, 2), 3});
  auto* m = &v.back().m;
  m->pre_softmax = true, m->topk_scaling_factor = 2.5, m->balance = {Balance::SeqAuxLoss};
  m->capacity_factor = 0.75, m->pad_to_capacity = true;
  v.back().grid = true, v.back().drops = v.back().pads = true;
  v.push_back({"position_cf05_2_blocks", base(4, 2), 2});
  v.back().m.capacity_factor = 0.5, v.back().m.drop_by_position = true, v.back().drops = true;
  v.push_back({"position_pad_to_capacity_sigmoid_groups", base(8, 3), 2});
  m = &v.back().m;
  m->score = Score::Sigmoid, m->num_groups = 4, m->group_topk = 3, m->capacity_factor = 1.25;
  m->drop_by_position = true, m->pad_to_capacity = true;
  v.back().bias = {0.3, 0.0, 0.1, 0.0, 0.2, 0.0, 0.0, 0.4};
  v.back().drops = v.back().pads = true;
  v.push_back({"pad_multiple_dropless_3_blocks", base(8, 2), 3});
  v.back().m.pad_multiple = 8, v.back().grid = true, v.back().pads = true;
  v.push_back({"probs_pad_multiple_2_blocks", base(8, 2), 2});
  v.back().m.capacity_factor = 1.0, v.back().m.pad_multiple = 4;
  v.back().drops = v.back().pads = true;
  v.push_back({"probs_pad_to_capacity_and_multiple", base(8, 2), 2});
  v.back().m.capacity_factor = 0.5, v.back().m.pad_to_capacity = true;
  v.back().m.pad_multiple = 16, v.back().drops = v.back().pads = true;
  // Every token picks expert 2 (a bias far above the scores): it keeps its capacity, the
  // others receive only padding.
  for (bool position : {false, true}) {
    v.push_back({position ? "all_to_one_expert_position" : "all_to_one_expert_probs", base(4, 1),
                 2});
    m = &v.back().m;
    m->score = Score::Sigmoid, m->capacity_factor = 1.0, m->drop_by_position = position;
    m->pad_to_capacity = position;
    v.back().bias = {0.0, 0.0, 100.0, 0.0}, v.back().drops = true, v.back().pads = position;
  }
  // Every token on expert 2 and rows padded to 16: its 36 rows a block would need 12 more,
  // but no token is left to pad with (at most all of a block's tokens per expert).
  v.push_back({"all_to_one_expert_pad_multiple", base(4, 1), 2});
  v.back().m.score = Score::Sigmoid, v.back().m.pad_multiple = 16, v.back().pads = false;
  v.back().bias = {0.0, 0.0, 100.0, 0.0};
  // Expert 5 is never picked (a bias far below): no rows dropless, only padding with it.
  v.push_back({"zero_token_expert_pad_multiple", base(8, 2), 3});
  m = &v.back().m;
  m->score = Score::Sigmoid, m->capacity_factor = 2.0, m->pad_multiple = 4, v.back().pads = true;
  v.back().bias = {0, 0, 0, 0, 0, -100.0, 0, 0};
  v.push_back({"zero_token_expert_pad_to_capacity", base(8, 2), 1});
  m = &v.back().m;
  m->score = Score::Sigmoid, m->capacity_factor = 0.5, m->pad_to_capacity = true;
  v.back().bias = {0, 0, 0, 0, 0, -100.0, 0, 0}, v.back().drops = v.back().pads = true;
  // Context parallelism (a group of two with the same tokens): the summed counts, T x CP.
  v.push_back({"cp2_probs_cf1", base(8, 2), 1});
  v.back().m.capacity_factor = 1.0, v.back().cp = 2, v.back().drops = true;
  v.push_back({"cp2_seq_aux_dropless", base(8, 3), 1});
  v.back().m.balance = {Balance::SeqAuxLoss}, v.back().cp = 2;
  // ... every aux loss at once (global_aux_loss's counts summed over a DP x CP group of two
  // with the same tokens), sqrtsoftplus, capacity.
  v.push_back({"cp2_sqrtsoftplus_every_aux_cf1", base(8, 2), 2});
  m = &v.back().m;
  m->score = Score::SqrtSoftplus, m->capacity_factor = 1.0;
  m->balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  m->aux_loss_coeff = {1e-2, 2e-2, 3e-2}, v.back().cp = 2, v.back().drops = true;
  return v;
}

}  // namespace

// The routing ops with capacity, padding and CP equal the host routing exactly: the same
// experts, the same kept (token, slot) pairs (dropped weights 0), the same rows per expert,
// the same token and slot of every row (padding rows slot -1), each token's rows, the
// expert-bias counts; weights, losses and the backward (d(prob) gathered through slot_row,
// as the layer does) to f64 rounding.
TEST(MoeRouteOps, F64CapacityAndPaddingMatchHostRouting) {
  const int64_t S = 24, B = 3, T = S * B;
  for (const auto& c : cap_cases()) {
    SCOPED_TRACE(c.name);
    const auto& m = c.m;
    const int64_t E = m.num_experts, k = m.topk;
    std::vector<double> l(size_t(T * E));
    for (int64_t i = 0; i < T * E; ++i)
      l[size_t(i)] = c.grid ? 0.25 * double(int64_t(Philox::u32(9, 1, uint64_t(i)) % 13) - 6)
                            : 1.5 * Philox::normal(9, 3, uint64_t(i));
    const double* bias = c.bias.empty() ? nullptr : c.bias.data();
    moe::AuxLossGroup cpg;
    cpg.ranks = c.cp;
    if (c.cp > 1) {
      cpg.sum = [&](std::vector<double>& v) {
        for (double& x : v) x *= double(c.cp);
      };
      cpg.global_ranks = c.cp, cpg.global = cpg.sum;  // one micro-batch: the mean is the sum
    }
    const moe::Routing r = moe::route(m, l.data(), T, B, bias, c.blocks, cpg);
    ops::MoeRouteSpec spec = moe::route_spec(m);
    spec.cp = c.cp, spec.global_ranks = c.cp;

    Tensor logits = Tensor::from(l, {T, E});
    std::vector<float> bias_f(c.bias.begin(), c.bias.end());
    Tensor tb = bias ? Tensor::from(bias_f, {E}) : Tensor();
    Tensor idx = Tensor::empty({T, k}, DType::I64), prob = Tensor::empty({T, k}, DType::F64);
    ops::moe_route_topk(logits, tb, spec, idx, prob, Stream::cpu());
    const int64_t Nmax = ops::moe_route_max_rows(spec, T, c.blocks);
    auto i64 = [](int64_t n) { return Tensor::empty({n}, DType::I64); };
    Tensor counts = i64(E), bias_counts = i64(E), src = i64(Nmax), row_slot = i64(Nmax);
    Tensor slot_row = i64(T * k), off = i64(T + 1), rows = i64(Nmax);
    ops::moe_route_index(idx, prob, spec, c.blocks, counts, bias_counts, src, row_slot, slot_row,
                         off, rows, Stream::cpu());

    int64_t dropped = 0;
    for (int64_t i = 0; i < T * k; ++i) {
      ASSERT_EQ(idx.data<int64_t>()[i], r.idx[size_t(i)]) << "slot " << i;
      EXPECT_EQ(slot_row.data<int64_t>()[i] >= 0, r.kept[size_t(i)] != 0) << "slot " << i;
      EXPECT_NEAR(prob.data<double>()[i], r.prob[size_t(i)], 1e-14) << "slot " << i;
      if (!r.kept[size_t(i)]) EXPECT_EQ(prob.data<double>()[i], 0.0) << "dropped slot " << i;
      dropped += !r.kept[size_t(i)];
    }
    EXPECT_EQ(i64v(counts), r.counts);
    int64_t N = 0, pad_rows = 0;
    for (int64_t e = 0; e < E; ++e) N += counts.data<int64_t>()[e];
    ASSERT_EQ(N, int64_t(r.row_token.size()));
    ASSERT_LE(N, Nmax);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t = r.row_token[size_t(n)], j = r.row_slot[size_t(n)];
      EXPECT_EQ(src.data<int64_t>()[n], t) << "row " << n;
      EXPECT_EQ(row_slot.data<int64_t>()[n], j >= 0 ? t * k + j : -1) << "row " << n;
      if (j >= 0) EXPECT_EQ(slot_row.data<int64_t>()[t * k + j], n) << "row " << n;
      pad_rows += j < 0;
    }
    EXPECT_EQ(i64v(off), r.tok_offsets);
    EXPECT_EQ(std::vector<int64_t>(rows.data<int64_t>(), rows.data<int64_t>() + N), r.tok_rows);
    for (int64_t e = 0; e < E; ++e)
      EXPECT_EQ(double(bias_counts.data<int64_t>()[e]), r.tokens_per_expert[size_t(e)]) << e;
    EXPECT_EQ(dropped > 0, c.drops) << dropped << " dropped pairs";
    EXPECT_EQ(pad_rows > 0, c.pads) << pad_rows << " padding rows";

    // The weights in row order (padding rows 0).
    Tensor pr = Tensor::empty({N}, DType::F64);
    ops::moe_gather(prob, row_slot.narrow(0, N), pr, Stream::cpu());
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t = r.row_token[size_t(n)], j = r.row_slot[size_t(n)];
      EXPECT_EQ(pr.data<double>()[n], j >= 0 ? prob.data<double>()[t * k + j] : 0.0) << n;
    }

    // Statistics: the counts (summed over the CP group), then the losses.
    const int64_t R = ops::moe_aux_rows(spec, B);
    Tensor aux_counts = Tensor::empty({R * E}, DType::F64), losses = Tensor::empty({4}, DType::F64);
    ops::moe_route_counts(logits, spec, B, aux_counts, Stream::cpu());
    for (int64_t i = 0; i < R * E; ++i) aux_counts.data<double>()[i] *= double(c.cp);
    ops::moe_route_stats(logits, aux_counts, spec, B, losses, Stream::cpu());
    const std::vector<double> hrows = host_rows(spec, r);
    ASSERT_EQ(int64_t(hrows.size()), R * E);
    for (int64_t i = 0; i < R * E; ++i) EXPECT_EQ(aux_counts.data<double>()[i], hrows[size_t(i)]);
    expect_losses(losses, m, r, spec, 1e-14);

    // Backward: d(loss)/d(prob) per row, gathered to the (token, slot)s through slot_row
    // (dropped: 0); the host routing gets the same values and 7 at the dropped slots,
    // which it must ignore.
    std::vector<double> dp_rows(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) dp_rows[size_t(n)] = Philox::normal(11, 2, uint64_t(n));
    Tensor dprob = Tensor::empty({T * k}, DType::F64);
    ops::moe_gather(Tensor::from(dp_rows, {N}), slot_row, dprob, Stream::cpu());
    std::vector<double> dp_host(size_t(T * k), 7.0);
    for (int64_t i = 0; i < T * k; ++i)
      if (r.kept[size_t(i)]) dp_host[size_t(i)] = dp_rows[size_t(slot_row.data<int64_t>()[i])];
    const int64_t r0 = T / 3, r1 = T - 5;
    const double aux_scale = 0.375;
    std::vector<double> dl_ref(size_t(T * E));
    moe::route_backward(m, r, l.data(), dp_host.data(), aux_scale, r0, r1, B, dl_ref.data());
    Tensor dl = Tensor::empty({T, E}, DType::F64);
    ops::moe_route_backward(logits, idx, dprob, aux_counts, spec, B, aux_scale, r0, r1, dl,
                            Stream::cpu());
    double worst = 0, mag = 0;
    for (int64_t i = 0; i < T * E; ++i) {
      worst = std::max(worst, std::abs(dl.data<double>()[i] - dl_ref[size_t(i)]));
      mag = std::max(mag, std::abs(dl_ref[size_t(i)]));
    }
    EXPECT_GT(mag, 1e-3);
    EXPECT_LE(worst, 1e-13 * mag);
  }
}

// ---- the layer's device path on the CPU ---------------------------------------------------

namespace {

TransformerConfig tiny_model() {
  TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 2;
  c.seq_length = 12, c.max_position_embeddings = 16, c.padded_vocab_size = 16;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1, c.dtype = DType::F64;
  c.init_method_std = 0.3, c.num_query_groups = 2, c.ffn_hidden_size = 12;
  c.rope = c.rmsnorm = c.swiglu = true, c.add_bias_linear = false;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.05}, c.moe.z_loss_coeff = 0.01;
  return c;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-30, std::abs(b)); }

}  // namespace

// Whole f64 models whose MoE layers route with the routing ops (RoutingPlace::Ops, the GPU's
// path, here on the CPU) against the same models routing on the host: the loss, every
// gradient, the expert-bias counts and the aux / z losses, for capacity with both drop
// policies, pad-to-capacity and the FP8 router padding.
TEST(MoeRouteOpsInLayer, CapacityModelsMatchHostRouting) {
  struct V {
    const char* name;
    double cf;
    bool position, pad;
    int64_t multiple;
  };
  for (V v : {V{"probs", 1.0, false, false, 0}, V{"probs_pad_to_capacity", 0.75, false, true, 0},
              V{"position", 0.5, true, false, 0}, V{"position_pad_to_capacity", 1.0, true, true, 0},
              V{"pad_multiple", 0.0, false, false, 8},
              V{"probs_pad_multiple", 1.0, false, false, 4}}) {
    SCOPED_TRACE(v.name);
    TransformerConfig c = tiny_model();
    c.moe.capacity_factor = v.cf, c.moe.drop_by_position = v.position;
    c.moe.pad_to_capacity = v.pad, c.moe.pad_multiple = v.multiple;
    auto mb = [&] {
      model::MicroBatch b;
      const int64_t Bn = 3, S = c.seq_length;
      b.tokens = Tensor::empty({Bn, S}, DType::I64), b.labels = Tensor::empty({Bn, S}, DType::I64);
      b.loss_mask = Tensor::empty({Bn, S}, DType::F32);
      for (int64_t i = 0; i < Bn * S; ++i) {
        b.tokens.data<int64_t>()[i] = Philox::u32(5, 1, uint64_t(i)) % 16;
        b.labels.data<int64_t>()[i] = Philox::u32(5, 2, uint64_t(i)) % 16;
        b.loss_mask.data<float>()[i] = 1.f;
      }
      return b;
    }();
    model::StepKeys keys;
    keys.iteration = 2;
    struct Out {
      double loss = 0;
      std::vector<double> grads, tpe, aux, z;
      bool ops = false;  // whether the routing ops ran (their statistics live on the device)
    };
    auto run = [&](moe::MoeLayer::RoutingPlace place) {
      model::GPTModel m(c);
      for (auto* l : moe_layers(m)) l->set_routing_place(place);
      m.params().zero_grads();
      Out o;
      o.loss = m.forward(mb, keys);
      m.backward(1.0);
      const Tensor& g = m.params().flat_grads();
      o.grads.assign(g.data<double>(), g.data<double>() + g.numel());
      for (auto* l : moe_layers(m)) {
        o.ops = l->stats().dev_sum.defined();
        l->sync_stats();
        o.tpe.insert(o.tpe.end(), l->stats().tokens_per_expert.begin(),
                     l->stats().tokens_per_expert.end());
        o.aux.push_back(l->stats().last_aux_sum()), o.z.push_back(l->stats().last_z_loss);
      }
      return o;
    };
    const Out host = run(moe::MoeLayer::RoutingPlace::Host);
    const Out dev = run(moe::MoeLayer::RoutingPlace::Ops);
    EXPECT_FALSE(host.ops);
    EXPECT_TRUE(dev.ops);
    EXPECT_LE(rel(dev.loss, host.loss), 1e-13);
    EXPECT_EQ(dev.tpe, host.tpe);
    ASSERT_EQ(dev.aux.size(), 2u);
    for (size_t i = 0; i < dev.aux.size(); ++i) {
      EXPECT_LE(rel(dev.aux[i], host.aux[i]), 1e-12) << "layer " << i;
      EXPECT_LE(rel(dev.z[i], host.z[i]), 1e-12) << "layer " << i;
    }
    double worst = 0, mag = 0;
    for (size_t i = 0; i < host.grads.size(); ++i) {
      worst = std::max(worst, std::abs(dev.grads[i] - host.grads[i]));
      mag = std::max(mag, std::abs(host.grads[i]));
    }
    EXPECT_GT(mag, 1e-3);
    EXPECT_LE(worst, 1e-11 * mag);
  }
}

// Context parallelism on the routing ops' path: one MoE layer in a CP group of two (a
// stand-in whose other rank holds the same tokens, so the summed counts are twice this
// rank's): the output, input and parameter gradients, the expert-bias counts and the aux /
// z losses equal the host routing's with the same group; both sum the counts once a forward.
TEST(MoeRouteOpsInLayer, ContextParallelMatchesHostRouting) {
  for (bool capacity : {false, true}) {
    SCOPED_TRACE(capacity ? "capacity" : "dropless");
    TransformerConfig c = tiny_model();
    c.cp_size = 2, c.seq_length = 24;
    if (capacity) c.moe.capacity_factor = 1.0, c.moe.pad_to_capacity = true;
    c.moe.balance = {capacity ? Balance::AuxLoss : Balance::SeqAuxLoss};
    test::MirrorCommunicator cp_host, cp_dev;
    const auto host = test::run_moe_layer(c, &cp_host, moe::MoeLayer::RoutingPlace::Host, 12, 2, 3);
    const auto dev = test::run_moe_layer(c, &cp_dev, moe::MoeLayer::RoutingPlace::Ops, 12, 2, 3);
    EXPECT_FALSE(host.on_device);
    EXPECT_TRUE(dev.on_device);
    EXPECT_EQ(cp_host.all_reduces, 1);
    EXPECT_EQ(cp_dev.all_reduces, 1);
    auto close = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
      ASSERT_EQ(a.size(), b.size()) << what;
      double worst = 0, mag = 0;
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(a[i] - b[i])), mag = std::max(mag, std::abs(b[i]));
      EXPECT_GT(mag, 1e-6) << what;
      EXPECT_LE(worst, 1e-12 * mag) << what;
    };
    close(dev.y, host.y, "y");
    close(dev.dx, host.dx, "dx");
    close(dev.grads, host.grads, "parameter gradients");
    EXPECT_EQ(dev.tokens_per_expert, host.tokens_per_expert);
    EXPECT_LE(rel(dev.aux_loss, host.aux_loss), 1e-12);
    EXPECT_LE(rel(dev.z_loss, host.z_loss), 1e-12);
    // Against no CP at all: the CP group's counts are twice these and T is twice, so the
    // aux loss is half, and so is the z-loss (each rank's share of the group's mean).
    TransformerConfig c1 = c;
    c1.cp_size = 1;
    const auto one = test::run_moe_layer(c1, nullptr, moe::MoeLayer::RoutingPlace::Ops, 12, 2, 3);
    EXPECT_LE(rel(dev.aux_loss, one.aux_loss / 2), 1e-12);
    EXPECT_LE(rel(dev.z_loss, one.z_loss / 2), 1e-12);
  }
}

// ---- global_aux_loss in a layer ------------------------------------------------------------

namespace {

// One MoE layer (layer 0 of c, f64 on the CPU) routing where `place` says, with its global
// aux group `dp`, run forward and backward on micro-batches of S x B tokens whose input
// depends on the micro-batch's index j (StepKeys: iteration `it`, sample offset j*B).
struct GlobalAuxLayer {
  model::ParamStore store;
  std::unique_ptr<moe::MoeLayer> layer;
  const TransformerConfig& c;
  int64_t S, B;
  struct Pass {
    std::vector<double> counts;  // the global_aux_loss counts the forward used [E]
    std::vector<double> local;   // this micro-batch's own counts [E] (host routing only)
    std::vector<double> colsum;  // sum over its tokens of the aux scores [E] (host only)
    std::vector<double> dx, grads;
    double loss = 0;             // global_aux_loss with its coefficient
  };
  GlobalAuxLayer(const TransformerConfig& cfg, moe::MoeLayer::RoutingPlace place,
                 comm::Communicator* dp, int64_t s, int64_t b)
      : c(cfg), S(s), B(b) {
    std::vector<model::ParamInfo> ps;
    moe::MoeLayer::add_params(c, 0, ps);
    for (auto& p : ps) store.add(p);
    std::vector<model::BufferInfo> bs;
    moe::MoeLayer::add_buffers(c, 0, bs);
    for (auto& x : bs) store.add_buffer(x);
    store.allocate(c.dtype, c.grad_dtype(), c.device, 0, 1);
    store.initialize(c.seed);
    layer = std::make_unique<moe::MoeLayer>(c, 0, &store);
    layer->set_routing_place(place);
    layer->set_global_aux_group(dp);
  }
  Pass run(int64_t it, int64_t j) {
    model::StepKeys keys;
    keys.iteration = it, keys.sample_offset = j * B, keys.global_batch = 3 * B;
    const model::StepContext cx = model::make_step_context(c, S, B, keys, nullptr);
    auto saved = layer->new_saved();
    model::Workspace ws;
    model::allocate(
        [&](const model::TensorVisitor& v) { layer->saved_specs(cx, false, *saved, v); },
        c.device, true);
    const int64_t T = S * B, H = c.hidden_size, E = c.moe.num_experts;
    std::vector<double> xv(static_cast<size_t>(T * H)), dyv(xv.size());
    for (size_t i = 0; i < xv.size(); ++i)
      xv[i] = Philox::normal(40 + uint64_t(j), 1, i), dyv[i] = 0.1 * Philox::normal(50, 2, i);
    Tensor x = Tensor::from(xv, {T, H}), dy = Tensor::from(dyv, {T, H});
    Tensor y = Tensor::empty({T, H}, c.dtype), dx = Tensor::empty({T, H}, c.dtype);
    store.zero_grads();
    layer->forward(x, *saved, nullptr, y, ws, cx);
    layer->backward(dy, x, *saved, dx, ws, cx);
    layer->sync_stats();
    auto& s = static_cast<moe::MoeLayer::Saved&>(*saved);
    Pass p;
    if (s.on_device) {
      const ops::MoeRouteSpec spec = moe::route_spec(c.moe);
      const double* d = s.d_aux_counts.data<double>() + ops::moe_aux_global_row(spec, B) * E;
      p.counts.assign(d, d + E);
    } else {
      p.counts = s.routing.global_counts;
      TransformerConfig::Moe one = c.moe;  // this micro-batch's counts: aux_loss's alone
      one.balance = {Balance::AuxLoss}, one.aux_loss_coeff = {1.0};
      const moe::Routing r1 = moe::route(one, s.logits.data(), T, B, nullptr);
      p.local = r1.aux_counts;
      p.colsum.assign(size_t(E), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) p.colsum[size_t(e)] += r1.aux_scores[size_t(t * E + e)];
    }
    p.dx.assign(dx.data<double>(), dx.data<double>() + dx.numel());
    const Tensor& g = store.flat_grads();
    p.grads.assign(g.data<double>(), g.data<double>() + g.numel());
    p.loss = layer->stats().last_aux_loss[2];
    return p;
  }
};

}  // namespace

// global_aux_loss over the micro-batches of a global batch (Megatron's global_tokens_per_expert
// / ga_steps): each forward's counts are the running mean, over the micro-batches so far, of
// their counts summed over the DP x CP group (a stand-in group of two ranks with the same
// tokens: the sums double), by hand from each micro-batch's own counts, and the loss is
// coeff E/(k T^2) sum_e mean_e sum_t s with T the group's. A recomputed forward (micro-batch 0
// again, after micro-batch 1: a pipeline schedule's order) reuses micro-batch 0's mean and
// sums nothing more, so its gradients are its first pass's. The routing ops (the GPU's path,
// here on the CPU) give the host routing's counts, losses and gradients; restart() (once per
// global batch) starts over.
TEST(MoeRouteOpsInLayer, GlobalAuxLossRunningMeanOverMicroBatches) {
  TransformerConfig c = tiny_model();
  c.moe.score = Score::SqrtSoftplus, c.moe.topk = 2;
  c.moe.balance = {Balance::AuxLoss, Balance::SeqAuxLoss, Balance::GlobalAuxLoss};
  c.moe.aux_loss_coeff = {0.05, 0.02, 0.1};
  const int64_t S = 12, B = 2, T = S * B, E = c.moe.num_experts, k = c.moe.topk;
  using Place = moe::MoeLayer::RoutingPlace;
  test::MirrorCommunicator dp_host, dp_dev;
  GlobalAuxLayer host(c, Place::Host, &dp_host, S, B), dev(c, Place::Ops, &dp_dev, S, B);
  std::vector<GlobalAuxLayer::Pass> h, d;
  for (int64_t j : {0, 1, 2}) h.push_back(host.run(7, j)), d.push_back(dev.run(7, j));
  const auto h0 = host.run(7, 0), d0 = dev.run(7, 0);  // recomputed: micro-batch 0 again
  EXPECT_EQ(dp_host.all_reduces, 3);  // once per micro-batch, none for the recomputation
  EXPECT_EQ(dp_dev.all_reduces, 3);
  EXPECT_EQ(host.layer->stats().forwards, 3);
  std::vector<double> sum(static_cast<size_t>(E), 0.0);
  for (size_t j = 0; j < 3; ++j) {
    SCOPED_TRACE(j);
    ASSERT_EQ(h[j].counts.size(), size_t(E));
    ASSERT_EQ(d[j].counts.size(), size_t(E));
    double local = 0;
    for (int64_t e = 0; e < E; ++e) {
      sum[size_t(e)] += 2 * h[j].local[size_t(e)];
      local += h[j].local[size_t(e)];
      EXPECT_EQ(h[j].counts[size_t(e)], sum[size_t(e)] / double(j + 1)) << e;
      EXPECT_NEAR(d[j].counts[size_t(e)], h[j].counts[size_t(e)], 1e-15 * double(T)) << e;
    }
    EXPECT_EQ(local, double(T * k));
    // The loss by hand: coeff E / (k (2T)^2) sum_e mean_e sum_t s[t,e].
    double L = 0;
    for (int64_t e = 0; e < E; ++e) L += h[j].counts[size_t(e)] * h[j].colsum[size_t(e)];
    const double Tg = double(2 * T);
    EXPECT_NEAR(h[j].loss, 0.1 * double(E) / (double(k) * Tg * Tg) * L, 1e-14 * h[j].loss);
    EXPECT_GT(h[j].loss, 0.0);
    EXPECT_LE(rel(d[j].loss, h[j].loss), 1e-12);
    double worst = 0, mag = 0;
    for (size_t i = 0; i < h[j].grads.size(); ++i)
      worst = std::max(worst, std::abs(d[j].grads[i] - h[j].grads[i])),
      mag = std::max(mag, std::abs(h[j].grads[i]));
    EXPECT_LE(worst, 1e-11 * mag);
  }
  // The means differ between micro-batches (else the check above would be weak).
  EXPECT_NE(h[0].counts, h[2].counts);
  // The recomputation: micro-batch 0's counts, loss and gradients, bit for bit.
  EXPECT_EQ(h0.counts, h[0].counts);
  EXPECT_EQ(h0.loss, h[0].loss);
  EXPECT_EQ(h0.grads, h[0].grads);
  EXPECT_EQ(h0.dx, h[0].dx);
  EXPECT_EQ(d0.counts, d[0].counts);
  EXPECT_EQ(d0.grads, d[0].grads);
  // The next global batch starts over: micro-batch 0 alone.
  host.layer->stats().restart(), dev.layer->stats().restart();
  const auto hn = host.run(8, 0), dn = dev.run(8, 0);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(hn.counts[size_t(e)], 2 * hn.local[size_t(e)]) << e;
    EXPECT_NEAR(dn.counts[size_t(e)], hn.counts[size_t(e)], 1e-15 * double(T)) << e;
  }
  EXPECT_EQ(dp_host.all_reduces, 4);
}
