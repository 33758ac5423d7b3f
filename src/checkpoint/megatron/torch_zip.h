// Reading the zip container of torch.save (PyTorch >= 1.6's default): entries
// `<archive>/data.pkl`, `<archive>/data/<key>` (tensor storages), `<archive>/byteorder`,
// `<archive>/version`. PyTorch writes every entry *stored* (uncompressed) and switches to
// ZIP64 records for large archives; this reader accepts exactly that: stored entries, with or
// without ZIP64, and refuses compressed or encrypted ones by name. It trusts nothing: every
// offset and size is checked against the bytes it was given before it is used, so a
// truncated or corrupt file is an mcpp::Error naming the file and the record, never a crash.
//
// A zip may also sit inside a larger file (torch.distributed.checkpoint writes one torch.save
// archive per tensor into its .distcp files): ZipArchive reads any byte span.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace mcpp::checkpoint::megatron {

// A read-only memory map of a whole regular file (errors name the file).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// CRC-32 (zip's, zlib's) of d, continuing from the CRC of the bytes before it (0: none).
uint32_t crc32(std::span<const uint8_t> d, uint32_t crc = 0);

class ZipArchive {
 public:
  // `what` names the archive in errors (a file, or "file[offset..end)").
  ZipArchive(std::span<const uint8_t> bytes, std::string what);
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // The stored bytes of an entry (an error naming the entry when absent).
  std::span<const uint8_t> entry(const std::string& name) const;
  const std::map<std::string, std::span<const uint8_t>>& entries() const { return entries_; }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  std::map<std::string, std::span<const uint8_t>> entries_;
};

}  // namespace mcpp::checkpoint::megatron
