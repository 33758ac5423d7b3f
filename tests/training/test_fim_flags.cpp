// --fim-data and its ten flags: the values reach Args, and each start-up error names the flag
// and gives a HINT (training/fim_setup.cpp).
#include <string>
#include <vector>

#include "test_util.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace fim_flags_test {

// base_argv with a dataset instead of mock data (validate_args does not open it) and a
// tokenizer type that has text.
std::vector<std::string> data_argv() {
  auto v = without(without(without(base_argv(), "--mock-data"), "--tokenizer-type"),
                   "--vocab-size");
  return with(v, {"--data-path", "code_text_document", "--tokenizer-type",
                  "HuggingFaceTokenizer", "--tokenizer-model", "tok"});
}

TEST(FimFlags, ValuesReachArgs) {
  Args a = parse_and_validate(with(data_argv(), {"--fim-data", "--fim-rate", "0.25",
                                                 "--fim-spm-rate", "1", "--fim-split-sample",
                                                 "<file_sep>", "--fim-fragment-rate", "0.5",
                                                 "--fim-no-prefix", "<|repo|>",
                                                 "--fim-pad-token", "<pad>"}));
  EXPECT_TRUE(a.fim_data);
  EXPECT_EQ(a.fim_rate, 0.25);
  EXPECT_EQ(a.fim_spm_rate, 1.0);
  EXPECT_EQ(a.fim_split_sample, "<file_sep>");
  EXPECT_EQ(a.fim_fragment_rate, 0.5);
  EXPECT_EQ(a.fim_no_prefix, "<|repo|>");
  EXPECT_EQ(a.fim_pad_token, "<pad>");
  EXPECT_EQ(a.fim_prefix_token, "<fim_prefix>");  // Megatron's defaults
  EXPECT_EQ(a.fim_eod_token, "<|endoftext|>");
  Args off = parse_and_validate(data_argv());
  EXPECT_FALSE(off.fim_data);
  EXPECT_EQ(off.fim_rate, 0.5);
}

TEST(FimFlags, FlagsWithoutFimDataAreErrors) {
  const std::vector<std::vector<std::string>> flags = {
      {"--fim-rate", "0.3"},          {"--fim-spm-rate", "0.3"},
      {"--fim-split-sample", "x"},    {"--fim-fragment-rate", "0.3"},
      {"--fim-no-prefix", "x"},       {"--fim-prefix-token", "<p>"},
      {"--fim-middle-token", "<m>"},  {"--fim-suffix-token", "<s>"},
      {"--fim-pad-token", "<pad>"},   {"--fim-eod-token", "<eod>"}};
  for (const auto& f : flags) {
    auto argv = data_argv();
    argv.insert(argv.end(), f.begin(), f.end());
    expect_error([&] { parse_and_validate(argv); }, {f[0] + " without --fim-data"});
  }
  // Megatron's default value given explicitly counts as given too.
  expect_error([&] { parse_and_validate(with(data_argv(), {"--fim-rate", "0.5"})); },
               {"--fim-rate without --fim-data"});
}

TEST(FimFlags, RatesAreProbabilities) {
  auto fim = with(data_argv(), {"--fim-data"});
  expect_error([&] { parse_and_validate(with(fim, {"--fim-rate", "1.5"})); },
               {"--fim-rate 1.5", "[0, 1]"});
  expect_error([&] { parse_and_validate(with(fim, {"--fim-spm-rate", "-0.1"})); },
               {"--fim-spm-rate -0.1"});
  expect_error(
      [&] {
        parse_and_validate(
            with(fim, {"--fim-split-sample", "x", "--fim-fragment-rate", "2"}));
      },
      {"--fim-fragment-rate 2"});
  Args zero = parse_and_validate(with(fim, {"--fim-rate", "0", "--fim-spm-rate", "0"}));
  EXPECT_EQ(zero.fim_rate, 0.0);  // allowed here (Megatron's `assert args.fim_rate` is not)
}

TEST(FimFlags, SplitSampleAndFragmentRateGoTogether) {
  auto fim = with(data_argv(), {"--fim-data"});
  expect_error([&] { parse_and_validate(with(fim, {"--fim-split-sample", "<file_sep>"})); },
               {"--fim-split-sample <file_sep> without --fim-fragment-rate"});
  expect_error([&] { parse_and_validate(with(fim, {"--fim-fragment-rate", "0.5"})); },
               {"--fim-fragment-rate 0.5 without --fim-split-sample"});
}

TEST(FimFlags, MockDataAndNullTokenizerCannotWork) {
  expect_error([&] { parse_and_validate(with(base_argv(), {"--fim-data"})); },
               {"--fim-data with --mock-data"});
  auto null_data = with(without(base_argv(), "--mock-data"), {"--data-path", "d", "--fim-data"});
  expect_error([&] { parse_and_validate(null_data); },
               {"--fim-data with --tokenizer-type NullTokenizer"});
}

}  // namespace fim_flags_test
