// Shared by the CUDA op files: element conversions, dtype dispatch, launch checks.
// Activations are f32, bf16 or f16 (`act` below); statistics and parameter gradients
// are f32. Every kernel computes in f32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/device.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// ---- element conversions (round to nearest even on the way down) -------------------
template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f<bf16>(bf16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<f16>(f16 x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half_rn(x); }

inline cudaStream_t stream_of(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

// Grid size for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65536) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return unsigned(b < max_blocks ? b : max_blocks);
}

// Argument checks shared by the launchers.
inline void check_cuda(const Tensor& t, const char* op, const char* name) {
  MCPP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  MCPP_CHECK(t.device() == Device::CUDA, "{}: {} is {}, expected a CUDA tensor", op, name,
             t.str());
}
inline void check_f32(const Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::F32, "{}: {} is {}, expected f32 (statistics and parameter "
             "gradients are f32 on CUDA)", op, name, t.str());
}
inline void check_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  MCPP_CHECK(t.numel() == n, "{}: {} is {}, expected {} elements", op, name, t.str(), n);
}

}  // namespace mcpp::ops::cuda

// Runs `__VA_ARGS__` with `T` bound to the C++ type of activation dtype `dt`
// (f32, bf16, f16); any other dtype is an error naming the op.
#define MCPP_DISPATCH_ACT(dt, op, ...)                                                       \
  do {                                                                                       \
    switch (dt) {                                                                            \
      case ::mcpp::DType::F32: { using T = float; __VA_ARGS__; break; }                       \
      case ::mcpp::DType::BF16: { using T = ::mcpp::ops::cuda::bf16; __VA_ARGS__; break; }    \
      case ::mcpp::DType::F16: { using T = ::mcpp::ops::cuda::f16; __VA_ARGS__; break; }      \
      default:                                                                               \
        MCPP_FAIL("{}: dtype {} is not supported on CUDA (f32, bf16, f16 are)", op,          \
                  ::mcpp::dtype_name(dt));                                                   \
    }                                                                                        \
  } while (0)

// Same, binding `T2` (for a second tensor of independent dtype).
#define MCPP_DISPATCH_ACT2(dt, op, ...)                                                      \
  do {                                                                                       \
    switch (dt) {                                                                            \
      case ::mcpp::DType::F32: { using T2 = float; __VA_ARGS__; break; }                      \
      case ::mcpp::DType::BF16: { using T2 = ::mcpp::ops::cuda::bf16; __VA_ARGS__; break; }   \
      case ::mcpp::DType::F16: { using T2 = ::mcpp::ops::cuda::f16; __VA_ARGS__; break; }     \
      default:                                                                               \
        MCPP_FAIL("{}: dtype {} is not supported on CUDA (f32, bf16, f16 are)", op,          \
                  ::mcpp::dtype_name(dt));                                                   \
    }                                                                                        \
  } while (0)

// After every launch: the launch configuration error, with file:line.
#define MCPP_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
