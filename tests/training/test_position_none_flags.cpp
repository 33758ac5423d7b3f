// --position-embedding-type none (no learned table, no RoPE): the model config it gives,
// sequences past --max-position-embeddings allowed, and the start-up errors for what needs
// positions.
#include <gtest/gtest.h>

#include <string>

#include "model/config.h"
#include "test_util.h"
#include "training/memory_plan.h"

namespace position_none_flags_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

std::vector<std::string> none_argv() {
  return with(base_argv(), {"--position-embedding-type", "none"});
}

model::TransformerConfig config_of(Args a) {
  a.padded_vocab_size = 128;
  return model_config(a, Device::CPU, DType::F32);
}

TEST(PositionNoneFlags, GivesAModelWithoutPositions) {
  const auto c = config_of(parse_and_validate(none_argv()));
  EXPECT_TRUE(c.no_positions);
  EXPECT_FALSE(c.rope);
  EXPECT_FALSE(c.learned_positions());
  EXPECT_NO_THROW(c.validate());
  const auto learned = config_of(parse_and_validate(base_argv()));
  EXPECT_TRUE(learned.learned_positions());
  EXPECT_FALSE(learned.no_positions);
  // No table bounds the sequence: --seq-length past --max-position-embeddings is a model
  // without positions' right (as it is RoPE's); a learned table's rows are its limit.
  auto longer = c;
  longer.seq_length = 4 * c.max_position_embeddings;
  EXPECT_NO_THROW(longer.validate());
  auto learned_longer = learned;
  learned_longer.seq_length = 4 * learned.max_position_embeddings;
  EXPECT_THROW(learned_longer.validate(), Error);
  auto both = c;
  both.rope = true;
  EXPECT_THROW(both.validate(), Error);
}

TEST(PositionNoneFlags, WhatNeedsPositionsIsAnError) {
  auto invalid = [](const std::vector<std::string>& argv, const std::string& needle) {
    expect_error([&] { parse_and_validate(argv); }, {needle});
  };
  invalid(with(none_argv(), {"--use-rope-scaling"}),
          "--use-rope-scaling rescales RoPE's frequencies, but --position-embedding-type is none");
  invalid(with(none_argv(), {"--rotary-interleaved"}),
          "--rotary-interleaved changes RoPE's pairs, but --position-embedding-type is none");
  invalid(with(none_argv(), {"--mtp-num-layers", "1"}),
          "--mtp-num-layers with --position-embedding-type none");
  invalid(with(none_argv(), {"--no-position-embedding"}),
          "--no-position-embedding with --position-embedding-type none");
  invalid(with(none_argv(), {"--yarn-beta-fast", "4"}),
          "--yarn-beta-fast configures YaRN, but --position-embedding-type is none");
  invalid(with(base_argv(), {"--position-embedding-type", "relative"}),
          "--position-embedding-type relative is not implemented yet");
}

}  // namespace position_none_flags_test
