#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace mcpp::checkpoint {

namespace {
struct DTypeName {
  DType t;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::F32, "F32"},         {DType::F64, "F64"},
                                {DType::BF16, "BF16"},       {DType::F16, "F16"},
                                {DType::I32, "I32"},         {DType::I64, "I64"},
                                {DType::U8, "U8"},           {DType::U16, "U16"},
                                {DType::FP8E4M3, "F8_E4M3"}, {DType::FP8E5M2, "F8_E5M2"}};
}  // namespace

std::string safetensors_dtype(DType t) {
  for (auto& n : kDTypeNames)
    if (n.t == t) return n.name;
  MCPP_FAIL("dtype {} has no safetensors name", dtype_name(t));
}

DType dtype_from_safetensors(const std::string& s, const std::string& file) {
  for (auto& n : kDTypeNames)
    if (s == n.name) return n.t;
  MCPP_FAIL("{}: unsupported safetensors dtype '{}'", file, s);
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  MCPP_CHECK(it != tensors.end(), "safetensors file has no tensor '{}'", name);
  return it->second;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    MCPP_CHECK(t.device() == Device::CPU, "save_safetensors: {} is not on the CPU", name);
    header[name] = {{"dtype", safetensors_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MCPP_CHECK_HINT(fd >= 0, "check that the directory exists and is writable",
                  "cannot create {}: {}", tmp, std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        MCPP_FAIL("writing {} failed: {}", tmp, std::strerror(e));
      }
      c += w, n -= size_t(w);
    }
  };
  uint64_t hlen = h.size();
  write_all(&hlen, 8);
  write_all(h.data(), h.size());
  for (const auto& [name, t] : tensors) write_all(t.raw(), t.nbytes());
  MCPP_CHECK(::fsync(fd) == 0, "fsync {} failed: {}", tmp, std::strerror(errno));
  ::close(fd);
  MCPP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rename {} -> {} failed: {}", tmp, path,
             std::strerror(errno));
}

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), in_(path, std::ios::binary) {
  std::ifstream& in = in_;
  MCPP_CHECK_HINT(in.good(), "check the path", "cannot open safetensors file {}", path);
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  uint64_t hlen = 0;
  MCPP_CHECK(size >= 8 && in.read(reinterpret_cast<char*>(&hlen), 8),
             "{}: truncated (no header length)", path);
  MCPP_CHECK(hlen <= size - 8 && hlen < (uint64_t(1) << 30),
             "{}: header length {} exceeds the file size {} (truncated or not safetensors)", path,
             hlen, size);
  std::string h(hlen, '\0');
  in.read(h.data(), std::streamsize(hlen));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    MCPP_FAIL("{}: header is not valid JSON: {}", path, e.what());
  }
  MCPP_CHECK(header.is_object(), "{}: header is not a JSON object", path);
  data_start_ = 8 + hlen;
  const uint64_t data_size = size - data_start_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (auto& [k, val] : v.items())
        metadata_[k] = val.is_string() ? val.get<std::string>() : val.dump();
      continue;
    }
    MCPP_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
               "{}: tensor '{}' lacks dtype/shape/data_offsets", path, name);
    DType dt{};
    Shape shape;
    std::vector<uint64_t> offs;
    try {
      dt = dtype_from_safetensors(v["dtype"].get<std::string>(), path);
      shape = v["shape"].get<Shape>();
      offs = v["data_offsets"].get<std::vector<uint64_t>>();
    } catch (const nlohmann::json::exception& e) {
      MCPP_FAIL("{}: tensor '{}' has a malformed header entry ({})", path, name, e.what());
    }
    MCPP_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] <= data_size,
               "{}: tensor '{}' data_offsets out of the file (truncated?)", path, name);
    // Size from the header before allocating: a corrupt shape must not allocate terabytes.
    uint64_t want = dtype_size(dt);
    for (int64_t d : shape) {
      MCPP_CHECK(d >= 0 && (d == 0 || want <= data_size / uint64_t(d)),
                 "{}: tensor '{}' has shape {}, larger than the file (corrupt header?)", path, name,
                 shape_str(shape));
      want *= uint64_t(d);
    }
    MCPP_CHECK(offs[1] - offs[0] == want,
               "{}: tensor '{}' has {} bytes for shape {} {} (expected {})", path, name,
               offs[1] - offs[0], shape_str(shape), dtype_name(dt), want);
    ranges.push_back({offs[0], offs[1]});
    entries_[name] = Entry{dt, shape, offs[0], offs[1]};
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    MCPP_CHECK(ranges[i].first >= ranges[i - 1].second, "{}: overlapping tensor data", path);
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Tensor SafetensorsReader::read(const std::string& name) {
  auto it = entries_.find(name);
  MCPP_CHECK(it != entries_.end(), "{} has no tensor '{}'", path_, name);
  const Entry& e = it->second;
  Tensor t = Tensor::empty(e.shape, e.dtype);
  in_.clear();
  in_.seekg(std::streamoff(data_start_ + e.begin));
  in_.read(static_cast<char*>(t.raw()), std::streamsize(t.nbytes()));
  MCPP_CHECK(in_.good(), "{}: short read of tensor '{}'", path_, name);
  bytes_read_ += e.end - e.begin;
  return t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsReader rd(path);
  SafetensorsFile f;
  f.metadata = rd.metadata();
  for (const std::string& name : rd.names()) f.tensors[name] = rd.read(name);
  return f;
}

}  // namespace mcpp::checkpoint
