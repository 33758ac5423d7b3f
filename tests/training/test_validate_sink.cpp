// --softmax-type at start-up: its values reach the model config, an unknown one is an error
// naming the flag, and the hierarchical context-parallel exchange refuses sinks naming both
// flags (the other CP exchanges take them).
#include "model/config.h"
#include "test_util.h"
#include "training/memory_plan.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace validate_sink_test {

TEST(ValidateSink, SoftmaxTypes) {
  using ST = model::TransformerConfig::SoftmaxType;
  for (auto [name, want] : {std::pair{"vanilla", ST::Vanilla}, {"off-by-one", ST::OffByOne},
                            {"learnable", ST::Learnable}}) {
    Args a = parse_and_validate(with(base_argv(), {"--softmax-type", name}), 1);
    EXPECT_EQ(a.softmax_type, name);
    EXPECT_EQ(model_config(a, Device::CPU, DType::F32).softmax_type, want);
  }
  expect_error([] { parse_and_validate(with(base_argv(), {"--softmax-type", "sparse"}), 1); },
               {"--softmax-type"});
}

TEST(ValidateSink, ContextParallelExchanges) {
  auto cp = [](const char* type, const std::vector<std::string>& more = {}) {
    auto v = with(base_argv(), {"--softmax-type", "learnable", "--context-parallel-size", "4",
                                "--cp-comm-type", type});
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  for (const char* t : {"p2p", "a2a", "all_gather"})
    EXPECT_NO_THROW(parse_and_validate(cp(t), 4)) << t;
  EXPECT_NO_THROW(
      parse_and_validate(cp("a2a+p2p", {"--hierarchical-context-parallel-sizes", "2", "2"}), 4));
}

}  // namespace validate_sink_test
