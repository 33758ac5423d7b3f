// The blockwise FP8 recipe on this GPU (--fp8-recipe blockwise; docs/fp8.md "Blockwise"):
// whether cuBLASLt's block-scaled FP8 GEMMs (1x128 / 128x128 f32 scales) are there.
#pragma once
#include <string>

namespace mcpp::ops::cuda {

// True when the cuBLASLt in use has the block-scaled FP8 GEMMs (12.9 or newer) and device 0
// is a Hopper GPU; otherwise false and `why` says which is missing (gemm_fp8.cu).
bool fp8_block_gemm_supported(std::string* why);

}  // namespace mcpp::ops::cuda
