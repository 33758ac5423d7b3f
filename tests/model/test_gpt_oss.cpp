// gpt-oss's MLP in whole models (f64 on the CPU): --quick-geglu with --glu-linear-offset and
// --activation-func-clamp-value in the dense MLP and the routed experts, a clamped SwiGLU in
// MoE layers (routed and shared experts), and the MoE layers' linear biases (the router's, the
// experts' fc1 and fc2). Gradients against central differences (tiny_model.h), the biases'
// names, shapes and initialisation, that offset, clamp and biases each change the function,
// keeping / recomputing the activation bit for bit, and generation with the KV cache against
// the full forward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "../inference/inference_test_util.h"
#include "model/gpt_model.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;

namespace gpt_oss_test {

// A dense quick-GEGLU model (GPT-style: biases, LayerNorm), with offset and clamp when asked.
TransformerConfig dense_qgeglu(double offset, std::optional<double> clamp) {
  TransformerConfig c = model::test::tiny(false, 2, 0.2);
  c.quick_geglu = true, c.glu_linear_offset = offset, c.activation_func_clamp_value = clamp;
  return c;
}

// gpt-oss at toy size: RoPE, RMSNorm, GQA, untied, quick-GEGLU with offset 1 and a clamp that
// cuts some of fc1's outputs (gpt-oss's 7 leaves these tiny layers' values alone), linear
// biases everywhere (the router's, the experts'), a dense layer, then a MoE layer. The aux
// loss off: the loss is the LM loss the finite differences see.
TransformerConfig gpt_oss(double dropout) {
  TransformerConfig c = model::test::tiny(true, 2, dropout);
  c.swiglu = false, c.quick_geglu = true, c.glu_linear_offset = 1.0;
  c.activation_func_clamp_value = 0.6;
  c.add_bias_linear = true;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.0}, c.moe.layer_pattern = {0, 1};
  return c;
}

// A Llama-style MoE model with a clamped SwiGLU (Megatron: MoE only) in its routed and shared
// experts and its dense layer.
TransformerConfig swiglu_clamp() {
  TransformerConfig c = model::test::tiny(true, 2, 0.2);
  c.activation_func_clamp_value = 0.5;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.0}, c.moe.layer_pattern = {0, 1};
  c.moe.shared_ffn_hidden_size = 10;
  return c;
}

double loss_of(const TransformerConfig& c, GPTModel& from) {
  GPTModel m(c);
  std::memcpy(m.params().flat_params().raw(), from.params().flat_params().raw(),
              from.params().flat_params().nbytes());
  return m.forward(model::test::random_batch(2, c.seq_length, 13, 4), {});
}

TEST(GptOssGrad, DenseQuickGegluFiniteDifferences) {
  model::test::expect_model_finite_differences(dense_qgeglu(0, std::nullopt), 13);
  model::test::expect_model_finite_differences(dense_qgeglu(1.0, 0.6), 13);
}

TEST(GptOssGrad, MoeQuickGegluOffsetClampBiasesFiniteDifferences) {
  model::test::expect_model_finite_differences(gpt_oss(0.2), 13);
  TransformerConfig c = gpt_oss(0.0);
  c.moe.layer_pattern = {1, 1};  // every layer MoE, sigmoid routing
  c.moe.score = TransformerConfig::Moe::Score::Sigmoid;
  model::test::expect_model_finite_differences(c, 13);
}

TEST(GptOssGrad, MoeSwigluClampFiniteDifferences) {
  model::test::expect_model_finite_differences(swiglu_clamp(), 13);
}

TEST(GptOss, BiasParametersAreMegatrons) {
  const TransformerConfig c = gpt_oss(0.0);
  GPTModel m(c);
  const auto& ps = m.params();
  const auto& r = ps.info("decoder.layers.1.mlp.router.bias");
  EXPECT_EQ(r.global_shape, (Shape{4}));
  EXPECT_EQ(r.split, model::TpSplit::None);
  EXPECT_EQ(r.init, model::Init::Normal);  // TopKRouter: init_method(bias)
  EXPECT_EQ(r.init_std, c.init_method_std);
  EXPECT_FALSE(r.weight_decay);
  EXPECT_EQ(r.expert, -1);
  for (int e = 0; e < 4; ++e) {
    const std::string l = "decoder.layers.1.mlp.experts.";
    const auto& b1 = ps.info(l + "linear_fc1.bias" + std::to_string(e));
    const auto& b2 = ps.info(l + "linear_fc2.bias" + std::to_string(e));
    EXPECT_EQ(b1.global_shape, (Shape{12}));  // [gate; up]
    EXPECT_EQ(b1.split, model::TpSplit::SwigluRows);
    EXPECT_EQ(b2.global_shape, (Shape{c.hidden_size}));
    for (const auto* b : {&b1, &b2}) {
      EXPECT_EQ(b->init, model::Init::Zeros);
      EXPECT_FALSE(b->weight_decay);
      EXPECT_EQ(b->grad_group, model::GradGroup::Expert);
      EXPECT_EQ(b->expert, e);
    }
  }
  // The dense layer's MLP keeps its own biases; without --add-bias-linear none of these.
  EXPECT_TRUE(ps.has("decoder.layers.0.mlp.linear_fc1.bias"));
  TransformerConfig n = c;
  n.add_bias_linear = false;
  GPTModel none(n);
  EXPECT_FALSE(none.params().has("decoder.layers.1.mlp.router.bias"));
  EXPECT_FALSE(none.params().has("decoder.layers.1.mlp.experts.linear_fc2.bias0"));
}

// The offset, the clamp and each bias change the loss (none is silently ignored), and
// quick-GEGLU is not SwiGLU on the same parameters.
TEST(GptOss, OffsetClampAndBiasesChangeTheFunction) {
  const TransformerConfig c = gpt_oss(0.0);
  GPTModel m(c);
  model::test::perturb_norms(m.params());  // the zero-initialised biases too
  const double base = loss_of(c, m);
  auto differs = [&](TransformerConfig v, const char* what) {
    EXPECT_GT(std::abs(loss_of(v, m) - base), 1e-6 * std::abs(base)) << what;
  };
  TransformerConfig v = c;
  v.glu_linear_offset = 0.5;
  differs(v, "offset");
  v = c, v.activation_func_clamp_value = 50.0;
  differs(v, "clamp");
  v = c, v.quick_geglu = false, v.swiglu = true, v.glu_linear_offset = 0;
  differs(v, "swiglu");
  for (const char* name : {"decoder.layers.1.mlp.router.bias",
                           "decoder.layers.1.mlp.experts.linear_fc1.bias0",
                           "decoder.layers.1.mlp.experts.linear_fc2.bias2"}) {
    GPTModel z(c);
    std::memcpy(z.params().flat_params().raw(), m.params().flat_params().raw(),
                m.params().flat_params().nbytes());
    Tensor b = z.params().param(name);
    ops::fill(b, 0.0, Stream::cpu());
    EXPECT_GT(std::abs(z.forward(model::test::random_batch(2, c.seq_length, 13, 4), {}) - base),
              1e-9)
        << name;
  }
}

struct Training {
  std::vector<double> losses;
  Tensor params;
};

Training train(const TransformerConfig& c) {
  const int steps = 3, M = 2;
  const int64_t B = 2;
  GPTModel m(c);
  optim::AdamW opt(m.params(), {});
  Training t;
  for (int it = 0; it < steps; ++it) {
    m.params().zero_grads();
    for (int j = 0; j < M; ++j) {
      model::StepKeys k;
      k.iteration = it, k.sample_offset = j * B, k.global_batch = M * B;
      t.losses.push_back(m.forward(
          model::test::random_batch(B, c.seq_length, c.padded_vocab_size, uint64_t(10 * it + j)),
          k));
      m.backward(1.0 / double(M * B * c.seq_length));
    }
    opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
    opt.step(3e-2, 0.1);
  }
  t.params = m.params().flat_params().clone();
  return t;
}

void expect_same(const Training& t, const Training& ref) {
  ASSERT_EQ(t.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_EQ(t.losses[i], ref.losses[i]) << "micro-batch " << i;
  EXPECT_EQ(std::memcmp(t.params.raw(), ref.params.raw(), ref.params.nbytes()), 0)
      << "parameters after the last step";
}

TEST(GptOss, KeepingAndRecomputingTrainBitwiseAlike) {
  // --keep-mlp-activations, --recompute-modules mlp / moe and full recomputation run the same
  // element ops and GEMMs as recomputing the activation from fc1's output in backward.
  using RC = TransformerConfig::Recompute;
  for (DType dt : {DType::F32, DType::F64})
    for (bool swiglu : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dt), swiglu ? "clamped swiglu" : "gpt-oss"));
      TransformerConfig c = swiglu ? swiglu_clamp() : gpt_oss(0.1);
      c.dtype = dt;
      const Training ref = train(c);
      TransformerConfig k = c;
      k.keep_mlp_activations = 2;
      expect_same(train(k), ref);
      TransformerConfig r = c;
      r.recompute = RC::Selective, r.recompute_mlp = true, r.recompute_moe = true;
      expect_same(train(r), ref);
      TransformerConfig f = c;
      f.recompute = RC::Full, f.recompute_num_layers = 1;
      expect_same(train(f), ref);
    }
}

TEST(GptOss, GenerationMatchesTheFullForward) {
  // Greedy decoding with the KV cache (fc1 through linear_decode, then glu_forward; the
  // experts' biases) against the training model's full forward of the whole sequence.
  for (bool moe : {false, true}) {
    SCOPED_TRACE(fmt::format("moe {}", moe));
    TransformerConfig cfg = test::tiny_config(true, DType::F64);
    cfg.swiglu = false, cfg.quick_geglu = true, cfg.glu_linear_offset = 1.0;
    cfg.activation_func_clamp_value = 0.6, cfg.add_bias_linear = true;
    if (moe) {
      cfg.moe.num_experts = 4, cfg.moe.topk = 2, cfg.moe.ffn_hidden_size = 16;
      cfg.moe.layer_pattern = {1, 0};
    }
    GPTModel m(cfg);
    test::perturb_norms(m.params());
    test::expect_greedy_decode_matches_full_forward(m, cfg);
  }
}

}  // namespace gpt_oss_test
