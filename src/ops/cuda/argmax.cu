// argmax_rows, CUDA backend (the catalogue's `---- inference` section): greedy decoding on
// the device, ids[r] = the first index of the largest of logits[r, 0 .. V). A block per
// row; each thread compares a strided part of the row, then a warp and a block reduction
// of (value, index) keep the larger value, the lower index on ties; a NaN never wins. The
// CPU backend (ops/cpu/decode.cpp) is the reference (tests/serve/decode_gpu_test.cpp).
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

// (v, i) beats (bv, bi): larger, or equal and earlier; NaN never beats.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

// A block of kArgmaxThreads per row. Where the row's base is 16-byte aligned each thread
// reads whole 16-byte words w = tid, tid + kArgmaxThreads, ..., kArgmaxWords of them
// requested before the first is compared (a 32K vocabulary in one round of loads: the
// one-block scan of 2-byte loads this replaced took 22 us a row on an H200, ncu); elements
// at V or beyond are skipped. Otherwise element by element. The (value, lowest index) winner
// is the same in any order of comparison, so the result does not depend on the split.
constexpr int kArgmaxThreads = 1024, kArgmaxWords = 4;

template <typename T>
__device__ __forceinline__ void argmax_word(const uint4& u, int64_t i0, int64_t V, float& bv,
                                            int64_t& bi) {
  constexpr int E = int(16 / sizeof(T));
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const float v = to_f(e[j]);
    if (i0 + j < V && better(v, i0 + j, bv, bi)) bv = v, bi = i0 + j;
  }
}

template <typename T>
static __global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const T* __restrict__ x, int64_t V, int64_t Vp, int64_t* __restrict__ ids,
                       bool vec) {
  __shared__ float bv_s[32];
  __shared__ int64_t bi_s[32];
  pdl_wait();  // (launch_dependent: x is the step's logits)
  pdl_trigger();
  const T* row = x + int64_t(blockIdx.x) * Vp;
  float bv = -INFINITY;
  int64_t bi = INT64_MAX;
  if (vec) {
    constexpr int E = int(16 / sizeof(T));
    const int64_t words = (V + E - 1) / E;
    const uint4* r4 = reinterpret_cast<const uint4*>(row);
    for (int64_t w0 = threadIdx.x; w0 < words; w0 += int64_t(kArgmaxThreads) * kArgmaxWords) {
      uint4 u[kArgmaxWords];
#pragma unroll
      for (int k = 0; k < kArgmaxWords; ++k) {
        const int64_t w = w0 + int64_t(k) * kArgmaxThreads;
        if (w < words) u[k] = __ldg(r4 + w);
      }
#pragma unroll
      for (int k = 0; k < kArgmaxWords; ++k) {
        const int64_t w = w0 + int64_t(k) * kArgmaxThreads;
        if (w < words) argmax_word<T>(u[k], w * E, V, bv, bi);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const float v = to_f(row[i]);
      if (better(v, i, bv, bi)) bv = v, bi = i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  if (lane == 0) bv_s[warp] = bv, bi_s[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w)
      if (better(bv_s[w], bi_s[w], bv, bi)) bv = bv_s[w], bi = bi_s[w];
    ids[blockIdx.x] = bi == INT64_MAX ? 0 : bi;  // every value NaN: index 0, as the CPU
  }
}

}  // namespace

void argmax_rows(const Tensor& logits, int64_t V, Tensor& ids, Stream& s) {
  const char* op = "argmax_rows";
  check_cuda(logits, op, "logits");
  check_cuda(ids, op, "ids");
  MCPP_CHECK(logits.dim() >= 1, "{}: logits {} has no rows", op, logits.str());
  const int64_t Vp = logits.size(-1), R = logits.numel() / std::max<int64_t>(Vp, 1);
  MCPP_CHECK(V > 0 && V <= Vp, "{}: V={} outside (0, {}]", op, V, Vp);
  MCPP_CHECK(ids.dtype() == DType::I64 && ids.numel() == R, "{}: ids {} is not i64 [{}]", op,
             ids.str(), R);
  if (R == 0) return;
  const bool vec = is_aligned16(logits.raw()) &&
                   (Vp * int64_t(dtype_size(logits.dtype()))) % 16 == 0;
  MCPP_DISPATCH_ACT(logits.dtype(), op, {
    launch_dependent(argmax_rows_kernel<T>, unsigned(R), kArgmaxThreads, 0, stream_of(s),
                     static_cast<const T*>(logits.raw()), V, Vp, ids.data<int64_t>(), vec);
    MCPP_LAUNCH_CHECK();
  });
}

}  // namespace mcpp::ops::cuda
