// FP8 ops on CUDA (catalogue.inc's FP8 section): quantise-dequantise through the
// hardware's conversion (__nv_fp8_e4m3 / __nv_fp8_e5m2 from float: round to nearest even,
// saturating, NaN kept: the same grid as ops/fp8_grid.h, which the GPU tests check), amax
// recording and the delayed-scaling update, all on the stream with device-side scales (no
// host synchronisation). x and y: f32 or bf16 (one dtype), scales and amaxes f32.
#include <cuda_fp8.h>
#include <fmt/format.h>

#include <cfloat>
#include <string>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

__device__ __forceinline__ float round_fp8(float v, Fp8Format f) {
  if (f == Fp8Format::E4M3) return float(__nv_fp8_e4m3(v));
  return float(__nv_fp8_e5m2(v));
}

template <typename T>
__global__ void quantize_kernel(const T* x, T* y, int64_t n, Fp8Format f, const float* scale) {
  const float sc = *scale, inv = 1.0f / sc;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(round_fp8(to_f(x[i]) * sc, f) * inv);
}

// max |x| as the bits of a non-negative float: integer order is float order, NaN's bits
// (0x7fc00000 and above) exceed Inf's, so a NaN wins as in the CPU op.
__device__ __forceinline__ unsigned abs_bits(float v) {
  return v != v ? 0x7fc00000u : (__float_as_uint(v) & 0x7fffffffu);
}

template <typename T>
__global__ void amax_kernel(const T* x, int64_t n, float* amax) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, abs_bits(to_f(x[i])));
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ unsigned w[32];
  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < int(blockDim.x >> 5); ++i) m = max(m, w[i]);
    atomicMax(reinterpret_cast<unsigned*>(amax), m);
  }
}

// bf16, 16-byte aligned, n a multiple of 8: eight values a load, a packed max over their
// 15-bit magnitudes (NaN's bits above Inf's), mapped to abs_bits' float order at the end.
__global__ void amax_bf16x8_kernel(const uint4* __restrict__ x, int64_t n8, float* amax) {
  uint32_t m2 = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = x[i];
    m2 = __vmaxu2(m2, __vmaxu2(__vmaxu2(v.x & 0x7fff7fffu, v.y & 0x7fff7fffu),
                               __vmaxu2(v.z & 0x7fff7fffu, v.w & 0x7fff7fffu)));
  }
  unsigned m = max(m2 & 0xffffu, m2 >> 16);
  m = m > 0x7f80u ? 0x7fc00000u : m << 16;
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ unsigned w[32];
  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < int(blockDim.x >> 5); ++i) m = max(m, w[i]);
    atomicMax(reinterpret_cast<unsigned*>(amax), m);
  }
}

// Delayed scaling's update of one [L, K] amax history (row 0 the newest): per column the
// amax (max over the rows, or row 0 alone; NaN if any is NaN), the scale max / amax / 2^margin
// where that is finite and positive, then (roll) every row moves down one and row 0 is
// zeroed. One block: the max over the rows strided across the threads, then the in-place
// roll in chunks of blockDim elements from the end, each read before any of it is written.
constexpr int kScaleUpdateThreads = 1024;
__global__ void __launch_bounds__(kScaleUpdateThreads)
    scale_update_kernel(float* h, float* sc, int64_t L, int64_t K, int64_t e5m2, int64_t margin,
                        bool amax_max, bool roll) {
  __shared__ float wmax[kScaleUpdateThreads / 32];
  __shared__ int wnan[kScaleUpdateThreads / 32];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nw = blockDim.x >> 5;
  for (int64_t k = 0; k < K; ++k) {
    float a = 0.f;
    int nan = 0;
    const int64_t rows = amax_max ? L : 1;
    for (int64_t r = t; r < rows; r += blockDim.x) {
      const float v = h[r * K + k];
      nan |= v != v;
      a = fmaxf(a, v);
    }
    for (int o = 16; o > 0; o >>= 1) {
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      nan |= __shfl_xor_sync(0xffffffffu, nan, o);
    }
    if (lane == 0) wmax[warp] = a, wnan[warp] = nan;
    __syncthreads();
    if (t == 0) {
      // The serial rule: the max of the column's values (amaxes are >= 0), NaN if any is.
      float m = h[k];
      int any = m != m;
      for (int w = 0; w < nw; ++w) m = fmaxf(m, wmax[w]), any |= wnan[w];
      if (any) m = NAN;
      const double mx = (e5m2 >> k) & 1 ? 57344.0 : 448.0;
      if (isfinite(m) && m > 0) {
        const float v = float(mx / double(m) / ldexp(1.0, int(margin)));
        sc[k] = isfinite(v) ? v : FLT_MAX;
      }
    }
    __syncthreads();
  }
  if (!roll) return;
  // h[i] = h[i - K] for i >= K, from the top down, one chunk at a time.
  const int64_t n = L * K;
  for (int64_t hi = n; hi > K; hi -= blockDim.x) {
    const int64_t i = hi - blockDim.x + t;
    const bool mine = i >= K && i < hi;
    const float v = mine ? h[i - K] : 0.f;
    __syncthreads();
    if (mine) h[i] = v;
    __syncthreads();
  }
  for (int64_t k = t; k < K; k += blockDim.x) h[k] = 0.f;
}

// Cast + transpose + amax, the general path (f32 input, ragged shapes; the fast paths are
// below): one 32 x 32 tile of x per block (32 x 8 threads, 4 rows each),
// read once, coalesced; the FP8 bytes go out row-wise directly and column-wise through
// shared memory. The amax is a per-block max, then one atomicMax on its bits.
template <typename T, typename F8>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t R, int64_t C,
                                      const float* scale, F8* q, F8* qt, float* amax,
                                      float* scale_inv) {
  __shared__ uint8_t tile[32][33];
  __shared__ unsigned wmax[8];
  const float sc = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  unsigned m = 0;
  for (int i = ty; i < 32; i += 8) {
    const int64_t r = r0 + i, c = c0 + tx;
    uint8_t b = 0;
    if (r < R && c < C) {
      const float v = to_f(x[r * C + c]);
      m = max(m, abs_bits(v));
      const F8 f(v * sc);
      b = f.__x;
      if (q) q[r * C + c] = f;
    }
    tile[i][tx] = b;
  }
  if (amax) {
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (tx == 0) wmax[ty] = m;
  }
  __syncthreads();
  if (amax && tx == 0 && ty == 0) {
    for (int i = 1; i < 8; ++i) m = max(m, wmax[i]);
    atomicMax(reinterpret_cast<unsigned*>(amax), m);
  }
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0) *scale_inv = 1.0f / sc;
  if (qt)
    for (int i = ty; i < 32; i += 8) {  // qt[c, r] for c = c0 + i, r = r0 + tx
      const int64_t c = c0 + i, r = r0 + tx;
      if (r < R && c < C) qt[c * R + r].__x = tile[tx][i];
    }
}

// The fast paths (bf16 input, both dimensions multiples of 16, 16-byte aligned pointers:
// every shape the FP8 GEMMs accept): a column-wise copy (alone or with the row-wise one)
// comes from fp8_fused.cu's tiled kernel without an element function, a row-wise copy
// alone from cast_rowwise_kernel below. Both convert two values per instruction
// (cvt.rn.satfinite: the same rounding as the scalar path and the emulation) and take the
// amax as a packed max over the bf16 bits (|v| as 15-bit integers, NaN above Inf).
constexpr int kVecRows = 128;  // the tiled kernel's rows per block (its grid's y limit)

template <bool E4M3>
__device__ __forceinline__ uint32_t cvt2(uint32_t bf2, float sc) {
  const float2 f =
      make_float2(__uint_as_float(bf2 << 16) * sc, __uint_as_float(bf2 & 0xffff0000u) * sc);
  return __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// Row-wise only (the forward's input cast): no transpose, so a plain coalesced pass:
// each thread converts 8 values a time (a 16-byte load, an 8-byte store), consecutive
// threads consecutive in memory, four loads issued before their conversions.
template <bool E4M3>
__global__ void __launch_bounds__(256)
    cast_rowwise_kernel(const uint4* __restrict__ x, int64_t n8, const float* __restrict__ scale,
                        uint2* __restrict__ q, float* amax, float* scale_inv) {
  const float sc = *scale;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t m2 = 0;
  for (int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i0 < n8; i0 += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = i0 + u * stride < n8 ? x[i0 + u * stride] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      m2 = __vmaxu2(m2, __vmaxu2(__vmaxu2(v[u].x & 0x7fff7fffu, v[u].y & 0x7fff7fffu),
                                 __vmaxu2(v[u].z & 0x7fff7fffu, v[u].w & 0x7fff7fffu)));
      if (i0 + u * stride < n8)
        q[i0 + u * stride] = make_uint2(cvt2<E4M3>(v[u].x, sc) | (cvt2<E4M3>(v[u].y, sc) << 16),
                                        cvt2<E4M3>(v[u].z, sc) | (cvt2<E4M3>(v[u].w, sc) << 16));
    }
  }
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / sc;
  if (!amax) return;
  unsigned m = max(m2 & 0xffffu, m2 >> 16);
  m = m > 0x7f80u ? 0x7fc00000u : m << 16;
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ unsigned w[8];
  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < 8; ++i) m = max(m, w[i]);
    atomicMax(reinterpret_cast<unsigned*>(amax), m);
  }
}

template <bool E4M3>
void launch_cast_rowwise(const bf16* x, int64_t R, int64_t C, const float* scale, uint8_t* q,
                         float* amax, float* scale_inv, cudaStream_t st) {
  // R * C is a multiple of 256, so of 8
  cast_rowwise_kernel<E4M3><<<grid_for(R * C / 8, 256, 132 * 8), 256, 0, st>>>(
      reinterpret_cast<const uint4*>(x), R * C / 8, scale, reinterpret_cast<uint2*>(q), amax,
      scale_inv);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename F8>
void launch_cast_transpose(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt,
                           Tensor& amax, Tensor& scale_inv, int64_t R, int64_t C, Stream& s) {
  dim3 block(32, 8), grid(unsigned((C + 31) / 32), unsigned((R + 31) / 32));
  F8* qp = q.defined() ? static_cast<F8*>(q.raw()) : nullptr;
  F8* qtp = qt.defined() ? static_cast<F8*>(qt.raw()) : nullptr;
  float* ap = amax.defined() ? amax.data<float>() : nullptr;
  float* sip = scale_inv.defined() ? scale_inv.data<float>() : nullptr;
  if (x.dtype() == DType::BF16 && R % 16 == 0 && C % 16 == 0 && aligned16(x.raw()) && qp &&
      !qtp && aligned16(qp)) {
    const auto* xb = static_cast<const bf16*>(x.raw());
    auto* q8 = reinterpret_cast<uint8_t*>(qp);
    if (std::is_same_v<F8, __nv_fp8_e4m3>)
      launch_cast_rowwise<true>(xb, R, C, scale.data<float>(), q8, ap, sip, stream_of(s));
    else
      launch_cast_rowwise<false>(xb, R, C, scale.data<float>(), q8, ap, sip, stream_of(s));
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (x.dtype() == DType::F32)
    cast_transpose_kernel<float, F8><<<grid, block, 0, stream_of(s)>>>(
        x.data<float>(), R, C, scale.data<float>(), qp, qtp, ap, sip);
  else
    cast_transpose_kernel<bf16, F8><<<grid, block, 0, stream_of(s)>>>(
        static_cast<const bf16*>(x.raw()), R, C, scale.data<float>(), qp, qtp, ap, sip);
  CUDA_CHECK(cudaGetLastError());
}

void check_act(const Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16,
             "{}: {} is {}, expected f32 or bf16", op, name, t.str());
}

}  // namespace

void fp8_quantize(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& y, Stream& s) {
  const char* op = "fp8_quantize";
  check_act(x, op, "x");
  check_act(y, op, "y");
  MCPP_CHECK(x.dtype() == y.dtype(), "{}: x {} and y {} differ in dtype", op, x.str(), y.str());
  check_numel(y, x.numel(), op, "y");
  check_f32(scale, op, "scale");
  check_numel(scale, 1, op, "scale");
  const int64_t n = x.numel();
  if (n == 0) return;
  const int th = 256;
  if (x.dtype() == DType::F32)
    quantize_kernel<float><<<grid_for(n, th), th, 0, stream_of(s)>>>(
        x.data<float>(), y.data<float>(), n, fmt, scale.data<float>());
  else
    quantize_kernel<bf16><<<grid_for(n, th), th, 0, stream_of(s)>>>(
        static_cast<const bf16*>(x.raw()), static_cast<bf16*>(y.raw()), n, fmt,
        scale.data<float>());
  CUDA_CHECK(cudaGetLastError());
}

void fp8_amax(const Tensor& x, Tensor& amax, Stream& s) {
  const char* op = "fp8_amax";
  check_act(x, op, "x");
  check_f32(amax, op, "amax");
  check_numel(amax, 1, op, "amax");
  const int64_t n = x.numel();
  if (n == 0) return;
  const int th = 256;
  if (x.dtype() == DType::F32)
    amax_kernel<float>
        <<<grid_for(n, th, 1024), th, 0, stream_of(s)>>>(x.data<float>(), n, amax.data<float>());
  else if (n % 8 == 0 && (reinterpret_cast<uintptr_t>(x.raw()) & 15) == 0)
    amax_bf16x8_kernel<<<grid_for(n / 8, th, 1056), th, 0, stream_of(s)>>>(
        static_cast<const uint4*>(x.raw()), n / 8, amax.data<float>());
  else
    amax_kernel<bf16><<<grid_for(n, th, 1024), th, 0, stream_of(s)>>>(
        static_cast<const bf16*>(x.raw()), n, amax.data<float>());
  CUDA_CHECK(cudaGetLastError());
}

void fp8_scale_update(Tensor& history, Tensor& scale, int64_t e5m2_columns, int64_t margin,
                      bool amax_max, bool roll, Stream& s) {
  const char* op = "fp8_scale_update";
  check_f32(history, op, "history");
  check_f32(scale, op, "scale");
  MCPP_CHECK(history.dim() == 2 && history.size(1) == scale.numel(),
             "{}: history {} and scale {} do not match ([L, K] and [K])", op, history.str(),
             scale.str());
  scale_update_kernel<<<1, kScaleUpdateThreads, 0, stream_of(s)>>>(history.data<float>(), scale.data<float>(),
                                                 history.size(0), history.size(1), e5m2_columns,
                                                 margin, amax_max, roll);
  CUDA_CHECK(cudaGetLastError());
}

void fp8_cast_transpose(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& q, Tensor& qt,
                        Tensor& amax, Tensor& scale_inv, Stream& s) {
  const char* op = "fp8_cast_transpose";
  check_act(x, op, "x");
  MCPP_CHECK(x.dim() == 2, "{}: x {} must be 2-D [R, C]", op, x.str());
  const int64_t R = x.size(0), C = x.size(1);
  check_f32(scale, op, "scale");
  const DType f8 = fmt == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2;
  if (q.defined()) {
    check_cuda(q, op, "q");
    MCPP_CHECK(q.dtype() == f8 && q.shape() == x.shape(), "{}: q {} for x {}, expected {}", op,
               q.str(), x.str(), dtype_name(f8));
  }
  if (qt.defined()) {
    check_cuda(qt, op, "qt");
    MCPP_CHECK(qt.dtype() == f8 && qt.shape() == (Shape{C, R}),
               "{}: qt {} for x {}, expected {} "
               "[{}, {}]",
               op, qt.str(), x.str(), dtype_name(f8), C, R);
  }
  if (amax.defined()) check_f32(amax, op, "amax");
  if (scale_inv.defined()) check_f32(scale_inv, op, "scale_inv");
  if (R == 0 || C == 0) return;
  if (qt.defined() && x.dtype() == DType::BF16 && R % 16 == 0 && C % 16 == 0 &&
      aligned16(x.raw()) && (!q.defined() || aligned16(q.raw())) && aligned16(qt.raw()) &&
      R <= 65535LL * kVecRows) {
    Tensor none;  // a column-wise copy: the tiled kernel, no element function, no db
    cuda::fp8_cast_transpose_dbias(x, fmt, scale, q, qt, amax, scale_inv, none, s);
    return;
  }
  if (fmt == Fp8Format::E4M3)
    launch_cast_transpose<__nv_fp8_e4m3>(x, scale, q, qt, amax, scale_inv, R, C, s);
  else
    launch_cast_transpose<__nv_fp8_e5m2>(x, scale, q, qt, amax, scale_inv, R, C, s);
}

bool fp8_gemm_supported(std::string* why) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    if (why) *why = "no CUDA device could be queried";
    return false;
  }
  if (prop.major * 10 + prop.minor >= 89) return true;
  if (why)
    *why = fmt::format(
        "{} (compute capability {}.{}) has no FP8 tensor cores (8.9 or newer "
        "needed)",
        prop.name, prop.major, prop.minor);
  return false;
}

}  // namespace mcpp::ops::cuda
