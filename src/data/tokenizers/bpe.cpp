#include "data/tokenizers/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <queue>

#include "base/error.h"

#ifdef MCPP_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif
#ifdef MCPP_HAVE_SIMDJSON
#include <simdjson.h>
#endif

namespace mcpp::data::bpe {

// ---- UTF-8 --------------------------------------------------------------------------

bool utf8_decode(std::string_view s, std::vector<uint32_t>& cps) {
  cps.clear();
  for (size_t i = 0; i < s.size();) {
    uint8_t c = uint8_t(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    }
    cps.push_back(cp);
    i += n;
  }
  return true;
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  }
}

bool utf8_valid(std::string_view s) {
#ifdef MCPP_HAVE_SIMDJSON
  return simdjson::validate_utf8(s.data(), s.size());
#else
  std::vector<uint32_t> cps;
  return utf8_decode(s, cps);  // slower; also accepts surrogates and overlongs
#endif
}

const std::array<uint32_t, 256>& byte_to_unicode() {
  static const std::array<uint32_t, 256> m = [] {
    std::array<uint32_t, 256> r{};
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      r[b] = printable ? uint32_t(b) : 256 + n++;
    }
    return r;
  }();
  return m;
}

bool unicode_to_bytes(std::string_view s, std::string& out) {
  static const std::array<int16_t, 324> inv = [] {
    std::array<int16_t, 324> r;
    r.fill(-1);
    for (int b = 0; b < 256; ++b) r[byte_to_unicode()[b]] = int16_t(b);
    return r;
  }();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    uint8_t c = uint8_t(s[i]);
    size_t n = utf8_len(c);
    if (i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out += char(inv[cp]);
    i += n;
  }
  return true;
}

// ---- TokenIndex ---------------------------------------------------------------------

namespace {
inline uint64_t hash_bytes(std::string_view s) {
  // 8 bytes at a time, multiply-xorshift; pieces are short.
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t v = 0;
  std::memcpy(&v, s.data() + i, s.size() - i);
  h = (h ^ v) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  return h | 1;  // never 0, which marks an empty slot; tables index with h >> 1
}
}  // namespace

TokenIndex::TokenIndex(size_t expected) {
  size_t cap = 16;
  while (cap < 2 * expected) cap <<= 1;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  off_.reserve(expected + 1);
  id_.reserve(expected);
  off_.push_back(0);
}

size_t TokenIndex::probe(std::string_view bytes, uint64_t h) const {
  const uint64_t tag = h >> 32 << 32;
  for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
    const uint64_t s = slots_[i];
    if (s == 0) return i;
    if ((s >> 32 << 32) == tag) {
      const size_t e = size_t(uint32_t(s)) - 1;
      if (std::string_view(arena_).substr(off_[e], off_[e + 1] - off_[e]) == bytes) return i;
    }
  }
}

void TokenIndex::add(std::string_view bytes, int32_t id) {
  if (2 * (id_.size() + 1) > slots_.size()) {  // grow: rehash every entry
    std::vector<uint64_t> old(std::move(slots_));
    slots_.assign(2 * old.size(), 0);
    mask_ = slots_.size() - 1;
    for (size_t e = 0; e < id_.size(); ++e) {
      std::string_view k = std::string_view(arena_).substr(off_[e], off_[e + 1] - off_[e]);
      const uint64_t h = hash_bytes(k);
      slots_[probe(k, h)] = h >> 32 << 32 | (e + 1);
    }
  }
  const uint64_t h = hash_bytes(bytes);
  uint64_t& s = slots_[probe(bytes, h)];
  if (s != 0) return;
  arena_.append(bytes);
  off_.push_back(uint32_t(arena_.size()));
  id_.push_back(id);
  s = h >> 32 << 32 | id_.size();
}

int32_t TokenIndex::find(std::string_view bytes) const {
  const uint64_t h = hash_bytes(bytes);
  const uint64_t s = slots_[probe(bytes, h)];
  return s == 0 ? -1 : id_[size_t(uint32_t(s)) - 1];
}

// ---- Pretokenizer -------------------------------------------------------------------

Pretokenizer::Pretokenizer(const std::string& pattern) : pattern_(pattern) {
#ifdef MCPP_HAVE_PCRE2
  int err = 0;
  PCRE2_SIZE off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(fmt::format("cannot compile the pre-tokenisation pattern '{}' at offset {}: {}",
                            pattern, off, reinterpret_cast<const char*>(msg)),
                "the pattern must be a PCRE2-compatible regular expression");
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
#else
  throw Error("pre-tokenisation needs PCRE2, which this build lacks",
              "install libpcre2-dev and rebuild");
#endif
}

Pretokenizer::~Pretokenizer() {
#ifdef MCPP_HAVE_PCRE2
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
#endif
}

bool Pretokenizer::next(std::string_view text, size_t pos, size_t& b, size_t& e) const {
#ifdef MCPP_HAVE_PCRE2
  struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  };
  thread_local MatchData m;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  auto* code = static_cast<pcre2_code*>(code_);
  for (;;) {
    // The caller validated the UTF-8 once; pcre2_jit_match skips the per-call checks.
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, m.md, nullptr)
                  : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(fmt::format("pre-tokenisation failed at byte {}: {}", pos,
                              reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    if (ov[1] > ov[0]) {
      b = ov[0], e = ov[1];
      return true;
    }
    // An empty match: step one character on (never loop forever).
    pos = ov[0] + utf8_len(uint8_t(text[ov[0]]));
    if (pos >= text.size()) return false;
  }
#else
  (void)text, (void)pos, (void)b, (void)e;
  return false;
#endif
}

// ---- BpeModel -----------------------------------------------------------------------

namespace {

constexpr uint64_t kEmpty = ~0ull;
constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
std::atomic<uint64_t> g_next_uid{1};

inline uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }
inline size_t mix(uint64_t k) { return size_t((k * 0x9E3779B97F4A7C15ull) >> 17); }

// The overflow cache, used only once the model's SharedPieceCache is full: per thread,
// open addressing, keys and ids in two arenas; cleared when full (bounded memory) and
// when a different model uses the thread.
struct PieceCache {
  struct Entry {
    uint64_t hash = 0;
    uint32_t key_off = 0, key_len = 0, val_off = 0, val_len = 0;
  };
  static constexpr size_t kSlots = size_t(1) << 16, kMaxEntries = kSlots / 2;
  uint64_t uid = 0;
  std::vector<Entry> table;
  std::string keys;
  std::vector<int32_t> vals;
  size_t count = 0;

  void reset(uint64_t id) {
    uid = id;
    table.assign(kSlots, Entry{});
    keys.clear(), vals.clear();
    count = 0;
  }
  const Entry* find(std::string_view piece, uint64_t h) const {
    for (size_t i = (h >> 1) & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Entry& e = table[i];
      if (e.hash == 0) return nullptr;
      if (e.hash == h && e.key_len == piece.size() &&
          std::memcmp(keys.data() + e.key_off, piece.data(), piece.size()) == 0)
        return &e;
    }
  }
  void insert(std::string_view piece, uint64_t h, const int32_t* ids, size_t n) {
    if (count >= kMaxEntries || keys.size() > (size_t(8) << 20)) reset(uid);
    size_t i = (h >> 1) & (kSlots - 1);
    while (table[i].hash != 0) i = (i + 1) & (kSlots - 1);
    table[i] = {h, uint32_t(keys.size()), uint32_t(piece.size()), uint32_t(vals.size()),
                uint32_t(n)};
    keys.append(piece);
    vals.insert(vals.end(), ids, ids + n);
    ++count;
  }
};

}  // namespace

// ---- SharedPieceCache ---------------------------------------------------------------

SharedPieceCache::SharedPieceCache(size_t slots, size_t max_bytes)
    : mask_(slots - 1), max_entries_(slots / 2), max_bytes_(max_bytes) {
  MCPP_CHECK(slots >= 2 && (slots & (slots - 1)) == 0, "cache slots {} not a power of two", slots);
  slots_.reset(static_cast<const Entry**>(std::calloc(slots, sizeof(const Entry*))));
  MCPP_CHECK(slots_, "out of memory for a piece cache of {} slots", slots);
}

void* SharedPieceCache::allocate(size_t bytes) {
  bytes = (bytes + 7) & ~size_t(7);  // keeps every Entry 8-byte aligned
  if (bytes > kBlock) return nullptr;
  std::lock_guard lk(arena_mu_);
  if (block_used_ + bytes > kBlock) {
    if (arena_bytes_ + kBlock > max_bytes_) return nullptr;
    blocks_.push_back(std::make_unique_for_overwrite<std::byte[]>(kBlock));
    arena_bytes_ += kBlock;
    block_used_ = 0;
  }
  void* p = blocks_.back().get() + block_used_;
  block_used_ += bytes;
  return p;
}

const SharedPieceCache::Entry* SharedPieceCache::find(std::string_view piece, uint64_t h) const {
  for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
    const Entry* e = slot(i).load(std::memory_order_acquire);
    if (!e) return nullptr;
    if (e->hash == h && e->key_len == piece.size() &&
        std::memcmp(e->key(), piece.data(), piece.size()) == 0)
      return e;
  }
}

bool SharedPieceCache::insert(std::string_view piece, uint64_t h, const int32_t* ids, size_t n) {
  // Racing inserts may overshoot max_entries_ by the number of threads; the table keeps
  // half its slots free, so probing always ends.
  if (full() || count_.load(std::memory_order_relaxed) >= max_entries_) {
    full_.store(true, std::memory_order_relaxed);
    return false;
  }
  auto* e = static_cast<Entry*>(allocate(sizeof(Entry) + n * sizeof(int32_t) + piece.size()));
  if (!e) {
    full_.store(true, std::memory_order_relaxed);
    return false;
  }
  e->hash = h, e->key_len = uint32_t(piece.size()), e->n_ids = uint32_t(n);
  std::memcpy(const_cast<int32_t*>(e->ids()), ids, n * sizeof(int32_t));
  std::memcpy(const_cast<char*>(e->key()), piece.data(), piece.size());
  for (size_t i = (h >> 1) & mask_;; i = (i + 1) & mask_) {
    const Entry* cur = nullptr;
    if (slot(i).compare_exchange_strong(cur, e, std::memory_order_release,
                                        std::memory_order_acquire)) {
      count_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    // Another thread published the same piece first: ours stays unused in the arena.
    if (cur->hash == h && cur->key_len == piece.size() &&
        std::memcmp(cur->key(), piece.data(), piece.size()) == 0)
      return true;
  }
}

// ---- BpeModel -----------------------------------------------------------------------

BpeModel::BpeModel() : uid_(g_next_uid++), shared_(std::make_unique<SharedPieceCache>()) {
  reserve(1024);
}
BpeModel::~BpeModel() = default;

void BpeModel::reserve(size_t n) {
  size_t cap = 1;
  while (cap < 2 * std::max<size_t>(n, 16)) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{kEmpty, 0, 0});
  mask_ = cap - 1;
  n_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) add_merge(int32_t(s.key >> 32), int32_t(uint32_t(s.key)), s.rank, s.id);
}

void BpeModel::add_merge(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  if (2 * (n_ + 1) > slots_.size()) reserve(2 * (n_ + 1));
  const uint64_t key = pair_key(a, b);
  for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, rank, merged};
      ++n_;
      return;
    }
    if (slots_[i].key == key) return;
  }
}

inline int32_t BpeModel::find(int32_t a, int32_t b, int32_t& merged) const {
  const uint64_t key = pair_key(a, b);
  for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.key == key) return merged = s.id, s.rank;
    if (s.key == kEmpty) return kNone;
  }
}

void BpeModel::merge(std::vector<int32_t>& sym) const {
  size_t n = sym.size();
  if (n < 2) return;
  if (n > 256) return merge_large(sym);
  // rank[i], mid[i]: the pair (sym[i], sym[i+1]). Merging at i removes slot i+1 and
  // updates the pairs at i-1 and i: O(n) a merge, cheap for the short pieces of text.
  int32_t rank[256], mid[256];
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = find(sym[i], sym[i + 1], mid[i]);
  while (n > 1) {
    size_t best = 0;
    int32_t r = rank[0];
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < r) r = rank[i], best = i;
    if (r == kNone) break;
    sym[best] = mid[best];
    for (size_t i = best + 1; i + 1 < n; ++i)
      sym[i] = sym[i + 1], rank[i] = rank[i + 1], mid[i] = mid[i + 1];
    --n;
    if (best + 1 < n) rank[best] = find(sym[best], sym[best + 1], mid[best]);
    if (best > 0) rank[best - 1] = find(sym[best - 1], sym[best], mid[best - 1]);
  }
  sym.resize(n);
}

// Long pieces (a run of spaces, a whole document for models without a pre-tokeniser):
// a doubly linked list of symbols and a min-heap of (rank, position), stale entries
// skipped on pop. Same order as merge(): lowest rank, leftmost first.
void BpeModel::merge_large(std::vector<int32_t>& sym) const {
  const size_t n = sym.size();
  std::vector<int32_t> prev(n), next(n), rank(n, kNone), mid(n, 0);
  std::vector<uint8_t> alive(n, 1);
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> heap;
  auto push = [&](size_t i) {
    if (next[i] < 0) return (void)(rank[i] = kNone);
    rank[i] = find(sym[i], sym[size_t(next[i])], mid[i]);
    if (rank[i] != kNone) heap.push(int64_t(rank[i]) << 32 | int64_t(i));
  };
  for (size_t i = 0; i < n; ++i)
    prev[i] = int32_t(i) - 1, next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const int64_t top = heap.top();
    heap.pop();
    const auto i = size_t(top & 0xFFFFFFFF);
    const auto r = int32_t(top >> 32);
    if (!alive[i] || rank[i] != r) continue;
    const auto j = size_t(next[i]);
    sym[i] = mid[i];
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[size_t(next[j])] = int32_t(i);
    push(i);
    if (prev[i] >= 0) push(size_t(prev[i]));
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[size_t(i)]) sym[w++] = sym[size_t(i)];
  sym.resize(w);
}

void BpeModel::encode_bytes(std::string_view piece, std::vector<int32_t>& out) const {
  const uint64_t h = hash_bytes(piece);
  if (const auto* e = shared_->find(piece, h)) {
    out.insert(out.end(), e->ids(), e->ids() + e->n_ids);
    return;
  }
  thread_local PieceCache overflow;
  const bool use_overflow = shared_->full();
  if (use_overflow) {
    if (overflow.uid != uid_) overflow.reset(uid_);
    if (const auto* e = overflow.find(piece, h)) {
      const int32_t* v = overflow.vals.data() + e->val_off;
      out.insert(out.end(), v, v + e->val_len);
      return;
    }
  }
  thread_local std::vector<int32_t> sym;
  sym.clear();
  if (use_whole_) {
    if (auto it = whole_.find(std::string(piece)); it != whole_.end()) sym.push_back(it->second);
  }
  if (sym.empty()) {
    sym.resize(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id_[uint8_t(piece[i])];
    merge(sym);
  }
  out.insert(out.end(), sym.begin(), sym.end());
  if (piece.size() > 1024) return;  // a run of spaces or a whole document: rarely repeats
  if (!shared_->insert(piece, h, sym.data(), sym.size()) && use_overflow)
    overflow.insert(piece, h, sym.data(), sym.size());
}

}  // namespace mcpp::data::bpe
