// TorchFile and element conversion of torch_pickle.h: a torch.save archive's data.pkl and
// the tensors it references, read with bounds checks against the storage entries.
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "checkpoint/megatron/torch_pickle.h"

namespace mcpp::checkpoint::megatron {

using K = Value::Kind;

int64_t torch_dtype_size(DType t) { return int64_t(dtype_size(t)); }

void convert_elements(const uint8_t* src, DType from, int64_t n, Tensor& dst, int64_t at) {
  auto get = [&](int64_t k) -> double {
    const uint8_t* p = src + k * int64_t(dtype_size(from));
    switch (from) {
      case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
      case DType::F64: { double v; std::memcpy(&v, p, 8); return v; }
      case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_float(h); }
      case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_float(h); }
      case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return double(v); }
      case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
      case DType::U8: return *p;
      default: MCPP_FAIL("cannot convert {} elements", dtype_name(from));
    }
  };
  if (dst.dtype() == DType::F32)
    for (int64_t k = 0; k < n; ++k) dst.data<float>()[at + k] = float(get(k));
  else if (dst.dtype() == DType::F64)
    for (int64_t k = 0; k < n; ++k) dst.data<double>()[at + k] = get(k);
  else
    MCPP_FAIL("convert_elements writes F32 or F64, not {}", dtype_name(dst.dtype()));
}

TorchFile::TorchFile(std::span<const uint8_t> bytes, std::string what)
    : zip_(bytes, std::move(what)) {
  for (const auto& [name, _] : zip_.entries())
    if (name.ends_with("/data.pkl") && name.find('/') == name.size() - 9) {
      prefix_ = name.substr(0, name.size() - 8);
      break;
    }
  MCPP_CHECK_HINT(!prefix_.empty(), "is it a torch.save file of PyTorch 1.6 or later?",
                  "{}: the zip archive has no <archive>/data.pkl", zip_.what());
  if (zip_.has(prefix_ + "byteorder")) {
    auto b = zip_.entry(prefix_ + "byteorder");
    MCPP_CHECK(std::string(b.begin(), b.end()) == "little",
               "{}: byteorder '{}' (only little-endian files are read)", zip_.what(),
               std::string(b.begin(), b.end()).substr(0, 16));
  }
  root_ = unpickle(zip_.entry(prefix_ + "data.pkl"), zip_.what() + ":" + prefix_ + "data.pkl");
}

Tensor TorchFile::tensor(const Value& t, DType out, const std::string& name) const {
  MCPP_CHECK(t.is(K::Tensor), "{}: '{}' is a {}, not a tensor", zip_.what(), name, t.describe());
  const Value& s = *t.storage;
  DType sdt;
  int64_t es = 0;
  MCPP_CHECK(storage_class(s.cls, sdt, es),
             "{}: tensor '{}' is stored as {}, which megatron.cpp does not read", zip_.what(),
             name, s.cls);
  const std::string entry = prefix_ + "data/" + s.s;
  auto bytes = zip_.entry(entry);
  MCPP_CHECK(s.numel <= int64_t(bytes.size()) / es,
             "{}: storage {} of '{}' declares {} elements but holds {} bytes", zip_.what(), s.s,
             name, s.numel, bytes.size());
  const int64_t have = int64_t(bytes.size()) / es;
  // The highest element the view touches must lie inside the storage (overflow-safe).
  int64_t numel = 1, last = t.storage_offset;
  MCPP_CHECK(t.storage_offset >= 0, "{}: tensor '{}' has a negative storage offset", zip_.what(),
             name);
  std::vector<int64_t> shape = t.shape;
  for (size_t d = 0; d < shape.size(); ++d) {
    MCPP_CHECK(shape[d] >= 0 && t.stride[d] >= 0 && shape[d] <= (int64_t(1) << 40) &&
                   t.stride[d] <= (int64_t(1) << 40),
               "{}: tensor '{}' has size/stride {}/{} in dim {}", zip_.what(), name, shape[d],
               t.stride[d], d);
    if (shape[d] == 0) numel = 0;
    else numel *= shape[d], last += (shape[d] - 1) * t.stride[d];
    MCPP_CHECK(numel <= (int64_t(1) << 40) && last <= (int64_t(1) << 50),
               "{}: tensor '{}' is implausibly large", zip_.what(), name);
  }
  MCPP_CHECK_HINT(numel == 0 || last < have,
                  "the file is truncated or corrupt: copy it again",
                  "{}: tensor '{}' reaches element {} of a storage of {} elements", zip_.what(),
                  name, last, have);
  Shape sh;
  for (auto x : shape) sh.push_back(x);
  Tensor o = Tensor::empty(sh, out);
  // Walk the view in row-major order; the innermost dimension in one conversion run when
  // it is contiguous (the common case).
  const size_t nd = shape.size();
  if (numel == 0) return o;
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = nd ? shape[nd - 1] : 1;
  const bool contiguous_inner = nd == 0 || t.stride[nd - 1] == 1;
  for (int64_t done = 0; done < numel;) {
    int64_t off = t.storage_offset;
    for (size_t d = 0; d < nd; ++d) off += idx[d] * t.stride[d];
    if (contiguous_inner) {
      convert_elements(bytes.data() + off * es, sdt, inner, o, done);
    } else {
      for (int64_t k = 0; k < inner; ++k)
        convert_elements(bytes.data() + (off + k * t.stride[nd - 1]) * es, sdt, 1, o,
                         done + k);
    }
    done += inner;
    for (size_t d = nd - 1; nd > 1 && d-- > 0;) {  // advance the outer index
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return o;
}

}  // namespace mcpp::checkpoint::megatron
