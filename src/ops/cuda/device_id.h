// Which physical GPU this process runs on (defined in device.cu; apart from device.h so
// that code asking it does not pull in the whole device set-up).
#pragma once
#include <string>

namespace mcpp::ops::cuda {

// The PCI bus id of the device init_device selected ("0000:3B:00.0"): the name NVML and
// nvidia-smi know it by, whatever CUDA_VISIBLE_DEVICES renumbers.
std::string pci_bus_id();

}  // namespace mcpp::ops::cuda
