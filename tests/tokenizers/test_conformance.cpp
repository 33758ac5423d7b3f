// Conformance of TikTokenizer, HuggingFaceTokenizer and SentencePieceTokenizer against
// published vectors:
//   - gpt-tokenizer's TestPlans.txt (313 texts -> ids for r50k/p50k/p50k_edit/cl100k/o200k),
//   - llama.cpp's tokenizer test pairs (models/ggml-vocab-*.gguf.inp/.out, from the git
//     bundle node-llama-cpp ships) for gpt-2, llama-bpe (Llama-3) and qwen2 (a
//     tokenizer.json is built from the GGUF's tokens and merges) and llama-spm (Llama-2),
//   - known ids (Mistral "Hello world" -> 1 22557 1526).
// Assets come from scripts/fetch_assets.sh; a missing asset fails the test.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

#ifdef MCPP_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

using namespace mcpp;
using namespace mcpp::data;
using json = nlohmann::json;

namespace conformance_test {

std::string asset(const std::string& rel) {
  const char* env = std::getenv("MCPP_ASSETS");
  std::string root = env ? env : std::string(MCPP_SOURCE_DIR) + "/.cache/assets";
  std::string p = root + "/" + rel;
  EXPECT_TRUE(std::filesystem::exists(p)) << p << " missing: run scripts/fetch_assets.sh";
  return p;
}

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::string scratch(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("mcpp_tok_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(d);
  return d.string();
}

std::vector<int32_t> parse_ids(std::string body) {
  for (char& c : body)
    if (c == '[' || c == ']' || c == ',') c = ' ';
  std::istringstream is(body);
  std::vector<int32_t> v;
  for (int32_t x; is >> x;) v.push_back(x);
  return v;
}

// gpt-tokenizer's TestPlans.txt: EncodingName / Sample / Encoded records.
struct Plan {
  std::string enc, sample;
  std::vector<int32_t> ids;
};
std::vector<Plan> test_plans() {
  std::ifstream f(asset("tiktoken/package/data/TestPlans.txt"));
  std::vector<Plan> v;
  std::string line, enc, sample;
  while (std::getline(f, line)) {
    if (line.rfind("EncodingName: ", 0) == 0)
      enc = line.substr(14);
    else if (line.rfind("Sample: ", 0) == 0)
      sample = line.substr(8);
    else if (line.rfind("Encoded: ", 0) == 0)
      v.push_back({enc, sample, parse_ids(line.substr(9))});
  }
  return v;
}

// ---- a minimal GGUF metadata reader (github.com/ggerganov/ggml docs/gguf.md) ----------
// Header: "GGUF", u32 version, u64 tensor count, u64 kv count; then kv pairs
// (u64-length key, u32 type, value). Only the metadata is read.
struct Gguf {
  std::map<std::string, std::vector<std::string>> str_arrays;
  std::map<std::string, std::vector<int64_t>> int_arrays;
  std::map<std::string, std::string> strings;
};
Gguf read_gguf(const std::string& path) {
  std::string b = read_all(path);
  size_t p = 0;
  auto need = [&](size_t n) {
    if (p + n > b.size()) throw Error(fmt::format("{}: truncated GGUF", path));
  };
  auto u32 = [&] { need(4); uint32_t v; std::memcpy(&v, b.data() + p, 4); p += 4; return v; };
  auto u64 = [&] { need(8); uint64_t v; std::memcpy(&v, b.data() + p, 8); p += 8; return v; };
  auto str = [&] { uint64_t n = u64(); need(n); std::string s = b.substr(p, n); p += n; return s; };
  if (b.compare(0, 4, "GGUF") != 0) throw Error(fmt::format("{}: not a GGUF file", path));
  p = 4;
  uint32_t version = u32();
  EXPECT_GE(version, 2u);
  u64();
  uint64_t nkv = u64();
  auto scalar = [&](uint32_t t) -> int64_t {
    static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t > 12 || size[t] == 0) throw Error("bad GGUF scalar type");
    need(size_t(size[t]));
    int64_t v = 0;
    if (t == 5) { int32_t x; std::memcpy(&x, b.data() + p, 4); v = x; }
    else std::memcpy(&v, b.data() + p, size_t(size[t]));
    p += size_t(size[t]);
    return v;
  };
  Gguf g;
  for (uint64_t i = 0; i < nkv; ++i) {
    std::string key = str();
    uint32_t t = u32();
    if (t == 8) {
      g.strings[key] = str();
    } else if (t == 9) {
      uint32_t et = u32();
      uint64_t n = u64();
      for (uint64_t k = 0; k < n; ++k) {
        if (et == 8) g.str_arrays[key].push_back(str());
        else g.int_arrays[key].push_back(scalar(et));
      }
    } else {
      scalar(t);
    }
  }
  return g;
}

// llama.cpp's .inp (texts separated by "\n__ggml_vocab_test__\n") and .out (ids a line).
std::vector<std::pair<std::string, std::vector<int32_t>>> vocab_tests(const std::string& model) {
  std::string inp = read_all(asset("llamacpp/models/ggml-vocab-" + model + ".gguf.inp"));
  std::string out = read_all(asset("llamacpp/models/ggml-vocab-" + model + ".gguf.out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t q; (q = inp.find(sep, pos)) != std::string::npos; pos = q + sep.size())
    texts.push_back(inp.substr(pos, q - pos));
  std::istringstream os(out);
  std::vector<std::pair<std::string, std::vector<int32_t>>> v;
  std::string line;
  for (size_t i = 0; i < texts.size() && std::getline(os, line); ++i)
    v.emplace_back(texts[i], parse_ids(line));
  EXPECT_EQ(v.size(), texts.size());
  return v;
}

// A byte-level BPE tokenizer.json from a GGUF vocab (tokens, merges, control tokens).
std::string hf_json_from_gguf(const std::string& model, const std::string& split_regex,
                              bool ignore_merges, const json& normalizer = nullptr) {
  Gguf g = read_gguf(asset("llamacpp/models/ggml-vocab-" + model + ".gguf"));
  const auto& toks = g.str_arrays["tokenizer.ggml.tokens"];
  const auto& types = g.int_arrays["tokenizer.ggml.token_type"];
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < toks.size(); ++i) {
    if (i < types.size() && (types[i] == 3 || types[i] == 4))
      added.push_back({{"id", i}, {"content", toks[i]}, {"special", true}});
    else
      vocab[toks[i]] = i;
  }
  json pre;
  if (split_regex.empty()) {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  } else {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", split_regex}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  }
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", normalizer},
            {"pre_tokenizer", pre},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"vocab", vocab},
              {"merges", g.str_arrays["tokenizer.ggml.merges"]},
              {"ignore_merges", ignore_merges}}}};
  std::string dir = scratch("hf_" + model);
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  return dir;
}

int check_vocab_tests(const Tokenizer& t, const std::string& model) {
  int n = 0;
  for (auto& [text, want] : vocab_tests(model)) {
    EXPECT_EQ(t.encode(text), want) << model << " text: '" << text << "'";
    ++n;
  }
  return n;
}

const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";


// ---- tiktoken -------------------------------------------------------------------------

TEST(Tiktoken, AllTestPlans) {
  std::map<std::string, std::unique_ptr<Tokenizer>> encs;
  std::map<std::string, int> counts;
  for (const Plan& p : test_plans()) {
    auto& t = encs[p.enc];
    if (!t) {
      std::string file = p.enc == "p50k_edit" ? "p50k_base" : p.enc;
      t = make_tiktoken_encoding(p.enc, asset("tiktoken/package/data/" + file + ".tiktoken"));
    }
    EXPECT_EQ(t->encode(p.sample), p.ids) << p.enc << " sample: " << p.sample;
    EXPECT_EQ(t->decode(p.ids), p.sample) << p.enc;
    ++counts[p.enc];
  }
  EXPECT_EQ(counts["r50k_base"], 64);
  EXPECT_EQ(counts["p50k_base"], 64);
  EXPECT_EQ(counts["p50k_edit"], 64);
  EXPECT_EQ(counts["cl100k_base"], 64);
  EXPECT_EQ(counts["o200k_base"], 57);
}

TEST(Tiktoken, SpecialTokensAndKnownIds) {
  auto r50k = make_tiktoken_encoding("r50k_base", asset("tiktoken/package/data/r50k_base.tiktoken"));
  EXPECT_EQ(r50k->eod(), 50256);
  EXPECT_EQ(r50k->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  std::vector<int32_t> e{50256};
  EXPECT_EQ(r50k->decode(e), "<|endoftext|>");
  auto cl = make_tiktoken_encoding("cl100k_base", asset("tiktoken/package/data/cl100k_base.tiktoken"));
  EXPECT_EQ(cl->eod(), 100257);
  std::vector<int32_t> p{100276};
  EXPECT_EQ(cl->decode(p), "<|endofprompt|>");
  auto o200k = make_tiktoken_encoding("o200k_base", asset("tiktoken/package/data/o200k_base.tiktoken"));
  EXPECT_EQ(o200k->eod(), 199999);
  EXPECT_EQ(o200k->vocab_size(), 200019);
  // encode is encode_ordinary: special-token text is plain text
  EXPECT_NE(o200k->encode("<|endoftext|>"), (std::vector<int32_t>{199999}));
  // a long piece takes the heap path of the merge; it must round-trip
  std::string spaces(5000, ' '), digits(3000, '7');
  EXPECT_EQ(cl->decode(cl->encode(spaces + "x" + digits)), spaces + "x" + digits);
}

// Megatron's CustomTikTokenizer: specials first, ranks shifted by num_special_tokens.
TEST(TikTokenizer, MegatronSpecialTokensAndShift) {
  const std::string ranks = asset("tiktoken/package/data/r50k_base.tiktoken");
  TokenizerArgs a{.type = "TikTokenizer", .tokenizer_model = ranks};
  a.tiktoken_pattern = "v2";
  a.vocab_size = 50256 + 1000;
  auto t = make_tokenizer(a);
  EXPECT_EQ(t->vocab_size(), 51256);
  EXPECT_EQ(t->eod(), 2);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->encode("hello world"), (std::vector<int32_t>{31373 + 1000, 995 + 1000}));
  std::vector<int32_t> sp{0, 1, 2, 3, 999};
  EXPECT_EQ(t->decode(sp), "<unk><s></s><SPECIAL_3><SPECIAL_999>");
  for (std::string s : {"It's 2024: naïve café — 東京 😀\n\n  x", "  a\r\nb/c 12345"})
    EXPECT_EQ(t->decode(t->encode(s)), s);
  // v1 splits digits one by one (\p{N}); v2 likewise in Megatron's patterns
  EXPECT_EQ(t->encode("123").size(), 3u);

  // Megatron's JSON rank format gives the same ids as the .tiktoken text.
  std::ifstream f(ranks);
  json list = json::array();
  std::string line;
  for (int64_t r = 0; std::getline(f, line) && !line.empty(); ++r) {
    auto sp2 = line.find(' ');
    list.push_back({{"rank", std::stoll(line.substr(sp2 + 1))},
                    {"token_bytes", line.substr(0, sp2)},
                    {"token_str", ""}});
  }
  std::string dir = scratch("tikjson");
  std::ofstream(dir + "/tok.json") << list.dump();
  TokenizerArgs aj = a;
  aj.tokenizer_model = dir + "/tok.json";
  auto tj = make_tokenizer(aj);
  const std::string text = "The quick brown fox jumps over 13 lazy dogs.";
  EXPECT_EQ(tj->encode(text), t->encode(text));

  // Custom special tokens must hold <unk> <s> </s>; the vocab must fit the ranks.
  TokenizerArgs bad = a;
  bad.special_tokens = {"<s>", "</s>"};
  EXPECT_THROW(make_tokenizer(bad), Error);
  bad = a;
  bad.vocab_size = 200000;
  EXPECT_THROW(make_tokenizer(bad), Error);
  bad = a;
  bad.tiktoken_pattern = "v3";
  EXPECT_THROW(make_tokenizer(bad), Error);
  TokenizerArgs custom = a;
  custom.special_tokens = {"<pad>", "<unk>", "<s>", "</s>"};
  custom.tiktoken_num_special_tokens = 8;
  custom.vocab_size = 1008;  // the vocabulary cut to the first 1000 ranks
  auto tc = make_tokenizer(custom);
  EXPECT_EQ(tc->eod(), 3);
  for (int32_t id : tc->encode("hello world, the quick brown fox")) {
    EXPECT_GE(id, 8);
    EXPECT_LT(id, 1008);
  }
}

// ---- Hugging Face tokenizer.json ------------------------------------------------------

TEST(HuggingFace, LlamaCppVocabTestsGpt2) {
  auto t = make_tokenizer({.type = "HuggingFaceTokenizer",
                           .tokenizer_model = hf_json_from_gguf("gpt-2", "", false)});
  EXPECT_EQ(t->eod(), 50256);
  EXPECT_EQ(check_vocab_tests(*t, "gpt-2"), 46);
}

TEST(HuggingFace, LlamaCppVocabTestsLlama3) {
  auto t = make_tokenizer({.type = "HuggingFaceTokenizer",
                           .tokenizer_model = hf_json_from_gguf("llama-bpe", kLlama3Split, true)});
  EXPECT_EQ(check_vocab_tests(*t, "llama-bpe"), 46);
  EXPECT_EQ(t->eod(), 128001);  // <|end_of_text|>
}

TEST(HuggingFace, LlamaCppVocabTestsQwen2) {
  auto t = make_tokenizer({.type = "HuggingFaceTokenizer",
                           .tokenizer_model = hf_json_from_gguf("qwen2", kQwen2Split, false)});
  EXPECT_EQ(check_vocab_tests(*t, "qwen2"), 46);
#ifdef MCPP_HAVE_UTF8PROC
  // With the NFC normalizer of Qwen2's published tokenizer.json (llama.cpp's inputs are
  // all in NFC, so the ids stay; their Chinese, emoji and accents pass through utf8proc).
  json nfc = {{"type", "NFC"}};
  auto tn = make_tokenizer({.type = "HuggingFaceTokenizer",
                            .tokenizer_model = hf_json_from_gguf("qwen2", kQwen2Split, false, nfc)});
  EXPECT_EQ(check_vocab_tests(*tn, "qwen2"), 46);
  // A decomposed é reaches the model as the composed one.
  EXPECT_EQ(tn->encode("cafe\u0301"), tn->encode("caf\u00e9"));
  EXPECT_NE(t->encode("cafe\u0301"), t->encode("caf\u00e9"));
#endif
}

TEST(HuggingFace, MistralByteFallbackKnownIds) {
  auto t = make_tokenizer(
      {.type = "HuggingFaceTokenizer", .tokenizer_model = asset("hf/package/models")});
  EXPECT_EQ(t->vocab_size(), 32000);
  EXPECT_EQ(t->eod(), 2);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{1, 22557, 1526}));
  // a character missing from the vocabulary falls back to its UTF-8 bytes <0xNN>
  auto ids = t->encode("\xF0\x9F\xA6\x99");  // U+1F999
  ASSERT_EQ(ids.size(), 6u);  // <s> ▁ <0xF0> <0x9F> <0xA6> <0x99>
  EXPECT_EQ(ids[2], 3 + 0xF0);
  for (std::string s : {"Hello world", "naïve café — 東京 😀\n\n  x y", "a  b\tc"}) {
    auto v = t->encode(s);
    EXPECT_EQ(t->decode(std::span<const int32_t>(v).subspan(1)), s);
  }
}

TEST(HuggingFace, UnsupportedComponentIsNamed) {
  std::string dir = scratch("hf_bad");
  json j = {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  try {
    make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = dir});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model type WordPiece"), std::string::npos) << e.what();
  }
  j = {{"normalizer", {{"type", "BertNormalizer"}}},
       {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"</s>", 1}}}, {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  try {
    make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = dir});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer BertNormalizer"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = "/nonexistent"}),
               Error);
}

// ---- SentencePiece ----------------------------------------------------------------------

#ifdef MCPP_HAVE_SENTENCEPIECE
// llama.cpp's llama-spm pairs are Llama-2's SentencePiece ids (no BOS): libsentencepiece
// on the same model must agree, and a BPE-with-byte-fallback tokenizer.json built from
// the model's pieces (merges ordered by the merged piece's score) must too.
TEST(SentencePiece, LlamaCppVocabTestsLlamaSpm) {
  const std::string model = asset("llama/llama.model");
  auto t = make_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = model});
  EXPECT_EQ(check_vocab_tests(*t, "llama-spm"), 46);

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model).ok());
  json vocab = json::object();
  std::vector<std::pair<float, std::string>> merges;  // (-score of the merged piece, "a b")
  std::unordered_map<std::string, int> ids;
  for (int i = 0; i < sp.GetPieceSize(); ++i) ids[sp.IdToPiece(i)] = i;
  auto normal = [&](int i) {
    return !sp.IsControl(i) && !sp.IsUnknown(i) && !sp.IsByte(i) && !sp.IsUnused(i);
  };
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    const std::string p = sp.IdToPiece(i);
    vocab[p] = i;
    if (!normal(i)) continue;
    for (size_t k = 1; k < p.size(); ++k) {
      auto a = ids.find(p.substr(0, k)), b = ids.find(p.substr(k));
      if (a != ids.end() && b != ids.end() && normal(a->second) && normal(b->second))
        merges.emplace_back(-sp.GetScore(i), p.substr(0, k) + " " + p.substr(k));
    }
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](auto& x, auto& y) { return x.first < y.first; });
  json ml = json::array();
  for (auto& m : merges) ml.push_back(m.second);
  json j = {{"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
            {"pre_tokenizer", nullptr},
            {"model",
             {{"type", "BPE"}, {"vocab", vocab}, {"merges", ml}, {"byte_fallback", true},
              {"fuse_unk", true}, {"unk_token", "<unk>"}}}};
  std::string dir = scratch("hf_spm");
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  auto hf = make_tokenizer({.type = "HuggingFaceTokenizer", .tokenizer_model = dir});
  int n = 0;
  for (auto& [text, want] : vocab_tests("llama-spm")) {
    if (text.empty()) continue;  // HF's Prepend leaves "" empty, SentencePiece too
    EXPECT_EQ(hf->encode(text), want) << "text: '" << text << "'";
    ++n;
  }
  EXPECT_EQ(n, 45);
}

TEST(SentencePiece, MegatronSpecialTokens) {
  auto t = make_tokenizer(
      {.type = "SentencePieceTokenizer", .tokenizer_model = asset("llama/llama.model")});
  // 32000 pieces + <CLS> <SEP> <EOD> <MASK> <PAD>; <s> and </s> are the model's own.
  EXPECT_EQ(t->vocab_size(), 32005);
  EXPECT_EQ(t->eod(), 32002);
  EXPECT_EQ(t->pad(), 32004);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(t->encode("Hello world"), (std::vector<int32_t>{15043, 3186}));
  EXPECT_EQ(t->encode("Hello<EOD>world<s>"),
            (std::vector<int32_t>{15043, 32002, 3186, 1}));
  std::vector<int32_t> ids{15043, 32002, 3186};
  EXPECT_EQ(t->decode(ids), "Hello <EOD> world");
  TokenizerArgs a{.type = "SentencePieceTokenizer", .tokenizer_model = asset("llama/llama.model")};
  a.vocab_extra_ids = 3;
  EXPECT_EQ(make_tokenizer(a)->vocab_size(), 32008);
}
#endif

}  // namespace conformance_test
