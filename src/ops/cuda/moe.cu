// MoE token permutation and probability ops (catalogue.inc, ---- MoE): deterministic kernels
// (no atomics: each output element is one thread's fixed-order sum). Activations
// f32/bf16/f16; p and row-dot outputs f32; index tensors i64. Where rows are whole 16-byte
// words and aligned, the row kernels move them as packs (a row per block-row of threads, no
// per-element index division); the math per element is the scalar kernels', in the same
// order, so both paths give the same bits.
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

template <typename T>
__global__ void permute_kernel(const T* __restrict__ x, const int64_t* __restrict__ src,
                               T* __restrict__ y, int64_t N, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i - n * H;
    y[i] = x[src[n] * H + h];
  }
}

template <typename T>
__global__ void unpermute_kernel(const T* __restrict__ y, const int64_t* __restrict__ off,
                                 const int64_t* __restrict__ rows, T* __restrict__ out, int64_t T_,
                                 int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T_ * H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, h = i - t * H;
    float acc = 0.f;
    for (int64_t r = off[t]; r < off[t + 1]; ++r) acc += to_f(y[rows[r] * H + h]);
    out[i] = from_f<T>(acc);
  }
}

template <typename T>
__global__ void scale_rows_kernel(const T* __restrict__ x, const float* __restrict__ p, T* y,
                                  int64_t N, int64_t F) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * F;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(x[i]) * p[i / F]);
}

// One warp per row: lanes stride the row, then a fixed butterfly reduction.
template <typename T>
__global__ void row_dot_kernel(const T* __restrict__ a, const T* __restrict__ b,
                               float* __restrict__ out, int64_t N, int64_t F) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N) return;
  float acc = 0.f;
  for (int64_t f = lane; f < F; f += 32) acc += to_f(a[warp * F + f]) * to_f(b[warp * F + f]);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) out[warp] = acc;
}

// The packed forms: rows of H elements as H/N packs of N (16 bytes); grid-stride over packs.
template <typename T, int N>
__global__ void permute_pack_kernel(const T* __restrict__ x, const int64_t* __restrict__ src,
                                    T* __restrict__ y, int64_t N_, int64_t HP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N_ * HP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / HP, c = i - n * HP;
    st_pack<N>(y + (n * HP + c) * N, ld_pack<N>(x + (src[n] * HP + c) * N));
  }
}

template <typename T, int N>
__global__ void unpermute_pack_kernel(const T* __restrict__ y, const int64_t* __restrict__ off,
                                      const int64_t* __restrict__ rows, T* __restrict__ out,
                                      int64_t T_, int64_t HP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T_ * HP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / HP, c = i - t * HP;
    float acc[N];
#pragma unroll
    for (int q = 0; q < N; ++q) acc[q] = 0.f;
    for (int64_t r = off[t]; r < off[t + 1]; ++r) {
      const Pack<T, N> v = ld_pack<N>(y + (rows[r] * HP + c) * N);
#pragma unroll
      for (int q = 0; q < N; ++q) acc[q] += to_f(v.v[q]);
    }
    Pack<T, N> o;
#pragma unroll
    for (int q = 0; q < N; ++q) o.v[q] = from_f<T>(acc[q]);
    st_pack<N>(out + (t * HP + c) * N, o);
  }
}

template <typename T, int N>
__global__ void scale_rows_pack_kernel(const T* __restrict__ x, const float* __restrict__ p,
                                       T* y, int64_t N_, int64_t FP) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N_ * FP;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float pn = p[i / FP];
    const Pack<T, N> v = ld_pack<N>(x + i * N);
    Pack<T, N> o;
#pragma unroll
    for (int q = 0; q < N; ++q) o.v[q] = from_f<T>(to_f(v.v[q]) * pn);
    st_pack<N>(y + i * N, o);
  }
}

// Whether rows of `width` elements of T can move as 16-byte packs between these pointers.
template <typename T>
bool packable(int64_t width, std::initializer_list<const void*> ptrs) {
  if (width % kPackN<T> != 0) return false;
  for (const void* p : ptrs)
    if (!is_aligned16(p)) return false;
  return true;
}

void check_index(const Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::I64, "{}: {} is {}, expected i64", op, name, t.str());
}

}  // namespace

void gather_rows(const Tensor& x, const Tensor& src, Tensor& y, Stream& s) {
  check_cuda(x, "gather_rows", "x");
  check_cuda(y, "gather_rows", "y");
  check_index(src, "gather_rows", "src");
  MCPP_CHECK(x.dtype() == y.dtype(), "gather_rows: x {} and y {} differ in dtype", x.str(), y.str());
  const int64_t N = src.numel(), H = N ? y.numel() / N : 0;
  if (N * H == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), "gather_rows", {
    constexpr int P = kPackN<T>;
    if (packable<T>(H, {x.raw(), y.raw()}))
      permute_pack_kernel<T, P><<<grid_for(N * H / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), src.data<int64_t>(), static_cast<T*>(y.raw()), N,
          H / P);
    else
      permute_kernel<T><<<grid_for(N * H, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), src.data<int64_t>(), static_cast<T*>(y.raw()), N, H);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_unpermute(const Tensor& y, const Tensor& offsets, const Tensor& rows, Tensor& out,
                   Stream& s) {
  check_cuda(y, "moe_unpermute", "y");
  check_cuda(out, "moe_unpermute", "out");
  check_index(offsets, "moe_unpermute", "offsets");
  check_index(rows, "moe_unpermute", "rows");
  MCPP_CHECK(y.dtype() == out.dtype(), "moe_unpermute: y {} and out {} differ in dtype", y.str(),
             out.str());
  const int64_t T_ = offsets.numel() - 1, H = T_ > 0 ? out.numel() / T_ : 0;
  if (T_ * H == 0) return;
  MCPP_DISPATCH_ACT(out.dtype(), "moe_unpermute", {
    constexpr int P = kPackN<T>;
    if (packable<T>(H, {y.raw(), out.raw()}))
      unpermute_pack_kernel<T, P><<<grid_for(T_ * H / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(y.raw()), offsets.data<int64_t>(), rows.data<int64_t>(),
          static_cast<T*>(out.raw()), T_, H / P);
    else
      unpermute_kernel<T><<<grid_for(T_ * H, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(y.raw()), offsets.data<int64_t>(), rows.data<int64_t>(),
          static_cast<T*>(out.raw()), T_, H);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_scale_rows(const Tensor& x, const Tensor& p, Tensor& y, Stream& s) {
  check_cuda(x, "moe_scale_rows", "x");
  check_cuda(y, "moe_scale_rows", "y");
  check_f32(p, "moe_scale_rows", "p");
  const int64_t N = p.numel(), F = N ? x.numel() / N : 0;
  check_numel(y, N * F, "moe_scale_rows", "y");
  if (N * F == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), "moe_scale_rows", {
    constexpr int P = kPackN<T>;
    if (packable<T>(F, {x.raw(), y.raw()}))
      scale_rows_pack_kernel<T, P><<<grid_for(N * F / P, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), p.data<float>(), static_cast<T*>(y.raw()), N, F / P);
    else
      scale_rows_kernel<T><<<grid_for(N * F, 256), 256, 0, stream_of(s)>>>(
          static_cast<const T*>(x.raw()), p.data<float>(), static_cast<T*>(y.raw()), N, F);
  });
  MCPP_LAUNCH_CHECK();
}

void moe_row_dot(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  check_cuda(a, "moe_row_dot", "a");
  check_cuda(b, "moe_row_dot", "b");
  check_f32(out, "moe_row_dot", "out");
  const int64_t N = out.numel(), F = N ? a.numel() / N : 0;
  check_numel(b, N * F, "moe_row_dot", "b");
  if (N == 0) return;
  MCPP_DISPATCH_ACT(a.dtype(), "moe_row_dot",
                    row_dot_kernel<T><<<unsigned((N * 32 + 255) / 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(a.raw()), static_cast<const T*>(b.raw()),
                        out.data<float>(), N, F));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
