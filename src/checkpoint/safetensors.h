// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
// then raw little-endian tensor data. Loading executes no code (unlike pickle).
#pragma once
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

}  // namespace mcpp::checkpoint
