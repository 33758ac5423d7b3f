// Megatron's "MMIDIDX" indexed dataset: `{prefix}.bin` holds every token id of every
// sequence back to back (no header); `{prefix}.idx` holds, little-endian:
//
//   magic "MMIDIDX\0\0" (9) | u64 version = 1 | u8 dtype code | u64 N (sequences)
//   | u64 D (document boundaries = documents + 1) | i32[N] sequence lengths
//   | i64[N] byte offsets of the sequences in .bin | i64[D] document boundaries
//   (sequence indices, 0 .. N) | [i8[N] sequence modes, multimodal only]
//
// The reader memory-maps both files and validates every field before it trusts
// one; a bad file is an mcpp::Error naming the file and the field. The builder
// writes byte-identical files to Megatron's IndexedDatasetBuilder for the same
// token ids, under temporary names renamed into place by finalize(), so an
// interrupted run never leaves a valid-looking .idx behind.
#pragma once
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace mcpp::data {

// Megatron's DType enum codes.
enum class IndexDType : uint8_t {
  U8 = 1,
  I8 = 2,
  I16 = 3,
  I32 = 4,
  I64 = 5,
  F64 = 6,
  F32 = 7,
  U16 = 8
};
bool index_dtype_valid(uint8_t code);
int64_t index_dtype_size(IndexDType t);
const char* index_dtype_name(IndexDType t);
// DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
IndexDType optimal_index_dtype(int64_t vocab_size);

// Appends the ids as `dtype` values (the bytes of a .bin) to out. An id the dtype cannot
// hold is an Error naming `dataset`: the tokenizer's vocabulary does not fit the dtype.
void append_as_dtype(IndexDType dtype, std::span<const int32_t> ids, std::vector<uint8_t>& out,
                     const std::string& dataset);
void append_as_dtype(IndexDType dtype, std::span<const int64_t> ids, std::vector<uint8_t>& out,
                     const std::string& dataset);

std::string idx_path(const std::string& prefix);  // prefix + ".idx"
std::string bin_path(const std::string& prefix);  // prefix + ".bin"

// Memory-mapped reader. Thread-safe for concurrent get() calls. mmap_bin = false
// (--no-mmap-bin-files, Megatron's _FileBinReader): the .idx is still mapped, the .bin is
// read with pread() at each get(), for file systems where mapping large files is slow or
// not allowed.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix, bool multimodal = false,
                          bool mmap_bin = true);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return n_; }
  int64_t num_documents() const { return d_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  std::span<const int32_t> sequence_lengths() const { return {lengths_, size_t(n_)}; }
  std::span<const int64_t> sequence_pointers() const { return {pointers_, size_t(n_)}; }
  std::span<const int64_t> document_indices() const { return {docs_, size_t(d_)}; }
  std::span<const int8_t> sequence_modes() const { return {modes_, modes_ ? size_t(n_) : 0}; }

  // Megatron's get(idx, offset, length): `length` items of sequence `seq` starting
  // at item `offset` (length < 0: to the end), converted to int64, written to out.
  // Returns the number of items written.
  int64_t get(int64_t seq, int64_t offset, int64_t length, int64_t* out) const;
  std::vector<int64_t> get(int64_t seq, int64_t offset = 0, int64_t length = -1) const;

  // The largest token id in the dataset, from one pass over the .bin (computed once, then
  // cached): -1 when empty. Negative, fractional or NaN values are an Error naming the file.
  int64_t max_token_id() const;
  // An Error naming the .bin when an id is >= vocab_size (the model's padded vocabulary):
  // such ids would otherwise read past the embedding or train on a zero row. max_id: a
  // largest id known from a cache (else max_token_id()).
  void check_vocabulary(int64_t vocab_size, std::optional<int64_t> max_id = std::nullopt) const;

 private:
  std::string prefix_;
  IndexDType dtype_ = IndexDType::U16;
  int64_t n_ = 0, d_ = 0, num_tokens_ = 0, itemsize_ = 2;
  const int32_t* lengths_ = nullptr;
  const int64_t* pointers_ = nullptr;
  const int64_t* docs_ = nullptr;
  const int8_t* modes_ = nullptr;
  const uint8_t* bin_ = nullptr;
  void* idx_map_ = nullptr;
  size_t idx_bytes_ = 0;
  void* bin_map_ = nullptr;
  size_t bin_bytes_ = 0;
  int bin_fd_ = -1;  // open .bin when it is not mapped
  // nbytes of .bin at byte `offset`: a pointer into the mapping, or read into buf.
  const uint8_t* bin_bytes_at(int64_t offset, int64_t nbytes, std::vector<uint8_t>& buf) const;
  mutable std::once_flag max_once_;
  mutable int64_t max_id_ = -1;
};

// Writes `{prefix}.bin` and `{prefix}.idx` as Megatron's IndexedDatasetBuilder does.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, IndexDType dtype);
  ~IndexedDatasetBuilder();  // not finalized: removes the temporary files
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // One sequence. Ids must fit the dtype (an id that does not is an error: the
  // tokenizer's vocabulary does not match the dtype).
  void add_item(std::span<const int32_t> tokens);
  void add_item(std::span<const int64_t> tokens);
  // Closes the current document (Megatron: document_indices.append(len(lengths))).
  void end_document();
  // Several sequences (lengths sum to tokens.size()) appended as one document.
  void add_document(std::span<const int32_t> tokens, std::span<const int64_t> lengths);
  // Many documents whose tokens are already in the dataset's dtype (append_as_dtype):
  // document d has doc_nseq[d] sequences, of lengths[...] tokens, back to back in
  // token_bytes. Lets preprocess workers convert in parallel and the writer only copy.
  void add_documents(std::span<const uint8_t> token_bytes, std::span<const int32_t> lengths,
                     std::span<const int32_t> doc_nseq);
  // Appends another dataset of the same dtype (Megatron's add_index / merge_datasets).
  void add_index(const std::string& prefix);
  // Writes the index and moves both files into place (.bin first, .idx last).
  // A document left open by add_item is closed first.
  void finalize();

  int64_t num_sequences() const { return int64_t(lengths_.size()); }
  int64_t bytes_written() const { return bin_bytes_; }

 private:
  template <typename T>
  void write_tokens(std::span<const T> tokens);
  void write_raw(const void* p, size_t bytes);

  std::string prefix_, bin_tmp_, idx_tmp_;
  IndexDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> docs_{0};
  std::vector<uint8_t> scratch_;
  int64_t bin_bytes_ = 0;
  int64_t writeback_from_ = 0;  // .bin bytes before this offset were handed to the kernel
  bool finalized_ = false;
};

}  // namespace mcpp::data
