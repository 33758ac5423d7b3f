// The iteration and validation lines, byte for byte (megatron.md §5.4).
#include <gtest/gtest.h>

#include <regex>

#include "training/log_line.h"

using namespace mcpp::training;

namespace log_line_test {
IterationLog example() {
  IterationLog l;
  l.timestamp = "2026-11-29 15:46:11.709595";
  l.iteration = 5;
  l.train_iters = 30;
  l.consumed_samples = 320;
  l.elapsed_ms_per_iteration = 1004.5;
  l.throughput_tflops = 52.1;
  l.learning_rate = 6e-4;
  l.global_batch_size = 64;
  l.losses = {{"lm loss", 10.76833}};
  l.loss_scale = 1.0;
  l.grad_norm = 1.023;
  return l;
}

TEST(LogLine, MatchesMegatronRealRun) {
  EXPECT_EQ(format_iteration_line(example()),
            " [2026-11-29 15:46:11.709595] iteration        5/      30 | consumed samples:   "
            "       320 | elapsed time per iteration (ms): 1004.5 | throughput per GPU "
            "(TFLOP/s/GPU): 52.1 | learning rate: 6.000000E-04 | global batch size:    64 | lm "
            "loss: 1.076833E+01 | loss scale: 1.0 | grad norm: 1.023 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |");
}

TEST(LogLine, OptionalFieldsAndOurTokensPerSecond) {
  IterationLog l = example();
  l.throughput_tflops.reset();
  l.grad_norm.reset();
  l.learning_rate.reset();
  l.skipped_iterations = 2;
  l.nan_iterations = 1;
  l.skipped_samples = 7;
  l.num_zeros_in_grad = 12;
  l.params_norm = 250.1234;
  l.losses.push_back({"mtp_1 loss", 0.0});  // zero losses are not printed, as Megatron
  l.tokens_per_sec_per_gpu = 65432.14;
  EXPECT_EQ(format_iteration_line(l),
            " [2026-11-29 15:46:11.709595] iteration        5/      30 | consumed samples:   "
            "       320 | skipped samples:            7 | elapsed time per iteration (ms): "
            "1004.5 | learning rate: None | global batch size:    64 | lm loss: 1.076833E+01 | "
            "loss scale: 1.0 | num zeros: 12.0 | params norm: 250.123 | number of skipped "
            "iterations:   2 | number of nan iterations:   1 | tokens per second per GPU: "
            "65432.1 |");
}

// --decoupled-lr: Megatron prints the decoupled group's rate right after the learning rate.
TEST(LogLine, DecoupledLearningRateFollowsTheLearningRate) {
  IterationLog l;
  l.timestamp = "2026-11-29 15:46:11.709595";
  l.iteration = 1, l.train_iters = 2, l.consumed_samples = 4, l.global_batch_size = 4;
  l.learning_rate = 3e-4, l.decoupled_learning_rate = 1.5e-3;
  const std::string s = format_iteration_line(l);
  EXPECT_NE(s.find("| learning rate: 3.000000E-04 | decoupled learning rate: 1.500000E-03 | "
                   "global batch size:     4 |"),
            std::string::npos)
      << s;
}

// --log-energy: Megatron's two fields right after the throughput, before the learning rate.
TEST(LogLine, EnergyAndPowerFollowTheThroughput) {
  IterationLog l = example();
  l.energy_j_per_iteration = 312.46, l.power_w = 311.06;
  EXPECT_EQ(format_iteration_line(l),
            " [2026-11-29 15:46:11.709595] iteration        5/      30 | consumed samples:   "
            "       320 | elapsed time per iteration (ms): 1004.5 | throughput per GPU "
            "(TFLOP/s/GPU): 52.1 | energy per GPU (J/iter/GPU): 312.5 | power per GPU (W/GPU): "
            "311.1 | learning rate: 6.000000E-04 | global batch size:    64 | lm "
            "loss: 1.076833E+01 | loss scale: 1.0 | grad norm: 1.023 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |");
}

TEST(LogLine, ValidationLine) {
  const std::string v = format_validation_line("iteration 100", {{"lm loss", 5.0}});
  EXPECT_EQ(v,
            " validation loss at iteration 100 | lm loss value: 5.000000E+00 | lm loss PPL: "
            "1.484132E+02 | ");
  EXPECT_EQ(validation_rule(v), std::string(v.size() + 1, '-'));
  // PPL is exp(min(20, loss)).
  EXPECT_NE(format_validation_line("iteration 1", {{"lm loss", 30.0}}).find("PPL: 4.851652E+08"),
            std::string::npos);
  // One of several validation sets (--multiple-validation-sets): Megatron's suffix.
  EXPECT_EQ(format_validation_line("iteration 5", {{"lm loss", 5.0}}, "-wiki")
                .rfind(" validation-wiki loss at iteration 5 | lm loss value: 5.000000E+00", 0),
            0u);
}

TEST(LogLine, NowTimestampShape) {
  EXPECT_TRUE(
      std::regex_match(now_timestamp(), std::regex(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})")));
  IterationLog l = example();
  l.timestamp.clear();
  EXPECT_EQ(format_iteration_line(l).rfind(" [", 0), 0u);
}

}  // namespace log_line_test
