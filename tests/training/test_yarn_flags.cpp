// Standard attention's YaRN (--position-embedding-type yarn): its flags with Megatron's
// defaults and printing, the model config and RoPE frequencies they give, and the start-up
// errors for what Megatron ignores or asserts against with it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "model/attention.h"
#include "model/config.h"
#include "ops/rope_math.h"
#include "test_util.h"
#include "training/memory_plan.h"

namespace yarn_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

std::vector<std::string> yarn_argv() {
  return with(base_argv(), {"--position-embedding-type", "yarn"});
}

void expect_invalid(const std::vector<std::string>& argv,
                    std::initializer_list<std::string> needles) {
  expect_error([&] { parse_and_validate(argv); }, needles);
}

bool shows(const Args& a, const std::string& line) {
  return format_args(a).find(line) != std::string::npos;
}

model::TransformerConfig config_of(Args a) {
  a.padded_vocab_size = 128;
  return model_config(a, Device::CPU, DType::F32);
}

TEST(YarnFlags, DefaultsAreMegatrons) {
  const Args a = parse_and_validate(yarn_argv());
  EXPECT_TRUE(shows(a, "  yarn_original_max_position_embeddings ........... None\n"));
  EXPECT_TRUE(shows(a, "  yarn_beta_fast .................................. None\n"));
  EXPECT_TRUE(shows(a, "  yarn_correction_range_round_to_int .............. None\n"));
  const auto c = config_of(a);
  EXPECT_TRUE(c.rope);
  EXPECT_TRUE(c.yarn.on);
  EXPECT_EQ(c.yarn.factor, 1.0);
  EXPECT_EQ(c.yarn.original_max_positions, 4096);
  EXPECT_EQ(c.yarn.beta_fast, 32.0);
  EXPECT_EQ(c.yarn.beta_slow, 1.0);
  EXPECT_TRUE(c.yarn.round_to_int);
  EXPECT_EQ(c.yarn.mscale, 1.0);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.0);
  EXPECT_NO_THROW(c.validate());
  // Plain RoPE and learned positions leave it off.
  EXPECT_FALSE(config_of(parse_and_validate(base_argv())).yarn.on);
  const auto r = config_of(parse_and_validate(with(base_argv(), {"--position-embedding-type",
                                                                  "rope"})));
  EXPECT_TRUE(r.rope);
  EXPECT_FALSE(r.yarn.on);
}

TEST(YarnFlags, ReachTheModelAndItsFrequencies) {
  const Args a = parse_and_validate(with(
      yarn_argv(), {"--rotary-scaling-factor", "4", "--yarn-original-max-position-embeddings",
                    "16", "--yarn-beta-fast", "16", "--yarn-beta-slow", "2",
                    "--no-yarn-correction-range-round-to-int", "--mscale", "0.9",
                    "--mscale-all-dim", "0.5", "--rotary-base", "50000"}));
  EXPECT_TRUE(shows(a, "  yarn_beta_fast .................................. 16.0\n"));
  EXPECT_TRUE(shows(a, "  yarn_original_max_position_embeddings ........... 16\n"));
  EXPECT_TRUE(shows(a, "  yarn_correction_range_round_to_int .............. False\n"));
  const auto c = config_of(a);
  EXPECT_EQ(c.yarn.factor, 4.0);
  EXPECT_EQ(c.yarn.original_max_positions, 16);
  EXPECT_EQ(c.yarn.beta_fast, 16.0);
  EXPECT_EQ(c.yarn.beta_slow, 2.0);
  EXPECT_FALSE(c.yarn.round_to_int);
  EXPECT_EQ(c.yarn.mscale, 0.9);
  EXPECT_EQ(c.yarn.mscale_all_dim, 0.5);
  // Every RoPE op of the model takes these frequencies and the concentration factor.
  const ops::RopeFreqs f = model::rope_freqs(c);
  EXPECT_TRUE(f.yarn);
  EXPECT_FALSE(f.scaled);
  EXPECT_EQ(f.base, 50000.0);
  const double m = (0.1 * 0.9 * std::log(4.0) + 1) / (0.1 * 0.5 * std::log(4.0) + 1);
  EXPECT_NEAR(f.mscale, m, 1e-15);
  const int64_t dim = c.kv_channels;
  for (int64_t i = 0; i < dim / 2; ++i)
    EXPECT_EQ(ops::rope_inv_freq(f, i, dim),
              ops::yarn_inv_freq(50000.0, 4.0, 16, 16.0, 2.0, false, i, dim));
  // The explicit --yarn-correction-range-round-to-int is True.
  const Args t = parse_and_validate(with(yarn_argv(), {"--yarn-correction-range-round-to-int"}));
  EXPECT_TRUE(shows(t, "  yarn_correction_range_round_to_int .............. True\n"));
  EXPECT_TRUE(config_of(t).yarn.round_to_int);
  // Multi-token prediction needs rotary positions: YaRN's are.
  EXPECT_NO_THROW(parse_and_validate(with(yarn_argv(), {"--mtp-num-layers", "1"})));
}

TEST(YarnFlags, ItsFlagsWithoutItAreErrors) {
  for (const auto& [flag, value] :
       {std::pair<std::string, std::string>{"--yarn-beta-fast", "16"},
        {"--yarn-beta-slow", "2"},
        {"--yarn-original-max-position-embeddings", "64"}}) {
    SCOPED_TRACE(flag);
    expect_invalid(with(base_argv(), {flag, value}),
                   {flag + " configures YaRN, but --position-embedding-type is learned_absolute",
                    "HINT: add --position-embedding-type yarn, or drop " + flag});
  }
  expect_invalid(with(base_argv(), {"--position-embedding-type", "rope",
                                    "--no-yarn-correction-range-round-to-int"}),
                 {"yarn-correction-range-round-to-int configures YaRN, but "
                  "--position-embedding-type is rope"});
  for (const char* flag : {"--rotary-scaling-factor", "--mscale", "--mscale-all-dim"})
    expect_invalid(with(base_argv(), {"--position-embedding-type", "rope", flag, "2"}),
                   {std::string(flag) + " configures YaRN, which neither multi-latent attention "
                                        "(off) nor --position-embedding-type rope uses",
                    "--position-embedding-type yarn"});
}

TEST(YarnFlags, WhatMegatronIgnoresOrRefusesWithItIsAnError) {
  expect_invalid(with(yarn_argv(), {"--rotary-percent", "0.5"}),
                 {"--rotary-percent 0.5 with --position-embedding-type yarn",
                  "HINT: drop --rotary-percent"});
  expect_invalid(with(yarn_argv(), {"--use-rope-scaling"}),
                 {"--use-rope-scaling rescales RoPE's frequencies, but --position-embedding-type "
                  "is yarn"});
  expect_invalid(with(yarn_argv(), {"--rotary-seq-len-interpolation-factor", "2"}),
                 {"--rotary-seq-len-interpolation-factor divides RoPE's positions, but "
                  "--position-embedding-type is yarn"});
  expect_invalid(with(yarn_argv(), {"--rotary-interleaved"}),
                 {"--rotary-interleaved changes RoPE's pairs, but --position-embedding-type is "
                  "yarn"});
  expect_invalid(with(yarn_argv(), {"--multi-latent-attention"}),
                 {"--position-embedding-type yarn with --multi-latent-attention",
                  "--rope-type yarn"});
  expect_invalid(with(yarn_argv(), {"--no-position-embedding"}),
                 {"--no-position-embedding with --position-embedding-type yarn"});
}

TEST(YarnFlags, BadValuesAreErrors) {
  expect_invalid(with(yarn_argv(), {"--rotary-scaling-factor", "0"}),
                 {"--rotary-scaling-factor 0.0 is not positive"});
  expect_invalid(with(yarn_argv(), {"--yarn-beta-fast", "-1"}),
                 {"--yarn-beta-fast -1.0 is not positive"});
  expect_invalid(with(yarn_argv(), {"--yarn-beta-slow", "0"}),
                 {"--yarn-beta-slow 0.0 is not positive"});
  expect_invalid(with(yarn_argv(), {"--yarn-original-max-position-embeddings", "0"}),
                 {"--yarn-original-max-position-embeddings 0 is not positive"});
  expect_invalid(with(yarn_argv(), {"--rotary-base", "1"}),
                 {"--rotary-base 1 with yarn: YaRN divides by ln(base)"});
  // A non-finite --mscale stops at parsing; one from a checkpoint at the model (below).
  expect_invalid(with(yarn_argv(), {"--mscale", "inf"}), {"--mscale expects a finite number"});
}

TEST(YarnFlags, ModelConfigRefusesWhatTheFlagsRefuse) {
  // A config that reaches the model another way (a checkpoint, a converter) is checked too.
  model::TransformerConfig c = config_of(parse_and_validate(yarn_argv()));
  c.rotary_percent = 0.5;
  EXPECT_THROW(c.validate(), Error);
  c = config_of(parse_and_validate(yarn_argv()));
  c.rope_scaling = true;
  EXPECT_THROW(c.validate(), Error);
  c = config_of(parse_and_validate(yarn_argv()));
  c.yarn.beta_fast = 0;
  EXPECT_THROW(c.validate(), Error);
  c = config_of(parse_and_validate(yarn_argv()));
  c.rope = false;
  EXPECT_THROW(c.validate(), Error);
  c = config_of(parse_and_validate(yarn_argv()));
  c.yarn.mscale = std::numeric_limits<double>::infinity();
  EXPECT_THROW(c.validate(), Error);
}

}  // namespace yarn_flags_test
