// Durable file-system steps of the checkpoint writer, and the shard checksum.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mcpp::checkpoint {

// a / b as std::filesystem joins them.
std::string join_path(const std::string& a, const std::string& b);
// Writes bytes to path + ".tmp-<pid>", fsyncs, renames over path and fsyncs the directory:
// readers see the old file or the new one, never a part.
void write_file_durable(const std::string& path, const std::string& bytes);
// fsync of a directory, so that the renames and creations inside it survive a crash.
void fsync_dir(const std::string& dir);
// The whole of a regular file (after symlinks) of at most max_bytes: a FIFO, a device such
// as /dev/zero, a directory or an oversized file is an Error naming the path, never an
// unbounded or blocking read.
inline constexpr size_t kMaxTextFile = size_t(256) << 20;  // metadata.json of huge models
std::string read_text_file(const std::string& path, size_t max_bytes = kMaxTextFile);
// Progress lines: the bytes of the regular files under `path` (0 when it does not exist),
// and "1.23 GB in 0.456 s (2.70 GB/s)".
uint64_t tree_bytes(const std::string& path);
std::string size_and_rate(uint64_t bytes, double seconds);

// base/hash.h's hash64: "xxh3-64" when built with xxHash, else "fnv1a-64".
const char* checksum_algorithm();
std::string checksum_hex(const void* data, size_t n);  // 16 lower-case hex digits

}  // namespace mcpp::checkpoint
