// Tokenizer conformance. Tests that need the real GPT-2 files get them from
// scripts/fetch_assets.sh (cached in .cache/assets); they fail, not skip, without them.
#include <gtest/gtest.h>

#include <filesystem>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

using namespace mcpp;
using namespace mcpp::data;

namespace {

std::string asset(const std::string& rel) {
  const char* env = std::getenv("MCPP_ASSETS");
  std::string root = env ? env : std::string(MCPP_SOURCE_DIR) + "/.cache/assets";
  std::string p = root + "/" + rel;
  EXPECT_TRUE(std::filesystem::exists(p)) << p << " missing: run scripts/fetch_assets.sh";
  return p;
}

const Tokenizer& gpt2() {
  static std::unique_ptr<Tokenizer> t = make_tokenizer(
      {.type = "GPT2BPETokenizer", .vocab_file = asset("gpt2/package/encoder.json"),
       .merge_file = asset("gpt2/package/vocab.bpe")});
  return *t;
}

}  // namespace

TEST(NullTokenizer, Semantics) {
  auto t = make_tokenizer({.type = "NullTokenizer", .vocab_size = 100});
  EXPECT_EQ(t->vocab_size(), 101);
  EXPECT_EQ(t->eod(), 100);
  EXPECT_EQ(t->encode("1 2  3\n99"), (std::vector<int32_t>{1, 2, 3, 99}));
  std::vector<int32_t> ids{4, 5};
  EXPECT_EQ(t->decode(ids), "4 5");
  EXPECT_THROW(t->encode("1 x"), Error);
  EXPECT_THROW(make_tokenizer({.type = "NullTokenizer"}), Error);
}

TEST(Tokenizer, UnknownTypeAndMissingFiles) {
  EXPECT_THROW(make_tokenizer({.type = "NoSuchTokenizer"}), Error);
  EXPECT_THROW(make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = "/nonexistent.json"}), Error);
  EXPECT_THROW(make_tokenizer({.type = "TikTokenizer"}), Error);
}

TEST(GPT2BPE, KnownIds) {
  const auto& t = gpt2();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eod(), 50256);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{31373, 995}));
  EXPECT_TRUE(t.encode("").empty());
}

TEST(GPT2BPE, RoundTripsUnicodeAndWhitespace) {
  const auto& t = gpt2();
  for (std::string s : {"It's  a test.\n\n  Tabs\tand   spaces   ", "naïve café — 東京 😀 123,456.78",
                        "I'll we've they're DON'T", "\xc2\xa0nbsp and \xe2\x80\xa8 separators"}) {
    auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
  }
}
