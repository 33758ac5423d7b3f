// --data-cache-path: the GPTDataset and BlendedDataset index arrays on disk, as Megatron
// caches them: in the cache folder, per dataset and split,
//   {hash}-GPTDataset-{split}-description.txt       the JSON that identifies the indices
//   {hash}-GPTDataset-{split}-document_index.npy    int32 [E*N]
//   {hash}-GPTDataset-{split}-sample_index.npy      int32 or int64 [n+1, 2]
//   {hash}-GPTDataset-{split}-shuffle_index.npy     uint32 or int64 [n]
//   {hash}-BlendedDataset-{split}-{description.txt, dataset_index.npy (int16),
//                                  dataset_sample_index.npy (int64)}
// {hash} is a hash of the description. Megatron's is the md5 of its own description
// (which names the tokenizer object), so names differ from Megatron's and a Megatron
// cache folder is not reused; the .npy files are ordinary numpy arrays either way.
// The .npy files are written through temporary names and the description last, so a
// crash never leaves a set that looks complete. A set whose description differs, whose
// headers are not the expected dtype/shape, or whose values are out of range is
// rebuilt with a warning.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcpp::data {

// A numpy array read from disk: dtype string ("<i4", "<i8", "<u4", "<i2"), shape, bytes.
struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;
  int64_t numel() const;
  // Elements converted to int64; empty optional when the dtype is not an integer one
  // this reader knows.
  std::optional<std::vector<int64_t>> as_int64() const;
};

// Writes a C-order array (npy format 1.0), atomically (temporary file + rename).
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t bytes);
// Reads and validates an .npy file; nullopt (with `why` set) when it is not one.
std::optional<NpyArray> read_npy(const std::string& path, std::string* why = nullptr);

// A 128-bit FNV-1a hash of the description, 32 hex digits.
std::string description_hash(const std::string& description);

// The cache file set of one dataset split.
struct CacheFiles {
  std::string dir, stem;  // stem: {hash}-{class}-{split}
  std::string path(const std::string& suffix) const { return dir + "/" + stem + "-" + suffix; }
};
CacheFiles cache_files(const std::string& dir, const std::string& description,
                       const std::string& cls, const std::string& split);
// True when the description file exists and equals `description` byte for byte.
bool cache_description_matches(const CacheFiles& f, const std::string& description);
// Writes the description (last, atomically), creating the folder if needed.
void write_cache_description(const CacheFiles& f, const std::string& description);

}  // namespace mcpp::data
