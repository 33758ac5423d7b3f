#include "data/index_cache.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <unistd.h>

#include "base/error.h"

namespace mcpp::data {

namespace {

void write_atomic(const std::string& path, const std::string& head, const void* data,
                  size_t bytes) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f)
      throw Error(fmt::format("cannot write the index cache file {}", tmp),
                  "check that --data-cache-path is writable");
    f.write(head.data(), std::streamsize(head.size()));
    if (bytes) f.write(static_cast<const char*>(data), std::streamsize(bytes));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("write error on {}", tmp), "is the disk full?");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", tmp, path, ec.message()));
  }
}

int64_t descr_size(const std::string& d) {
  if (d == "<i2" || d == "<u2") return 2;
  if (d == "<i4" || d == "<u4") return 4;
  if (d == "<i8" || d == "<u8") return 8;
  if (d == "|i1" || d == "|u1") return 1;
  return 0;
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::optional<std::vector<int64_t>> NpyArray::as_int64() const {
  const int64_t n = numel(), es = descr_size(descr);
  if (es == 0 || int64_t(data.size()) != n * es) return std::nullopt;
  std::vector<int64_t> v(static_cast<size_t>(n));
  const char* p = data.data();
  for (int64_t i = 0; i < n; ++i, p += es) {
    if (descr == "<i2") { int16_t x; std::memcpy(&x, p, 2); v[i] = x; }
    else if (descr == "<u2") { uint16_t x; std::memcpy(&x, p, 2); v[i] = x; }
    else if (descr == "<i4") { int32_t x; std::memcpy(&x, p, 4); v[i] = x; }
    else if (descr == "<u4") { uint32_t x; std::memcpy(&x, p, 4); v[i] = x; }
    else if (descr == "<i8" || descr == "<u8") { std::memcpy(&v[i], p, 8); }
    else if (descr == "|i1") v[i] = int8_t(*p);
    else v[i] = uint8_t(*p);
  }
  return v;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t bytes) {
  // numpy's own spelling: "(5,)" for 1-D and "(5, 2)" for 2-D.
  std::string sh = shape.size() == 1 ? fmt::format("({},)", shape[0])
                                     : fmt::format("({}, {})", shape[0], shape[1]);
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, sh);
  // Pad with spaces so that magic + version + length + dict + '\n' is a multiple of 64.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += char(1), head += char(0);
  head += char(dict.size() & 0xFF), head += char(dict.size() >> 8);
  head += dict;
  write_atomic(path, head, data, bytes);
}

std::optional<NpyArray> read_npy(const std::string& path, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<NpyArray> {
    if (why) *why = w;
    return std::nullopt;
  };
  // A FIFO or device under a cache name would block or never end: regular files only.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return fail("not a regular file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail("cannot open");
  std::string b{std::istreambuf_iterator<char>(f), {}};
  if (b.size() < 10 || b.compare(0, 6, "\x93NUMPY") != 0) return fail("not an .npy file");
  const int major = uint8_t(b[6]);
  size_t hlen, hoff;
  if (major == 1) {
    hlen = uint8_t(b[8]) | size_t(uint8_t(b[9])) << 8, hoff = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return fail("truncated header");
    uint32_t x;
    std::memcpy(&x, b.data() + 8, 4);
    hlen = x, hoff = 12;
  } else {
    return fail(fmt::format("npy version {}", major));
  }
  if (hoff + hlen > b.size()) return fail("truncated header");
  const std::string dict = b.substr(hoff, hlen);
  static const std::regex re_descr(R"('descr'\s*:\s*'([^']*)')"),
      re_fortran(R"('fortran_order'\s*:\s*(True|False))"), re_shape(R"('shape'\s*:\s*\(([^)]*)\))");
  std::smatch m;
  NpyArray a;
  if (!std::regex_search(dict, m, re_descr)) return fail("no descr");
  a.descr = m[1];
  if (!std::regex_search(dict, m, re_fortran) || m[1] != "False") return fail("not C order");
  if (!std::regex_search(dict, m, re_shape)) return fail("no shape");
  const std::string shape = m[1];
  static const std::regex re_num("[0-9]+");
  for (auto it = std::sregex_iterator(shape.begin(), shape.end(), re_num);
       it != std::sregex_iterator(); ++it)
    a.shape.push_back(std::stoll(it->str()));
  const int64_t es = descr_size(a.descr);
  if (es == 0) return fail(fmt::format("dtype {}", a.descr));
  a.data = b.substr(hoff + hlen);
  if (int64_t(a.data.size()) != a.numel() * es)
    return fail(fmt::format("{} data bytes for shape ({}) of {}", a.data.size(), shape, a.descr));
  return a;
}

std::string description_hash(const std::string& d) {
  // Two 64-bit FNV-1a streams with different offsets: a stable name, not a security hash.
  uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
  for (unsigned char c : d) {
    h1 = (h1 ^ c) * 0x100000001b3ull;
    h2 = (h2 ^ c) * 0x100000001b3ull;
    h2 ^= h2 >> 29;
  }
  return fmt::format("{:016x}{:016x}", h1, h2);
}

CacheFiles cache_files(const std::string& dir, const std::string& description,
                       const std::string& cls, const std::string& split) {
  return {dir, fmt::format("{}-{}-{}", description_hash(description), cls, split)};
}

bool cache_description_matches(const CacheFiles& f, const std::string& description) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(f.path("description.txt"), ec)) return false;
  std::ifstream in(f.path("description.txt"), std::ios::binary);
  if (!in) return false;
  std::string s{std::istreambuf_iterator<char>(in), {}};
  return s == description;
}

void write_cache_description(const CacheFiles& f, const std::string& description) {
  write_atomic(f.path("description.txt"), description, nullptr, 0);
}

}  // namespace mcpp::data
