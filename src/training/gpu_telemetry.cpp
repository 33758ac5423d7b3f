#include "training/gpu_telemetry.h"

#include <dlfcn.h>

namespace mcpp::training {

// The few NVML entry points used, declared by their C ABI (nvml.h): every call returns an
// nvmlReturn_t, 0 on success; a device is an opaque handle.
struct GpuTelemetry::Api {
  using Device = void*;
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {  // nvmlMemory_t
    unsigned long long total, free, used;
  };
  void* lib = nullptr;
  Device dev = nullptr;
  int (*shutdown)() = nullptr;
  int (*power)(Device, unsigned*) = nullptr;               // milliwatts
  int (*temperature)(Device, int, unsigned*) = nullptr;    // sensor 0: the GPU core
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;          // clock type 1: SM
  int (*memory)(Device, Memory*) = nullptr;
  int (*energy)(Device, unsigned long long*) = nullptr;  // millijoules; may be absent
  const char* (*error_string)(int) = nullptr;
};

namespace {

template <class F>
bool bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

}  // namespace

std::unique_ptr<GpuTelemetry> GpuTelemetry::open(const std::string& pci_bus_id,
                                                 std::string* why) {
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api->lib) {
    if (why) *why = "libnvidia-ml.so.1 (the NVIDIA driver's NVML) could not be loaded";
    return nullptr;
  }
  int (*init)() = nullptr;
  int (*by_pci)(const char*, Api::Device*) = nullptr;
  const bool ok = bind(api->lib, "nvmlInit_v2", init) &&
                  bind(api->lib, "nvmlDeviceGetHandleByPciBusId_v2", by_pci) &&
                  bind(api->lib, "nvmlShutdown", api->shutdown) &&
                  bind(api->lib, "nvmlDeviceGetPowerUsage", api->power) &&
                  bind(api->lib, "nvmlDeviceGetTemperature", api->temperature) &&
                  bind(api->lib, "nvmlDeviceGetUtilizationRates", api->utilization) &&
                  bind(api->lib, "nvmlDeviceGetClockInfo", api->clock) &&
                  bind(api->lib, "nvmlDeviceGetMemoryInfo", api->memory) &&
                  bind(api->lib, "nvmlErrorString", api->error_string);
  bind(api->lib, "nvmlDeviceGetTotalEnergyConsumption", api->energy);  // optional
  if (!ok) {
    if (why) *why = "libnvidia-ml.so.1 lacks an NVML function this build calls";
    dlclose(api->lib);
    return nullptr;
  }
  if (int rc = init(); rc != 0) {
    if (why) *why = std::string("nvmlInit failed: ") + api->error_string(rc);
    dlclose(api->lib);
    return nullptr;
  }
  if (int rc = by_pci(pci_bus_id.c_str(), &api->dev); rc != 0) {
    if (why) *why = "NVML does not know the device " + pci_bus_id + ": " + api->error_string(rc);
    api->shutdown();
    dlclose(api->lib);
    return nullptr;
  }
  std::unique_ptr<GpuTelemetry> t(new GpuTelemetry());
  t->api_ = std::move(api);
  return t;
}

GpuTelemetry::~GpuTelemetry() {
  if (!api_) return;
  api_->shutdown();
  dlclose(api_->lib);
}

std::optional<GpuSample> GpuTelemetry::sample() const {
  unsigned mw = 0, temp = 0, mhz = 0;
  Api::Utilization u{};
  if (api_->power(api_->dev, &mw) != 0 || api_->temperature(api_->dev, 0, &temp) != 0 ||
      api_->utilization(api_->dev, &u) != 0 || api_->clock(api_->dev, 1, &mhz) != 0)
    return std::nullopt;
  return GpuSample{mw / 1000.0, double(temp), double(u.gpu), double(mhz)};
}

std::optional<uint64_t> GpuTelemetry::memory_used() const {
  Api::Memory m{};
  if (api_->memory(api_->dev, &m) != 0) return std::nullopt;
  return uint64_t(m.used);
}

std::optional<uint64_t> GpuTelemetry::total_energy_mj() const {
  unsigned long long mj = 0;
  if (!api_->energy || api_->energy(api_->dev, &mj) != 0) return std::nullopt;
  return uint64_t(mj);
}

}  // namespace mcpp::training
