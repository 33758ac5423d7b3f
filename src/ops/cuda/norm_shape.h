// The register-row shape of the LayerNorm / RMSNorm forward (ops/cuda/norms.cu) for a row of
// nvec 16-byte vectors: wpr warps hold a row, each lane nv vectors of it. One table for the
// norm kernels and for the decode GEMM that folds the RMSNorm in (ops/cuda/gemv.cu), which
// must sum a row's squares exactly as the norm kernel does to give its bits.
#pragma once
#include <cstdint>

namespace mcpp::ops::cuda {

struct NormRowShape {
  int wpr = 0, nv = 0;  // {0, 0}: the row is too long for registers (the streaming kernel)
};

// One warp a row up to 128 vectors (H = 1024 in bf16), then 2, 4, 8, 16 warps with 3 or 4
// vectors a lane.
constexpr NormRowShape norm_fwd_row_shape(int64_t nvec) {
  if (nvec <= 32) return {1, 1};
  if (nvec <= 64) return {1, 2};
  if (nvec <= 96) return {1, 3};
  if (nvec <= 128) return {1, 4};
  if (nvec <= 192) return {2, 3};
  if (nvec <= 256) return {2, 4};
  if (nvec <= 384) return {4, 3};
  if (nvec <= 512) return {4, 4};
  if (nvec <= 768) return {8, 3};
  if (nvec <= 1024) return {8, 4};
  if (nvec <= 1536) return {16, 3};
  if (nvec <= 2048) return {16, 4};
  return {};
}

}  // namespace mcpp::ops::cuda
