#include "checkpoint/fs.h"

#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "base/error.h"
#include "base/hash.h"

namespace mcpp::checkpoint {

std::string join_path(const std::string& a, const std::string& b) {
  return (std::filesystem::path(a) / b).string();
}

void write_file_durable(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MCPP_CHECK_HINT(fd >= 0, "check that the directory exists and is writable",
                  "cannot create {}: {}", tmp, std::strerror(errno));
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      MCPP_FAIL("writing {} failed: {}", tmp, std::strerror(e));
    }
    p += w, n -= size_t(w);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    MCPP_FAIL("fsync {} failed: {}", tmp, std::strerror(e));
  }
  ::close(fd);
  MCPP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rename {} -> {} failed: {}", tmp, path,
             std::strerror(errno));
  const auto slash = path.find_last_of('/');
  fsync_dir(slash == std::string::npos ? "." : path.substr(0, slash));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  MCPP_CHECK(fd >= 0, "cannot open directory {} to fsync it: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  // Some file systems (and /proc-like mounts) refuse fsync on directories: not an error.
  MCPP_CHECK(rc == 0 || e == EINVAL || e == EROFS, "fsync of directory {} failed: {}", dir,
             std::strerror(e));
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked on the open
  // descriptor, so a file swapped after a stat() cannot slip through.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  MCPP_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    MCPP_FAIL("{} is {}, not a regular file", path,
              dir ? "a directory" : "a device, FIFO or socket");
  }
  if (size_t(st.st_size) > max_bytes) {
    ::close(fd);
    MCPP_FAIL("{} has {} bytes, more than the {} this reader accepts (corrupt or not the "
              "expected file)",
              path, st.st_size, max_bytes);
  }
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // shrank while reading: return what is there
    got += size_t(r);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

const char* checksum_algorithm() { return hash64_algorithm(); }

std::string checksum_hex(const void* data, size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash64(data, n)));
  return buf;
}

uint64_t tree_bytes(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) return std::filesystem::file_size(path, ec);
  uint64_t n = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

std::string size_and_rate(uint64_t bytes, double seconds) {
  const double gb = double(bytes) / 1e9;
  return fmt::format("{:.3f} GB in {:.3f} s ({:.2f} GB/s)", gb, seconds,
                     seconds > 0 ? gb / seconds : 0.0);
}

}  // namespace mcpp::checkpoint
