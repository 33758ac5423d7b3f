// Shared by the CUDA op files: element conversions, dtype dispatch, launch checks.
// Activations are f32, bf16 or f16 (`act` below); statistics and parameter gradients
// are f32. Every kernel computes in f32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

// From double, one rounding (nearest even): the conversion of copy's casts (ld_d / st_d in
// elementwise.cu). For an f32 value it gives what from_f gives; ops that must match copy
// bit for bit (adamw_step's model-parameter output) use this one.
template <typename T> __device__ __forceinline__ T from_d(double v);
template <> __device__ __forceinline__ float from_d<float>(double v) { return float(v); }
template <> __device__ __forceinline__ bf16 from_d<bf16>(double v) { return __double2bfloat16(v); }
template <> __device__ __forceinline__ f16 from_d<f16>(double v) { return __double2half(v); }

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

// ---- 16-byte vector access -------------------------------------------------------------
// The memory-bound kernels move N elements of T per thread and step as whole 16-byte words
// (one LDG.128 / STG.128 each) when the launcher has checked that every pointer is 16-byte
// aligned and every row they walk is a whole number of packs; otherwise they fall back to
// their scalar kernels. Only the memory access changes: the float math per element is the
// scalar kernel's, in the same order, so both paths give bitwise-identical results.
template <typename T, int N>
struct Pack {
  static_assert(N * sizeof(T) % 16 == 0, "a Pack is a whole number of 16-byte words");
  T v[N];
};

// Raw bits of an element and back: the words are built with integer ops.
__device__ __forceinline__ uint32_t bits_of(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t bits_of(bf16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ uint32_t bits_of(f16 x) { return __half_as_ushort(x); }
template <typename T> __device__ __forceinline__ T of_bits(uint32_t b);
template <> __device__ __forceinline__ float of_bits<float>(uint32_t b) { return __uint_as_float(b); }
template <> __device__ __forceinline__ bf16 of_bits<bf16>(uint32_t b) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(b));
}
template <> __device__ __forceinline__ f16 of_bits<f16>(uint32_t b) {
  return __ushort_as_half(static_cast<unsigned short>(b));
}

// Elements per pack for kernels that read A and write B (or the reverse): 16 bytes of the
// narrower type, so the wider one moves as two (or more) 16-byte words.
template <typename A, typename B = A>
inline constexpr int kPackN = int(16 / (sizeof(A) < sizeof(B) ? sizeof(A) : sizeof(B)));

// p: 16-byte aligned. T: f32 (one element per 32-bit lane) or bf16/f16 (two, low first).
template <int N, typename T>
__device__ __forceinline__ Pack<T, N> ld_pack(const T* p) {
  constexpr int E = int(4 / sizeof(T));  // elements per 32-bit lane
  Pack<T, N> r;
#pragma unroll
  for (int k = 0; k < int(N * sizeof(T) / 16); ++k) {
    uint4 u = reinterpret_cast<const uint4*>(p)[k];
    uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      if constexpr (E == 1) {
        r.v[4 * k + l] = of_bits<T>(q[l]);
      } else {
        r.v[8 * k + 2 * l] = of_bits<T>(q[l] & 0xffffu);
        r.v[8 * k + 2 * l + 1] = of_bits<T>(q[l] >> 16);
      }
    }
  }
  return r;
}
template <int N, typename T>
__device__ __forceinline__ void st_pack(T* p, const Pack<T, N>& x) {
  constexpr int E = int(4 / sizeof(T));
#pragma unroll
  for (int k = 0; k < int(N * sizeof(T) / 16); ++k) {
    uint32_t q[4];
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      if constexpr (E == 1)
        q[l] = bits_of(x.v[4 * k + l]);
      else
        q[l] = bits_of(x.v[8 * k + 2 * l]) | (bits_of(x.v[8 * k + 2 * l + 1]) << 16);
    }
    // One st.global.v4 by hand: left to itself nvcc splits some of these stores (those at
    // run-time offsets such as `+ half`) into 4-byte pieces.
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(p) + k),
                 "r"(q[0]), "r"(q[1]), "r"(q[2]), "r"(q[3])
                 : "memory");
  }
}

inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The GPU's multiprocessors (the device current at the first call: one kind of GPU a
// process).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

// Blocks of `threads` threads (no dynamic shared memory) of `kernel` that the GPU holds at
// once: its occupancy times the multiprocessors, at least 1. Not cached: callers keep it.
template <typename K>
int64_t occupancy_blocks(K kernel, int threads) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::max<int64_t>(1, int64_t(sm_count()) * per_sm);
}

// ---- programmatic dependent launch (Hopper) --------------------------------------------
// A kernel launched with launch_dependent may start while the kernel before it in the
// stream is still running: its blocks are scheduled once every block of that kernel has
// called pdl_trigger (or exited). So the decode step's kernels -- each a few microseconds,
// launched back to back -- overlap their launch and their first weight loads with the
// previous kernel's tail instead of paying both in the gap between them.
// The contract, for every kernel launched that way:
//   - before pdl_wait it reads only what no kernel of this step writes (weights, the KV
//     cache of earlier positions) and writes nothing;
//   - pdl_wait returns once the kernel before it has completed and its writes are visible
//     (that kernel itself waited on the one before it, so on everything before);
//   - pdl_trigger after its own pdl_wait, so at most two kernels overlap.
// Launched the ordinary way (or on a GPU before sm_90) both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether a launch on cs asks for the overlap: pdl_enabled() (device.h) and cs not capturing
// a CUDA graph. Measured on an H200 (bench_decode, the 1B model; bench/RESULTS.md,
// "programmatic dependent launch of the decode kernels"): launched eagerly -- the step of
// sampled, non-greedy generation -- the overlap takes the step from 1,191-1,222 to
// 1,102-1,111 us at one row (1-4% at 8 and 64 rows); inside the greedy step's CUDA graph it
// gains nothing at 1 and 64 rows and costs 5% at 8 (1,152-1,166 against 1,214-1,221 us), so
// captured kernels are launched the ordinary way.
bool pdl_for_stream(cudaStream_t cs);

// kernel<<<grid, block, smem, cs>>>(args...) in thread-block clusters of `cluster`
// consecutive blocks along x (sm_90; grid.x a multiple of it, at most 8; 0: no clusters),
// allowed to overlap the kernel before it as above (the kernel must keep the contract).
template <typename... P, typename... A>
void launch_dependent_clusters(void (*kernel)(P...), dim3 grid, dim3 block, unsigned cluster,
                               size_t smem, cudaStream_t cs, A&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_for_stream(cs)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = cs;
  cfg.attrs = attr, cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
}
template <typename... P, typename... A>
void launch_dependent(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t cs,
                      A&&... args) {
  launch_dependent_clusters(kernel, grid, block, 0, smem, cs, std::forward<A>(args)...);
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
