// Unicode normalization (libutf8proc) and the NFC/NFD/NFKC/NFKD normalizers of
// tokenizer.json. Vectors from UAX #15 (Unicode Normalization Forms) and its examples.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"
#include "data/tokenizers/unicode_norm.h"

using namespace mcpp;
using namespace mcpp::data;
using json = nlohmann::json;

namespace unicode_norm_test {

// A character-level BPE tokenizer.json (no byte fallback, no unk: a character outside
// the vocabulary is an error) whose ids show which form the text reached the model in.
std::string write_fixture(const json& normalizer) {
  json vocab = {{"c", 0},       {"a", 1},       {"f", 2},       {"e", 3},         {"\u0301", 4},
                {"\u00e9", 5},  {"ca", 6},      {"caf", 7},     {"caf\u00e9", 8}, {"</s>", 9},
                {"fi", 10},     {"i", 11},      {"\ufb01", 12}, {"\uac01", 13},   {"\u1100", 14},
                {"\u1161", 15}, {"\u11a8", 16}, {" ", 17},      {"\u00c5", 18},   {"\u212b", 19},
                {"A", 20},      {"\u030a", 21}};
  json j = {
      {"version", "1.0"},
      {"normalizer", normalizer},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"c a", "ca f", "caf \u00e9", "f i"}}}}};
  auto dir = std::filesystem::temp_directory_path() /
             ("mcpp_nfc_" + std::to_string(::getpid()) + "_" +
              std::to_string(std::hash<std::string>{}(normalizer.dump())));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  return dir.string();
}

std::unique_ptr<Tokenizer> fixture(const json& normalizer) {
  return make_tokenizer(
      {.type = "HuggingFaceTokenizer", .tokenizer_model = write_fixture(normalizer)});
}

using Ids = std::vector<int32_t>;


#ifdef MCPP_HAVE_UTF8PROC

TEST(UnicodeNorm, KnownVectors) {
  EXPECT_TRUE(unicode_normalization_available());
  auto nfc = [](std::string_view s) { return normalize(s, UnicodeForm::NFC); };
  auto nfd = [](std::string_view s) { return normalize(s, UnicodeForm::NFD); };
  auto nfkc = [](std::string_view s) { return normalize(s, UnicodeForm::NFKC); };
  auto nfkd = [](std::string_view s) { return normalize(s, UnicodeForm::NFKD); };
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfd("\u00e9"), "e\u0301");
  // Hangul: conjoining jamo compose algorithmically (L V T -> one syllable) and back.
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(nfd("\uac01"), "\u1100\u1161\u11a8");
  EXPECT_EQ(nfc("\u1112\u1161\u11ab\u1100\u1173\u11af"), "\ud55c\uae00");  // 한글
  // Singletons: ANGSTROM SIGN is never kept, in any form.
  EXPECT_EQ(nfc("\u212b"), "\u00c5");
  EXPECT_EQ(nfd("\u212b"), "A\u030a");
  // Canonical ordering of combining marks (dot below, ccc 220, before dot above, 230).
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");  // UAX #15's d + dots example
  // UAX #15 figure 6: long s with dot above, combining dot below.
  EXPECT_EQ(nfc("\u1e9b\u0323"), "\u1e9b\u0323");
  EXPECT_EQ(nfd("\u1e9b\u0323"), "\u017f\u0323\u0307");
  EXPECT_EQ(nfkc("\u1e9b\u0323"), "\u1e69");
  EXPECT_EQ(nfkd("\u1e9b\u0323"), "s\u0323\u0307");
  // Compatibility characters change only under NFKC/NFKD.
  EXPECT_EQ(nfc("\ufb01 \u2460 \uff21"), "\ufb01 \u2460 \uff21");
  EXPECT_EQ(nfkc("\ufb01 \u2460 \uff21"), "fi 1 A");
  EXPECT_EQ(nfkd("\ufb01"), "fi");
  // Already in NFC: unchanged, byte for byte (ASCII never reaches the library).
  for (const std::string& s :
       std::vector<std::string>{"Hello, world!", "na\u00efve caf\u00e9 \u6771\u4eac \U0001f600",
                                "\u0301 leading mark", std::string("nul\0inside", 10)})
    EXPECT_EQ(nfc(s), s);
  // Every form of a string is stable under the same form again.
  for (UnicodeForm f : {UnicodeForm::NFC, UnicodeForm::NFD, UnicodeForm::NFKC, UnicodeForm::NFKD}) {
    std::string once = normalize("Vie\u0302\u0323t \u1e9b\u0323 \u212b \ufb01", f);
    EXPECT_EQ(normalize(once, f), once);
  }
  EXPECT_THROW(nfc("bad \xff utf-8"), Error);
}

TEST(HuggingFace, NfcNormalizerIds) {
  auto plain = fixture(nullptr);
  auto t = fixture({{"type", "NFC"}});
  // Decomposed input: the model sees the composed character.
  EXPECT_EQ(plain->encode("cafe\u0301"), (Ids{7, 3, 4}));
  EXPECT_EQ(t->encode("cafe\u0301"), (Ids{8}));
  EXPECT_EQ(t->encode("caf\u00e9"), (Ids{8}));  // already NFC
  EXPECT_EQ(t->encode("\u1100\u1161\u11a8"), (Ids{13}));
  EXPECT_EQ(plain->encode("\u1100\u1161\u11a8"), (Ids{14, 15, 16}));
  EXPECT_EQ(t->encode("\u212b A\u030a"), (Ids{18, 17, 18}));
  EXPECT_EQ(t->encode("\ufb01"), (Ids{12}));  // not a compatibility form
  EXPECT_EQ(t->encode("caf"), (Ids{7}));      // ASCII

  auto nfkc = fixture({{"type", "NFKC"}});
  EXPECT_EQ(nfkc->encode("\ufb01"), (Ids{10}));
  auto nfd = fixture({{"type", "NFD"}});
  EXPECT_EQ(nfd->encode("caf\u00e9"), (Ids{7, 3, 4}));
  EXPECT_EQ(nfd->encode("\u212b"), (Ids{20, 21}));
  auto nfkd = fixture({{"type", "NFKD"}});
  EXPECT_EQ(nfkd->encode("\ufb01 \u00e9"), (Ids{10, 17, 3, 4}));
  // A Sequence applies its normalizers in order: NFD then NFC is NFC.
  auto seq =
      fixture({{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "NFC"}}}}});
  EXPECT_EQ(seq->encode("cafe\u0301 \u1100\u1161\u11a8"), (Ids{8, 17, 13}));
}

#else  // a build without libutf8proc names the library

TEST(HuggingFace, NfcNormalizerNeedsUtf8proc) {
  EXPECT_FALSE(unicode_normalization_available());
  try {
    fixture({{"type", "NFC"}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libutf8proc"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace unicode_norm_test
