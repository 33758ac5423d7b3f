// The readers shared by loading (load.cpp) and finding / describing checkpoints (find.cpp):
// where a checkpoint's iteration folder is, its metadata.json parsed and checked, and the
// shard files read tensor by tensor with their sizes and checksums verified. Internal to
// checkpoint/ (checkpoint.h is the API).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

// "4, 8, 12", or "none".
std::string iterations_str(const std::vector<int64_t>& its);
// A shard's piece from its metadata entry (offsets, shape, local_offsets); malformed: an Error.
Piece piece_from_json(const json& j);
// The iteration folder of `dir` (a checkpoint root: the tracker's or `iteration`'s; or an
// iter_* folder itself). A Megatron-LM folder is an Error whose HINT converts it.
std::string resolve_iter_dir(const std::string& dir, std::optional<int64_t> iteration);
// metadata.json of an iteration folder, every field the readers index checked; "__iter_dir"
// added (never saved).
json parse_metadata(const std::string& iter_dir);

// Lazily opened shard files whose tensors are read on demand (only the bytes a rank
// needs); each shard's checksum verified when it is read.
class ShardReader {
 public:
  ShardReader(std::string dir, const json& md, bool verify)
      : dir_(std::move(dir)), md_(md), verify_(verify) {}

  const Tensor& shard(const std::string& key, const json& sh) {
    const std::string file = sh.at("file"), name = sh.at("name");
    const std::string path = join_path(dir_, file);
    auto it = files_.find(file);
    if (it == files_.end()) {
      MCPP_CHECK(std::filesystem::exists(path), "shard file {} (tensor {}) is missing", path, key);
      if (md_.at("files").contains(file)) {
        const uint64_t want = md_["files"][file].at("bytes");
        const uint64_t got = std::filesystem::file_size(path);
        MCPP_CHECK(want == got,
                   "shard file {} has {} bytes, the metadata says {} (truncated or "
                   "overwritten); tensor {}",
                   path, got, want, key);
      }
      it = files_.emplace(file, std::make_unique<SafetensorsReader>(path)).first;
    }
    const std::string id = file + "\n" + name;
    if (auto c = cache_.find(id); c != cache_.end()) return c->second;
    MCPP_CHECK(it->second->contains(name), "shard file {} lacks tensor {}", path, name);
    Tensor x = it->second->read(name);
    MCPP_CHECK(x.shape() == sh.at("shape").get<Shape>(),
               "tensor {} in {} has shape {}, the metadata says {}", name, path,
               shape_str(x.shape()), sh.at("shape").dump());
    if (verify_) {
      const std::string want = sh.at("checksum"), got = checksum_hex(x.raw(), x.nbytes());
      MCPP_CHECK(want == got,
                 "checksum mismatch for tensor {} in {}: stored {}, computed {} "
                 "({}); the file is corrupt",
                 name, path, want, got, checksum_algorithm());
    }
    return cache_.emplace(id, std::move(x)).first->second;
  }
  // Forgets the tensors read so far (each stored tensor belongs to one key: a loader
  // releases them once that key is loaded, so memory holds one tensor's shards at a time).
  void release() { cache_.clear(); }
  uint64_t bytes_read() const {
    uint64_t n = 0;
    for (const auto& [f, r] : files_) n += r->bytes_read();
    return n;
  }

 private:
  std::string dir_;
  const json& md_;
  bool verify_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Tensor> cache_;
};

}  // namespace mcpp::checkpoint
