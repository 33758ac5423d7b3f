// GPT-2 byte-level BPE (Radford et al. 2019; Megatron's gpt2_tokenization.py):
// pre-tokenise with GPT-2's regex, map each word's bytes to symbols, merge the pair of
// lowest merge rank until none applies (bpe::BpeModel). Symbols are vocabulary ids
// from the start (every single byte and every merge result is in encoder.json), so a
// merge is a lookup of (left id, right id) -> (rank, merged id).
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer.h"

namespace mcpp::data {

namespace {
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}  // namespace

struct GPT2BPETokenizer::Impl {
  bpe::BpeModel model;
  std::unique_ptr<bpe::Pretokenizer> pre;
};

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : impl_(std::make_unique<Impl>()) {
  std::string raw;
  auto to_bytes = [&](const std::string& s, const std::string& file) {
    if (!bpe::unicode_to_bytes(s, raw))
      throw Error(fmt::format("{}: token '{}' is not in GPT-2's byte alphabet", file, s),
                  "is this a GPT-2 byte-level BPE vocabulary?");
    return raw;
  };

  std::ifstream vf(vocab_file);
  if (vocab_file.empty() || !vf)
    throw Error(fmt::format("cannot read --vocab-file '{}'", vocab_file),
                "GPT2BPETokenizer needs --vocab-file (GPT-2's encoder.json / gpt2-vocab.json) and "
                "--merge-file (vocab.bpe / gpt2-merges.txt)");
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(vf);
  } catch (const std::exception& e) {
    throw Error(fmt::format("--vocab-file {} is not valid JSON: {}", vocab_file, e.what()));
  }
  if (!enc.is_object() || enc.empty())
    throw Error(fmt::format("--vocab-file {} is not a JSON object of token -> id", vocab_file));
  std::unordered_map<std::string, int32_t> bytes_id;
  std::array<int32_t, 256> byte_id{};
  id_to_bytes_.resize(enc.size());
  std::vector<bool> seen(enc.size(), false);
  for (auto& [tok, idv] : enc.items()) {
    int64_t id = idv.is_number_integer() ? idv.get<int64_t>() : -1;
    if (id < 0 || id >= int64_t(enc.size()) || seen[id])
      throw Error(fmt::format("--vocab-file {}: token '{}' has id {}, expected unique ids 0..{}",
                              vocab_file, tok, idv.dump(), enc.size() - 1));
    seen[id] = true;
    std::string b = to_bytes(tok, vocab_file);
    if (tok == "<|endoftext|>") eod_ = id, b = tok;  // a special token, not bytes
    id_to_bytes_[id] = b;
    bytes_id.emplace(b, int32_t(id));
  }
  if (!enc.contains("<|endoftext|>"))
    throw Error(fmt::format("--vocab-file {} has no <|endoftext|> token", vocab_file));
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_id.find(std::string(1, char(b)));
    if (it == bytes_id.end())
      throw Error(fmt::format("--vocab-file {} lacks the single byte {}", vocab_file, b));
    byte_id[b] = it->second;
  }
  impl_->model.set_byte_ids(byte_id);

  std::ifstream mf(merge_file);
  if (merge_file.empty() || !mf)
    throw Error(fmt::format("cannot read --merge-file '{}'", merge_file),
                "GPT2BPETokenizer needs --merge-file (vocab.bpe / gpt2-merges.txt)");
  std::string line;
  int32_t rank = 0;
  struct M {
    uint64_t key;
    int32_t rank, id;
  };
  std::vector<M> merge_list;
  int64_t lineno = 0;
  while (std::getline(mf, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    auto sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      throw Error(
          fmt::format("{}:{}: expected two symbols separated by one space", merge_file, lineno));
    std::string a = to_bytes(line.substr(0, sp), merge_file),
                b = to_bytes(line.substr(sp + 1), merge_file);
    auto ia = bytes_id.find(a), ib = bytes_id.find(b), im = bytes_id.find(a + b);
    if (ia == bytes_id.end() || ib == bytes_id.end() || im == bytes_id.end())
      throw Error(fmt::format("{}:{}: merge '{}' uses a symbol missing from {}", merge_file, lineno,
                              line, vocab_file),
                  "the vocab and merge files must come from the same tokenizer");
    uint64_t key = uint64_t(uint32_t(ia->second)) << 32 | uint32_t(ib->second);
    merge_list.push_back({key, rank++, im->second});
  }

  impl_->model.reserve(merge_list.size());
  for (const M& m : merge_list)
    impl_->model.add_merge(int32_t(m.key >> 32), int32_t(uint32_t(m.key)), m.rank, m.id);
  impl_->pre = std::make_unique<bpe::Pretokenizer>(kGpt2Pattern);
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

void GPT2BPETokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  impl_->model.encode_bytes(word, out);
}

void GPT2BPETokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (!bpe::utf8_valid(text))
    throw Error("GPT2BPETokenizer: the text is not valid UTF-8", "decode the input as UTF-8 first");
  impl_->pre->split(text, false, [&](std::string_view piece) { impl_->model.encode_bytes(piece, out); });
}

std::string GPT2BPETokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) {
    MCPP_CHECK(id >= 0 && id < int64_t(id_to_bytes_.size()),
               "token id {} outside the vocabulary of {}", id, id_to_bytes_.size());
    s += id_to_bytes_[id];
  }
  return s;
}

}  // namespace mcpp::data
