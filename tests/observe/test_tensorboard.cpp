// The TensorBoard writer's pieces against known values: CRC-32C's check value and RFC 3720
// vectors, the masked CRC, and one scalar Event's bytes assembled by hand from the
// protobuf wire format.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "training/tensorboard.h"
#include "training/training_log.h"

namespace tensorboard_test {

using namespace mcpp::training;

TEST(TensorBoard, Crc32cKnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarEventBytes) {
  const std::string e = encode_scalar_event(1.5, 300, "lm loss", 2.0f);
  std::string want;
  want += '\x09';  // field 1 (wall_time), fixed64
  double w = 1.5;
  want.append(reinterpret_cast<const char*>(&w), 8);
  want += '\x10';  // field 2 (step), varint 300 = 0xAC 0x02
  want += '\xAC';
  want += '\x02';
  want += '\x2A';  // field 5 (summary), length-delimited
  want += char(2 + 14);
  want += '\x0A';  // Summary.value
  want += char(14);  // 9 bytes of tag + 5 of simple_value
  want += '\x0A';  // Value.tag
  want += char(7);
  want += "lm loss";
  want += '\x15';  // Value.simple_value, fixed32
  float v = 2.0f;
  want.append(reinterpret_cast<const char*>(&v), 4);
  EXPECT_EQ(e, want);
}

TEST(Timers, LogOptions) {
  const std::vector<std::string> names = {"forward-backward", "optimizer"};
  const std::vector<std::vector<double>> ms = {{12.3, 1.0}, {14.1, 0.5}};
  auto mm = format_timers("minmax", names, ms);
  ASSERT_EQ(mm.size(), 3u);
  EXPECT_EQ(mm[0], "(min, max) time across ranks (ms):");
  EXPECT_NE(mm[1].find("forward-backward"), std::string::npos);
  EXPECT_NE(mm[1].find(": (12.30, 14.10)"), std::string::npos) << mm[1];
  EXPECT_NE(mm[2].find(": (0.50, 1.00)"), std::string::npos) << mm[2];
  auto mx = format_timers("max", names, ms);
  EXPECT_EQ(mx[0], "max time across ranks (ms):");
  EXPECT_NE(mx[1].find(": 14.10"), std::string::npos) << mx[1];
  auto all = format_timers("all", names, ms);
  ASSERT_EQ(all.size(), 7u);
  EXPECT_EQ(all[0], "times across ranks (ms):");
  EXPECT_EQ(all[1], "  forward-backward:");
  EXPECT_EQ(all[2], "     rank  0: 12.30");
  EXPECT_EQ(all[3], "     rank  1: 14.10");
}

}  // namespace tensorboard_test
