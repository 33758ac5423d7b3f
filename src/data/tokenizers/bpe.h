// The byte-pair-encoding core shared by GPT2BPETokenizer, TikTokenizer and
// HuggingFaceTokenizer: a PCRE2 (JIT) pre-tokeniser, a pair table (left id, right id) ->
// (rank, merged id), and the merge loop of tiktoken's byte_pair_merge / Hugging Face's
// Word::merge_all — repeatedly merge the adjacent pair of lowest rank, the leftmost one
// on ties — with a per-thread cache of piece -> ids, since natural text repeats its
// words constantly. For GPT-2 vocabularies this gives the ids of GPT-2's own bpe()
// (which merges every occurrence of the best bigram at once); the r50k test plans check it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mcpp::data::bpe {

// ---- UTF-8 and GPT-2's byte alphabet ------------------------------------------------

// Length of the UTF-8 sequence that starts with `lead` (1 for a stray continuation byte).
inline size_t utf8_len(uint8_t lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
}
bool utf8_decode(std::string_view s, std::vector<uint32_t>& cps);  // false on malformed input
void utf8_append(uint32_t cp, std::string& out);
bool utf8_valid(std::string_view s);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+n.
const std::array<uint32_t, 256>& byte_to_unicode();
// A token written in GPT-2's byte alphabet -> its raw bytes; false if a character is
// outside the alphabet.
bool unicode_to_bytes(std::string_view s, std::string& out);

// ---- pre-tokenisation ---------------------------------------------------------------

// A PCRE2 pattern (UTF + Unicode properties, JIT-compiled) that splits text into pieces.
class Pretokenizer {
 public:
  explicit Pretokenizer(const std::string& pattern);  // throws mcpp::Error naming the pattern
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls f(piece) for each match in order and, when emit_gaps, for the text between
  // matches too (Hugging Face's Split "Isolated"; the patterns used here leave no gaps
  // in valid UTF-8). text must be valid UTF-8 (checked by the caller once).
  template <class F>
  void split(std::string_view text, bool emit_gaps, F&& f) const {
    size_t pos = 0, b = 0, e = 0;
    while (pos < text.size() && next(text, pos, b, e)) {
      if (emit_gaps && b > pos) f(text.substr(pos, b - pos));
      f(text.substr(b, e - b));
      pos = e;
    }
    if (emit_gaps && pos < text.size()) f(text.substr(pos));
  }
  const std::string& pattern() const { return pattern_; }

 private:
  // Next non-empty match at or after pos: [b, e). False when none.
  bool next(std::string_view text, size_t pos, size_t& b, size_t& e) const;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

// ---- merges -------------------------------------------------------------------------

class BpeModel {
 public:
  BpeModel();
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // The pair (a, b) merges into `merged` with priority `rank` (lower first). The first
  // insertion of a pair wins.
  void add_merge(int32_t a, int32_t b, int32_t rank, int32_t merged);
  void reserve(size_t n_merges);
  size_t num_merges() const { return n_; }

  // Merges syms in place (ids in, ids out).
  void merge(std::vector<int32_t>& syms) const;

  // Byte-level encoding of one piece: bytes -> byte_ids -> merge; appends to out.
  // whole_piece: when set, a piece that is itself a token is that token (tiktoken's
  // rule and Hugging Face's ignore_merges). Cached per thread.
  void set_byte_ids(const std::array<int32_t, 256>& ids) { byte_id_ = ids; }
  void set_whole_pieces(std::unordered_map<std::string, int32_t> m) {
    whole_ = std::move(m), use_whole_ = true;
  }
  void encode_bytes(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  int32_t find(int32_t a, int32_t b, int32_t& merged) const;
  void merge_large(std::vector<int32_t>& syms) const;
  struct Slot {
    uint64_t key;
    int32_t rank, id;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0, n_ = 0;
  std::array<int32_t, 256> byte_id_{};
  std::unordered_map<std::string, int32_t> whole_;
  bool use_whole_ = false;
  uint64_t uid_;  // identifies this model in the per-thread caches
};

}  // namespace mcpp::data::bpe
