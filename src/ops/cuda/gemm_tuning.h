// What the two cuBLASLt GEMM paths (gemm.cu: bf16/f16/f32; gemm_fp8.cu: FP8) share for their
// per-shape algorithm tuning: the switch, scratch memory outside the tensor pool, the owner
// of one call's descriptors, and the bitwise comparison of a candidate's output with the
// first pick's (a candidate is only taken when its bits equal the first pick's).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mcpp::ops::cuda {

// Whether a new shape's candidates are timed (true) or cuBLASLt's first pick is kept:
// MCPP_GEMM_AUTOTUNE (docs/environment.md), changed at run time by set_gemm_autotune.
bool gemm_autotune_enabled();

// Shapes that change from call to call (a MoE layer's rows per expert: M, or K in the
// weight gradient) would tune at every new size. A miss on the exact key first reuses the
// algorithm tuned for its shape class (M and K rounded up to 256 from 256 on), once cuBLASLt
// confirms that it applies; dense models' dimensions, multiples of 256, stay classes of
// their own.
inline int64_t gemm_shape_class(int64_t x) { return x < 256 ? x : (x + 255) / 256 * 256; }

// Device memory for tuning, outside the tensor pool (so it never counts in the peak the log
// reports), freed when tuning ends. p is null when the device has no room: then the
// heuristic's first pick is used.
struct TuningBuffer {
  void* p = nullptr;
  explicit TuningBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      p = nullptr;
      (void)cudaGetLastError();
    }
  }
  ~TuningBuffer() {
    if (p) cudaFree(p);
  }
  TuningBuffer(const TuningBuffer&) = delete;
  TuningBuffer& operator=(const TuningBuffer&) = delete;
};

// The cuBLASLt descriptors of one call, destroyed together.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// What a tuning report says of an algorithm: "algo I tile T stages S split-k K cluster C".
std::string algo_config(const cublasLtMatmulAlgo_t& a);

// Whether the first `bytes` (even) of device buffers a and b differ, compared as 16-bit
// words on cs; flag: one device unsigned of scratch. Synchronises cs.
bool device_bytes_differ(const void* a, const void* b, int64_t bytes, unsigned* flag,
                         cudaStream_t cs);

}  // namespace mcpp::ops::cuda
