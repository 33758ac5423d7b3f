// cuBLASLt is opened by the first GEMM on the GPU, not when the program starts (it costs
// every process ~0.35 s to load): src/ops/cuda/cublaslt_loader.cpp. Needs a CUDA build (the
// CUDA libraries), not a GPU: cublasLtGetVersion runs without one.
#include <gtest/gtest.h>

#ifdef MCPP_HAVE_CUDA
#include <cublasLt.h>

#include <fstream>
#include <sstream>
#include <string>

#include "ops/cuda/cublaslt_loader.h"

namespace cublaslt_loader_test {

bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find(name) != std::string::npos;
}


TEST(CublasLtLoader, NotLoadedAtStartThenLoadedByTheFirstCall) {
  // A process linked against libmegatron_core.so: neither cuBLAS library is mapped.
  EXPECT_FALSE(mapped("libcublasLt.so")) << "libcublasLt is loaded at program start";
  EXPECT_FALSE(mapped("libcublas.so")) << "libcublas is loaded at program start";
  EXPECT_FALSE(mcpp::ops::cuda::cublaslt_loaded());
  // The first call through the loader opens the toolkit's cuBLASLt we compiled against.
  const size_t v = mcpp::ops::cuda::cublaslt_version();
  EXPECT_EQ(v / 10000, size_t(CUBLAS_VER_MAJOR)) << "version " << v;
  EXPECT_GE(v, size_t(CUBLAS_VER_MAJOR) * 10000 + size_t(CUBLAS_VER_MINOR) * 100);
  EXPECT_TRUE(mcpp::ops::cuda::cublaslt_loaded());
  EXPECT_TRUE(mapped("libcublasLt.so"));
}

}  // namespace cublaslt_loader_test
#endif
