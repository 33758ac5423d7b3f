// Multi-token prediction (model/mtp.h) on the CPU in f64: the gradients of the objective the
// backward computes -- the LM loss plus each depth's loss L_k with its scale
// (factor / D) * n_main / n_k -- against finite differences (dense and MoE layers, dropout
// on), the direction of the roll (which labels, mask entries and tokens each depth reads),
// and that a factor of 0 leaves every other gradient as without MTP.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/philox.h"
#include <algorithm>

#include "model/gpt_model.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;

namespace mtp_test {

model::MicroBatch batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  return model::test::random_batch(B, S, V, seed);
}

TransformerConfig mtp_cfg(int64_t depths, double dropout, bool moe) {
  TransformerConfig c = model::test::tiny(/*llama=*/true, 2, dropout);  // RoPE
  c.mtp_num_layers = depths, c.mtp_loss_scaling_factor = 0.3;
  if (moe) {  // the last layer is MoE, so the MTP layers are too. No aux loss: its
    // gradient enters the router outside the objective these tests differentiate (the MoE
    // tests check it).
    c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
    c.moe.layer_pattern = {0, 1};
  }
  return c;
}

void perturb(model::ParamStore& ps) { model::test::perturb_norms(ps); }

double mask_sum(const model::MicroBatch& mb) {
  double n = 0;
  for (int64_t i = 0; i < mb.loss_mask.numel(); ++i) n += mb.loss_mask.data<float>()[i];
  return n;
}

// The depths' losses L_k and token counts n_k of the last forward.
std::vector<std::pair<double, double>> last_mtp(GPTModel& m) {
  std::vector<std::pair<double, double>> out;
  auto& st = m.mtp_stats();
  for (size_t k = 0; k < st.losses.size(); ++k)
    out.push_back({st.losses[k].back().value(), st.tokens[k].back()});
  return out;
}

// The objective backward(1) differentiates: L_main + sum_k (factor / D) (n_main / n_k) L_k.
double objective(GPTModel& m, const model::MicroBatch& mb, const model::StepKeys& keys) {
  const auto& c = m.config();
  double J = m.forward(mb, keys);
  for (const auto& [L, n] : last_mtp(m))
    if (n > 0) J += c.mtp_loss_scaling_factor / double(c.mtp_num_layers) * mask_sum(mb) / n * L;
  return J;
}

void fd_check(const TransformerConfig& cfg) {
  GPTModel m(cfg);
  perturb(m.params());
  auto mb = batch(2, cfg.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  auto& ps = m.params();
  ps.zero_grads();
  m.forward(mb, keys);
  m.backward(1.0);
  model::test::expect_finite_differences(ps, [&] { return objective(m, mb, keys); });
  int mtp_params = 0;  // enorm, hnorm, eh_proj and final_layernorm weights, and the layer's
  for (const auto& p : ps.infos()) mtp_params += p.name.rfind("mtp.layers.", 0) == 0;
  EXPECT_GE(mtp_params, 5 * int(cfg.mtp_num_layers));
}


TEST(Mtp, OneDepthFiniteDifferences) { fd_check(mtp_cfg(1, 0.0, false)); }
TEST(Mtp, TwoDepthsFiniteDifferencesWithDropout) { fd_check(mtp_cfg(2, 0.2, false)); }
TEST(Mtp, MoeDepthFiniteDifferences) { fd_check(mtp_cfg(1, 0.0, true)); }

// Sliding windows: depth k slides as decoder layer k (Megatron builds its layer with layer
// number k + 1, which its window rule reads as the decoder's). With the pattern [1, 0] depth
// 0 has a window of 2 and depth 1 full attention; the gradients through both against finite
// differences (dropout on).
TEST(Mtp, WindowedDepthsFollowTheDecodersRule) {
  TransformerConfig c = mtp_cfg(2, 0.2, false);
  c.window_left = 2, c.window_pattern = {1, 0};
  EXPECT_NO_THROW(c.validate());
  const int64_t base = TransformerConfig::kMtpLayerBase;
  EXPECT_TRUE(c.is_window_layer(0));
  EXPECT_FALSE(c.is_window_layer(1));
  EXPECT_TRUE(c.is_window_layer(base + 0));
  EXPECT_FALSE(c.is_window_layer(base + 1));
  TransformerConfig every = c;
  every.window_pattern.clear();  // no --window-attn-skip-freq: every layer, every depth
  EXPECT_TRUE(every.is_window_layer(base + 1));
  TransformerConfig deep = c;
  deep.mtp_num_layers = 3;  // more depths than decoder layers: no rule entry for depth 2
  EXPECT_THROW(deep.validate(), Error);
  fd_check(c);
  // The window changes what the depths see: their losses differ from full attention's.
  GPTModel win(c);
  TransformerConfig full_cfg = c;
  full_cfg.window_left = -1, full_cfg.window_pattern.clear();
  GPTModel full(full_cfg);
  ASSERT_EQ(std::memcmp(win.params().flat_params().raw(), full.params().flat_params().raw(),
                        win.params().flat_params().nbytes()),
            0);
  auto mb = batch(2, c.seq_length, 13, 12);
  model::StepKeys keys;
  win.forward(mb, keys);
  full.forward(mb, keys);
  const auto a = last_mtp(win), b = last_mtp(full);
  EXPECT_GT(std::abs(a[0].first - b[0].first), 1e-6);
}

// Megatron's names, and the MTP layer of a MoE model is a MoE layer.
TEST(Mtp, ParameterNames) {
  GPTModel m(mtp_cfg(2, 0.0, true));
  std::vector<std::string> names;
  for (const auto& p : m.params().infos())
    if (p.name.rfind("mtp.layers.1.", 0) == 0) names.push_back(p.name);
  for (const char* want :
       {"mtp.layers.1.enorm.weight", "mtp.layers.1.hnorm.weight", "mtp.layers.1.eh_proj.weight",
        "mtp.layers.1.final_layernorm.weight",
        "mtp.layers.1.mtp_model_layer.input_layernorm.weight",
        "mtp.layers.1.mtp_model_layer.self_attention.linear_qkv.weight",
        "mtp.layers.1.mtp_model_layer.mlp.router.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_EQ(m.params().info("mtp.layers.1.eh_proj.weight").global_shape,
            (Shape{m.config().hidden_size, 2 * m.config().hidden_size}));
  for (const auto& p : m.params().infos())  // ready with the head's (the -1 hooks)
    if (p.name.rfind("mtp.", 0) == 0) EXPECT_EQ(p.layer, -1) << p.name;
}

// Depth k at position i reads the token i + k (its embedding), the label i + k and the mask
// entry i + k: labels[k - 1] and earlier, mask[k - 1] and earlier do not enter L_k, the last
// label and mask entry do; n_k counts mask[k..S).
TEST(Mtp, RollReadsTheTokensAhead) {
  TransformerConfig c = mtp_cfg(2, 0.0, false);
  GPTModel m(c);
  perturb(m.params());
  const int64_t B = 2, S = c.seq_length;
  const model::MicroBatch mb = batch(B, S, 13, 5);
  model::StepKeys keys;
  auto run = [&](const model::MicroBatch& b) {
    m.forward(b, keys);
    return last_mtp(m);
  };
  const auto ref = run(mb);
  ASSERT_EQ(ref.size(), 2u);
  for (int64_t k = 1; k <= 2; ++k) {
    double n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = k; s < S; ++s) n += mb.loss_mask.data<float>()[b * S + s];
    EXPECT_EQ(ref[size_t(k - 1)].second, n) << "n_" << k;
  }
  auto edited = [&](const char* what, int64_t s) {
    model::MicroBatch b;
    b.tokens = mb.tokens.clone(), b.labels = mb.labels.clone(), b.loss_mask = mb.loss_mask.clone();
    for (int64_t r = 0; r < B; ++r) {
      const int64_t i = r * S + s;
      int64_t* label = b.labels.data<int64_t>() + i;
      int64_t* token = b.tokens.data<int64_t>() + i;
      float* mask = b.loss_mask.data<float>() + i;
      if (std::strcmp(what, "label") == 0) *label = (*label + 3) % 13;
      if (std::strcmp(what, "mask") == 0) *mask = 1.f - *mask;
      if (std::strcmp(what, "token") == 0) *token = (*token + 5) % 13;
    }
    return run(b);
  };
  // labels[0] only the LM loss reads; labels[1] depth 1 (at position 0) but not depth 2.
  auto l0 = edited("label", 0), l1 = edited("label", 1), last = edited("label", S - 1);
  EXPECT_EQ(l0[0].first, ref[0].first);
  EXPECT_EQ(l0[1].first, ref[1].first);
  EXPECT_NE(l1[0].first, ref[0].first);
  EXPECT_EQ(l1[1].first, ref[1].first);
  EXPECT_NE(last[0].first, ref[0].first);
  EXPECT_NE(last[1].first, ref[1].first);
  // mask[0]: neither depth; mask[S - 1]: both (and their counts).
  auto m0 = edited("mask", 0), mlast = edited("mask", S - 1);
  EXPECT_EQ(m0[0], ref[0]);
  EXPECT_EQ(m0[1], ref[1]);
  EXPECT_NE(mlast[0].second, ref[0].second);
  EXPECT_NE(mlast[1].second, ref[1].second);
  // The last token: the decoder reads it only at position S - 1, whose label depth 1 never
  // uses (mask_1[S - 1] is 0), and depth 1's embedding reads it at position S - 2.
  auto tlast = edited("token", S - 1);
  EXPECT_NE(tlast[0].first, ref[0].first);
}

// --mtp-loss-scaling-factor 0: the MTP layers run, but no gradient reaches the rest of the
// model: every other parameter's gradient is that of the model without MTP, bit for bit,
// and the MTP layers' own gradients are zero. (An MTP MoE layer's aux loss would still
// send its gradient, as in Megatron: the models here have none.)
TEST(Mtp, FactorZeroLeavesTheModelsGradients) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    TransformerConfig c = mtp_cfg(2, 0.1, moe);
    c.mtp_loss_scaling_factor = 0;
    GPTModel with(c);
    c.mtp_num_layers = 0;
    GPTModel without(c);
    perturb(without.params());
    for (size_t i = 0; i < without.params().infos().size(); ++i) {
      const auto& name = without.params().infos()[i].name;
      Tensor dst = with.params().param(name);
      const Tensor src = without.params().param(i);
      std::memcpy(dst.raw(), src.raw(), src.nbytes());
    }
    const auto mb = batch(2, c.seq_length, 13, 7);
    model::StepKeys keys;
    keys.iteration = 2;
    with.params().zero_grads(), without.params().zero_grads();
    EXPECT_EQ(with.forward(mb, keys), without.forward(mb, keys));
    with.backward(0.25), without.backward(0.25);
    for (size_t i = 0; i < with.params().infos().size(); ++i) {
      const auto& name = with.params().infos()[i].name;
      const Tensor g = with.params().grad(i);
      if (name.rfind("mtp.", 0) == 0) {
        for (int64_t e = 0; e < g.numel(); ++e) ASSERT_EQ(g.data<double>()[e], 0.0) << name;
        continue;
      }
      const Tensor r = without.params().grad(name);
      EXPECT_EQ(std::memcmp(g.raw(), r.raw(), g.nbytes()), 0) << name;
    }
  }
}

// The memory plan lists what the depths keep (their batch, embedding, norms, eh_proj's input,
// layer and logits) and their scratch: the prediction is what a forward and backward hold.
TEST(Mtp, MemoryPlanIsWhatTheDepthsHold) {
  for (int64_t D : {1, 2}) {
    const TransformerConfig c = mtp_cfg(D, 0.1, D == 2);
    GPTModel m(c);
    const auto mb = batch(2, c.seq_length, 13, 3);
    m.forward(mb, model::StepKeys{});
    m.backward(0.1);
    EXPECT_EQ(m.activation_memory().per_slot_max, m.saved_bytes_per_microbatch(0, 2, c.seq_length))
        << D;
    EXPECT_EQ(m.activation_memory().scratch, m.scratch_bytes(2, c.seq_length)) << D;
    TransformerConfig none = c;
    none.mtp_num_layers = 0;
    EXPECT_GT(m.saved_bytes_per_microbatch(0, 2, c.seq_length),
              GPTModel(none).saved_bytes_per_microbatch(0, 2, c.seq_length));
  }
}


// FP8 (delayed scaling): the depths' GEMMs -- eh_proj and the layer's four linears -- run in
// FP8 with their own scaling state even when --first-last-layers-bf16 keeps every decoder
// layer out of it (Megatron's one global FP8 context for MTP): the state is registered,
// checkpointed under Megatron-style names, and a training pass records every operand's
// amax; the depths' losses then differ from the same model without FP8.
TEST(Mtp, Fp8DepthsRunInFp8WhateverTheBf16Layers) {
  TransformerConfig c = mtp_cfg(2, 0.0, false);
  c.fp8.format = model::Fp8Config::Format::Hybrid;
  c.fp8.recipe = model::Fp8Config::Recipe::Delayed;
  c.fp8.amax_history_len = 2;
  c.fp8.bf16_start = 1, c.fp8.bf16_end = 1;  // both decoder layers out of FP8
  GPTModel m(c);
  const auto& ps = m.params();
  for (const auto& b : ps.buffer_infos())
    EXPECT_EQ(b.name.find("decoder."), std::string::npos) << b.name << ": a bf16 layer's";
  std::vector<std::string> linears;
  for (int k = 0; k < 2; ++k) {
    const std::string p = fmt::format("mtp.layers.{}.", k);
    linears.push_back(p + "eh_proj");
    for (const char* l : {"self_attention.linear_qkv", "self_attention.linear_proj",
                          "mlp.linear_fc1", "mlp.linear_fc2"})
      linears.push_back(p + "mtp_model_layer." + l);
  }
  for (const auto& l : linears) {
    ASSERT_TRUE(ps.has_buffer(l + ".fp8_amax_history")) << l;
    ASSERT_TRUE(ps.has_buffer(l + ".fp8_scale")) << l;
  }
  auto mb = batch(2, c.seq_length, 13, 21);
  model::StepKeys keys;
  m.params().zero_grads();
  m.forward(mb, keys);
  m.backward(1.0);
  for (const auto& l : linears) {  // row 0: this step's amaxes of x, w and dy
    const Tensor h = m.params().buffer(l + ".fp8_amax_history");
    for (int j = 0; j < 3; ++j) EXPECT_GT(h.data<float>()[j], 0.f) << l << " operand " << j;
  }
  TransformerConfig plain = c;
  plain.fp8 = {};
  GPTModel p(plain);
  ASSERT_EQ(std::memcmp(m.params().flat_params().raw(), p.params().flat_params().raw(),
                        p.params().flat_params().nbytes()),
            0);
  p.forward(mb, keys);
  const auto a = last_mtp(m), b = last_mtp(p);
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_GT(std::abs(a[k].first - b[k].first), 1e-6 * std::abs(b[k].first)) << "depth " << k;
}

}  // namespace mtp_test
