// GPT-2 byte-level BPE (Radford et al. 2019; Megatron's gpt2_tokenization.py):
// pre-tokenise with GPT-2's regex, map each word's bytes to symbols, merge the pair of
// lowest merge rank until none applies (bpe::BpeModel). Symbols are vocabulary ids
// from the start (every single byte and every merge result is in encoder.json), so a
// merge is a lookup of (left id, right id) -> (rank, merged id).
#include <algorithm>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer.h"

#ifdef MCPP_HAVE_SIMDJSON
#include <simdjson.h>
#endif

namespace mcpp::data {

struct GPT2BPETokenizer::Impl {
  bpe::BpeModel model;
  std::unique_ptr<bpe::Pretokenizer> pre;
};

namespace {

// Loading is start-up time that every `megatron preprocess` run pays before any worker
// starts, so it is made fast: encoder.json is read without building a DOM, token
// lookups go through bpe::TokenIndex, and the 50K merge lines (the bulk: two UTF-8
// conversions and three lookups each) are resolved on several threads.

// encoder.json: one flat object token -> id.
std::vector<std::pair<std::string, int64_t>> parse_vocab(const std::string& text,
                                                         const std::string& file) {
  std::vector<std::pair<std::string, int64_t>> items;
  auto bad = [&](const std::string& why) {
    return Error(fmt::format("--vocab-file {} is not a JSON object of token -> id: {}", file, why),
                 "pass GPT-2's encoder.json (gpt2-vocab.json)");
  };
#ifdef MCPP_HAVE_SIMDJSON
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  if (auto e = parser.parse(simdjson::padded_string(text)).get(obj))
    throw bad(simdjson::error_message(e));
  items.reserve(obj.size());
  for (auto [key, value] : obj) {
    int64_t id = -1;
    if (value.get_int64().get(id)) throw bad(fmt::format("the id of '{}' is not an integer", key));
    items.emplace_back(std::string(key), id);
  }
#else
  struct Sax final : nlohmann::json_sax<nlohmann::json> {
    std::vector<std::pair<std::string, int64_t>>* items;
    std::string key_, error;
    int depth = 0;
    bool fail(const char* what) { return error = what, false; }
    bool null() override { return fail("a null value"); }
    bool boolean(bool) override { return fail("a boolean value"); }
    bool number_integer(number_integer_t v) override {
      return items->emplace_back(std::move(key_), int64_t(v)), true;
    }
    bool number_unsigned(number_unsigned_t v) override {
      return items->emplace_back(std::move(key_), v > uint64_t(INT64_MAX) ? -1 : int64_t(v)), true;
    }
    bool number_float(number_float_t, const string_t&) override { return fail("a non-integer id"); }
    bool string(string_t&) override { return fail("a string value"); }
    bool binary(binary_t&) override { return fail("a binary value"); }
    bool start_object(std::size_t) override { return ++depth == 1 || fail("a nested object"); }
    bool key(string_t& k) override { return key_ = std::move(k), true; }
    bool end_object() override { return --depth, true; }
    bool start_array(std::size_t) override { return fail("an array"); }
    bool end_array() override { return fail("an array"); }
    bool parse_error(std::size_t, const std::string&,
                     const nlohmann::detail::exception& e) override {
      return fail(e.what());
    }
  } sax;
  sax.items = &items;
  if (!nlohmann::json::sax_parse(text, &sax) || sax.depth != 0)
    throw bad(sax.error.empty() ? "not an object" : sax.error);
#endif
  if (items.empty()) throw bad("no tokens");
  return items;
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (path.empty() || !f) return std::nullopt;
  std::string s(size_t(f.tellg()), '\0');
  f.seekg(0);
  if (!f.read(s.data(), std::streamsize(s.size()))) return std::nullopt;
  return s;
}

// f(begin, end) over [0, n) in contiguous ranges on up to 8 threads; the first error
// (lowest range) is rethrown.
template <class F>
void parallel_ranges(size_t n, F&& f) {
  const size_t T = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  if (T == 1 || n < 4096) return f(size_t(0), n);
  std::vector<std::exception_ptr> errors(T);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < T; ++t)
    threads.emplace_back([&, t] {
      try {
        f(n * t / T, n * (t + 1) / T);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : impl_(std::make_unique<Impl>()) {
  auto to_bytes = [&](std::string_view s, const std::string& file, std::string& raw) {
    if (!bpe::unicode_to_bytes(s, raw))
      throw Error(fmt::format("{}: token '{}' is not in GPT-2's byte alphabet", file, s),
                  "is this a GPT-2 byte-level BPE vocabulary?");
  };

  const std::optional<std::string> vocab_text = read_file(vocab_file);
  if (!vocab_text)
    throw Error(fmt::format("cannot read --vocab-file '{}'", vocab_file),
                "GPT2BPETokenizer needs --vocab-file (GPT-2's encoder.json / gpt2-vocab.json) and "
                "--merge-file (vocab.bpe / gpt2-merges.txt)");
  const auto items = parse_vocab(*vocab_text, vocab_file);
  const size_t V = items.size();
  id_to_bytes_.resize(V);
  std::vector<uint8_t> seen(V, 0);
  for (const auto& [tok, id] : items) {
    if (id < 0 || id >= int64_t(V) || seen[size_t(id)])
      throw Error(fmt::format("--vocab-file {}: token '{}' has id {}, expected unique ids 0..{}",
                              vocab_file, tok, id, V - 1));
    seen[size_t(id)] = 1;
    if (tok == "<|endoftext|>") eod_ = id;
  }
  if (!std::any_of(items.begin(), items.end(),
                   [](auto& it) { return it.first == "<|endoftext|>"; }))
    throw Error(fmt::format("--vocab-file {} has no <|endoftext|> token", vocab_file));
  parallel_ranges(V, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const auto& [tok, id] = items[i];
      if (id == eod_)
        id_to_bytes_[size_t(id)] = tok;  // a special token, not bytes
      else
        to_bytes(tok, vocab_file, id_to_bytes_[size_t(id)]);
    }
  });
  bpe::TokenIndex bytes_id(V);
  for (size_t id = 0; id < V; ++id) bytes_id.add(id_to_bytes_[id], int32_t(id));
  std::array<int32_t, 256> byte_id{};
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    byte_id[b] = bytes_id.find(std::string_view(&c, 1));
    if (byte_id[b] < 0)
      throw Error(fmt::format("--vocab-file {} lacks the single byte {}", vocab_file, b));
  }
  impl_->model.set_byte_ids(byte_id);

  const std::optional<std::string> merges = read_file(merge_file);
  if (!merges)
    throw Error(fmt::format("cannot read --merge-file '{}'", merge_file),
                "GPT2BPETokenizer needs --merge-file (vocab.bpe / gpt2-merges.txt)");
  struct Line {
    std::string_view text;
    int64_t lineno;
  };
  std::vector<Line> lines;
  int64_t lineno = 0;
  for (size_t pos = 0; pos < merges->size();) {
    size_t end = merges->find('\n', pos);
    if (end == std::string::npos) end = merges->size();
    std::string_view line(merges->data() + pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if ((lineno == 1 && line.starts_with("#version")) || line.empty()) continue;
    lines.push_back({line, lineno});
  }
  struct Merge {
    int32_t a, b, merged;
  };
  std::vector<Merge> resolved(lines.size());
  parallel_ranges(lines.size(), [&](size_t begin, size_t end) {
    std::string a, b, ab;
    for (size_t i = begin; i < end; ++i) {
      const auto [line, no] = lines[i];
      auto sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        throw Error(
            fmt::format("{}:{}: expected two symbols separated by one space", merge_file, no));
      to_bytes(line.substr(0, sp), merge_file, a);
      to_bytes(line.substr(sp + 1), merge_file, b);
      ab.assign(a).append(b);
      Merge& m = resolved[i];
      m = {bytes_id.find(a), bytes_id.find(b), bytes_id.find(ab)};
      if (m.a < 0 || m.b < 0 || m.merged < 0)
        throw Error(fmt::format("{}:{}: merge '{}' uses a symbol missing from {}", merge_file, no,
                                line, vocab_file),
                    "the vocab and merge files must come from the same tokenizer");
    }
  });
  impl_->model.reserve(resolved.size());
  for (size_t r = 0; r < resolved.size(); ++r)
    impl_->model.add_merge(resolved[r].a, resolved[r].b, int32_t(r), resolved[r].merged);
  impl_->pre = std::make_unique<bpe::Pretokenizer>(bpe::kGpt2Pattern);
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

void GPT2BPETokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  impl_->model.encode_bytes(word, out);
}

void GPT2BPETokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (!bpe::utf8_valid(text))
    throw Error("GPT2BPETokenizer: the text is not valid UTF-8", "decode the input as UTF-8 first");
  impl_->pre->split(text, false,
                    [&](std::string_view piece) { impl_->model.encode_bytes(piece, out); });
}

std::optional<int64_t> GPT2BPETokenizer::token_to_id(std::string_view token) const {
  if (token == "<|endoftext|>") return eod_;
  // encoder.json spells tokens in GPT-2's byte alphabet; they are held here as raw bytes.
  std::string raw;
  if (!bpe::unicode_to_bytes(token, raw)) return std::nullopt;
  for (size_t id = 0; id < id_to_bytes_.size(); ++id)  // start-up only: a scan is fine
    if (int64_t(id) != eod_ && id_to_bytes_[id] == raw) return int64_t(id);
  return std::nullopt;
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
