#include "checkpoint/megatron/torch_zip.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace mcpp::checkpoint::megatron {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MCPP_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MCPP_FAIL("{} is not a regular file", path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      MCPP_FAIL("cannot map {}: {}", path, std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

uint64_t rd(std::span<const uint8_t> b, uint64_t at, int n) {  // little-endian, bounds checked
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[at + uint64_t(i)];
  return v;
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> d, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (uint8_t x : d) c = table[(c ^ x) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace {

constexpr uint32_t kEocd = 0x06054b50, kEocd64 = 0x06064b50, kLoc64 = 0x07064b50,
                   kCentral = 0x02014b50, kLocal = 0x04034b50;

}  // namespace

ZipArchive::ZipArchive(std::span<const uint8_t> b, std::string what) : what_(std::move(what)) {
  const uint64_t n = b.size();
  const std::string hint =
      "the file is truncated or corrupt: copy it again from where the checkpoint was written";
  MCPP_CHECK_HINT(n >= 22, hint, "{}: {} bytes is too short for a zip archive (torch.save file)",
                  what_, n);
  // The end-of-central-directory record sits in the last 22 + 65535 (comment) bytes.
  uint64_t eocd = n;
  for (uint64_t p = n - 22 + 1; p-- > 0 && n - p <= 22 + 65535;)
    if (rd(b, p, 4) == kEocd) {
      eocd = p;
      break;
    }
  MCPP_CHECK_HINT(eocd < n, hint,
                  "{}: no zip end-of-central-directory record (not a torch.save zip file, or "
                  "truncated)",
                  what_);
  uint64_t count = rd(b, eocd + 10, 2), cd_size = rd(b, eocd + 12, 4), cd_off = rd(b, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {  // ZIP64
    MCPP_CHECK_HINT(eocd >= 20 && rd(b, eocd - 20, 4) == kLoc64, hint,
                    "{}: the zip needs ZIP64 records but has no ZIP64 locator", what_);
    const uint64_t z = rd(b, eocd - 20 + 8, 8);
    MCPP_CHECK_HINT(z < eocd && eocd - z >= 76 && rd(b, z, 4) == kEocd64, hint,
                    "{}: the ZIP64 end-of-central-directory record at {} is outside the file or "
                    "damaged",
                    what_, z);
    count = rd(b, z + 32, 8), cd_size = rd(b, z + 40, 8), cd_off = rd(b, z + 48, 8);
  }
  MCPP_CHECK_HINT(cd_off <= n && cd_size <= n - cd_off && count <= cd_size / 46, hint,
                  "{}: central directory (offset {}, {} bytes, {} entries) does not fit in the "
                  "{}-byte archive",
                  what_, cd_off, cd_size, count, n);
  uint64_t p = cd_off;
  const uint64_t cd_end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    MCPP_CHECK_HINT(p + 46 <= cd_end && rd(b, p, 4) == kCentral, hint,
                    "{}: central directory entry {} is damaged", what_, i);
    const uint64_t flags = rd(b, p + 8, 2), method = rd(b, p + 10, 2);
    const uint32_t crc = uint32_t(rd(b, p + 16, 4));
    uint64_t csize = rd(b, p + 20, 4), usize = rd(b, p + 24, 4);
    const uint64_t nlen = rd(b, p + 28, 2), xlen = rd(b, p + 30, 2), clen = rd(b, p + 32, 2);
    uint64_t local = rd(b, p + 42, 4);
    MCPP_CHECK_HINT(p + 46 + nlen + xlen + clen <= cd_end, hint,
                    "{}: central directory entry {} runs past the directory", what_, i);
    const std::string name(reinterpret_cast<const char*>(&b[p + 46]), nlen);
    // ZIP64 extended information: the 64-bit values of the fields saturated at 0xFFFFFFFF.
    for (uint64_t x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) {
      const uint64_t id = rd(b, x, 2), len = rd(b, x + 2, 2);
      MCPP_CHECK_HINT(x + 4 + len <= p + 46 + nlen + xlen, hint,
                      "{}: extra field of entry '{}' runs past its record", what_, name);
      if (id == 1) {
        uint64_t q = x + 4;
        auto take = [&](uint64_t& v) {
          if (v != 0xFFFFFFFF) return;
          MCPP_CHECK_HINT(q + 8 <= x + 4 + len, hint, "{}: ZIP64 field of '{}' is short", what_,
                          name);
          v = rd(b, q, 8);
          q += 8;
        };
        take(usize), take(csize), take(local);
      }
      x += 4 + len;
    }
    MCPP_CHECK_HINT(!(flags & 1), "decrypt it first", "{}: entry '{}' is encrypted", what_, name);
    MCPP_CHECK_HINT(method == 0,
                    "torch.save writes entries uncompressed; re-save the file with torch.save",
                    "{}: entry '{}' is compressed (zip method {}); only stored entries are read",
                    what_, name, method);
    MCPP_CHECK_HINT(csize == usize, hint, "{}: entry '{}' is stored but its sizes differ ({} vs {})",
                    what_, name, csize, usize);
    MCPP_CHECK_HINT(local <= n && n - local >= 30 && rd(b, local, 4) == kLocal, hint,
                    "{}: local header of '{}' at {} is outside the file or damaged", what_, name,
                    local);
    const uint64_t data = local + 30 + rd(b, local + 26, 2) + rd(b, local + 28, 2);
    MCPP_CHECK_HINT(data <= n && csize <= n - data, hint,
                    "{}: entry '{}' ({} bytes at {}) runs past the end of the {}-byte archive",
                    what_, name, csize, data, n);
    auto bytes = b.subspan(data, csize);
    MCPP_CHECK_HINT(crc32(bytes) == crc, hint, "{}: entry '{}' fails its CRC-32 check", what_,
                    name);
    entries_[name] = bytes;
    p += 46 + nlen + xlen + clen;
  }
}

std::span<const uint8_t> ZipArchive::entry(const std::string& name) const {
  auto it = entries_.find(name);
  MCPP_CHECK(it != entries_.end(), "{}: the zip archive has no entry '{}'", what_, name);
  return it->second;
}

}  // namespace mcpp::checkpoint::megatron
