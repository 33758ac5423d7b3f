// The byte-pair-encoding core shared by GPT2BPETokenizer, TikTokenizer and
// HuggingFaceTokenizer: a PCRE2 (JIT) pre-tokeniser, a pair table (left id, right id) ->
// (rank, merged id), and the merge loop of tiktoken's byte_pair_merge / Hugging Face's
// Word::merge_all — repeatedly merge the adjacent pair of lowest rank, the leftmost one
// on ties — with a cache of piece -> ids, since natural text repeats its words
// constantly. The cache is shared by all threads (lock-free reads), so N preprocessing
// workers learn a corpus's vocabulary once, not N times. For GPT-2 vocabularies this gives the ids
// of GPT-2's own bpe() (which merges every occurrence of the best bigram at once); the r50k test
// plans check it.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
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

// Token bytes -> id while a vocabulary loads: the keys in one arena and an open-addressing
// table of (hash, entry), so the ~150K lookups of a 50K-merge file stay in cache (a
// std::unordered_map of strings made GPT-2's load take 86 ms, mostly cache misses).
class TokenIndex {
 public:
  explicit TokenIndex(size_t expected);
  void add(std::string_view bytes, int32_t id);  // a key already present keeps its id
  int32_t find(std::string_view bytes) const;    // -1 when absent

 private:
  size_t probe(std::string_view bytes, uint64_t h) const;  // the key's slot, or an empty one
  std::string arena_;
  std::vector<uint32_t> off_;  // entry e: arena_[off_[e], off_[e + 1])
  std::vector<int32_t> id_;
  std::vector<uint64_t> slots_;  // 0 = empty, else (hash high 32 bits) << 32 | (entry + 1)
  size_t mask_ = 0;
};

// ---- pre-tokenisation ---------------------------------------------------------------

// GPT-2's pre-tokenizer pattern (its encoder.py; also the ByteLevel pre-tokenizer's default).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

// piece -> ids for all threads of one BpeModel: a fixed open-addressing table of
// pointers to immutable entries, published with a release CAS and read with acquire
// loads, so lookups take no lock and write nothing. Insert-only: once full (kMaxEntries
// or kMaxArena bytes) it stops growing and the model falls back to a small per-thread
// cache for the pieces it lacks.
class SharedPieceCache {
 public:
  struct Entry {
    uint64_t hash;
    uint32_t key_len, n_ids;
    const int32_t* ids() const { return reinterpret_cast<const int32_t*>(this + 1); }
    const char* key() const { return reinterpret_cast<const char*>(ids() + n_ids); }
  };
  // slots: a power of two (at most slots/2 entries); max_bytes: bound on the entries'
  // memory. The defaults hold ~500K distinct pieces, more than a BPE vocabulary meets
  // in most corpora: 8 MB of slots + at most 64 MB of entries.
  explicit SharedPieceCache(size_t slots = size_t(1) << 20, size_t max_bytes = size_t(64) << 20);
  const Entry* find(std::string_view piece, uint64_t hash) const;
  // False when the cache is full (the caller keeps the piece elsewhere).
  bool insert(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n);
  bool full() const { return full_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kBlock = size_t(1) << 20;  // arena block
  void* allocate(size_t bytes);                      // nullptr when max_bytes would be exceeded
  std::atomic_ref<const Entry*> slot(size_t i) const { return std::atomic_ref(slots_[i]); }
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  // (slots), nullptr = empty; plain pointers from calloc, accessed through atomic_ref:
  // the zero pages are mapped on first touch, not cleared up front (8 MB at start-up).
  std::unique_ptr<const Entry*[], Free> slots_;
  const size_t mask_, max_entries_, max_bytes_;
  // Written by inserts: on their own cache lines, away from what every lookup reads.
  alignas(64) std::atomic<size_t> count_{0};
  alignas(64) std::atomic<bool> full_{false};
  alignas(64) std::mutex arena_mu_;  // guards the arena only; taken once per inserted piece
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  size_t block_used_ = kBlock, arena_bytes_ = 0;
};

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
  // rule and Hugging Face's ignore_merges). Cached (SharedPieceCache).
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
  uint64_t uid_;  // identifies this model in the per-thread overflow caches
  std::unique_ptr<SharedPieceCache> shared_;
};

}  // namespace mcpp::data::bpe
