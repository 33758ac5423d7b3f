// Sliding-window attention's flags (training/validate_window.h): --window-size's tuple_type
// syntax, Megatron's is_layer_window_attention rule (int, list, None; global 1-based layer
// numbers, so pipeline and virtual stages offset them), the model config they give, and the
// start-up errors and warning.
#include <gtest/gtest.h>

#include "model/config.h"
#include "test_util.h"
#include "training/memory_plan.h"
#include "training/validate_window.h"

namespace window_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(WindowFlags, WindowSizeParsesTupleType) {
  EXPECT_EQ(parse_window_size("63,0").left, 63);
  EXPECT_EQ(parse_window_size("(63,0)").right, 0);
  EXPECT_EQ(parse_window_size("(4, 2)").right, 2);
  EXPECT_EQ(parse_window_size("-1,0").left, -1);
  expect_error([] { parse_window_size("-2,0"); }, {"--window-size", "-2"});
  expect_error([] { parse_window_size("5"); }, {"--window-size", "expected 2"});
  expect_error([] { parse_window_size("5,0,1"); }, {"--window-size", "expected 2"});
  expect_error([] { parse_window_size("a,0"); }, {"--window-size", "not an integer"});
  expect_error([] { parse_window_size(""); }, {"--window-size"});
}

TEST(WindowFlags, IsLayerWindowAttentionFollowsMegatron) {
  const std::optional<WindowSize> w = WindowSize{7, 0}, none;
  const std::optional<std::string> no_freq;
  // No window: no layer slides, whatever the frequency.
  for (int64_t l = 1; l <= 4; ++l) EXPECT_FALSE(is_layer_window_attention(none, "2", l, 4));
  // No frequency: every layer.
  for (int64_t l = 1; l <= 4; ++l) EXPECT_TRUE(is_layer_window_attention(w, no_freq, l, 4));
  // An integer N: layer_number % N != 0 (N 1: none; N 3: layers 3, 6 full).
  EXPECT_EQ(window_layer_pattern(w, "3", 6), (std::vector<int64_t>{1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(window_layer_pattern(w, "1", 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(window_layer_pattern(w, "2", 4), (std::vector<int64_t>{1, 0, 1, 0}));
  // A list: its entry layer_number - 1, non-zero slides.
  EXPECT_EQ(window_layer_pattern(w, "[1,1,1,0]*3", 12),
            (std::vector<int64_t>{1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(window_layer_pattern(w, "([0]+[2]*2)", 3), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_TRUE(is_layer_window_attention(w, "[0,1,0]", 2, 3));
  EXPECT_FALSE(is_layer_window_attention(w, "[0,1,0]", 3, 3));
  // Errors: list length, N < 1, malformed expression.
  expect_error([&] { window_layer_pattern(w, "[1,0]", 3); },
               {"--window-attn-skip-freq", "2 entries", "--num-layers is 3"});
  expect_error([&] { window_layer_pattern(w, "0", 3); }, {"--window-attn-skip-freq", "positive"});
  expect_error([&] { window_layer_pattern(w, "[1,", 3); }, {"--window-attn-skip-freq"});
}

TEST(WindowFlags, ValidateSetsTheModelWindow) {
  Args a = parse_and_validate(
      with(base_argv(), {"--window-size", "(5,0)", "--window-attn-skip-freq", "2"}));
  a.padded_vocab_size = 128;
  EXPECT_EQ(a.window_left, 5);
  EXPECT_EQ(a.window_layer_pattern, (std::vector<int64_t>{1, 0}));
  const model::TransformerConfig c = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(c.has_window_layers());
  EXPECT_TRUE(c.is_window_layer(0));
  EXPECT_FALSE(c.is_window_layer(1));
  // Unbounded (-1) or absent: no window layer.
  // (A value starting with '-' is a flag to argparse as here: "(-1,0)" or --window-size=-1,0.)
  for (const auto& v :
       {with(base_argv(), {"--window-size", "(-1,0)"}), with(base_argv(), {"--window-size=-1,0"}),
        base_argv(), with(base_argv(), {"--window-attn-skip-freq", "2"})}) {
    Args b = parse_and_validate(v);
    b.padded_vocab_size = 128;
    EXPECT_EQ(b.window_left, -1);
    EXPECT_FALSE(model_config(b, Device::CPU, DType::F32).has_window_layers());
  }
}

// Multi-token prediction with a window: depth k slides as decoder layer k (Megatron's layer
// number k + 1); more depths than decoder layers have no such rule and are refused.
TEST(WindowFlags, MtpDepthsSlideAsTheDecodersLayers) {
  const auto rope = with(base_argv(), {"--position-embedding-type", "rope", "--window-size",
                                       "(5,0)", "--window-attn-skip-freq", "2"});
  Args a = parse_and_validate(with(rope, {"--mtp-num-layers", "2"}));
  a.padded_vocab_size = 128;
  const model::TransformerConfig c = model_config(a, Device::CPU, DType::F32);
  const int64_t base = model::TransformerConfig::kMtpLayerBase;
  EXPECT_TRUE(c.is_window_layer(base + 0));   // layer number 1: 1 % 2 != 0
  EXPECT_FALSE(c.is_window_layer(base + 1));  // layer number 2
  expect_error([&] { parse_and_validate(with(rope, {"--mtp-num-layers", "3"})); },
               {"--mtp-num-layers 3 with --window-size", "2 decoder layers"});
}

TEST(WindowFlags, StartUpErrors) {
  expect_error([] { parse_and_validate(with(base_argv(), {"--window-size=-3,0"})); },
               {"--window-size", "-3"});
  expect_error(
      [] {
        parse_and_validate(
            with(base_argv(), {"--window-size", "4,0", "--window-attn-skip-freq", "[1,0,1]"}));
      },
      {"--window-attn-skip-freq", "3 entries", "--num-layers is 2"});
  expect_error(
      [] {
        parse_and_validate(with(base_argv(), {"--window-size", "4"}));
      },
      {"--window-size", "expected 2"});
}

TEST(WindowFlags, RightExtentWarnsAndBecomesZero) {
  testing::internal::CaptureStderr();
  const Args a = parse_and_validate(with(base_argv(), {"--window-size", "4,3"}));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--window-size (4, 3)"), std::string::npos) << err;
  EXPECT_NE(err.find("(4, 0)"), std::string::npos) << err;
  EXPECT_EQ(a.window_left, 4);
  testing::internal::CaptureStderr();
  parse_and_validate(with(base_argv(), {"--window-size", "4,0"}));
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("--window-size"), std::string::npos);
}

// Pipeline and virtual stages: each chunk's layers keep their global numbers, so the
// pattern is the one of the whole model, not of a stage's local layers.
TEST(WindowFlags, PipelineStagesUseGlobalLayerNumbers) {
  const std::string freq = "[1,1,0,1,0,0,1,0]";
  Args a = parse_and_validate(
      with(without(base_argv(), "--num-layers"),
           {"--num-layers", "8", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "2", "--global-batch-size", "8",
            "--window-size", "3,0", "--window-attn-skip-freq", freq}),
      2);
  a.padded_vocab_size = 128;
  const model::TransformerConfig c = model_config(a, Device::CPU, DType::F32);
  int seen = 0;
  for (int stage = 0; stage < 2; ++stage)
    for (const auto& chunk : pipeline_part(a, stage).chunks)
      for (int layer : chunk) {
        const bool want = is_layer_window_attention(WindowSize{3, 0}, freq, layer + 1, 8);
        EXPECT_EQ(c.is_window_layer(layer), want) << "stage " << stage << " layer " << layer;
        ++seen;
      }
  EXPECT_EQ(seen, 8);
  // Stage 1's first chunk holds global layers 2 and 3: full and window.
  const auto part1 = pipeline_part(a, 1);
  ASSERT_FALSE(part1.chunks.empty());
  EXPECT_EQ(part1.chunks[0], (std::vector<int>{2, 3}));
  EXPECT_FALSE(c.is_window_layer(2));
  EXPECT_TRUE(c.is_window_layer(3));
}

}  // namespace window_flags_test
