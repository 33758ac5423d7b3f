// The tuning helpers both cuBLASLt GEMM paths share (gemm_tuning.h): a chosen algorithm's
// configuration as text, for the tuning report, and the bitwise comparison of a candidate's
// output with the first pick's.
#include <cublasLt.h>

#include <fmt/format.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm_tuning.h"

namespace mcpp::ops::cuda {

// "algo I tile T stages S split-k K cluster C" (cuBLASLt's enum values, cublasLt.h).
std::string algo_config(const cublasLtMatmulAlgo_t& a) {
  uint32_t tile = 0, stages = 0, splitk = 0;
  uint16_t cluster = 0;
  int id = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                       nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof(stages), nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                       sizeof(splitk), nullptr);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                       sizeof(cluster), nullptr);
  return fmt::format("algo {} tile {} stages {} split-k {} cluster {}", id, tile, stages, splitk,
                     cluster);
}

namespace {
// flag |= (a[i] != b[i]) over n 16-bit words (every output dtype is 2 or 4 bytes).
__global__ void differs_kernel(const uint16_t* __restrict__ a,
                                      const uint16_t* __restrict__ b, int64_t n,
                                      unsigned* flag) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) {
      *flag = 1u;
      return;
    }
}
}  // namespace

bool device_bytes_differ(const void* a, const void* b, int64_t bytes, unsigned* flag,
                         cudaStream_t cs) {
  CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), cs));
  const int64_t n = bytes / 2;
  if (n > 0) {
    differs_kernel<<<grid_for(n, 256), 256, 0, cs>>>(static_cast<const uint16_t*>(a),
                                                     static_cast<const uint16_t*>(b), n, flag);
    MCPP_LAUNCH_CHECK();
  }
  unsigned h = 0;
  CUDA_CHECK(cudaMemcpyAsync(&h, flag, sizeof(h), cudaMemcpyDeviceToHost, cs));
  CUDA_CHECK(cudaStreamSynchronize(cs));
  return h != 0;
}

}  // namespace mcpp::ops::cuda
