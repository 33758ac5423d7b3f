// Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py + helpers.cpp): the
// document, sample and shuffle indices that turn a tokenised corpus into a fixed
// sequence of training samples, built exactly as Megatron builds them so that sample
// i here is Megatron's sample i for the same files, split, sequence length and seed.
//
// The trainer only needs GPTSampleSource (below): size() and get(i) -> GPTSample.
// GPTDataset and BlendedDataset (blended_dataset.h) implement it; the builder in
// dataset_builder.h makes the three split datasets from Megatron-style arguments.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "data/fim.h"
#include "data/indexed_dataset.h"

namespace mcpp::data {

// One training sample of S = sequence_length tokens, as Megatron's GPTDataset
// __getitem__ returns it (pad ids already replaced by 0 in tokens and labels; the
// attention mask is the plain causal one and is not materialised).
struct GPTSample {
  std::vector<int64_t> tokens;        // [S] input ids
  std::vector<int64_t> labels;        // [S] target ids (tokens shifted by one)
  std::vector<float> loss_mask;       // [S] 1 = counts in the loss
  std::vector<int64_t> position_ids;  // [S] 0..S-1, or reset after each EOD
  // [S] with --reset-attention-mask: the first position of each token's document (one past
  // the last EOD before it; Megatron's attention_mask[(i+1):, :(i+1)] = 0 per EOD at i).
  std::vector<int64_t> doc_start;
};

// What the trainer reads. Thread-safe: get() may be called from several threads.
class GPTSampleSource {
 public:
  virtual ~GPTSampleSource() = default;
  virtual int64_t size() const = 0;                           // number of samples
  virtual void get(int64_t index, GPTSample& out) const = 0;  // 0 <= index < size()
  // The raw S + X token window of sample `index` (before shifting and masking).
  virtual void get_text(int64_t index, std::vector<int64_t>& out) const = 0;
  virtual std::string describe() const = 0;  // one line for logs
};

enum class Split : int { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);  // "train", "valid", "test"

// The token store under a GPTDataset: an IndexedDataset or the mock one.
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  virtual int64_t num_sequences() const = 0;
  virtual int32_t sequence_length(int64_t seq) const = 0;
  // `length` ids of sequence `seq` from `offset` into out; returns length.
  virtual int64_t read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const = 0;
  virtual std::string path() const = 0;
};

// Wraps a memory-mapped Megatron .bin/.idx pair.
class IndexedLowLevelDataset final : public LowLevelDataset {
 public:
  explicit IndexedLowLevelDataset(const std::string& prefix, bool mmap_bin = true)
      : ds_(prefix, /*multimodal=*/false, mmap_bin) {}
  int64_t num_sequences() const override { return ds_.num_sequences(); }
  int32_t sequence_length(int64_t seq) const override { return ds_.sequence_lengths()[seq]; }
  int64_t read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const override {
    return ds_.get(seq, offset, length, out);
  }
  std::string path() const override { return ds_.prefix(); }
  const IndexedDataset& indexed() const { return ds_; }

 private:
  IndexedDataset ds_;
};

// MockGPTLowLevelDataset: 100,000 sequences with lengths
// numpy.random.default_rng(0).integers(1, 4096, dtype=int32); sequence i holds
// (1, 2, ..., len-1) % vocab_size followed by EOD.
class MockGPTLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr int64_t kSize = 100000;
  MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod);
  int64_t num_sequences() const override { return kSize; }
  int32_t sequence_length(int64_t seq) const override { return lengths_[seq]; }
  int64_t read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const override;
  std::string path() const override { return "mock"; }

 private:
  std::vector<int32_t> lengths_;
  int64_t vocab_size_, eod_;
};

struct GPTDatasetConfig {
  int64_t sequence_length = 0;        // S (--seq-length)
  uint32_t seed = 1234;               // --seed
  int add_extra_token = 1;            // X: add_extra_token_to_sequence (always 1 in pretrain_gpt)
  bool reset_position_ids = false;    // --reset-position-ids
  bool reset_attention_mask = false;  // --reset-attention-mask (GPTSample::doc_start)
  bool eod_mask_loss = false;         // --eod-mask-loss
  bool drop_last_partial_validation_sequence = true;
  int64_t eod = 0;            // tokenizer.eod
  int64_t pad = -1;           // tokenizer.pad, or -1 (Megatron's _PAD_TOKEN_ID)
  bool mock = false;          // MockGPTDataset semantics (len = num_samples)
  std::string path_to_cache;  // --data-cache-path ("" = no cache); see index_cache.h
  std::string split_spec;     // --split as given (part of the cache description)
  // --fim-data: each sample's S + X tokens go through fim_transform (fim.h) before the
  // masks are made, drawn by sample index (the indices and their cache are unchanged).
  std::shared_ptr<const FimConfig> fim;
};

// An index of non-negative integers held in 4-byte elements while its values fit
// (Megatron's int32 sample index and uint32 shuffle index), else in 8-byte ones: half the
// memory, and half the pages to fault in, for every corpus below 2^31 documents / 2^32 - 1
// samples.
template <typename Narrow>
class CompactIndex {
 public:
  CompactIndex() = default;
  explicit CompactIndex(std::vector<Narrow> v) : narrow_(std::move(v)) {}
  explicit CompactIndex(std::vector<int64_t> v) : wide_(std::move(v)) {}
  int64_t operator[](size_t i) const { return wide_.empty() ? int64_t(narrow_[i]) : wide_[i]; }
  size_t size() const { return wide_.empty() ? narrow_.size() : wide_.size(); }
  bool is_narrow() const { return wide_.empty(); }
  const std::vector<Narrow>& narrow() const { return narrow_; }
  const std::vector<int64_t>& wide() const { return wide_; }
  std::vector<int64_t> to_vector() const {
    return is_narrow() ? std::vector<int64_t>(narrow_.begin(), narrow_.end()) : wide_;
  }

 private:
  std::vector<Narrow> narrow_;
  std::vector<int64_t> wide_;
};

class GPTDataset final : public GPTSampleSource {
 public:
  // indices: the split's sequence ids (contiguous range from the split book-ends).
  // num_samples: requested samples; nullopt = one epoch.
  GPTDataset(std::shared_ptr<const LowLevelDataset> low, std::vector<int32_t> indices,
             std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config);

  int64_t size() const override;
  void get(int64_t index, GPTSample& out) const override;
  void get_text(int64_t index, std::vector<int64_t>& out) const override;
  std::string describe() const override;

  // The indices, for tests and `megatron inspect` (built on first use, see below).
  const std::vector<int32_t>& document_index() const { return built().document_index_; }
  // Copies, widened to int64 (held as 4-byte elements where they fit: CompactIndex).
  std::vector<int64_t> sample_index() const { return built().sample_index_.to_vector(); }  // [(n+1)*2]
  std::vector<int64_t> shuffle_index() const { return built().shuffle_index_.to_vector(); }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  int64_t num_sequences_in_split() const { return int64_t(indices_.size()); }

 private:
  std::shared_ptr<const LowLevelDataset> low_;
  std::vector<int32_t> indices_;
  std::optional<int64_t> num_samples_;
  Split split_;
  GPTDatasetConfig cfg_;
  int64_t num_epochs_ = 1;
  bool separate_final_epoch_ = false;
  int64_t tokens_per_epoch_ = 0;
  int64_t samples_sans_final_ = 0;
  int64_t total_samples_ = 0;  // samples the indices cover (Megatron's len() when not mock)
  // The three indices are built (or loaded from --data-cache-path) on first use, once, by
  // whichever thread asks first: a split this run never reads (validation in a run that
  // stops before --eval-interval, a middle pipeline stage) costs nothing. Mock data covers
  // ~68M tokens a split, so building all three eagerly took ~1.5 s of every process start.
  // With --data-cache-path they are built in the constructor, so that rank 0 writes the
  // cache before the other ranks look for it (trainer_setup.cpp).
  mutable std::once_flag built_once_;
  mutable std::vector<int32_t> document_index_;
  mutable CompactIndex<int32_t> sample_index_;
  mutable CompactIndex<uint32_t> shuffle_index_;
  mutable bool loaded_from_cache_ = false;
  mutable std::atomic<bool> indices_built_{false};
  const GPTDataset& built() const;
  bool drops_last_partial() const;
  void build_indices() const;

 public:
  bool loaded_from_cache() const { return built().loaded_from_cache_; }
  // Whether the indices exist yet (they are built on first use); for tests.
  bool indices_built() const { return indices_built_.load(); }
  // The JSON that identifies these indices (Megatron's unique_description, our fields).
  std::string description() const;

 private:
  bool load_cache() const;
  void save_cache() const;
};

// How many samples of seq_length (+ add_extra_token) tokens `tokens` tokens make: whole
// samples only, or with drop_last_partial false one more partial one (helpers.cpp's count).
int64_t sample_count(int64_t tokens, int64_t seq_length, int64_t add_extra_token,
                     bool drop_last_partial);

// helpers.cpp build_sample_idx: rows (position in document_index, offset), flattened;
// int32 elements while the document index has fewer than 2^31 entries (offsets are int32
// sequence lengths), as Megatron's helper builds it.
CompactIndex<int32_t> build_sample_index(const LowLevelDataset& low,
                                        const std::vector<int32_t>& document_index,
                                        int64_t seq_length, int64_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial,
                                        int add_extra_token);

// Masks and position ids of Megatron's _get_ltor_masks_and_position_ids, then the
// pad handling of GPTDataset.__getitem__. text has S + X ids.
void make_gpt_sample(const std::vector<int64_t>& text, const GPTDatasetConfig& cfg, GPTSample& out);

// ---- split ------------------------------------------------------------------------

// parse_and_normalize_split: numbers found by [.0-9]+, padded to 3, normalised.
std::vector<double> parse_split(const std::string& split);
// convert_split_vector_to_split_matrix: book-ends per split, nullopt when zero-width.
std::vector<std::optional<std::pair<double, double>>> split_matrix(
    const std::vector<double>& split);
// Python's round() of lo*n (half to even), as Megatron computes split starts/ends.
int64_t python_round(double x);

}  // namespace mcpp::data
