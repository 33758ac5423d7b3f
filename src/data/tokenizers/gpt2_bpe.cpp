// GPT-2 byte-level BPE (Radford et al. 2019; Megatron's gpt2_tokenization.py):
// pre-tokenise with GPT-2's regex, map each word's bytes to symbols, merge the pair of
// lowest merge rank until none applies. Symbols are vocabulary ids from the start
// (every single byte and every merge result is in encoder.json), so a merge is a
// lookup of (left id, right id) -> (rank, merged id).
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

#ifdef MCPP_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace mcpp::data {

namespace {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+n.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> m{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) m[b] = printable[b] ? uint32_t(b) : 256 + n++;
  return m;
}

// Decodes UTF-8 to code points; false on malformed input.
bool utf8_decode(std::string_view s, std::vector<uint32_t>& cps) {
  cps.clear();
  for (size_t i = 0; i < s.size();) {
    uint8_t c = uint8_t(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    cps.push_back(cp);
    i += n;
  }
  return true;
}

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// Open-addressing table (a, b) -> (rank, merged id): one probe in the common case,
// where std::unordered_map chases a bucket list for every pair BPE looks at.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 1;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  void insert(uint64_t key, int32_t rank, int32_t id) {
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, id};
        return;
      }
      if (slots_[i].key == key) return;  // first (lowest-rank) occurrence wins
    }
  }
  // Rank of the pair, or INT32_MAX; sets id when found.
  int32_t find(uint64_t key, int32_t& id) const {
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return id = s.id, s.rank;
      if (s.key == kEmpty) return std::numeric_limits<int32_t>::max();
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    int32_t rank, id;
  };
  size_t hash(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct GPT2BPETokenizer::Impl {
  std::array<int32_t, 256> byte_id{};
  MergeTable merges;
#ifdef MCPP_HAVE_PCRE2
  pcre2_code* re = nullptr;
  ~Impl() {
    if (re) pcre2_code_free(re);
  }
#endif
};

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file)
    : impl_(std::make_unique<Impl>()) {
#ifndef MCPP_HAVE_PCRE2
  throw Error("GPT2BPETokenizer needs PCRE2, which this build lacks",
              "install libpcre2-dev and rebuild");
#else
  const auto b2u = bytes_to_unicode();
  std::unordered_map<uint32_t, uint8_t> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = uint8_t(b);
  std::vector<uint32_t> cps;
  auto to_bytes = [&](const std::string& s, const std::string& file) {
    if (!utf8_decode(s, cps)) throw Error(fmt::format("{}: invalid UTF-8 in token '{}'", file, s));
    std::string out;
    for (uint32_t cp : cps) {
      auto it = u2b.find(cp);
      if (it == u2b.end())
        throw Error(fmt::format("{}: token '{}' is not in GPT-2's byte alphabet", file, s),
                    "is this a GPT-2 byte-level BPE vocabulary?");
      out.push_back(char(it->second));
    }
    return out;
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
    impl_->byte_id[b] = it->second;
  }

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

  impl_->merges.reserve(merge_list.size());
  for (const M& m : merge_list) impl_->merges.insert(m.key, m.rank, m.id);

  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  MCPP_CHECK(impl_->re, "cannot compile the GPT-2 pattern (PCRE2 error {})", err);
  pcre2_jit_compile(impl_->re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
#endif
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

void GPT2BPETokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  // Per-thread cache of recent words: natural text repeats its words constantly.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Cache {
    const void* owner = nullptr;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  thread_local Cache cache;
  if (cache.owner != this) cache.map.clear(), cache.owner = this;
  if (auto it = cache.map.find(word); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  // Symbols and the merge rank of each adjacent pair; after a merge only the pairs
  // touching a merged symbol are looked up again.
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  const size_t n0 = word.size();
  std::vector<int32_t> sym(n0), rank(n0), mid(n0), nsym(n0), nrank(n0), nmid(n0);
  std::vector<size_t> orig(n0);  // new position -> old position of an unmerged symbol
  std::vector<uint8_t> merged(n0);
  for (size_t i = 0; i < n0; ++i) sym[i] = impl_->byte_id[uint8_t(word[i])];
  const auto& merges = impl_->merges;
  auto lookup = [&](int32_t a, int32_t b, int32_t& id) {
    return merges.find(uint64_t(uint32_t(a)) << 32 | uint32_t(b), id);
  };
  size_t n = n0;
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = lookup(sym[i], sym[i + 1], mid[i]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNone) break;
    const int32_t ba = sym[best], bb = sym[best + 1], id = mid[best], r = rank[best];
    // Merge every occurrence of (ba, bb), left to right, without overlap.
    size_t w = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && rank[i] == r && sym[i] == ba && sym[i + 1] == bb) {
        nsym[w] = id, merged[w] = 1, i += 2;
      } else {
        nsym[w] = sym[i], merged[w] = 0, orig[w] = i, i += 1;
      }
      ++w;
    }
    for (size_t j = 0; j + 1 < w; ++j) {
      if (merged[j] || merged[j + 1])
        nrank[j] = lookup(nsym[j], nsym[j + 1], nmid[j]);
      else
        nrank[j] = rank[orig[j]], nmid[j] = mid[orig[j]];
    }
    std::swap(mid, nmid);
    std::swap(sym, nsym), std::swap(rank, nrank);
    n = w;
  }
  sym.resize(n);
  out.insert(out.end(), sym.begin(), sym.end());
  if (cache.map.size() > 200000) cache.map.clear();
  cache.map.emplace(std::string(word), std::move(sym));
}

void GPT2BPETokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
#ifdef MCPP_HAVE_PCRE2
  struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  };
  thread_local MatchData m;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  while (pos < text.size()) {
    // The first call validates the whole subject as UTF-8; later calls skip that check.
    int rc = pcre2_match(impl_->re, subject, text.size(), pos, pos ? PCRE2_NO_UTF_CHECK : 0, m.md,
                         nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(fmt::format("GPT-2 pre-tokenisation failed at byte {}: {}", pos,
                              reinterpret_cast<const char*>(msg)),
                  "the text must be valid UTF-8");
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    if (ov[1] == ov[0]) {  // cannot happen with this pattern; never loop forever
      ++pos;
      continue;
    }
    bpe(text.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1];
  }
#else
  (void)text, (void)out;
#endif
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
