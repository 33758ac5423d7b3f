// TensorBoard event files of our own (no protobuf library): what TensorBoard's
// SummaryWriter writes for add_scalar, so `tensorboard --logdir DIR` reads it.
//
// File: DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.0, a TFRecord stream:
//   per record  u64 length (little-endian) | u32 masked_crc32c(length bytes) |
//               data[length]               | u32 masked_crc32c(data)
//   masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C (Castagnoli) of x
// Records: first an Event with file_version "brain.Event:2", then one Event per scalar:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// Events are queued in memory and written (and the file flushed) by flush(), or when
// queue_size events wait (Megatron's --tensorboard-queue-size, SummaryWriter's max_queue):
// the trainer flushes at every log interval, so a crash loses at most one interval.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace mcpp::training {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// The serialized Event of one scalar (exposed for tests).
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

class EventWriter {
 public:
  // Creates DIR (and parents) and the event file; an error naming --tensorboard-dir when
  // it cannot.
  EventWriter(const std::string& dir, int64_t queue_size);
  ~EventWriter();  // flushes
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void add_scalar(std::string_view tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t queue_size_;
  std::vector<std::string> pending_;
};

}  // namespace mcpp::training
