// tiktoken byte-level BPE: a rank file (token bytes -> rank), a pre-tokenisation regex
// and rank-based merging (tiktoken's byte_pair_merge: merge the adjacent pair whose
// concatenation has the lowest rank, leftmost first; a piece that is itself a token is
// that token). Two users:
//   - TikTokenizer, Megatron's CustomTikTokenizer (megatron/training/tokenizer): ids
//     0..num_special-1 are special tokens (default <unk> <s> </s>, then <SPECIAL_i>
//     fillers), rank r has id r + num_special, the vocabulary is cut to --vocab-size
//     (default 2^17), eod = eos = id of </s>; tokenize() is encode_ordinary (special
//     token text is plain text). Rank files: Megatron's JSON list of {rank, token_bytes,
//     token_str} or, as an extension, OpenAI's .tiktoken text (base64 token, rank a line).
//   - make_tiktoken_encoding(): OpenAI's r50k_base / p50k_base / p50k_edit / cl100k_base /
//     o200k_base with their patterns and special tokens (for conformance and for users of
//     those vocabularies).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer.h"

namespace mcpp::data {

namespace {

// Megatron's PATTERN_TIKTOKEN (v1) and PATTERN_TIKTOKEN_V2.
const char* kMegatronV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* kMegatronV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// OpenAI's encodings (tiktoken_ext/openai_public.py).
const char* kR50k = R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kCl100k =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> val = [] {
    std::array<int8_t, 256> v;
    v.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[uint8_t(a[i])] = int8_t(i);
    return v;
  }();
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int8_t d = val[uint8_t(c)];
    if (d < 0) return false;
    acc = (acc << 6) | uint32_t(d), bits += 6;
    if (bits >= 8) bits -= 8, out += char((acc >> bits) & 0xFF);
  }
  return true;
}

// Rank file -> token bytes indexed by rank (ranks must be 0..N-1).
std::vector<std::string> load_ranks(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (path.empty() || !f)
    throw Error(fmt::format("cannot read the tiktoken rank file '{}'", path),
                "pass --tokenizer-model FILE (Megatron's tokenizer JSON or a .tiktoken file)");
  std::string text{std::istreambuf_iterator<char>(f), {}};
  std::vector<std::pair<int64_t, std::string>> items;
  std::string bytes;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // Megatron's JSON
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: not valid JSON: {}", path, e.what()));
    }
    for (size_t i = 0; i < j.size(); ++i) {
      const auto& x = j[i];
      if (!x.is_object() || !x.contains("rank") || !x.contains("token_bytes") ||
          !x["rank"].is_number_integer() || !x["token_bytes"].is_string())
        throw Error(fmt::format("{}: entry {} is not {{\"rank\", \"token_bytes\", \"token_str\"}}",
                                path, i));
      if (!base64_decode(x["token_bytes"].get_ref<const std::string&>(), bytes))
        throw Error(fmt::format("{}: entry {}: token_bytes is not base64", path, i));
      items.emplace_back(x["rank"].get<int64_t>(), bytes);
    }
  } else {  // OpenAI's .tiktoken: "base64 rank" a line
    std::istringstream is(text);
    std::string line;
    int64_t lineno = 0;
    while (std::getline(is, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      auto sp = line.find(' ');
      int64_t r = -1;
      try {
        r = sp == std::string::npos ? -1 : std::stoll(line.substr(sp + 1));
      } catch (...) {
      }
      if (r < 0 || !base64_decode(std::string_view(line).substr(0, sp), bytes))
        throw Error(fmt::format("{}:{}: expected 'BASE64TOKEN RANK'", path, lineno),
                    "is this a tiktoken rank file?");
      items.emplace_back(r, bytes);
    }
  }
  // Megatron's JSON must hold ranks 0..N-1; OpenAI's files may skip a rank (p50k_base).
  int64_t max_rank = -1;
  for (auto& it : items) max_rank = std::max(max_rank, it.first);
  const bool json_file = first != std::string::npos && text[first] == '[';
  if (json_file && max_rank + 1 != int64_t(items.size()))
    throw Error(fmt::format("{}: ranks must be 0..{}; found {}", path, items.size() - 1, max_rank));
  std::vector<std::string> by_rank(size_t(max_rank + 1));
  std::vector<bool> seen(by_rank.size(), false);
  for (auto& [r, b] : items) {
    if (seen[size_t(r)]) throw Error(fmt::format("{}: rank {} appears twice", path, r));
    seen[size_t(r)] = true;
    by_rank[size_t(r)] = std::move(b);
  }
  return by_rank;
}

// Ranks -> BPE tables. Token of rank r has id r + offset. Every adjacent pair of parts
// in tiktoken's merge loop is two tokens whose concatenation is looked up; the pair
// table holds, for every token, each split into two tokens.
struct TiktokenCore {
  bpe::BpeModel model;
  std::unique_ptr<bpe::Pretokenizer> pre;
  std::vector<std::string> id_bytes;  // id -> bytes (specials: their text)

  TiktokenCore(const std::vector<std::string>& ranks, size_t n_ranks, int32_t offset,
               const std::string& pattern, const std::string& file) {
    std::unordered_map<std::string, int32_t> id_of;
    id_of.reserve(n_ranks * 2);
    for (size_t r = 0; r < n_ranks; ++r)
      if (!ranks[r].empty() && !id_of.emplace(ranks[r], int32_t(r) + offset).second)
        throw Error(fmt::format("{}: token of rank {} repeats an earlier token", file, r));
    std::array<int32_t, 256> byte_id{};
    for (int b = 0; b < 256; ++b) {
      auto it = id_of.find(std::string(1, char(b)));
      if (it == id_of.end())
        throw Error(fmt::format("{}: no token for the single byte {} among the first {} ranks",
                                file, b, n_ranks),
                    "a byte-level BPE rank file must hold all 256 bytes");
      byte_id[b] = it->second;
    }
    model.set_byte_ids(byte_id);
    model.reserve(n_ranks * 2);
    for (size_t r = 0; r < n_ranks; ++r) {
      const std::string& t = ranks[r];
      for (size_t k = 1; k < t.size(); ++k) {
        auto a = id_of.find(t.substr(0, k));
        if (a == id_of.end()) continue;
        auto b = id_of.find(t.substr(k));
        if (b == id_of.end()) continue;
        model.add_merge(a->second, b->second, int32_t(r), int32_t(r) + offset);
      }
    }
    model.set_whole_pieces(std::move(id_of));
    pre = std::make_unique<bpe::Pretokenizer>(pattern);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const {
    if (!bpe::utf8_valid(text))
      throw Error("TikTokenizer: the text is not valid UTF-8", "decode the input as UTF-8 first");
    pre->split(text, false, [&](std::string_view piece) { model.encode_bytes(piece, out); });
  }
  // The first id spelled `token`: a special token by its name, else a rank by its bytes.
  std::optional<int64_t> token_to_id(std::string_view token) const {
    for (size_t id = 0; id < id_bytes.size(); ++id)  // start-up only: a scan is fine
      if (id_bytes[id] == token) return int64_t(id);
    return std::nullopt;
  }
  std::string decode(std::span<const int32_t> ids) const {
    std::string s;
    for (int32_t id : ids) {
      MCPP_CHECK(id >= 0 && size_t(id) < id_bytes.size(), "token id {} outside the vocabulary of {}",
                 id, id_bytes.size());
      s += id_bytes[size_t(id)];
    }
    return s;
  }
};

class TikTokenizer final : public Tokenizer {
 public:
  TikTokenizer(const TokenizerArgs& a) {
    if (a.tiktoken_pattern != "v1" && a.tiktoken_pattern != "v2")
      throw Error(
          fmt::format("--tiktoken-pattern must be v1 or v2, got '{}'", a.tiktoken_pattern),
          "--tokenizer-type TikTokenizer needs --tiktoken-pattern v1|v2 (Megatron's patterns)");
    vocab_ = a.vocab_size.value_or(int64_t(1) << 17);
    const int64_t ns = a.tiktoken_num_special_tokens;
    std::vector<std::string> specials = a.special_tokens;
    if (specials.empty()) specials = {"<unk>", "<s>", "</s>"};
    for (const char* need : {"<unk>", "<s>", "</s>"})
      if (std::find(specials.begin(), specials.end(), need) == specials.end())
        throw Error(fmt::format("--tokenizer-special-tokens must include {}", need),
                    "Megatron's TikTokenizer requires <unk>, <s> and </s>");
    if (!(int64_t(specials.size()) <= ns && ns < vocab_))
      throw Error(fmt::format("TikTokenizer needs {} special tokens <= "
                              "--tiktoken-num-special-tokens {} < --vocab-size {}",
                              specials.size(), ns, vocab_));
    for (int64_t i = int64_t(specials.size()); i < ns; ++i)
      specials.push_back(fmt::format("<SPECIAL_{}>", i));
    {
      auto sorted = specials;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        throw Error("--tokenizer-special-tokens must be unique");
    }
    auto ranks = load_ranks(a.tokenizer_model);
    const int64_t inner = vocab_ - ns;
    if (int64_t(ranks.size()) < inner)
      throw Error(fmt::format("--vocab-size {} needs {} ranks after {} special tokens, but {} "
                              "holds only {}",
                              vocab_, inner, ns, a.tokenizer_model, ranks.size()),
                  fmt::format("pass --vocab-size {} (ranks + special tokens) or less",
                              int64_t(ranks.size()) + ns));
    const std::string pattern = a.tiktoken_pattern == "v1" ? kMegatronV1 : kMegatronV2;
    core_ = std::make_unique<TiktokenCore>(ranks, size_t(inner), int32_t(ns), pattern,
                                           a.tokenizer_model);
    core_->id_bytes = specials;
    for (int64_t r = 0; r < inner; ++r) core_->id_bytes.push_back(ranks[size_t(r)]);
    auto idx = [&](const char* t) {
      return int64_t(std::find(specials.begin(), specials.end(), t) - specials.begin());
    };
    bos_ = idx("<s>"), eos_ = idx("</s>");
    num_special_ = ns;
  }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    core_->encode(text, out);
  }
  std::string decode(std::span<const int32_t> ids) const override { return core_->decode(ids); }
  int64_t vocab_size() const override { return vocab_; }
  int64_t eod() const override { return eos_; }
  std::optional<int64_t> bos() const override { return bos_; }
  std::optional<int64_t> eos() const override { return eos_; }
  std::string name() const override { return "TikTokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    return core_->token_to_id(token);
  }
  // Megatron's TikTokenizer drops ids below --tiktoken-num-special-tokens (and bos, eos).
  bool is_special(int64_t id) const override {
    return id < num_special_ || id == bos_ || id == eos_;
  }

 private:
  std::unique_ptr<TiktokenCore> core_;
  int64_t vocab_ = 0, bos_ = 0, eos_ = 0, num_special_ = 0;
};

class OpenAIEncoding final : public Tokenizer {
 public:
  OpenAIEncoding(const std::string& name, const std::string& file) : name_(name) {
    std::vector<std::pair<std::string, int32_t>> specials;
    const char* pattern = nullptr;
    if (name == "r50k_base" || name == "p50k_base" || name == "p50k_edit") {
      pattern = kR50k;
      specials = {{"<|endoftext|>", 50256}};
      if (name == "p50k_edit")
        specials.insert(specials.end(), {{"<|fim_prefix|>", 50281},
                                         {"<|fim_middle|>", 50282},
                                         {"<|fim_suffix|>", 50283}});
    } else if (name == "cl100k_base") {
      pattern = kCl100k;
      specials = {{"<|endoftext|>", 100257},
                  {"<|fim_prefix|>", 100258},
                  {"<|fim_middle|>", 100259},
                  {"<|fim_suffix|>", 100260},
                  {"<|endofprompt|>", 100276}};
    } else if (name == "o200k_base") {
      pattern = kO200k;
      specials = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
    } else {
      throw Error(fmt::format("unknown tiktoken encoding '{}'", name),
                  "one of r50k_base, p50k_base, p50k_edit, cl100k_base, o200k_base");
    }
    auto ranks = load_ranks(file);
    core_ = std::make_unique<TiktokenCore>(ranks, ranks.size(), 0, pattern, file);
    core_->id_bytes = ranks;
    for (auto& [t, id] : specials) {
      if (size_t(id) >= core_->id_bytes.size()) core_->id_bytes.resize(size_t(id) + 1);
      core_->id_bytes[size_t(id)] = t;
      special_ids_.push_back(id);
    }
    eod_ = specials[0].second;
  }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    core_->encode(text, out);
  }
  std::string decode(std::span<const int32_t> ids) const override { return core_->decode(ids); }
  int64_t vocab_size() const override { return int64_t(core_->id_bytes.size()); }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "tiktoken:" + name_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    return core_->token_to_id(token);
  }
  bool is_special(int64_t id) const override {
    return std::find(special_ids_.begin(), special_ids_.end(), id) != special_ids_.end();
  }

 private:
  std::string name_;
  std::vector<int64_t> special_ids_;
  std::unique_ptr<TiktokenCore> core_;
  int64_t eod_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerArgs& a) {
  if (a.tokenizer_model.empty())
    throw Error("--tokenizer-type TikTokenizer needs --tokenizer-model",
                "pass the rank file (Megatron's tokenizer JSON or a .tiktoken file)");
  return std::make_unique<TikTokenizer>(a);
}

std::unique_ptr<Tokenizer> make_tiktoken_encoding(const std::string& name,
                                                  const std::string& rank_file) {
  return std::make_unique<OpenAIEncoding>(name, rank_file);
}

}  // namespace mcpp::data
