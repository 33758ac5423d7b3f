// muP's flags (training/validate_mup.cpp): the width multiplier derived from
// --mup-base-hidden-size, Megatron's output multiplier rule (1 / width when left at 1), the
// attention scale, the values in the model's configuration, and the start-up errors.
#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"
#include "test_util.h"
#include "training/memory_plan.h"

namespace mup_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

model::TransformerConfig config_of(const std::vector<std::string>& argv) {
  return model_config(parse_and_validate(argv), Device::CPU, DType::F32);
}

TEST(MupFlags, DerivedWidthOutputMultiplierAndAttentionScale) {
  // hidden 64, 4 heads: head dim 16
  const auto c = config_of(with(base_argv(), {"--use-mup", "--mup-base-hidden-size", "16"}));
  EXPECT_TRUE(c.mup.on);
  EXPECT_EQ(c.mup.width_mult, 4.0);
  EXPECT_EQ(c.mup.base_hidden_size, 16);
  EXPECT_EQ(c.mup.output_mult, 0.25);  // left at 1: 1 / width
  EXPECT_EQ(c.mup.embedding_mult, 1.0);
  EXPECT_DOUBLE_EQ(c.softmax_scale(), 1.0 / 16);  // 1 / head dim
  const auto d = config_of(with(base_argv(), {"--use-mup", "--mup-base-hidden-size", "16",
                                              "--mup-output-mult", "0.5", "--mup-embedding-mult",
                                              "10", "--mup-base-head-dim", "4",
                                              "--mup-attn-scale-power", "0.5"}));
  EXPECT_EQ(d.mup.output_mult, 0.5);  // given: kept
  EXPECT_EQ(d.mup.embedding_mult, 10.0);
  EXPECT_DOUBLE_EQ(d.softmax_scale(), 2.0 / 4.0);  // sqrt(4) / 16^0.5
  const auto base = config_of(with(base_argv(), {"--use-mup"}));  // the base model: width 1
  EXPECT_EQ(base.mup.width_mult, 1.0);
  EXPECT_EQ(base.mup.output_mult, 1.0);
  EXPECT_FALSE(config_of(base_argv()).mup.on);
  EXPECT_DOUBLE_EQ(config_of(base_argv()).softmax_scale(), 0.25);
}

TEST(MupFlags, StartUpErrorsNameTheFlag) {
  expect_error([] { parse_and_validate(with(base_argv(), {"--mup-embedding-mult", "2"})); },
               {"--mup-embedding-mult", "--use-mup"});
  expect_error([] { parse_and_validate(with(base_argv(), {"--mup-base-hidden-size", "8"})); },
               {"--mup-base-hidden-size", "--use-mup"});
  expect_error(
      [] { parse_and_validate(with(base_argv(), {"--use-mup", "--mup-width-mult", "2"})); },
      {"--mup-width-mult", "derived"});
  expect_error([] {
    parse_and_validate(with(base_argv(), {"--use-mup", "--mup-base-hidden-size", "0"}));
  },
               {"--mup-base-hidden-size 0"});
  expect_error([] {
    parse_and_validate(with(base_argv(), {"--use-mup", "--mup-output-mult", "-1"}));
  },
               {"--mup-output-mult"});
  const auto mla = with(base_argv(), {"--use-mup", "--multi-latent-attention", "--kv-lora-rank",
                                      "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
                                      "--v-head-dim", "8", "--position-embedding-type", "rope",
                                      "--normalization", "RMSNorm"});
  EXPECT_NO_THROW(parse_and_validate(mla));
  expect_error([&] { parse_and_validate(with(mla, {"--mup-attn-scale-power", "0.5"})); },
               {"--mup-attn-scale-power", "--multi-latent-attention"});
}

}  // namespace mup_flags_test

namespace no_rope_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

std::vector<std::string> rope_argv() {
  return with(base_argv(), {"--position-embedding-type", "rope", "--num-layers", "4"});
}

TEST(NoRopeFlags, PatternFromAnIntegerOrAList) {
  auto p = [](std::initializer_list<std::string> more) {
    return parse_and_validate(with(rope_argv(), more)).no_rope_pattern;
  };
  EXPECT_EQ(p({"--no-rope-freq", "2"}), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(p({"--no-rope-freq", "4"}), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(p({"--no-rope-freq", "([0]*3+[1])"}), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(p({"--no-rope-freq", "[1]+[0]*3"}), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_TRUE(p({"--no-rope-freq", "0"}).empty());  // Megatron's `if no_rope_freq:`
  EXPECT_TRUE(p({}).empty());
  const auto c = model_config(parse_and_validate(with(rope_argv(), {"--no-rope-freq", "2"})),
                              Device::CPU, DType::F32);
  EXPECT_TRUE(c.layer_rope(0));
  EXPECT_FALSE(c.layer_rope(3));
}

TEST(NoRopeFlags, StartUpErrorsNameTheFlag) {
  expect_error([] { parse_and_validate(with(rope_argv(), {"--no-rope-freq", "3"})); },
               {"--no-rope-freq 3", "--num-layers 4"});
  expect_error([] { parse_and_validate(with(rope_argv(), {"--no-rope-freq", "[0,1]"})); },
               {"--no-rope-freq", "2 entries"});
  expect_error([] { parse_and_validate(with(base_argv(), {"--no-rope-freq", "2"})); },
               {"--no-rope-freq", "learned_absolute"});
  expect_error([] {
    parse_and_validate(with(rope_argv(), {"--no-rope-freq", "2", "--mtp-num-layers", "5"}));
  },
               {"--mtp-num-layers 5"});
}

}  // namespace no_rope_flags_test

namespace qk_l2_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(QkL2NormFlags, ConfigAndErrors) {
  const auto rope = with(base_argv(), {"--position-embedding-type", "rope", "--normalization",
                                       "RMSNorm", "--qk-l2-norm"});
  EXPECT_TRUE(model_config(parse_and_validate(rope), Device::CPU, DType::F32).qk_l2_norm);
  expect_error([&] { parse_and_validate(with(rope, {"--qk-layernorm"})); },
               {"--qk-layernorm with --qk-l2-norm"});
  expect_error([&] {
    parse_and_validate(with(rope, {"--multi-latent-attention", "--kv-lora-rank", "16",
                                   "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8",
                                   "--v-head-dim", "8"}));
  },
               {"--qk-l2-norm with --multi-latent-attention"});
}

}  // namespace qk_l2_flags_test
