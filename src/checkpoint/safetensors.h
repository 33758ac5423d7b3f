// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
// then raw little-endian tensor data. Loading executes no code (unlike pickle).
#pragma once
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mcpp::checkpoint {

std::string safetensors_dtype(DType t);        // "F32", "BF16", ...
DType dtype_from_safetensors(const std::string& s, const std::string& file);

// Writes tensors (CPU) in name order with optional string metadata. Writes to
// path + ".tmp", fsyncs, and renames, so a crash never leaves a half file at path.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  const Tensor& at(const std::string& name) const;
};

// Reads and validates a whole file (header JSON, dtypes, shapes, offsets within
// the file, no overlaps); any inconsistency is an mcpp::Error naming the file.
SafetensorsFile load_safetensors(const std::string& path);

// A file whose header is read and validated as load_safetensors does (at construction),
// and whose tensors are read one by one on demand: a loader that needs a few of a file's
// tensors reads only their bytes (the checkpoint loader; --ckpt-fully-parallel-load).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const;
  // Reads the tensor's bytes from the file now (an error when it has no such tensor).
  Tensor read(const std::string& name);
  uint64_t bytes_read() const { return bytes_read_; }  // tensor data read so far
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // in the data section
  };
  std::string path_;
  std::ifstream in_;
  uint64_t data_start_ = 0, bytes_read_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mcpp::checkpoint
