// The straggler report's GPU readings (training/gpu_telemetry.h): NVML, loaded at run time,
// finds the device this process runs on by its PCI bus id and reads numbers an H100/H200
// (or any NVIDIA GPU) can have.
#include "gpu_test_util.h"
#include "ops/cuda/device_id.h"
#include "training/gpu_telemetry.h"

namespace mcpp::test {
namespace telemetry_gpu_test {

TEST(GpuTelemetry, ReadsThisDevicesPowerTemperatureUtilisationAndClock) {
  MCPP_REQUIRE_GPU();
  const std::string id = ops::cuda::pci_bus_id();
  EXPECT_NE(id.find(':'), std::string::npos) << id;
  std::string why;
  auto t = training::GpuTelemetry::open(id, &why);
  ASSERT_NE(t, nullptr) << why;
  const auto s = t->sample();
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(s->power_w, 5.0);
  EXPECT_LT(s->power_w, 2000.0);
  EXPECT_GT(s->temp_c, 5.0);
  EXPECT_LT(s->temp_c, 120.0);
  EXPECT_GE(s->util_pct, 0.0);
  EXPECT_LE(s->util_pct, 100.0);
  EXPECT_GT(s->clock_mhz, 100.0);
  EXPECT_LT(s->clock_mhz, 5000.0);
  // A bus id no device has: no telemetry, and the reason says so.
  EXPECT_EQ(training::GpuTelemetry::open("0000:FF:1F.7", &why), nullptr);
  EXPECT_NE(why.find("0000:FF:1F.7"), std::string::npos) << why;
}

}  // namespace telemetry_gpu_test
}  // namespace mcpp::test
