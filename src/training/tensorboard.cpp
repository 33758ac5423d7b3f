#include "training/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace mcpp::training {
namespace {

// CRC-32C, reflected polynomial 0x82F63B78, table-driven.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> r{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      r[i] = c;
    }
    return r;
  }();
  return t;
}

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}

void key(std::string& out, int field, int wire) { varint(out, uint64_t(field) << 3 | uint64_t(wire)); }

template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, std::string_view s) {
  key(out, field, 2);
  varint(out, s.size());
  out.append(s);
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  key(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, value);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event_header(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

EventWriter::EventWriter(const std::string& dir, int64_t queue_size)
    : queue_size_(std::max<int64_t>(1, queue_size)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MCPP_CHECK_HINT(!ec && std::filesystem::is_directory(dir),
                  "give --tensorboard-dir a folder that can be created and written",
                  "--tensorboard-dir {}: cannot create the folder ({})", dir, ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}.0", int64_t(now()), host, int(getpid())))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  MCPP_CHECK_HINT(f_ != nullptr, "give --tensorboard-dir a writable folder",
                  "--tensorboard-dir: cannot create {}: {}", path_, std::strerror(errno));
  std::string first = event_header(now(), 0);
  bytes_field(first, 3, "brain.Event:2");
  write_record(first);
  std::fflush(f_);
}

EventWriter::~EventWriter() {
  if (!f_) return;
  try {
    flush();
  } catch (...) {
  }
  std::fclose(f_);
}

void EventWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  pending_.push_back(encode_scalar_event(now(), step, tag, float(value)));
  if (int64_t(pending_.size()) >= queue_size_) flush();
}

void EventWriter::write_record(const std::string& data) {
  std::string r;
  fixed(r, uint64_t(data.size()));
  fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  MCPP_CHECK_HINT(std::fwrite(r.data(), 1, r.size(), f_) == r.size(),
                  "free space on the disk of --tensorboard-dir",
                  "cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno));
}

void EventWriter::flush() {
  for (const auto& e : pending_) write_record(e);
  pending_.clear();
  MCPP_CHECK_HINT(std::fflush(f_) == 0, "free space on the disk of --tensorboard-dir",
                  "cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno));
}

}  // namespace mcpp::training
