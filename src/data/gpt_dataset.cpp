#include "data/gpt_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <regex>

#include "base/error.h"
#include "base/log.h"
#include "base/numpy_rng.h"
#include "data/index_cache.h"

namespace mcpp::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train:
      return "train";
    case Split::Valid:
      return "valid";
    case Split::Test:
      return "test";
  }
  return "?";
}

// ---- mock ---------------------------------------------------------------------------

MockGPTLowLevelDataset::MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod)
    : lengths_(kSize), vocab_size_(vocab_size), eod_(eod) {
  MCPP_CHECK(vocab_size > 0, "mock data needs a vocabulary size, got {}", vocab_size);
  NumpyGenerator rng(0);
  for (auto& l : lengths_) l = rng.integers_i32(1, 4096);
}

int64_t MockGPTLowLevelDataset::read(int64_t seq, int64_t offset, int64_t length,
                                     int64_t* out) const {
  const int64_t len = lengths_[seq];
  if (length < 0) length = len - offset;
  MCPP_CHECK(offset >= 0 && offset + length <= len, "mock read out of range");
  for (int64_t k = 0; k < length; ++k) {
    int64_t pos = offset + k;
    out[k] = pos == len - 1 ? eod_ : (pos + 1) % vocab_size_;
  }
  return length;
}

// ---- index construction ---------------------------------------------------------------

namespace {

// _build_document_index: `documents` tiled num_epochs times, int32, one shuffle.
std::vector<int32_t> build_document_index(const std::vector<int32_t>& docs, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> out;
    out.reserve(docs.size() * size_t(num_epochs));
    for (int64_t e = 0; e < num_epochs; ++e) out.insert(out.end(), docs.begin(), docs.end());
    rng.shuffle(out.data(), int64_t(out.size()));
    return out;
  }
  auto first = build_document_index(docs, num_epochs - 1, rng, false);
  auto last = build_document_index(docs, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

// _build_shuffle_index: [0, n) shuffled, then [n, total) shuffled separately. The
// element type only matters for caching, the permutation is the same.
template <typename T>
void shuffle_split(T* v, int64_t num_samples, int64_t total, NumpyRandomState& rng) {
  for (int64_t i = 0; i < total; ++i) v[i] = T(i);
  rng.shuffle(v, num_samples);
  if (num_samples < total) rng.shuffle(v + num_samples, total - num_samples);
}

CompactIndex<uint32_t> build_shuffle_index(int64_t num_samples, int64_t total,
                                           NumpyRandomState& rng) {
  // Megatron's dtype: uint32 below 2^32 - 1 samples. The swaps then also touch half the
  // memory (mock data's 4.3M-sample split: most of a small run's start-up).
  if (total >= int64_t(std::numeric_limits<uint32_t>::max()) - 1) {
    std::vector<int64_t> out(static_cast<size_t>(total));
    shuffle_split(out.data(), num_samples, total, rng);
    return CompactIndex<uint32_t>(std::move(out));
  }
  std::vector<uint32_t> out(static_cast<size_t>(total));
  shuffle_split(out.data(), num_samples, total, rng);
  return CompactIndex<uint32_t>(std::move(out));
}

}  // namespace

int64_t sample_count(int64_t tokens, int64_t seq_length, int64_t add_extra_token,
                     bool drop_last_partial) {
  if (drop_last_partial) return (tokens - add_extra_token) / seq_length;
  // helpers.cpp computes this in single precision.
  return int64_t(std::ceil(float(tokens - add_extra_token) / float(seq_length)));
}

namespace {

template <typename T>
std::vector<T> sample_index_as(const LowLevelDataset& low, const std::vector<int32_t>& document_index,
                               int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                               bool drop_last_partial, int add_extra_token) {
  const int64_t X = add_extra_token;
  const int64_t num_samples =
      sample_count(num_epochs * tokens_per_epoch, seq_length, X, drop_last_partial);
  std::vector<T> idx;  // reserve + push_back: no zero-fill pass over tens of MB
  idx.reserve(size_t(2 * (num_samples + 1)));
  int64_t row = 0, doc_pos = 0, doc_offset = 0;
  idx.push_back(0), idx.push_back(0);
  ++row;
  const int64_t ndocs = int64_t(document_index.size());
  while (row <= num_samples) {
    int64_t remaining = seq_length + X;
    while (remaining != 0) {
      const int64_t doc_len = low.sequence_length(document_index[doc_pos]) - doc_offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        // The next sample starts X tokens before the end of this one.
        doc_offset += remaining + doc_len - X;
        remaining = 0;
      } else {
        if (doc_pos == ndocs - 1) {
          MCPP_CHECK(row == num_samples, "sample index ran out of documents at sample {} of {}",
                     row, num_samples);
          doc_offset = low.sequence_length(document_index[doc_pos]) - X;
          break;
        }
        ++doc_pos;
        doc_offset = 0;
      }
    }
    idx.push_back(T(doc_pos));
    idx.push_back(T(doc_offset));
    ++row;
  }
  return idx;
}

}  // namespace

CompactIndex<int32_t> build_sample_index(const LowLevelDataset& low,
                                         const std::vector<int32_t>& document_index,
                                         int64_t seq_length, int64_t num_epochs,
                                         int64_t tokens_per_epoch, bool drop_last_partial,
                                         int add_extra_token) {
  if (int64_t(document_index.size()) <= int64_t(std::numeric_limits<int32_t>::max()))
    return CompactIndex<int32_t>(sample_index_as<int32_t>(low, document_index, seq_length,
                                                          num_epochs, tokens_per_epoch,
                                                          drop_last_partial, add_extra_token));
  return CompactIndex<int32_t>(sample_index_as<int64_t>(low, document_index, seq_length,
                                                        num_epochs, tokens_per_epoch,
                                                        drop_last_partial, add_extra_token));
}

GPTDataset::GPTDataset(std::shared_ptr<const LowLevelDataset> low, std::vector<int32_t> indices,
                       std::optional<int64_t> num_samples, Split split,
                       const GPTDatasetConfig& config)
    : low_(std::move(low)),
      indices_(std::move(indices)),
      num_samples_(num_samples),
      split_(split),
      cfg_(config) {
  const int64_t S = cfg_.sequence_length, X = cfg_.add_extra_token;
  MCPP_CHECK(S > 0, "sequence length must be positive, got {}", S);
  if (cfg_.mock && !num_samples_) num_samples_ = int64_t(indices_.size());

  int64_t tokens_per_epoch = 0;
  for (int32_t i : indices_) tokens_per_epoch += low_->sequence_length(i);
  // Megatron would loop forever (or abort in its C++ helper) on an empty split.
  if (indices_.empty() || tokens_per_epoch <= X)
    throw Error(
        fmt::format("the {} split of dataset {} holds {} sequences ({} tokens): too few to "
                    "make even one sample of {} tokens (the dataset has {} sequences in all)",
                    split_name(split_), low_->path(), indices_.size(), tokens_per_epoch, S + X,
                    low_->num_sequences()),
        "change --split so that every non-zero split gets sequences (e.g. --split 98,2,0 "
        "for a small dataset), or use a larger dataset");
  tokens_per_epoch_ = tokens_per_epoch;

  // _get_num_epochs
  num_epochs_ = 1;
  if (num_samples_) {
    const int64_t requested = *num_samples_ * S + X;
    for (int64_t t = tokens_per_epoch; t < requested; t += tokens_per_epoch) ++num_epochs_;
  }
  if (num_epochs_ > 1) {
    samples_sans_final_ = ((num_epochs_ - 1) * tokens_per_epoch - X) / S;
    const int64_t from_final = *num_samples_ - samples_sans_final_;
    const int64_t per_epoch = (tokens_per_epoch - X) / S;
    MCPP_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "bad final-epoch sample count {}",
               from_final);
    separate_final_epoch_ = from_final < int64_t(0.80 * double(per_epoch));
  }
  const bool drop_last = drops_last_partial();
  total_samples_ = sample_count(num_epochs_ * tokens_per_epoch, S, X, drop_last);
  if (!cfg_.path_to_cache.empty() && !cfg_.mock) built();
}

// Megatron's drop_last_partial_validation_sequence applies to the validation split only.
bool GPTDataset::drops_last_partial() const {
  return split_ == Split::Valid ? cfg_.drop_last_partial_validation_sequence : true;
}

const GPTDataset& GPTDataset::built() const {
  std::call_once(built_once_, [this] {
    build_indices();
    indices_built_ = true;
  });
  return *this;
}

void GPTDataset::build_indices() const {
  if (!cfg_.path_to_cache.empty() && !cfg_.mock && load_cache()) return;
  const int64_t S = cfg_.sequence_length, X = cfg_.add_extra_token;
  NumpyRandomState rng(cfg_.seed);
  document_index_ = build_document_index(indices_, num_epochs_, rng, separate_final_epoch_);
  const bool drop_last = drops_last_partial();
  sample_index_ = build_sample_index(*low_, document_index_, S, num_epochs_, tokens_per_epoch_,
                                     drop_last, int(X));
  const int64_t total = int64_t(sample_index_.size() / 2) - 1;
  MCPP_CHECK(total == total_samples_, "the {} sample index holds {} samples, expected {}",
             split_name(split_), total, total_samples_);
  shuffle_index_ =
      build_shuffle_index(separate_final_epoch_ ? samples_sans_final_ : total, total, rng);
  if (!cfg_.path_to_cache.empty() && !cfg_.mock) save_cache();
}

std::string GPTDataset::description() const {
  // Megatron's unique_identifiers, plus what pins the data itself (sequence count,
  // the split's range) so that a rewritten dataset under the same path is not reused.
  int64_t tokens = 0;
  for (int32_t i : indices_) tokens += low_->sequence_length(i);
  return fmt::format(
      "{{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": \"{}\",\n    \"num_samples\": {},\n"
      "    \"index_split\": \"{}\",\n    \"random_seed\": {},\n    \"sequence_length\": {},\n"
      "    \"split\": \"{}\",\n    \"add_extra_token_to_sequence\": {},\n"
      "    \"drop_last_partial_validation_sequence\": {},\n    \"num_sequences\": {},\n"
      "    \"split_first_sequence\": {},\n    \"split_num_sequences\": {},\n"
      "    \"split_num_tokens\": {}\n}}",
      low_->path(), num_samples_ ? std::to_string(*num_samples_) : "null", split_name(split_),
      cfg_.seed, cfg_.sequence_length, cfg_.split_spec, cfg_.add_extra_token ? "true" : "false",
      cfg_.drop_last_partial_validation_sequence ? "true" : "false", low_->num_sequences(),
      indices_.empty() ? 0 : indices_.front(), indices_.size(), tokens);
}

bool GPTDataset::load_cache() const {
  const std::string desc = description();
  const CacheFiles f = cache_files(cfg_.path_to_cache, desc, "GPTDataset", split_name(split_));
  if (!std::filesystem::exists(f.path("description.txt"))) return false;
  std::string why;
  auto bad = [&](const std::string& w) {
    log::warn("index cache {}-*: {}; rebuilding it", f.path(""), w);
    return false;
  };
  if (!cache_description_matches(f, desc)) return bad("the description differs");
  auto doc = read_npy(f.path("document_index.npy"), &why);
  if (!doc) return bad("document_index.npy: " + why);
  auto smp = read_npy(f.path("sample_index.npy"), &why);
  if (!smp) return bad("sample_index.npy: " + why);
  auto shf = read_npy(f.path("shuffle_index.npy"), &why);
  if (!shf) return bad("shuffle_index.npy: " + why);
  // Shapes and ranges before trusting a single value.
  const int64_t S = cfg_.sequence_length, X = cfg_.add_extra_token;
  const bool drop_last = drops_last_partial();
  const int64_t total = total_samples_;
  const int64_t ndoc = int64_t(indices_.size()) * num_epochs_;
  if (doc->descr != "<i4" || doc->shape != std::vector<int64_t>{ndoc})
    return bad(fmt::format("document_index.npy is {} {}, expected <i4 [{}]", doc->descr,
                           doc->shape.size(), ndoc));
  if (smp->shape != std::vector<int64_t>{total + 1, 2})
    return bad(fmt::format("sample_index.npy does not hold [{}, 2]", total + 1));
  if (shf->shape != std::vector<int64_t>{total})
    return bad(fmt::format("shuffle_index.npy does not hold [{}]", total));
  auto d = doc->as_int64(), s = smp->as_int64(), h = shf->as_int64();
  if (!d || !s || !h) return bad("an index has an unexpected dtype");
  const int64_t lo = indices_.front(), hi = indices_.back();
  for (int64_t v : *d)
    if (v < lo || v > hi) return bad("document_index.npy holds a sequence outside the split");
  for (size_t i = 0; i < s->size(); i += 2)
    if ((*s)[i] < 0 || (*s)[i] >= ndoc || (*s)[i + 1] < 0 || (i >= 2 && (*s)[i] < (*s)[i - 2]))
      return bad("sample_index.npy is out of range");
  // Every sample must read exactly what get_text() will read: each piece inside its
  // sequence and S + X tokens in all (fewer only for validation's last partial sample). A
  // backwards boundary would make get_text() write past its buffer; an all-zero index would
  // train on samples of one token.
  for (int64_t j = 0; j < total; ++j) {
    const int64_t db = (*s)[2 * j], ob = (*s)[2 * j + 1], de = (*s)[2 * j + 2],
                  oe = (*s)[2 * j + 3];
    int64_t n = 0;
    bool ok = true;
    for (int64_t i = db; ok && i <= de; ++i) {
      const int64_t len = low_->sequence_length((*d)[size_t(i)]);
      const int64_t off = i > db ? 0 : ob,
                    want = i < de ? len - off : (db == de ? oe - ob : oe) + X;
      ok = off >= 0 && want >= 0 && off <= len && want <= len - off && n + want <= S + X;
      n += want;
    }
    const bool last_partial = !drop_last && j == total - 1;
    if (!ok || (last_partial ? n < X : n != S + X))
      return bad(fmt::format("sample_index.npy: sample {} does not cover {} tokens of the split", j,
                             S + X));
  }
  for (int64_t v : *h)
    if (v < 0 || v >= total) return bad("shuffle_index.npy is out of range");
  document_index_.assign(d->begin(), d->end());
  // Held as build_indices() holds them: 4-byte elements where the values fit.
  if (ndoc <= int64_t(std::numeric_limits<int32_t>::max()))
    sample_index_ = CompactIndex<int32_t>(std::vector<int32_t>(s->begin(), s->end()));
  else
    sample_index_ = CompactIndex<int32_t>(std::move(*s));
  if (total < int64_t(std::numeric_limits<uint32_t>::max()) - 1)
    shuffle_index_ = CompactIndex<uint32_t>(std::vector<uint32_t>(h->begin(), h->end()));
  else
    shuffle_index_ = CompactIndex<uint32_t>(std::move(*h));
  loaded_from_cache_ = true;
  log::info("loaded the {} indices of {} from {}-*", split_name(split_), low_->path(), f.path(""));
  return true;
}

void GPTDataset::save_cache() const {
  const std::string desc = description();
  const CacheFiles f = cache_files(cfg_.path_to_cache, desc, "GPTDataset", split_name(split_));
  std::filesystem::create_directories(cfg_.path_to_cache);
  const int64_t total = int64_t(shuffle_index_.size());
  write_npy(f.path("document_index.npy"), "<i4", {int64_t(document_index_.size())},
            document_index_.data(), document_index_.size() * 4);
  // Megatron's dtypes: int32 sample index while it fits, uint32 shuffle index below 2^32-1.
  const auto& si = sample_index_;
  int64_t smax = 0;
  if (!si.is_narrow())
    for (int64_t v : si.wide()) smax = std::max(smax, v);
  if (si.is_narrow()) {
    write_npy(f.path("sample_index.npy"), "<i4", {total + 1, 2}, si.narrow().data(),
              si.narrow().size() * 4);
  } else if (smax <= std::numeric_limits<int32_t>::max()) {
    std::vector<int32_t> v(si.wide().begin(), si.wide().end());
    write_npy(f.path("sample_index.npy"), "<i4", {total + 1, 2}, v.data(), v.size() * 4);
  } else {
    write_npy(f.path("sample_index.npy"), "<i8", {total + 1, 2}, si.wide().data(),
              si.wide().size() * 8);
  }
  const auto& sh = shuffle_index_;
  if (sh.is_narrow())
    write_npy(f.path("shuffle_index.npy"), "<u4", {total}, sh.narrow().data(),
              sh.narrow().size() * 4);
  else
    write_npy(f.path("shuffle_index.npy"), "<i8", {total}, sh.wide().data(), sh.wide().size() * 8);
  write_cache_description(f, desc);
}

int64_t GPTDataset::size() const {
  if (cfg_.mock) return *num_samples_;
  return total_samples_;
}

std::string GPTDataset::describe() const {
  return fmt::format("GPTDataset {} split of {}: {} sequences, {} samples, {} epochs{}",
                     split_name(split_), low_->path(), indices_.size(), size(), num_epochs_,
                     separate_final_epoch_ ? " (final epoch shuffled separately)" : "");
}

void GPTDataset::get_text(int64_t index, std::vector<int64_t>& out) const {
  MCPP_CHECK(index >= 0 && index < size(), "sample {} out of range [0, {}) of {}", index, size(),
             describe());
  built();
  const int64_t S = cfg_.sequence_length, X = cfg_.add_extra_token;
  const int64_t j = shuffle_index_[size_t(index)];
  const int64_t doc_beg = sample_index_[2 * j], off_beg = sample_index_[2 * j + 1];
  const int64_t doc_end = sample_index_[2 * j + 2], off_end = sample_index_[2 * j + 3];
  out.resize(size_t(S + X));
  int64_t n = 0;
  auto room = [&](int64_t want) {
    MCPP_CHECK(n + want <= S + X, "sample {} spans more than {} tokens", index, S + X);
  };
  if (doc_beg == doc_end) {
    room(off_end - off_beg + X);
    n += low_->read(document_index_[doc_beg], off_beg, off_end - off_beg + X, out.data());
  } else {
    for (int64_t i = doc_beg; i <= doc_end; ++i) {
      const int32_t seq = document_index_[i];
      const int64_t offset = i > doc_beg ? 0 : off_beg;
      const int64_t length = i < doc_end ? low_->sequence_length(seq) - offset : off_end + X;
      room(length);
      n += low_->read(seq, offset, length, out.data() + n);
    }
  }
  if (cfg_.fim) {  // Megatron's GPTFIMDataset: the tokens read, per sample index
    NumpyFimDraws draws(cfg_.seed, int(split_), index);
    fim_transform(std::span<int64_t>(out.data(), size_t(n)), *cfg_.fim, draws);
  }
  for (; n < S + X; ++n) out[n] = cfg_.pad;  // validation's last partial sample only
}

void make_gpt_sample(const std::vector<int64_t>& text, const GPTDatasetConfig& cfg,
                     GPTSample& out) {
  const int64_t S = cfg.sequence_length;
  out.tokens.resize(S), out.labels.resize(S), out.loss_mask.resize(S), out.position_ids.resize(S);
  if (cfg.add_extra_token) {
    std::copy(text.begin(), text.begin() + S, out.tokens.begin());
    std::copy(text.begin() + 1, text.begin() + S + 1, out.labels.begin());
  } else {
    std::copy(text.begin(), text.begin() + S, out.tokens.begin());
    std::copy(text.begin() + 1, text.begin() + S, out.labels.begin());
    out.labels[S - 1] = cfg.pad;
  }
  int64_t pos_base = 0, doc = 0;
  out.doc_start.resize(cfg.reset_attention_mask ? size_t(S) : 0);
  for (int64_t i = 0; i < S; ++i) {
    const bool eod = out.tokens[i] == cfg.eod;
    out.loss_mask[i] = (cfg.eod_mask_loss && eod) ? 0.f : 1.f;
    out.position_ids[i] = i - pos_base;
    if (cfg.reset_position_ids && eod) pos_base = i + 1;
    if (cfg.reset_attention_mask) out.doc_start[size_t(i)] = doc;
    if (eod) doc = i + 1;  // the EOD itself still belongs to its document
  }
  for (int64_t i = 0; i < S; ++i) {
    if (out.labels[i] == cfg.pad) out.loss_mask[i] = 0.f, out.labels[i] = 0;
    if (out.tokens[i] == cfg.pad) out.tokens[i] = 0;
  }
}

void GPTDataset::get(int64_t index, GPTSample& out) const {
  thread_local std::vector<int64_t> text;
  get_text(index, text);
  make_gpt_sample(text, cfg_, out);
}

// ---- split ------------------------------------------------------------------------

std::vector<double> parse_split(const std::string& split) {
  // Megatron reads the runs of digits and dots (re.findall("[.0-9]+")); that turns "1e400"
  // into 1 and 400 and "abc" or "nan" into nothing. Here every word between separators must
  // be such a number, so the error names the word that is not one.
  std::vector<double> v;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    const bool plain = std::all_of(word.begin(), word.end(),
                                   [](char c) { return (c >= '0' && c <= '9') || c == '.'; }) &&
                       std::count(word.begin(), word.end(), '.') <= 1 && word != ".";
    char* end = nullptr;
    const double x = plain ? std::strtod(word.c_str(), &end) : 0.0;
    if (!plain || end != word.c_str() + word.size() || !std::isfinite(x))
      throw Error(
          fmt::format("--split '{}': '{}' is not a non-negative decimal number", split, word),
          "give three weights, e.g. --split 969,30,1");
    v.push_back(x);
    word.clear();
  };
  for (char c : split) {
    if (c == ',' || c == '/' || c == ':' || c == ';' || std::isspace(static_cast<unsigned char>(c)))
      flush();
    else
      word += c;
  }
  flush();
  if (v.size() > 3)
    throw Error(fmt::format("--split '{}' has {} numbers, expected at most 3", split, v.size()),
                "give train,valid,test weights, e.g. --split 969,30,1");
  v.resize(3, 0.0);
  const double sum = v[0] + v[1] + v[2];
  if (!(sum > 0))
    throw Error(fmt::format("--split '{}' sums to zero", split), "e.g. --split 969,30,1");
  for (auto& x : v) x /= sum;
  return v;
}

std::vector<std::optional<std::pair<double, double>>> split_matrix(
    const std::vector<double>& split) {
  std::vector<std::optional<std::pair<double, double>>> m;
  double lo = 0.0;
  for (double w : split) {
    double hi = lo + w;
    if (hi <= lo)
      m.push_back(std::nullopt);
    else
      m.push_back(std::make_pair(lo, hi));
    lo = hi;
  }
  return m;
}

int64_t python_round(double x) { return int64_t(std::nearbyint(x)); }

}  // namespace mcpp::data
