// Attention sinks (--softmax-type) in a whole model: the learnable sinks' parameter (name,
// shape, split, initialisation, no decay) and f64 finite differences of the loss against
// backward() for both forms, with attention dropout, in GPT and Llama layouts, and with
// multi-latent attention.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "ops/ops.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;
using model::test::tiny;

namespace model_sink_test {

using ST = TransformerConfig::SoftmaxType;

void fd_check(const TransformerConfig& cfg) {
  model::test::expect_model_finite_differences(cfg, 13);
}

TEST(ModelSink, LearnableSinksAreMegatronsSoftmaxOffset) {
  TransformerConfig c = tiny(true, 2, 0.0);
  c.softmax_type = ST::Learnable;
  GPTModel m(c);
  const std::string name = "decoder.layers.1.self_attention.core_attention.softmax_offset";
  const auto& info = m.params().info(name);
  EXPECT_EQ(info.global_shape, (Shape{c.num_attention_heads}));
  EXPECT_EQ(info.split, model::TpSplit::Rows);
  EXPECT_EQ(info.init, model::Init::Normal);
  EXPECT_EQ(info.init_std, c.init_method_std);
  EXPECT_FALSE(info.weight_decay);
  c.softmax_type = ST::OffByOne;  // a fixed zero logit: no parameter
  GPTModel fixed(c);
  EXPECT_FALSE(fixed.params().has(name));
}

TEST(ModelSink, LearnableFiniteDifferencesWithDropout) {
  for (bool llama : {false, true}) {
    TransformerConfig c = tiny(llama, 2, 0.2);
    c.softmax_type = ST::Learnable;
    fd_check(c);
  }
}

TEST(ModelSink, OffByOneFiniteDifferences) {
  TransformerConfig c = tiny(true, 2, 0.2);
  c.softmax_type = ST::OffByOne;
  fd_check(c);
}

// The sinks change the loss (neither form is a no-op), and off-by-one is learnable at zero.
TEST(ModelSink, SinksChangeTheLoss) {
  auto loss = [](ST t, bool zero) {
    TransformerConfig c = tiny(true, 2, 0.0);
    c.softmax_type = t;
    GPTModel m(c);
    if (zero)
      for (const auto& p : m.params().infos())
        if (p.name.ends_with("softmax_offset")) {
          Tensor w = m.params().param(p.name);
          ops::fill(w, 0.0, Stream::cpu());
        }
    auto mb = model::test::random_batch(2, c.seq_length, 13, 11);
    return m.forward(mb, model::StepKeys{});
  };
  const double vanilla = loss(ST::Vanilla, false), one = loss(ST::OffByOne, false);
  EXPECT_GT(std::abs(vanilla - one), 1e-6);
  EXPECT_DOUBLE_EQ(loss(ST::Learnable, true), one);
}

}  // namespace model_sink_test
