// Tokenizer conformance. Tests that need the real GPT-2 files get them from
// scripts/fetch_assets.sh (cached in .cache/assets); they fail, not skip, without them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "data/dataset_builder.h"
#include "data/tokenizers/tokenizer.h"

using namespace mcpp;
using namespace mcpp::data;

namespace tokenizers_test {

std::string asset(const std::string& rel) {
  const char* env = std::getenv("MCPP_ASSETS");
  std::string root = env ? env : std::string(MCPP_SOURCE_DIR) + "/.cache/assets";
  std::string p = root + "/" + rel;
  EXPECT_TRUE(std::filesystem::exists(p)) << p << " missing: run scripts/fetch_assets.sh";
  return p;
}

const Tokenizer& gpt2() {
  static std::unique_ptr<Tokenizer> t =
      make_tokenizer({.type = "GPT2BPETokenizer",
                      .vocab_file = asset("gpt2/package/encoder.json"),
                      .merge_file = asset("gpt2/package/vocab.bpe")});
  return *t;
}


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

// --null-tokenizer-eod-id / --null-tokenizer-pad-id: another id as the EOD, a pad id (whose
// labels the dataset masks: pad_id_for), ids outside [0, V] and either flag with another
// tokenizer are errors naming the flag.
TEST(NullTokenizer, EodAndPadIds) {
  auto t = make_tokenizer({.type = "NullTokenizer", .vocab_size = 100, .null_eod_id = 0,
                           .null_pad_id = 7});
  EXPECT_EQ(t->vocab_size(), 101);
  EXPECT_EQ(t->eod(), 0);
  EXPECT_EQ(t->pad(), 7);
  EXPECT_EQ(pad_id_for(t->pad(), t->eod()), 7);
  auto plain = make_tokenizer({.type = "NullTokenizer", .vocab_size = 100});
  EXPECT_EQ(plain->eod(), 100);
  EXPECT_FALSE(plain->pad().has_value());
  EXPECT_EQ(pad_id_for(plain->pad(), plain->eod()), -1);
  auto fails = [](TokenizerArgs a, const char* what) {
    try {
      make_tokenizer(a);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails({.type = "NullTokenizer", .vocab_size = 100, .null_eod_id = 101},
        "--null-tokenizer-eod-id 101 is not a token id");
  fails({.type = "NullTokenizer", .vocab_size = 100, .null_pad_id = -2},
        "--null-tokenizer-pad-id -2 is not a token id");
  fails({.type = "GPT2BPETokenizer", .null_eod_id = 3},
        "--null-tokenizer-eod-id with --tokenizer-type GPT2BPETokenizer");
}

TEST(Tokenizer, UnknownTypeAndMissingFiles) {
  EXPECT_THROW(make_tokenizer({.type = "NoSuchTokenizer"}), Error);
  EXPECT_THROW(make_tokenizer({.type = "GPT2BPETokenizer", .vocab_file = "/nonexistent.json"}),
               Error);
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
  for (std::string s :
       {"It's  a test.\n\n  Tabs\tand   spaces   ", "naïve café — 東京 😀 123,456.78",
        "I'll we've they're DON'T", "\xc2\xa0nbsp and \xe2\x80\xa8 separators"}) {
    auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
  }
}

// tiktoken's r50k_base is GPT-2's encoding; gpt-tokenizer ships 64 test vectors for it
// (multilingual text, emoji, whitespace runs, code).
TEST(GPT2BPE, TiktokenR50kTestPlans) {
  std::ifstream f(asset("tiktoken/package/data/TestPlans.txt"));
  ASSERT_TRUE(f.good());
  std::string enc, line;
  int checked = 0;
  std::string sample;
  while (std::getline(f, line)) {
    if (line.rfind("EncodingName: ", 0) == 0)
      enc = line.substr(14);
    else if (line.rfind("Sample: ", 0) == 0)
      sample = line.substr(8);
    else if (line.rfind("Encoded: ", 0) == 0 && enc == "r50k_base") {
      std::vector<int32_t> want;
      std::string body = line.substr(9);
      for (char& c : body)
        if (c == '[' || c == ']' || c == ',') c = ' ';
      std::istringstream is(body);
      for (int32_t v; is >> v;) want.push_back(v);
      EXPECT_EQ(gpt2().encode(sample), want) << "sample: " << sample;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 64);
}

#ifdef MCPP_HAVE_SENTENCEPIECE
TEST(Llama2Tokenizer, KnownIdsAndSpecials) {
  auto t =
      make_tokenizer({.type = "Llama2Tokenizer", .tokenizer_model = asset("llama/llama.model")});
  EXPECT_EQ(t->vocab_size(), 32000);
  EXPECT_EQ(t->eod(), 2);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_FALSE(t->pad());
  EXPECT_EQ(t->encode("Hello world"),
            (std::vector<int32_t>{1, 15043, 3186}));  // BOS first, as Megatron
  std::vector<int32_t> ids{15043, 3186};
  EXPECT_EQ(t->decode(ids), "Hello world");
}

// token_to_id / is_special (what --fim-data resolves its tokens with).
TEST(Llama2Tokenizer, TokenToIdAndSpecials) {
  auto t =
      make_tokenizer({.type = "Llama2Tokenizer", .tokenizer_model = asset("llama/llama.model")});
  EXPECT_EQ(t->token_to_id("\xE2\x96\x81Hello"), 15043);  // "▁Hello"
  EXPECT_EQ(t->token_to_id("<s>"), 1);
  EXPECT_FALSE(t->token_to_id("<fim_prefix>"));  // not unk's id
  EXPECT_TRUE(t->is_special(1) && t->is_special(2));
  EXPECT_FALSE(t->is_special(15043));
}
#endif

TEST(GPT2BPE, TokenToIdAndSpecials) {
  EXPECT_EQ(gpt2().token_to_id("\xC4\xA0the"), 262);  // "Ġthe": encoder.json's spelling
  EXPECT_EQ(gpt2().token_to_id("hello"), 31373);
  EXPECT_EQ(gpt2().token_to_id("<|endoftext|>"), 50256);
  EXPECT_FALSE(gpt2().token_to_id("<fim_prefix>"));
  EXPECT_FALSE(gpt2().token_to_id(" the"));  // raw bytes are not the vocabulary's spelling
  EXPECT_TRUE(gpt2().is_special(50256));
  EXPECT_FALSE(gpt2().is_special(262));
  NullTokenizer null(10);
  EXPECT_FALSE(null.token_to_id("3"));
  EXPECT_FALSE(null.is_special(10));
}

// --tokenizer-hf-no-include-special-tokens: a tokenizer.json whose post-processor puts
// <file_sep> (id 260) before every text, as Llama-3's puts its BOS. By default encode adds
// it and decode keeps special tokens (Megatron's tokenizer(text).input_ids); with the switch
// off, encode leaves the template out (added tokens in the text still match) and decode
// drops special tokens. Only HuggingFaceTokenizer takes the switch.
TEST(HuggingFace, IncludeSpecialTokensSwitch) {
  std::ifstream in(std::string(MCPP_SOURCE_DIR) + "/tests/golden/fim/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string j = ss.str();
  const std::string null_post = "\"post_processor\": null";
  ASSERT_NE(j.find(null_post), std::string::npos);
  j.replace(j.find(null_post), null_post.size(),
            R"("post_processor": {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<file_sep>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}}],
               "pair": [], "special_tokens": {"<file_sep>": {"id": "<file_sep>",
               "ids": [260], "tokens": ["<file_sep>"]}}})");
  const auto dir = std::filesystem::temp_directory_path() / "mcpp_hf_include_special";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j;
  TokenizerArgs a{.type = "HuggingFaceTokenizer", .tokenizer_model = (dir / "tokenizer.json")};
  auto with = make_tokenizer(a);
  a.include_special_tokens = false;
  auto without = make_tokenizer(a);
  std::vector<int32_t> w, wo, fim;
  with->encode("hi", w);
  without->encode("hi", wo);
  ASSERT_FALSE(wo.empty());
  EXPECT_EQ(w.front(), 260);
  EXPECT_EQ(std::vector<int32_t>(w.begin() + 1, w.end()), wo);
  EXPECT_EQ(with->decode(w), "<file_sep>hi");
  EXPECT_EQ(without->decode(w), "hi");
  without->encode("<fim_prefix>hi", fim);
  EXPECT_EQ(fim.front(), 256);
  EXPECT_THROW(
      {
        try {
          make_tokenizer({.type = "GPT2BPETokenizer",
                          .vocab_file = asset("gpt2/package/encoder.json"),
                          .merge_file = asset("gpt2/package/vocab.bpe"),
                          .include_special_tokens = false});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("only HuggingFaceTokenizer adds special"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  std::filesystem::remove_all(dir);
}

}  // namespace tokenizers_test
