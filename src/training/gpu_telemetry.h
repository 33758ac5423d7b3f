// A GPU's power, temperature, utilisation and SM clock, read through NVML (the NVIDIA
// driver's management library, libnvidia-ml.so.1). The library is opened at run time, so
// the build needs no NVML and a machine without the driver simply has no telemetry; the
// straggler detector (straggler.h) prints what it can read.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace mcpp::training {

struct GpuSample {
  double power_w = 0;    // board power draw, watts
  double temp_c = 0;     // GPU core temperature, degrees Celsius
  double util_pct = 0;   // share of the last sample period a kernel ran, percent
  double clock_mhz = 0;  // current SM clock, MHz
};

class GpuTelemetry {
 public:
  // The device with PCI bus id `pci_bus_id` (as cudaDeviceGetPCIBusId writes it, which
  // names the same device whatever CUDA_VISIBLE_DEVICES renumbers). nullptr, with the
  // reason in *why, when NVML cannot be loaded or does not know the device.
  static std::unique_ptr<GpuTelemetry> open(const std::string& pci_bus_id, std::string* why);
  ~GpuTelemetry();
  // One reading of the four numbers; nullopt when NVML fails to answer.
  std::optional<GpuSample> sample() const;
  // Bytes of the device's memory in use by every process (NVML's "used", what
  // torch.cuda.device_memory_used reports); nullopt when NVML fails to answer.
  std::optional<uint64_t> memory_used() const;
  // The device's energy counter since the driver loaded, millijoules (Volta and later);
  // nullopt when NVML cannot answer (--log-energy).
  std::optional<uint64_t> total_energy_mj() const;

  struct Api;

 private:
  GpuTelemetry() = default;
  std::unique_ptr<Api> api_;
};

}  // namespace mcpp::training
