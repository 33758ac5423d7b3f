// muP (--use-mup; model/config.h Mup): its forward is a plain model's with the tensors muP
// multiplies folded into the weights -- the embedding multiplier into the word and position
// tables, the output multiplier into the (untied) output layer, the attention scale
// (sqrt(base head dim) / head_dim^power against 1/sqrt(head_dim)) into the query rows of
// linear_qkv -- so the two models' losses agree, and by the chain rule the muP model's
// gradients are the plain model's times the same factors on those tensors and equal
// elsewhere (f64, dropout on). The plain model's gradients are checked against finite
// differences in test_model; so muP's backward (the multipliers in the embedding's and the
// logits' gradients) is checked here. Also the initialisation's stds, and muP's optimizer
// groups (the hidden matrices' learning rate and Adam epsilon) against Adam's formula.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/gpt_model.h"
#include "model/stage.h"
#include "optim/optimizer.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;

namespace mup_test {

TransformerConfig llama(double dropout) {
  TransformerConfig c = model::test::tiny(true, 2, dropout);
  c.tie_embeddings = false;  // muP's output multiplier folds into an untied output layer
  return c;
}

// Multiplies rows [r0, r0 + n) of every group of `stride` rows of weight w [R, C] by k.
void scale_rows(Tensor w, int64_t stride, int64_t r0, int64_t n, double k) {
  const int64_t C = w.size(1);
  for (int64_t g = 0; g < w.size(0) / stride; ++g)
    for (int64_t r = r0; r < r0 + n; ++r)
      for (int64_t j = 0; j < C; ++j) w.data<double>()[(g * stride + r) * C + j] *= k;
}

TEST(Mup, ForwardAndGradientsAreAPlainModelsWithTheMultipliersFolded) {
  const TransformerConfig plain = llama(0.2);
  TransformerConfig mup = plain;
  mup.mup.on = true, mup.mup.width_mult = 2.0;  // (init and optimizer only)
  mup.mup.embedding_mult = 1.5, mup.mup.output_mult = 0.25;
  mup.mup.base_head_dim = 4.0, mup.mup.attn_scale_power = 1.0;
  const int64_t HD = plain.kv_channels, NH = plain.num_attention_heads;
  const int64_t NG = plain.num_query_groups, per = NH / NG;
  const double q_fold = mup.softmax_scale() / plain.softmax_scale();
  EXPECT_DOUBLE_EQ(mup.softmax_scale(), 2.0 / double(HD));
  GPTModel a(mup), b(plain);
  ops::copy(a.params().flat_params(), b.params().flat_params(), Stream::cpu());
  const std::string word = "embedding.word_embeddings.weight", out = "output_layer.weight";
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.weight",
                    qkv1 = "decoder.layers.1.self_attention.linear_qkv.weight";
  auto& pb = b.params();
  scale_rows(pb.param(word), 1, 0, 1, 1.5);
  scale_rows(pb.param(out), 1, 0, 1, 0.25);
  // linear_qkv's grouped rows: per group, its `per` query heads, one key, one value head
  for (const std::string& w : {qkv, qkv1})
    scale_rows(pb.param(w), (per + 2) * HD, 0, per * HD, q_fold);
  const auto mb = model::test::random_batch(2, plain.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  a.params().zero_grads(), pb.zero_grads();
  const double la = a.forward(mb, keys), lb = b.forward(mb, keys);
  EXPECT_NEAR(la, lb, 1e-12 * std::fabs(lb));
  a.backward(1.0), b.backward(1.0);
  // d/dW of f(k W) = k f'(k W): on the folded tensors (rows), the plain gradient times k.
  for (size_t i = 0; i < a.params().infos().size(); ++i) {
    const std::string& n = a.params().infos()[i].name;
    Tensor ga = a.params().grad(i), gb = pb.grad(i).clone();
    if (n == word) scale_rows(gb, 1, 0, 1, 1.5);
    if (n == out) scale_rows(gb, 1, 0, 1, 0.25);
    if (n == qkv || n == qkv1) scale_rows(gb, (per + 2) * HD, 0, per * HD, q_fold);
    double d = 0, m = 1e-300;
    for (int64_t e = 0; e < ga.numel(); ++e) {
      d = std::max(d, std::fabs(ga.data<double>()[e] - gb.data<double>()[e]));
      m = std::max(m, std::fabs(gb.data<double>()[e]));
    }
    EXPECT_LT(d / m, 1e-10) << n;
  }
  // The multipliers are really there: without them the muP model's loss moves.
  TransformerConfig unit = mup;
  unit.mup.embedding_mult = 1.0, unit.mup.output_mult = 1.0;
  GPTModel u(unit);
  ops::copy(a.params().flat_params(), u.params().flat_params(), Stream::cpu());
  EXPECT_GT(std::fabs(u.forward(mb, keys) - la), 1e-3);
}

// muP's initialisation (Megatron's): the weights drawn from init_method (std / sqrt(m))
// and output_layer_init_method (std / sqrt(2 L) / sqrt(m)); the embeddings at their std,
// an untied output layer at the embedding std; norms at one.
TEST(Mup, InitialisationStds) {
  TransformerConfig c = llama(0.0);
  c.mup.on = true, c.mup.width_mult = 4.0, c.init_method_std = 0.3;
  c.embedding_init_method_std = 0.5;
  const auto ps = model::Stage::parameters(c, model::PipelinePart{});
  const double s = 0.3, m = 4.0, L = double(c.num_layers);
  int checked = 0;
  for (const auto& p : ps) {
    if (p.init != model::Init::Normal) continue;
    double want = s / std::sqrt(m);
    if (p.name.find("linear_proj") != std::string::npos ||
        p.name.find("linear_fc2") != std::string::npos)
      want = s / std::sqrt(2 * L) / std::sqrt(m);
    if (p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight")
      want = 0.5;
    EXPECT_DOUBLE_EQ(p.init_std, want) << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 2 * 4);  // word, output; per layer qkv, proj, fc1, fc2
}

// The optimizer's muP groups: one AdamW step (its first: m^ = g, v^ = g^2) of a matrix at
// the hidden rate and epsilon, and of a vector, the word embedding and the output layer at
// the base ones, against Adam's formula.
TEST(Mup, AdamStepsTheHiddenMatricesAtTheirRateAndEpsilon) {
  TransformerConfig c = llama(0.0);
  GPTModel m(c);
  auto& ps = m.params();
  optim::OptimizerConfig oc;
  oc.eps = 1e-3;  // large enough to show in the update
  optim::AdamW opt(ps, oc);
  Tensor w0 = ps.flat_params().clone();
  for (int64_t i = 0; i < ps.flat_grads().numel(); ++i)
    ps.flat_grads().data<double>()[i] = 1e-3 * std::sin(double(i));
  optim::Optimizer::MupRates r;
  r.hidden_lr = 0.05, r.hidden_eps = 2.5e-4;
  opt.set_mup(r);
  opt.step(0.2, 0.0);
  int hidden = 0, vector = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    const bool h = optim::Optimizer::mup_matrix_like(p);
    (h ? hidden : vector) += 1;
    const double lr = h ? 0.05 : 0.2, eps = h ? 2.5e-4 : 1e-3;
    for (int64_t e = 0; e < p.numel(); e += 7) {
      const int64_t o = p.offset + e;
      const double g = ps.flat_grads().data<double>()[o];
      const double want = w0.data<double>()[o] - lr * g / (std::fabs(g) + eps);
      ASSERT_NEAR(ps.flat_params().data<double>()[o], want, 1e-12) << p.name;
    }
  }
  EXPECT_EQ(hidden, 2 * 4);         // qkv, proj, fc1, fc2 of both layers
  EXPECT_EQ(vector, 2 + 2 * 2 + 1);  // word, output; two norms a layer; the final norm
}

// SGD's muP group is the vector-like one (Megatron: lr times the width): its first step
// (momentum buffer = g) moves them by vector_lr g and the matrices by the base lr g.
TEST(Mup, SgdStepsTheVectorLikeParametersAtTheirRate) {
  TransformerConfig c = llama(0.0);
  GPTModel m(c);
  auto& ps = m.params();
  optim::OptimizerConfig oc;
  oc.rule = optim::UpdateRule::Sgd;
  optim::AdamW opt(ps, oc);
  Tensor w0 = ps.flat_params().clone();
  for (int64_t i = 0; i < ps.flat_grads().numel(); ++i)
    ps.flat_grads().data<double>()[i] = 1e-2 * std::cos(double(i));
  optim::Optimizer::MupRates r;
  r.vector_lr = 0.8;
  opt.set_mup(r);
  opt.step(0.2, 0.0);
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    const double lr = optim::Optimizer::mup_matrix_like(p) ? 0.2 : 0.8;
    for (int64_t e = 0; e < p.numel(); e += 7) {
      const int64_t o = p.offset + e;
      const double want = w0.data<double>()[o] - lr * ps.flat_grads().data<double>()[o];
      ASSERT_NEAR(ps.flat_params().data<double>()[o], want, 1e-14) << p.name;
    }
  }
}

}  // namespace mup_test

// ---- --no-rope-freq (NoPE layers; model/config.h no_rope_pattern) --------------------------

namespace nope_test {

// A model whose every layer is a NoPE layer is, weight for weight, the model without any
// position embedding; one with layer 2 alone without RoPE is neither (f64, dropout on); and
// its gradients match central finite differences.
TEST(NoRope, EveryLayerWithoutRopeIsTheModelWithoutPositions) {
  TransformerConfig rope = mup_test::llama(0.2);
  TransformerConfig all = rope, none = rope, mixed = rope;
  all.no_rope_pattern = {1, 1};
  none.rope = false, none.no_positions = true;
  mixed.no_rope_pattern = {0, 1};
  GPTModel a(all), n(none), x(mixed), r(rope);
  for (GPTModel* m : {&n, &x, &r})
    ops::copy(a.params().flat_params(), m->params().flat_params(), Stream::cpu());
  const auto mb = model::test::random_batch(2, rope.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  const double la = a.forward(mb, keys), ln = n.forward(mb, keys);
  const double lx = x.forward(mb, keys), lr = r.forward(mb, keys);
  EXPECT_NEAR(la, ln, 1e-12 * std::fabs(ln));
  EXPECT_GT(std::fabs(lx - ln), 1e-4);
  EXPECT_GT(std::fabs(lx - lr), 1e-4);
  EXPECT_TRUE(mixed.layer_rope(0));
  EXPECT_FALSE(mixed.layer_rope(1));
  EXPECT_TRUE(mixed.layer_rope(TransformerConfig::kMtpLayerBase + 0));  // as decoder layer 0
  EXPECT_FALSE(mixed.layer_rope(TransformerConfig::kMtpLayerBase + 1));
  model::test::expect_model_finite_differences(mixed, 13);
}

}  // namespace nope_test

// ---- --qk-l2-norm (Megatron's weightless L2Norm on queries and keys) -----------------------

namespace qk_l2_test {

// The weightless norm is --qk-layernorm's RMSNorm with its weights at one: the same loss and
// the same gradients of every other parameter (f64, dropout on, under GQA); its gradients
// match finite differences; and it changes the model (against no q/k norm).
TEST(QkL2Norm, IsTheRmsQkNormWithUnitWeights) {
  TransformerConfig l2 = mup_test::llama(0.2), ln = l2, none = l2;
  l2.qk_l2_norm = true;
  ln.qk_layernorm = true;  // RMSNorm (llama), weights initialised to one
  GPTModel a(l2), b(ln), n(none);
  ASSERT_EQ(a.params().flat_params().numel(), n.params().flat_params().numel());
  for (size_t i = 0; i < a.params().infos().size(); ++i) {
    const std::string& name = a.params().infos()[i].name;
    Tensor pb = b.params().param(name), pn = n.params().param(name);
    ops::copy(a.params().param(i), pb, Stream::cpu());
    ops::copy(a.params().param(i), pn, Stream::cpu());
  }
  const auto mb = model::test::random_batch(2, l2.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  a.params().zero_grads(), b.params().zero_grads();
  const double la = a.forward(mb, keys), lb = b.forward(mb, keys);
  EXPECT_NEAR(la, lb, 1e-13 * std::fabs(lb));
  EXPECT_GT(std::fabs(la - n.forward(mb, keys)), 1e-4);
  a.backward(1.0), b.backward(1.0);
  for (size_t i = 0; i < a.params().infos().size(); ++i) {
    const std::string& name = a.params().infos()[i].name;
    Tensor ga = a.params().grad(i), gb = b.params().grad(name);
    for (int64_t e = 0; e < ga.numel(); ++e)
      ASSERT_NEAR(ga.data<double>()[e], gb.data<double>()[e],
                  1e-12 * std::max(1.0, std::fabs(gb.data<double>()[e])))
          << name;
  }
  model::test::expect_model_finite_differences(l2, 13);
}

}  // namespace qk_l2_test
