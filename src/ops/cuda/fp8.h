// FP8 on this GPU: whether its tensor cores have FP8 (compute capability 8.9 or newer:
// Ada, Hopper and later). Start-up checks call it before anything runs in FP8.
#pragma once
#include <string>

namespace mcpp::ops::cuda {

// True when device 0 runs FP8 GEMMs; otherwise false and `why` names the device.
bool fp8_gemm_supported(std::string* why);

// What the FP8 GEMMs' algorithm tuning found (gemm_fp8.cu), one line per tuned shape.
std::string fp8_gemm_tuning_report();

}  // namespace mcpp::ops::cuda
