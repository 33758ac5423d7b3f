// --profile, --profile-step-start/-end, --profile-ranks and --attention-backend: parsed into
// Args (no longer "not implemented" errors), shown by print_args, and --profile's CPU
// behaviour as documented in training/profiler.h: an error naming --device cuda.
#include <gtest/gtest.h>

#include "ops/attention_backend.h"
#include "test_util.h"
#include "training/profiler.h"

namespace profile_flag_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(ProfileFlag, ParsesWithMegatronsDefaults) {
  const Args d = parse_and_validate(base_argv());
  EXPECT_FALSE(d.profile);
  EXPECT_EQ(d.profile_step_start, 10);
  EXPECT_EQ(d.profile_step_end, 12);
  EXPECT_EQ(d.profile_ranks, std::vector<int64_t>{0});
  const Args a =
      parse_and_validate(with(base_argv(), {"--profile", "--profile-step-start", "3",
                                            "--profile-step-end", "5", "--profile-ranks", "0",
                                            "2", "--tensor-model-parallel-size", "4"}),
                         4);
  EXPECT_TRUE(a.profile);
  EXPECT_EQ(a.profile_step_start, 3);
  EXPECT_EQ(a.profile_step_end, 5);
  EXPECT_EQ(a.profile_ranks, (std::vector<int64_t>{0, 2}));
  const std::string shown = format_args(a);
  EXPECT_NE(shown.find("profile_ranks"), std::string::npos) << shown;
  EXPECT_NE(shown.find("[0, 2]"), std::string::npos) << shown;
  expect_error([] { parse_args({"--profile-step-start", "ten"}); },
               {"--profile-step-start expects an integer"});
}

TEST(ProfileFlag, OnTheCpuIsAnErrorNamingDeviceCuda) {
  Args a = parse_and_validate(with(base_argv(), {"--profile"}));
  expect_error([&] { check_profile_args(a, Device::CPU, 1); },
               {"--profile needs --device cuda"});
  expect_error([&] { StepProfiler p(a, Device::CPU, 0, 1); }, {"--profile needs --device cuda"});
  // Without --profile nothing is checked, on any device.
  a.profile = false;
  EXPECT_NO_THROW(check_profile_args(a, Device::CPU, 1));
  StepProfiler off(a, Device::CPU, 0, 1);
  off.before_step(10);
  off.after_step(11);
  EXPECT_FALSE(off.active());
}

TEST(ProfileFlag, WindowAndRanksAreChecked) {
  Args a = parse_and_validate(with(base_argv(), {"--profile"}));
  EXPECT_NO_THROW(check_profile_args(a, Device::CUDA, 1));
  a.profile_step_end = a.profile_step_start;
  expect_error([&] { check_profile_args(a, Device::CUDA, 1); },
               {"--profile-step-start 10 and --profile-step-end 10 leave no iteration"});
  a.profile_step_end = 12;
  a.profile_ranks = {0, 4};
  expect_error([&] { check_profile_args(a, Device::CUDA, 4); },
               {"--profile-ranks 4: there is no rank 4 in a world of 4"});
}

TEST(AttentionBackendFlag, ParsesMegatronsNames) {
  EXPECT_EQ(parse_and_validate(base_argv()).attention_backend, "auto");
  for (const char* v : {"auto", "fused", "flash", "unfused", "local"}) {
    const Args a = parse_and_validate(with(base_argv(), {"--attention-backend", v}));
    EXPECT_EQ(a.attention_backend, v);
    EXPECT_STREQ(ops::attention_request_name(ops::parse_attention_request(a.attention_backend)),
                 v);
  }
  EXPECT_EQ(ops::parse_attention_request("AttnBackend.fused"), ops::AttentionRequest::Fused);
  expect_error([] { parse_args({"--attention-backend", "cudnn"}); },
               {"'cudnn' is not one of flash, fused, unfused, local, auto"});
  expect_error([] { ops::parse_attention_request("cudnn"); }, {"--attention-backend: 'cudnn'"});
}

}  // namespace profile_flag_test
