// cuBLASLt is opened on the first GEMM on the GPU, not at program start
// (cublaslt_loader.cpp says why). These two answer for it.
#pragma once
#include <cstddef>

namespace mcpp::ops::cuda {

// Whether libcublasLt is loaded in this process yet (by the first GEMM, or by anyone).
[[gnu::visibility("default")]] bool cublaslt_loaded();
// cuBLASLt's version number (cublasLtGetVersion: major * 10000 + minor * 100 + patch),
// loading the library if it is not yet; a clear error if it cannot be found.
[[gnu::visibility("default")]] size_t cublaslt_version();

}  // namespace mcpp::ops::cuda
