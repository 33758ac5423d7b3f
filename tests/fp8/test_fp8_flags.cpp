// The FP8 flags: Megatron's spellings and defaults into model::Fp8Config, and every
// combination that cannot run (or would be accepted and ignored) as an error with a HINT.
#include <gtest/gtest.h>

#include "../training/test_util.h"
#include "training/memory_plan.h"
#include "training/validate_fp8.h"

namespace fp8_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;
using F = model::Fp8Config;

TEST(Fp8Flags, DefaultsAreMegatrons) {
  Args a = parse_and_validate(base_argv());
  EXPECT_FALSE(a.fp8.has_value());
  EXPECT_FALSE(fp8_config(a).enabled());
  Args h = parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid"}));
  F c = fp8_config(h);
  EXPECT_EQ(c.format, F::Format::Hybrid);
  EXPECT_EQ(c.recipe, F::Recipe::Delayed);
  EXPECT_EQ(c.amax_history_len, 1);
  EXPECT_FALSE(c.amax_max);
  EXPECT_EQ(c.margin, 0);
  EXPECT_TRUE(c.wgrad);
  EXPECT_EQ(c.bf16_start + c.bf16_end, 0);
  EXPECT_TRUE(c.grads_e5m2());
}

TEST(Fp8Flags, EveryFlagReachesTheConfig) {
  Args a = parse_and_validate(with(
      base_argv(), {"--fp8-format", "e4m3", "--fp8-recipe", "delayed", "--fp8-amax-history-len",
                    "16", "--fp8-amax-compute-algo", "max", "--fp8-margin", "2", "--no-fp8-wgrad",
                    "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "0",
                    "--num-layers-at-end-in-bf16", "1"}));
  F c = fp8_config(a);
  EXPECT_EQ(c.format, F::Format::E4M3);
  EXPECT_FALSE(c.grads_e5m2());
  EXPECT_EQ(c.amax_history_len, 16);
  EXPECT_TRUE(c.amax_max);
  EXPECT_EQ(c.margin, 2);
  EXPECT_FALSE(c.wgrad);
  EXPECT_EQ(c.bf16_start, 0);
  EXPECT_EQ(c.bf16_end, 1);
  Args t =
      parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                                            "--first-last-layers-bf16", "--num-layers", "4"}));
  EXPECT_EQ(fp8_config(t).recipe, F::Recipe::Tensorwise);
  EXPECT_EQ(fp8_config(t).bf16_start, 1);  // Megatron's 1 and 1
  EXPECT_EQ(fp8_config(t).bf16_end, 1);
}

TEST(Fp8Flags, BadCombinationsAreClearErrors) {
  auto bad = [](std::vector<std::string> extra, std::initializer_list<std::string> needles) {
    std::vector<std::string> argv = base_argv();
    argv.insert(argv.end(), extra.begin(), extra.end());
    expect_error([&] { parse_and_validate(argv); }, needles);
  };
  bad({"--fp8-recipe", "tensorwise"}, {"--fp8-recipe acts on FP8 training only"});
  bad({"--no-fp8-wgrad"}, {"--no-fp8-wgrad acts on FP8 training only"});
  bad({"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}, {"--fp8-recipe mxfp8", "Blackwell"});
  bad({"--fp8-format", "hybrid", "--fp8-recipe", "custom"}, {"--fp8-recipe custom"});
  bad({"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "1"},
      {"--fp8-margin sets delayed scaling"});
  bad({"--fp8-format", "hybrid", "--fp8-amax-history-len", "0"},
      {"--fp8-amax-history-len 0 is out of range"});
  bad({"--fp8-format", "hybrid", "--num-layers-at-start-in-bf16", "2"},
      {"--num-layers-at-start-in-bf16 acts only with --first-last-layers-bf16"});
  bad({"--fp8-format", "hybrid", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "1",
       "--num-layers-at-end-in-bf16", "1"},
      {"leave none of the 2 layers in FP8"});
  bad({"--fp8-format", "hybrid", "--fp8-param-gather"},
      {"--fp8-param-gather", "--use-distributed-optimizer"});
  bad({"--fp8-format", "hybrid", "--fp16"}, {"--fp8-format with --fp16"});
  // MoE: FP8 expert GEMMs are accepted; the FP8 parameter gather of expert weights is not.
  const std::vector<std::string> moe = {"--num-experts", "4", "--disable-bias-linear"};
  std::vector<std::string> moe_fp8 = with(base_argv(), {"--fp8-format", "hybrid"});
  moe_fp8.insert(moe_fp8.end(), moe.begin(), moe.end());
  EXPECT_TRUE(fp8_config(parse_and_validate(moe_fp8)).enabled());
  bad({"--fp8-format", "hybrid", "--num-experts", "4", "--disable-bias-linear",
       "--use-distributed-optimizer", "--fp8-param-gather"},
      {"--fp8-param-gather with --num-experts"});
  // Megatron's router padding for FP8: its checks (FP8, the alltoall dispatcher), then the
  // pad multiple 16 in the model's config.
  bad({"--fp8-format", "hybrid", "--num-experts", "4", "--disable-bias-linear",
       "--moe-router-padding-for-fp8"},
      {"--moe-router-padding-for-fp8", "allgather", "alltoall"});
  bad({"--num-experts", "4", "--disable-bias-linear", "--moe-token-dispatcher-type", "alltoall",
       "--moe-router-padding-for-fp8"},
      {"--moe-router-padding-for-fp8 needs FP8 training"});
  bad({"--moe-router-padding-for-fp8"}, {"--moe-router-padding-for-fp8", "--num-experts"});
  std::vector<std::string> padded = moe_fp8;
  for (const char* f : {"--moe-token-dispatcher-type", "alltoall", "--moe-router-padding-for-fp8"})
    padded.push_back(f);
  EXPECT_EQ(model_config(parse_and_validate(padded), Device::CPU, DType::F32).moe.pad_multiple, 16);
  // argparse's choices already reject what Megatron's parser rejects.
  expect_error([] { parse_args({"--fp8-format", "e5m2"}); }, {"'e5m2' is not one of e4m3, hybrid"});
  // On the GPU FP8 needs --bf16.
  expect_error(
      [] {
        check_fp8_device(parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid"})),
                         Device::CUDA);
      },
      {"needs --bf16"});
  EXPECT_NO_THROW(check_fp8_device(
      parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid"})), Device::CPU));
}

}  // namespace fp8_flags_test
