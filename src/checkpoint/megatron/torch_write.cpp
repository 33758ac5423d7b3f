#include "checkpoint/megatron/torch_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "checkpoint/fs.h"
#include "checkpoint/megatron/torch_zip.h"
#include "tensor/dtype.h"

namespace mcpp::checkpoint::megatron {

using PK = Py::Kind;

Py Py::boolean(bool v) {
  Py p;
  p.kind = PK::Bool;
  p.b = v;
  return p;
}
Py Py::integer(int64_t v) {
  Py p;
  p.kind = PK::Int;
  p.i = v;
  return p;
}
Py Py::real(double v) {
  Py p;
  p.kind = PK::Float;
  p.f = v;
  return p;
}
Py Py::str(std::string v) {
  Py p;
  p.kind = PK::Str;
  p.s = std::move(v);
  return p;
}
Py Py::global(std::string v) {
  Py p;
  p.kind = PK::Global;
  p.s = std::move(v);
  return p;
}
Py Py::tuple(std::vector<Py> v) {
  Py p;
  p.kind = PK::Tuple;
  p.items = std::move(v);
  return p;
}
Py Py::list(std::vector<Py> v) {
  Py p;
  p.kind = PK::List;
  p.items = std::move(v);
  return p;
}
Py Py::dict() {
  Py p;
  p.kind = PK::Dict;
  return p;
}
Py Py::ordered_dict() {
  Py p;
  p.kind = PK::OrderedDict;
  return p;
}
Py Py::namespace_() {
  Py p;
  p.kind = PK::Namespace;
  return p;
}

Py Py::tensor_of(Tensor t, DType stored) {
  MCPP_CHECK(t.device() == Device::CPU, "internal: torch_write takes host tensors");
  const DType from = t.dtype();
  const bool ok = (from == DType::F32 &&
                   (stored == DType::F32 || stored == DType::BF16 || stored == DType::F16)) ||
                  (from == DType::F64 && stored == DType::F64) ||
                  (from == DType::I64 && stored == DType::I64) ||
                  (from == DType::U8 && stored == DType::U8);
  MCPP_CHECK(ok, "internal: torch_write cannot store a {} tensor as {}", dtype_name(from),
             dtype_name(stored));
  Py p;
  p.kind = PK::Tensor;
  p.tensor = std::move(t);
  p.dtype = stored;
  return p;
}

Py& Py::set(const std::string& key, Py v) {
  MCPP_CHECK(kind == PK::Dict || kind == PK::OrderedDict || kind == PK::Namespace,
             "internal: Py::set on a non-dict");
  entries.emplace_back(Py::str(key), std::move(v));
  return entries.back().second;
}
Py& Py::set(int64_t key, Py v) {
  MCPP_CHECK(kind == PK::Dict || kind == PK::OrderedDict, "internal: Py::set on a non-dict");
  entries.emplace_back(Py::integer(key), std::move(v));
  return entries.back().second;
}

std::string torch_dtype_global(DType t) {
  switch (t) {
    case DType::F32:
      return "torch.float32";
    case DType::F64:
      return "torch.float64";
    case DType::BF16:
      return "torch.bfloat16";
    case DType::F16:
      return "torch.float16";
    case DType::I64:
      return "torch.int64";
    case DType::U8:
      return "torch.uint8";
    default:
      MCPP_FAIL("internal: no torch dtype for {}", dtype_name(t));
  }
}

namespace {

const char* storage_class_of(DType t) {
  switch (t) {
    case DType::F32:
      return "FloatStorage";
    case DType::F64:
      return "DoubleStorage";
    case DType::BF16:
      return "BFloat16Storage";
    case DType::F16:
      return "HalfStorage";
    case DType::I64:
      return "LongStorage";
    case DType::U8:
      return "ByteStorage";
    default:
      MCPP_FAIL("internal: no torch storage class for {}", dtype_name(t));
  }
}

int64_t stored_size(DType t) {
  return t == DType::U8 ? 1 : t == DType::BF16 || t == DType::F16 ? 2 : t == DType::F32 ? 4 : 8;
}

// Pickle protocol 2, the opcodes Python's own pickler emits for these values.
struct Pickler {
  std::string out;
  std::vector<const Py*>& tensors;

  void u32(uint32_t v) {
    for (int k = 0; k < 4; ++k) out += char((v >> (8 * k)) & 0xFF);
  }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out += 'J';
      u32(uint32_t(int32_t(v)));
      return;
    }
    out += '\x8a';  // LONG1: two's complement, little-endian, shortest (8 bytes suffice)
    out += char(8);
    for (int k = 0; k < 8; ++k) out += char((uint64_t(v) >> (8 * k)) & 0xFF);
  }
  void str(const std::string& s) {
    out += 'X';
    u32(uint32_t(s.size()));
    out += s;
  }
  void global(const std::string& dotted) {
    const size_t dot = dotted.rfind('.');
    MCPP_CHECK(dot != std::string::npos, "internal: global '{}' has no module", dotted);
    out += 'c';
    out += dotted.substr(0, dot) + "\n" + dotted.substr(dot + 1) + "\n";
  }
  void ints_tuple(const std::vector<int64_t>& v) {
    if (v.empty()) {
      out += ')';
      return;
    }
    out += '(';
    for (int64_t x : v) integer(x);
    out += 't';
  }
  void items(const std::vector<std::pair<Py, Py>>& e, char close) {
    if (e.empty()) return;
    out += '(';
    for (const auto& [k, v] : e) value(k), value(v);
    out += close;
  }
  void tensor(const Py& t) {
    const Shape& shape = t.tensor.shape();
    std::vector<int64_t> stride(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) stride[d - 1] = stride[d] * shape[d];
    global("torch._utils._rebuild_tensor_v2");
    out += '(';
    out += '(';  // the persistent id: ('storage', class, key, location, numel)
    str("storage");
    global(std::string("torch.") + storage_class_of(t.dtype));
    str(std::to_string(tensors.size()));
    str("cpu");
    integer(t.tensor.numel());
    out += 't';
    out += 'Q';  // BINPERSID
    tensors.push_back(&t);
    integer(0);  // storage offset
    ints_tuple(shape);
    ints_tuple(stride);
    out += '\x89';  // requires_grad False
    global("collections.OrderedDict");
    out += ')';
    out += 'R';
    out += 't';
    out += 'R';
  }
  void value(const Py& v) {
    switch (v.kind) {
      case PK::None:
        out += 'N';
        break;
      case PK::Bool:
        out += v.b ? '\x88' : '\x89';
        break;
      case PK::Int:
        integer(v.i);
        break;
      case PK::Float: {
        uint64_t u;
        std::memcpy(&u, &v.f, 8);
        out += 'G';
        for (int k = 7; k >= 0; --k) out += char((u >> (8 * k)) & 0xFF);
        break;
      }
      case PK::Str:
        str(v.s);
        break;
      case PK::Global:
        global(v.s);
        break;
      case PK::Tuple:
        if (v.items.empty()) {
          out += ')';
          break;
        }
        out += '(';
        for (const auto& x : v.items) value(x);
        out += 't';
        break;
      case PK::List:
        out += ']';
        if (v.items.empty()) break;
        out += '(';
        for (const auto& x : v.items) value(x);
        out += 'e';
        break;
      case PK::Dict:
        out += '}';
        items(v.entries, 'u');
        break;
      case PK::OrderedDict:  // OrderedDict() then SETITEMS, as Python reduces one
        global("collections.OrderedDict");
        out += ")R";
        items(v.entries, 'u');
        break;
      case PK::Namespace:  // copyreg.__newobj__(Namespace) then BUILD with its __dict__
        global("argparse.Namespace");
        out += ')';
        out += '\x81';
        out += '}';
        items(v.entries, 'u');
        out += 'b';
        break;
      case PK::Tensor:
        tensor(v);
        break;
    }
  }
};

void put(std::string& b, uint64_t v, int n) {
  for (int k = 0; k < n; ++k) b += char((v >> (8 * k)) & 0xFF);
}

// A zip written front to back into one file descriptor.
class ZipOut {
 public:
  ZipOut(const std::string& path, bool force64) : path_(path), force64_(force64) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MCPP_CHECK_HINT(fd_ >= 0, "check that the --save folder exists and is writable",
                    "cannot create {}: {}", path, std::strerror(errno));
  }
  ~ZipOut() {
    if (fd_ >= 0) ::close(fd_);
  }
  // One stored record of `size` bytes; fill(write) must write exactly that many.
  template <class Fill>
  void record(const std::string& name, uint64_t size, Fill fill) {
    Entry e{name, size, offset_, 0};
    const bool z64 = force64_ || size >= 0xFFFFFFFFu;
    std::string h;
    put(h, 0x04034b50, 4);
    put(h, z64 ? 45 : 20, 2);       // version needed
    put(h, 0, 2), put(h, 0, 2);     // flags, method (stored)
    put(h, 0, 2), put(h, 0x21, 2);  // time, date (1980-01-01)
    put(h, 0, 4);                   // CRC-32, patched once the data is written
    put(h, z64 ? 0xFFFFFFFFu : size, 4), put(h, z64 ? 0xFFFFFFFFu : size, 4);
    put(h, name.size(), 2);
    // extra: ZIP64 sizes, then PyTorch's padding field that puts the data at a multiple of 64
    const uint64_t before = offset_ + 30 + name.size() + (z64 ? 20 : 0) + 4;
    const uint64_t pad = (64 - before % 64) % 64;
    put(h, (z64 ? 20 : 0) + 4 + pad, 2);
    h += name;
    if (z64) put(h, 1, 2), put(h, 16, 2), put(h, size, 8), put(h, size, 8);
    put(h, 0x4246, 2), put(h, pad, 2);  // "FB"
    h.append(size_t(pad), 'Z');
    write(h.data(), h.size());
    crc_ = 0;
    const uint64_t start = offset_;
    fill(*this);
    MCPP_CHECK(offset_ - start == size, "internal: zip record {} wrote {} bytes, expected {}", name,
               offset_ - start, size);
    e.crc = crc_;
    uint8_t c[4];
    for (int k = 0; k < 4; ++k) c[k] = uint8_t((crc_ >> (8 * k)) & 0xFF);
    MCPP_CHECK_HINT(::pwrite(fd_, c, 4, off_t(e.local + 14)) == 4,
                    "free disk space or choose another --save folder", "writing {} failed: {}",
                    path_, std::strerror(errno));
    entries_.push_back(e);
  }
  void data(const void* p, size_t n) {
    crc_ = crc32({static_cast<const uint8_t*>(p), n}, crc_);
    write(p, n);
  }
  void finish() {
    const uint64_t cd_off = offset_;
    std::string cd;
    for (const Entry& e : entries_) {
      const bool big = force64_ || e.size >= 0xFFFFFFFFu, far = force64_ || e.local >= 0xFFFFFFFFu;
      std::string x;
      if (big || far) {
        put(x, 1, 2), put(x, (big ? 16 : 0) + (far ? 8 : 0), 2);
        if (big) put(x, e.size, 8), put(x, e.size, 8);
        if (far) put(x, e.local, 8);
      }
      put(cd, 0x02014b50, 4);
      put(cd, 45, 2), put(cd, big || far ? 45 : 20, 2);  // made by, needed
      put(cd, 0, 2), put(cd, 0, 2), put(cd, 0, 2), put(cd, 0x21, 2);
      put(cd, e.crc, 4);
      put(cd, big ? 0xFFFFFFFFu : e.size, 4), put(cd, big ? 0xFFFFFFFFu : e.size, 4);
      put(cd, e.name.size(), 2), put(cd, x.size(), 2), put(cd, 0, 2);  // name, extra, comment
      put(cd, 0, 2), put(cd, 0, 2), put(cd, 0, 4);  // disk, internal, external attributes
      put(cd, far ? 0xFFFFFFFFu : e.local, 4);
      cd += e.name;
      cd += x;
    }
    const uint64_t n = entries_.size(), cd_size = cd.size();
    const bool z64 = force64_ || n >= 0xFFFF || cd_off >= 0xFFFFFFFFu || cd_size >= 0xFFFFFFFFu;
    if (z64) {
      const uint64_t eocd64 = cd_off + cd_size;
      put(cd, 0x06064b50, 4), put(cd, 44, 8), put(cd, 45, 2), put(cd, 45, 2);
      put(cd, 0, 4), put(cd, 0, 4), put(cd, n, 8), put(cd, n, 8);
      put(cd, cd_size, 8), put(cd, cd_off, 8);
      put(cd, 0x07064b50, 4), put(cd, 0, 4), put(cd, eocd64, 8), put(cd, 1, 4);
    }
    put(cd, 0x06054b50, 4), put(cd, 0, 2), put(cd, 0, 2);
    put(cd, z64 ? 0xFFFF : n, 2), put(cd, z64 ? 0xFFFF : n, 2);
    put(cd, z64 ? 0xFFFFFFFFu : cd_size, 4), put(cd, z64 ? 0xFFFFFFFFu : cd_off, 4);
    put(cd, 0, 2);
    write(cd.data(), cd.size());
    MCPP_CHECK_HINT(::fsync(fd_) == 0, "free disk space or choose another --save folder",
                    "fsync {} failed: {}", path_, std::strerror(errno));
    MCPP_CHECK_HINT(::close(fd_) == 0, "free disk space or choose another --save folder",
                    "closing {} failed: {}", path_, std::strerror(errno));
    fd_ = -1;
  }

 private:
  struct Entry {
    std::string name;
    uint64_t size, local;
    uint32_t crc;
  };
  void write(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      const ssize_t w = ::write(fd_, c, n);
      if (w < 0 && errno == EINTR) continue;
      MCPP_CHECK_HINT(w > 0, "free disk space or choose another --save folder",
                      "writing {} failed: {}", path_, std::strerror(errno));
      c += w, n -= size_t(w), offset_ += uint64_t(w);
    }
  }
  std::string path_;
  bool force64_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  uint32_t crc_ = 0;
  std::vector<Entry> entries_;
};

// A tensor's storage bytes, converted chunk by chunk.
void write_storage(ZipOut& z, const Py& t) {
  const Tensor& src = t.tensor;
  const int64_t n = src.numel();
  if (src.dtype() != DType::F32 || t.dtype == DType::F32) {
    z.data(src.raw(), src.nbytes());
    return;
  }
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<uint16_t> buf(size_t(std::min(n, kChunk)));
  const float* x = src.data<float>();
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    for (int64_t k = 0; k < m; ++k)
      buf[size_t(k)] = t.dtype == DType::BF16 ? float_to_bf16(x[at + k]) : float_to_f16(x[at + k]);
    z.data(buf.data(), size_t(m) * 2);
  }
}

}  // namespace

std::string pickle_py(const Py& root, std::vector<const Py*>& tensors) {
  Pickler p{std::string("\x80\x02", 2), tensors};
  p.value(root);
  p.out += '.';
  return p.out;
}

void save_torch_file(const std::string& path, const Py& root, bool force_zip64) {
  std::vector<const Py*> tensors;
  const std::string pkl = pickle_py(root, tensors);
  std::string archive = std::filesystem::path(path).stem().string();
  if (archive.empty()) archive = "archive";
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    ZipOut z(tmp, force_zip64);
    auto bytes = [](const std::string& s) {
      return [&s](ZipOut& o) { o.data(s.data(), s.size()); };
    };
    z.record(archive + "/data.pkl", pkl.size(), bytes(pkl));
    const std::string order = "little";
    z.record(archive + "/byteorder", order.size(), bytes(order));
    for (size_t k = 0; k < tensors.size(); ++k) {
      const Py& t = *tensors[k];
      z.record(archive + "/data/" + std::to_string(k),
               uint64_t(t.tensor.numel() * stored_size(t.dtype)),
               [&t](ZipOut& o) { write_storage(o, t); });
    }
    const std::string version = "3\n";
    z.record(archive + "/version", version.size(), bytes(version));
    z.finish();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // no partial file left behind
    throw;
  }
  MCPP_CHECK_HINT(::rename(tmp.c_str(), path.c_str()) == 0, "check the --save folder",
                  "rename {} -> {} failed: {}", tmp, path, std::strerror(errno));
  fsync_dir(std::filesystem::path(path).parent_path().string());
}

}  // namespace mcpp::checkpoint::megatron
