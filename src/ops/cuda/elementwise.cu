// Elementwise ops on CUDA: fill, copy (dtype casts and host <-> device transfers), add,
// axpy, scale, and the two reductions the optimizer needs (sum of squares in f64,
// non-finite check). Element types are read at run time (the branch is uniform, so it
// costs little next to the memory traffic); the hot cases take templated 16-byte vector
// paths (common.cuh) when every pointer is 16-byte aligned: fill (any dtype the scalar
// path writes), casts between f32/bf16/f16, add of one activation dtype, axpy/scale of
// activation dtypes. They convert and compute exactly as the scalar kernels (casts go
// through double as ld_d/st_d do), so results are bitwise the same; tails past the last
// whole pack are done element by element.
#include <cmath>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

// Run-time typed element access. Integers and f64 go through double, exactly.
struct DPtr {
  void* p;
  DType t;
};

__device__ __forceinline__ double ld_d(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return __bfloat162float(static_cast<const bf16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const f16*>(p)[i]);
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return double(static_cast<const int64_t*>(p)[i]);
    default: return 0;
  }
}
__device__ __forceinline__ void st_d(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = float(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    // From double directly: one rounding, which equals f32-then-bf16 for f32 inputs.
    case DType::BF16: static_cast<bf16*>(p)[i] = __double2bfloat16(v); break;
    case DType::F16: static_cast<f16*>(p)[i] = __double2half(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = int64_t(v); break;
    default: break;
  }
}

static __global__ void cast_kernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st_d(dst, dt, i, ld_d(src, st, i));
}

static __global__ void fill_kernel(void* dst, DType dt, int64_t n, double v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    st_d(dst, dt, i, v);
}

// fill, 16 bytes per store: the element's bits are made once per thread by st_d (the
// scalar path's conversion) and repeated across the word. es = element size in bytes.
static __global__ void fill_vec_kernel(void* dst, DType dt, int es, int64_t n, double v) {
  uint64_t bits = 0;
  st_d(&bits, dt, 0, v);  // little-endian: the element lands in the low es bytes
  uint32_t w = es == 1   ? uint32_t(bits & 0xffu) * 0x01010101u
               : es == 2 ? uint32_t(bits & 0xffffu) * 0x00010001u
                         : uint32_t(bits);
  uint4 word = es == 8 ? make_uint4(uint32_t(bits), uint32_t(bits >> 32), uint32_t(bits),
                                    uint32_t(bits >> 32))
                       : make_uint4(w, w, w, w);
  int64_t nw = n * es / 16, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < nw; i += stride) static_cast<uint4*>(dst)[i] = word;
  for (int64_t i = nw * 16 / es + tid; i < n; i += stride) st_d(dst, dt, i, v);
}

// Typed casts between activation dtypes, as ld_d / st_d convert them (through double,
// from_d in common.cuh).

template <typename TS, typename TD>
static __global__ void cast_vec_kernel(const TS* __restrict__ src, TD* __restrict__ dst,
                                       int64_t n) {
  constexpr int N = kPackN<TS, TD>;
  int64_t nv = n / N, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    Pack<TS, N> a = ld_pack<N>(src + v * N);
    Pack<TD, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_d<TD>(double(to_f(a.v[k])));
    st_pack(dst + v * N, o);
  }
  for (int64_t i = nv * N + tid; i < n; i += stride) dst[i] = from_d<TD>(double(to_f(src[i])));
}

// out = a + b; y = alpha*x + beta*y; generic dtypes, f32 arithmetic (f64 when any is f64).
static __global__ void add_generic_kernel(const void* a, DType at, const void* b, DType bt,
                                          void* out, DType ot, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (ot == DType::F64)
      st_d(out, ot, i, ld_d(a, at, i) + ld_d(b, bt, i));
    else
      st_d(out, ot, i, double(float(ld_d(a, at, i)) + float(ld_d(b, bt, i))));
  }
}
static __global__ void axpby_generic_kernel(float alpha, const void* x, DType xt, float beta,
                                            void* y, DType yt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float xv = x ? float(ld_d(x, xt, i)) : 0.f;
    float yv = float(ld_d(y, yt, i));
    st_d(y, yt, i, double(fmaf(alpha, xv, beta * yv)));
  }
}

// Vectorised same-dtype paths: 16 bytes per access.
template <typename T>
struct alignas(16) Vec {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

template <typename T>
static __global__ void add_vec_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                      T* out, int64_t n) {
  constexpr int N = Vec<T>::N;
  int64_t nv = n / N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nv;
       i += int64_t(gridDim.x) * blockDim.x) {
    Vec<T> va = reinterpret_cast<const Vec<T>*>(a)[i];
    Vec<T> vb = reinterpret_cast<const Vec<T>*>(b)[i];
    Vec<T> vo;
#pragma unroll
    for (int k = 0; k < N; ++k) vo.v[k] = from_f<T>(to_f(va.v[k]) + to_f(vb.v[k]));
    reinterpret_cast<Vec<T>*>(out)[i] = vo;
  }
  for (int64_t i = nv * N + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

// y = alpha * x + beta * y with x of type TX, y of type TY (x may be null: pure scale);
// 16-byte packs (x and y aligned), then the tail element by element.
template <typename TX, typename TY>
static __global__ void axpby_pack_kernel(float alpha, const TX* __restrict__ x, float beta, TY* y,
                                         int64_t n) {
  constexpr int N = kPackN<TX, TY>;
  int64_t nv = n / N, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t v = tid; v < nv; v += stride) {
    Pack<TY, N> yv = ld_pack<N>(y + v * N);
    if (x) {
      Pack<TX, N> xv = ld_pack<N>(x + v * N);
#pragma unroll
      for (int k = 0; k < N; ++k)
        yv.v[k] = from_f<TY>(fmaf(alpha, to_f(xv.v[k]), beta * to_f(yv.v[k])));
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) yv.v[k] = from_f<TY>(fmaf(alpha, 0.f, beta * to_f(yv.v[k])));
    }
    st_pack(y + v * N, yv);
  }
  for (int64_t i = nv * N + tid; i < n; i += stride)
    y[i] = from_f<TY>(fmaf(alpha, x ? to_f(x[i]) : 0.f, beta * to_f(y[i])));
}

// The same with element accesses, for unaligned pointers.
template <typename TX, typename TY>
static __global__ void axpby_vec_kernel(float alpha, const TX* __restrict__ x, float beta, TY* y,
                                        int64_t n) {
  constexpr int N = Vec<TY>::N >= Vec<TX>::N ? Vec<TX>::N : Vec<TY>::N;  // elements per step
  int64_t nv = n / N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nv;
       i += int64_t(gridDim.x) * blockDim.x) {
    TY yv[N];
    TX xv[N];
#pragma unroll
    for (int k = 0; k < N; ++k) yv[k] = y[i * N + k];
    if (x) {
#pragma unroll
      for (int k = 0; k < N; ++k) xv[k] = x[i * N + k];
    }
#pragma unroll
    for (int k = 0; k < N; ++k)
      y[i * N + k] = from_f<TY>(fmaf(alpha, x ? to_f(xv[k]) : 0.f, beta * to_f(yv[k])));
  }
  for (int64_t i = nv * N + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<TY>(fmaf(alpha, x ? to_f(x[i]) : 0.f, beta * to_f(y[i])));
}

constexpr int kReduceBlocks = 1024;

static __global__ void sum_squares_kernel(const void* x, DType t, int64_t n, double* partial) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = ld_d(x, t, i);
    acc += v * v;
  }
  __shared__ double sh[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  }
}

static __global__ void dot_kernel(const void* x, DType tx, const void* y, DType ty, int64_t n,
                                  double* partial) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    acc += ld_d(x, tx, i) * ld_d(y, ty, i);
  __shared__ double sh[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  }
}

// y[C, R] = x[R, C]^T on elements of E bytes (one thread per element: used on [B, S] ids).
template <typename E>
static __global__ void transpose_kernel(const E* __restrict__ x, E* __restrict__ y, int64_t R,
                                        int64_t C) {
  int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = i / R, r = i - k * R;  // output (k, r) reads input (r, k)
    y[i] = x[r * C + k];
  }
}

static __global__ void nonfinite_kernel(const void* x, DType t, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (!isfinite(ld_d(x, t, i))) {
      *flag = 1;
      return;
    }
  }
}

bool is_act(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

void cast_on_device(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t cs) {
  if (n == 0) return;
  if (is_act(st) && is_act(dt) && is_aligned16(src) && is_aligned16(dst)) {
    MCPP_DISPATCH_ACT(st, "copy", MCPP_DISPATCH_ACT2(dt, "copy", {
                        cast_vec_kernel<T, T2>
                            <<<grid_for(n / kPackN<T, T2> + 1, 256), 256, 0, cs>>>(
                                static_cast<const T*>(src), static_cast<T2*>(dst), n);
                      }));
  } else {
    cast_kernel<<<grid_for(n, 256), 256, 0, cs>>>(src, st, dst, dt, n);
  }
  MCPP_LAUNCH_CHECK();
}

// The dtypes st_d writes (fill's vector path repeats its bits).
bool st_d_writes(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16 ||
         t == DType::I32 || t == DType::I64;
}

}  // namespace

void fill(Tensor& x, double value, Stream& s) {
  check_cuda(x, "fill", "x");
  int64_t n = x.numel();
  if (n == 0) return;
  if (st_d_writes(x.dtype()) && is_aligned16(x.raw())) {
    int es = int(dtype_size(x.dtype()));
    fill_vec_kernel<<<grid_for(n * es / 16 + 1, 256), 256, 0, stream_of(s)>>>(x.raw(), x.dtype(),
                                                                              es, n, value);
  } else {
    fill_kernel<<<grid_for(n, 256), 256, 0, stream_of(s)>>>(x.raw(), x.dtype(), n, value);
  }
  MCPP_LAUNCH_CHECK();
}

void copy(const Tensor& src, Tensor& dst, Stream& s) {
  MCPP_CHECK(src.defined() && dst.defined(), "copy: undefined tensor");
  MCPP_CHECK(src.numel() == dst.numel(), "copy: {} -> {}: element counts differ", src.str(),
             dst.str());
  int64_t n = src.numel();
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  bool sd = src.device() == Device::CUDA, dd = dst.device() == Device::CUDA;
  if (src.dtype() == dst.dtype()) {
    cudaMemcpyKind kind = sd ? (dd ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                             : (dd ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), kind, cs));
    if (!dd) CUDA_CHECK(cudaStreamSynchronize(cs));  // host data valid on return
    return;
  }
  if (sd && dd) {
    cast_on_device(src.raw(), src.dtype(), dst.raw(), dst.dtype(), n, cs);
  } else if (!sd && dd) {
    // Transfer in the source dtype, cast on the device.
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), Device::CUDA);
    CUDA_CHECK(cudaMemcpyAsync(tmp.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, cs));
    cast_on_device(tmp.raw(), src.dtype(), dst.raw(), dst.dtype(), n, cs);
  } else if (sd && !dd) {
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype(), Device::CUDA);
    cast_on_device(src.raw(), src.dtype(), tmp.raw(), dst.dtype(), n, cs);
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), tmp.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
  } else {
    cpu::copy(src, dst, Stream::cpu());  // host to host: the CPU backend's casts
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  check_cuda(a, "add", "a");
  check_cuda(b, "add", "b");
  check_cuda(out, "add", "out");
  int64_t n = out.numel();
  check_numel(a, n, "add", "a");
  check_numel(b, n, "add", "b");
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  if (a.dtype() == b.dtype() && a.dtype() == out.dtype() && is_act(a.dtype()) &&
      is_aligned16(a.raw()) && is_aligned16(b.raw()) && is_aligned16(out.raw())) {
    MCPP_DISPATCH_ACT(a.dtype(), "add",
                      add_vec_kernel<T><<<grid_for(n / (16 / sizeof(T)) + 1, 256), 256, 0, cs>>>(
                          static_cast<const T*>(a.raw()), static_cast<const T*>(b.raw()),
                          static_cast<T*>(out.raw()), n));
  } else {
    add_generic_kernel<<<grid_for(n, 256), 256, 0, cs>>>(a.raw(), a.dtype(), b.raw(), b.dtype(),
                                                         out.raw(), out.dtype(), n);
  }
  MCPP_LAUNCH_CHECK();
}

static void axpby(double alpha, const Tensor* x, double beta, Tensor& y, Stream& s) {
  int64_t n = y.numel();
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  DType xt = x ? x->dtype() : y.dtype();
  const void* xp = x ? x->raw() : nullptr;
  if (is_act(xt) && is_act(y.dtype())) {
    bool vec = is_aligned16(y.raw()) && (!xp || is_aligned16(xp));
    MCPP_DISPATCH_ACT(xt, "axpy", MCPP_DISPATCH_ACT2(y.dtype(), "axpy", {
                        auto xt_ = static_cast<const T*>(xp);
                        auto yt_ = static_cast<T2*>(y.raw());
                        if (vec)
                          axpby_pack_kernel<T, T2>
                              <<<grid_for(n / kPackN<T, T2> + 1, 256), 256, 0, cs>>>(
                                  float(alpha), xt_, float(beta), yt_, n);
                        else
                          axpby_vec_kernel<T, T2><<<grid_for(n / 4 + 1, 256), 256, 0, cs>>>(
                              float(alpha), xt_, float(beta), yt_, n);
                      }));
  } else {
    axpby_generic_kernel<<<grid_for(n, 256), 256, 0, cs>>>(float(alpha), xp, xt, float(beta),
                                                           y.raw(), y.dtype(), n);
  }
  MCPP_LAUNCH_CHECK();
}

void axpy(double alpha, const Tensor& x, Tensor& y, Stream& s) {
  check_cuda(x, "axpy", "x");
  check_cuda(y, "axpy", "y");
  check_numel(x, y.numel(), "axpy", "x");
  axpby(alpha, &x, 1.0, y, s);
}

void scale(Tensor& x, double alpha, Stream& s) {
  check_cuda(x, "scale", "x");
  axpby(0.0, nullptr, alpha, x, s);
}

double sum_squares(const Tensor& x, Stream& s) { return sum_squares_each({x}, s)[0]; }

std::vector<double> sum_squares_each(const std::vector<Tensor>& xs, Stream& s) {
  for (const Tensor& x : xs) check_cuda(x, "sum_squares", "x");
  std::vector<double> total(xs.size(), 0.0);
  if (xs.empty()) return total;
  cudaStream_t cs = stream_of(s);
  // Fixed grid and fixed summation order: each result is bitwise reproducible. Tensor i's
  // block partials land in row i; one copy and one wait for all of them.
  const int64_t m = int64_t(xs.size());
  Tensor partial = Tensor::empty({m * kReduceBlocks}, DType::F64, Device::CUDA);
  double* pd = static_cast<double*>(partial.raw());
  int64_t launched = 0;
  for (int64_t i = 0; i < m; ++i) {
    const Tensor& x = xs[size_t(i)];
    if (x.numel() == 0) continue;
    sum_squares_kernel<<<kReduceBlocks, 256, 0, cs>>>(x.raw(), x.dtype(), x.numel(),
                                                       pd + i * kReduceBlocks);
    MCPP_LAUNCH_CHECK();
    ++launched;
  }
  if (launched == 0) return total;
  std::vector<double> h(size_t(m * kReduceBlocks), 0.0);
  CUDA_CHECK(cudaMemcpyAsync(h.data(), pd, size_t(m * kReduceBlocks) * sizeof(double),
                             cudaMemcpyDeviceToHost, cs));
  CUDA_CHECK(cudaStreamSynchronize(cs));
  for (int64_t i = 0; i < m; ++i) {
    if (xs[size_t(i)].numel() == 0) continue;
    double t = 0;
    for (int64_t k = 0; k < kReduceBlocks; ++k) t += h[size_t(i * kReduceBlocks + k)];
    total[size_t(i)] = t;
  }
  return total;
}

bool has_nonfinite(const Tensor& x, Stream& s) {
  check_cuda(x, "has_nonfinite", "x");
  int64_t n = x.numel();
  if (n == 0) return false;
  cudaStream_t cs = stream_of(s);
  Tensor flag = Tensor::empty({1}, DType::I32, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(flag.raw(), 0, sizeof(int), cs));
  nonfinite_kernel<<<grid_for(n, 256, 4096), 256, 0, cs>>>(x.raw(), x.dtype(), n,
                                                            static_cast<int*>(flag.raw()));
  MCPP_LAUNCH_CHECK();
  int h = 0;
  CUDA_CHECK(cudaMemcpyAsync(&h, flag.raw(), sizeof(int), cudaMemcpyDeviceToHost, cs));
  CUDA_CHECK(cudaStreamSynchronize(cs));
  return h != 0;
}

void dot_begin(const Tensor& x, const Tensor& y, Tensor& partial, Stream& s) {
  check_cuda(x, "dot", "x");
  check_cuda(y, "dot", "y");
  check_numel(y, x.numel(), "dot", "y");
  if (!partial.defined() || partial.numel() != kReduceBlocks || partial.dtype() != DType::F64 ||
      partial.device() != Device::CUDA)
    partial = Tensor::empty({kReduceBlocks}, DType::F64, Device::CUDA);
  cudaStream_t cs = stream_of(s);
  const int64_t n = x.numel();
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(partial.raw(), 0, kReduceBlocks * sizeof(double), cs));
    return;
  }
  // Fixed grid and fixed summation order, as sum_squares: bitwise reproducible.
  dot_kernel<<<kReduceBlocks, 256, 0, cs>>>(x.raw(), x.dtype(), y.raw(), y.dtype(), n,
                                             static_cast<double*>(partial.raw()));
  MCPP_LAUNCH_CHECK();
}

double dot_end(const Tensor& partial, Stream& s) {
  MCPP_CHECK(partial.defined() && partial.numel() == kReduceBlocks &&
                 partial.dtype() == DType::F64 && partial.device() == Device::CUDA,
             "dot_end: partial {} is not dot_begin's", partial.str());
  cudaStream_t cs = stream_of(s);
  std::vector<double> h(kReduceBlocks);
  CUDA_CHECK(cudaMemcpyAsync(h.data(), partial.raw(), kReduceBlocks * sizeof(double),
                             cudaMemcpyDeviceToHost, cs));
  CUDA_CHECK(cudaStreamSynchronize(cs));
  double total = 0;
  for (double v : h) total += v;
  return total;
}

double dot(const Tensor& x, const Tensor& y, Stream& s) {
  Tensor partial;
  dot_begin(x, y, partial, s);
  return dot_end(partial, s);
}

void transpose(const Tensor& x, Tensor& y, Stream& s) {
  check_cuda(x, "transpose", "x");
  check_cuda(y, "transpose", "y");
  MCPP_CHECK(x.dim() == 2 && y.dim() == 2 && y.size(0) == x.size(1) && y.size(1) == x.size(0) &&
                 x.dtype() == y.dtype(),
             "transpose: x {} and y {} are not a 2-D transpose pair of one dtype", x.str(),
             y.str());
  int64_t R = x.size(0), C = x.size(1), n = R * C;
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  auto run = [&](auto tag) {
    using E = decltype(tag);
    transpose_kernel<E><<<grid_for(n, 256), 256, 0, cs>>>(static_cast<const E*>(x.raw()),
                                                          static_cast<E*>(y.raw()), R, C);
  };
  switch (dtype_size(x.dtype())) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    default: run(uint64_t{}); break;
  }
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
