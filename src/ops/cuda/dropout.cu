// Dropout with the mask drawn from Philox over the element's *global* index (types.h):
// keep iff DropoutMask::u16(seed, stream, global index) >= DropoutMask::threshold(p)
// (base/philox.h: eight 16-bit uniforms per Philox-4x32-7 block), kept values scaled by
// DropoutMask::keep_scale(p). The same function as the CPU backend, so any partition of a
// tensor, on any backend, drops the same elements. The mask is never stored; backward
// redraws it. x, dout, dx: activation dtype; residual and out: one activation dtype (may
// differ from x's). out = residual + dropout(x) (`=`; out may alias residual).
// Vector paths (16-byte packs of N = 4 or 8 elements, common.cuh) when every pointer is
// 16-byte aligned: p == 0 is a flat add / copy; p > 0 also needs whole packs per row
// (d2 % N == 0) and global indices that are 0 mod min(N, 8) at each pack's start
// (o2 and G2 multiples of it), so a pack is one Philox block (N = 8) or half of one (N =
// 4). Every element still sees u16(seed, stream, its global index): the masks are the
// scalar kernels', bit for bit, as is the float math. Anything else takes the scalar
// kernels.
#include <cmath>

#include "base/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

struct Index3 {
  int64_t d1, d2;      // local inner dims
  int64_t o0, o1, o2;  // offsets of the local block
  int64_t G1, G2;      // global inner dims
  // A context-parallel rank's second sequence chunk: local rows >= split0 sit jump0
  // further along dim 0 (GlobalIndex3::row0).
  int64_t split0 = INT64_MAX, jump0 = 0;
  __device__ __forceinline__ int64_t row0(int64_t i0) const {
    return i0 + o0 + (i0 >= split0 ? jump0 : 0);
  }
  __device__ __forceinline__ uint64_t global(int64_t i) const {
    int64_t i2 = i % d2, r = i / d2;
    int64_t i1 = r % d1, i0 = r / d1;
    return uint64_t((row0(i0) * G1 + (i1 + o1)) * G2 + (i2 + o2));
  }
};

// The 16-bit uniforms of the 8 consecutive local elements [8j, 8j + 8). When they are 8
// consecutive global indices starting at a multiple of 8 (same row, aligned: the usual
// case for H % 8 == 0), they are one Philox block; otherwise each element is drawn on its
// own (u16 past n: 0).
__device__ __forceinline__ void draw8(uint64_t seed, uint64_t stream, const Index3& ix,
                                      int64_t i0, int64_t n, uint32_t (&u)[8]) {
  const uint64_t g0 = ix.global(i0);
  if (ix.d2 % 8 == 0 && (g0 & 7) == 0 && i0 + 7 < n) {
    uint32_t w[4];
    DropoutMask::block(seed, stream, g0 >> 3, w);
#pragma unroll
    for (int k = 0; k < 8; ++k) u[k] = DropoutMask::pick(w, k);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      u[k] = i0 + k < n ? DropoutMask::u16(seed, stream, ix.global(i0 + k)) : 0u;
  }
}

template <typename TX, typename TO>
static __global__ void dropout_add_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                          int64_t n, uint32_t threshold, bool drop, float scale,
                                          uint64_t seed, uint64_t stream, Index3 ix) {
  int64_t groups = (n + 7) / 8;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < groups;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u[8];
    if (drop) draw8(seed, stream, ix, 8 * j, n, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int64_t i = 8 * j + k;
      if (i >= n) break;
      float v = to_f(x[i]);
      if (drop) v = u[k] >= threshold ? v * scale : 0.f;
      if (residual) v += to_f(residual[i]);
      out[i] = from_f<TO>(v);
    }
  }
}

template <typename T>
static __global__ void dropout_bwd_kernel(const T* __restrict__ dout, T* dx, int64_t n,
                                          uint32_t threshold, bool drop, float scale,
                                          uint64_t seed, uint64_t stream, Index3 ix) {
  int64_t groups = (n + 7) / 8;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < groups;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u[8];
    if (drop) draw8(seed, stream, ix, 8 * j, n, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      int64_t i = 8 * j + k;
      if (i >= n) break;
      float v = to_f(dout[i]);
      if (drop) v = u[k] >= threshold ? v * scale : 0.f;
      dx[i] = from_f<T>(v);
    }
  }
}

// p == 0: out = x (+ residual), whole packs then the tail one by one. Also serves
// dropout_backward (TX = TO, no residual): dx = dout.
template <typename TX, typename TO>
static __global__ void add_copy_vec_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                           int64_t n) {
  constexpr int N = kPackN<TX, TO>;
  int64_t nv = n / N, tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
          stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = tid; j < nv; j += stride) {
    Pack<TX, N> a = ld_pack<N>(x + j * N);
    Pack<TO, N> o;
    if (residual) {
      Pack<TO, N> r = ld_pack<N>(residual + j * N);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float v = to_f(a.v[k]);
        v += to_f(r.v[k]);
        o.v[k] = from_f<TO>(v);
      }
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = from_f<TO>(to_f(a.v[k]));
    }
    st_pack(out + j * N, o);
  }
  for (int64_t i = nv * N + tid; i < n; i += stride) {
    float v = to_f(x[i]);
    if (residual) v += to_f(residual[i]);
    out[i] = from_f<TO>(v);
  }
}

// p > 0: out = residual + dropout(x) on one pack of N elements of a row per thread and
// step (residual may be null: dropout_backward). nv = numel / N < 2^32 and W = d2 / N
// packs per row; the pack's first global index g0 is 0 mod min(N, 8), so its elements
// are the uniforms g0 & 7 .. (g0 & 7) + N - 1 of the blocks from counter g0 / 8 on.
template <typename TX, typename TO>
static __global__ void dropout_vec_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                          int64_t nv, uint32_t W, uint32_t threshold, float scale,
                                          uint64_t seed, uint64_t stream, Index3 ix) {
  constexpr int N = kPackN<TX, TO>, NB = (N + 7) / 8;  // Philox blocks a pack touches
  static_assert(N == 4 || N % 8 == 0, "a pack is half a Philox block or whole ones");
  uint32_t d1 = uint32_t(ix.d1);
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < nv;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t r = uint32_t(j) / W, c = uint32_t(j) - r * W;  // local row i0 * d1 + i1, pack
    uint32_t i0 = r / d1, i1 = r - i0 * d1;
    uint64_t g0 = uint64_t((ix.row0(i0) * ix.G1 + (int64_t(i1) + ix.o1)) * ix.G2 +
                           (int64_t(c) * N + ix.o2));
    // The loads first: they are in flight while the Philox rounds run.
    Pack<TX, N> a = ld_pack<N>(x + j * N);
    Pack<TO, N> rr;
    if (residual) rr = ld_pack<N>(residual + j * N);
    uint32_t w[4 * NB];
#pragma unroll
    for (int b = 0; b < NB; ++b)
      DropoutMask::block(seed, stream, (g0 >> 3) + uint64_t(b), w + 4 * b);
    uint32_t u[N];
    if constexpr (N == 4) {  // uniforms 0..3 or 4..7 of the block (g0 & 7 is 0 or 4)
      const bool hi = (g0 & 4) != 0;
      const uint32_t w0 = hi ? w[2] : w[0], w1 = hi ? w[3] : w[1];
      u[0] = w0 & 0xFFFFu, u[1] = w0 >> 16, u[2] = w1 & 0xFFFFu, u[3] = w1 >> 16;
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) u[k] = DropoutMask::pick(w, k);
    }
    Pack<TO, N> o;
    if (residual) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float v = to_f(a.v[k]);
        v = u[k] >= threshold ? v * scale : 0.f;
        v += to_f(rr.v[k]);
        o.v[k] = from_f<TO>(v);
      }
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        float v = to_f(a.v[k]);
        v = u[k] >= threshold ? v * scale : 0.f;
        o.v[k] = from_f<TO>(v);
      }
    }
    st_pack(out + j * N, o);
  }
}

// Launches the vector kernel for out = residual + dropout(x) when it applies (see the
// file comment); false: the caller runs the scalar kernel.
template <typename TX, typename TO>
bool launch_vec(const TX* x, const TO* residual, TO* out, int64_t n, bool drop, uint32_t threshold,
                float scale, const DropoutKey& key, const Index3& ix, cudaStream_t cs) {
  constexpr int N = kPackN<TX, TO>;
  if (!is_aligned16(x) || !is_aligned16(out) || (residual && !is_aligned16(residual))) return false;
  if (!drop) {
    add_copy_vec_kernel<TX, TO><<<grid_for(n / N + 1, 256), 256, 0, cs>>>(x, residual, out, n);
    return true;
  }
  constexpr int A = N < 8 ? N : 8;  // a pack's first global index is a multiple of A
  if (ix.d2 % N != 0 || ix.o2 % A != 0 || ix.G2 % A != 0 || n / N > int64_t(UINT32_MAX))
    return false;
  dropout_vec_kernel<TX, TO><<<grid_for(n / N, 256), 256, 0, cs>>>(
      x, residual, out, n / N, uint32_t(ix.d2 / N), threshold, scale, key.seed, key.stream, ix);
  return true;
}

Index3 make_index(const Tensor& x, const GlobalIndex3& g, const char* op) {
  MCPP_CHECK(x.dim() == 3, "{}: x is {}; a 3-D [d0, d1, d2] tensor is expected", op, x.str());
  Index3 ix;
  ix.d1 = x.size(1), ix.d2 = x.size(2);
  ix.o0 = g.offset[0], ix.o1 = g.offset[1], ix.o2 = g.offset[2];
  ix.G1 = g.global[1], ix.G2 = g.global[2];
  ix.split0 = g.split0, ix.jump0 = g.jump0;
  MCPP_CHECK(g.split0 >= 0 && g.jump0 >= 0, "{}: split0 {} / jump0 {} negative", op, g.split0,
             g.jump0);
  MCPP_CHECK(g.global[0] >= g.row0(x.size(0) - 1) + 1 && ix.G1 >= ix.d1 + ix.o1 &&
                 ix.G2 >= ix.d2 + ix.o2,
             "{}: local block {} at offset ({}, {}, {}) does not fit the global shape [{}, {}, "
             "{}]",
             op, x.str(), g.offset[0], g.offset[1], g.offset[2], g.global[0], g.global[1],
             g.global[2]);
  return ix;
}

template <typename T>
static __global__ void random_normal_kernel(T* y, int64_t n, uint64_t seed, uint64_t stream,
                                            Index3 ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_d<T>(Philox::normal(seed, stream, ix.global(i)));
}

template <typename T>
static __global__ void uniform_scale_kernel(const T* x, T* y, int64_t n, double lo, double hi,
                                            uint64_t seed, uint64_t stream, Index3 ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double u = Philox::uniform(seed, stream, ix.global(i));
    y[i] = from_d<T>(double(to_f(x[i])) * (lo + (hi - lo) * u));
  }
}

}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& residual, double p, DropoutKey key,
                         const GlobalIndex3& g, Tensor& out, Stream& s) {
  const char* op = "dropout_add_forward";
  check_cuda(x, op, "x");
  check_cuda(out, op, "out");
  check_numel(out, x.numel(), op, "out");
  MCPP_CHECK(p >= 0 && p <= 1, "{}: dropout probability {} outside [0, 1]", op, p);
  if (residual.defined()) {
    check_cuda(residual, op, "residual");
    check_numel(residual, x.numel(), op, "residual");
    MCPP_CHECK(residual.dtype() == out.dtype(), "{}: residual is {}, out is {}; one dtype", op,
               residual.str(), out.str());
  }
  Index3 ix = p > 0 ? make_index(x, g, op) : Index3{1, 1, 0, 0, 0, 1, 1};
  int64_t n = x.numel();
  if (n == 0) return;
  const float scale = float(DropoutMask::keep_scale(p));
  const uint32_t threshold = DropoutMask::threshold(p);
  MCPP_DISPATCH_ACT(
      x.dtype(), op, MCPP_DISPATCH_ACT2(out.dtype(), op, {
        auto xp = static_cast<const T*>(x.raw());
        auto rp = residual.defined() ? static_cast<const T2*>(residual.raw()) : nullptr;
        auto op_ = static_cast<T2*>(out.raw());
        if (!launch_vec<T, T2>(xp, rp, op_, n, p > 0, threshold, scale, key, ix, stream_of(s)))
          dropout_add_kernel<T, T2><<<grid_for((n + 7) / 8, 256), 256, 0, stream_of(s)>>>(
              xp, rp, op_, n, threshold, p > 0, scale, key.seed, key.stream, ix);
      }));
  MCPP_LAUNCH_CHECK();
}

void dropout_backward(const Tensor& dout, double p, DropoutKey key, const GlobalIndex3& g,
                      Tensor& dx, Stream& s) {
  const char* op = "dropout_backward";
  check_cuda(dout, op, "dout");
  check_cuda(dx, op, "dx");
  check_numel(dx, dout.numel(), op, "dx");
  MCPP_CHECK(dx.dtype() == dout.dtype(), "{}: dx is {}, dout is {}; one dtype", op, dx.str(),
             dout.str());
  MCPP_CHECK(p >= 0 && p <= 1, "{}: dropout probability {} outside [0, 1]", op, p);
  Index3 ix = p > 0 ? make_index(dout, g, op) : Index3{1, 1, 0, 0, 0, 1, 1};
  int64_t n = dout.numel();
  if (n == 0) return;
  const float scale = float(DropoutMask::keep_scale(p));
  const uint32_t threshold = DropoutMask::threshold(p);
  MCPP_DISPATCH_ACT(dout.dtype(), op, {
    auto dp = static_cast<const T*>(dout.raw());
    auto dxp = static_cast<T*>(dx.raw());
    if (!launch_vec<T, T>(dp, nullptr, dxp, n, p > 0, threshold, scale, key, ix, stream_of(s)))
      dropout_bwd_kernel<T><<<grid_for((n + 7) / 8, 256), 256, 0, stream_of(s)>>>(
          dp, dxp, n, threshold, p > 0, scale, key.seed, key.stream, ix);
  });
  MCPP_LAUNCH_CHECK();
}

// The CPU's values up to the device's double log and cos (a unit or two in the last place
// of the double, so the f32 / bf16 values match but for a rare rounding).
void random_normal(DropoutKey key, const GlobalIndex3& g, Tensor& y, Stream& s) {
  const char* op = "random_normal";
  check_cuda(y, op, "y");
  const Index3 ix = make_index(y, g, op);
  const int64_t n = y.numel();
  if (n == 0) return;
  MCPP_DISPATCH_ACT(y.dtype(), op, {
    random_normal_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
        static_cast<T*>(y.raw()), n, key.seed, key.stream, ix);
  });
  MCPP_LAUNCH_CHECK();
}

void uniform_scale(const Tensor& x, double lo, double hi, DropoutKey key, const GlobalIndex3& g,
                   Tensor& y, Stream& s) {
  const char* op = "uniform_scale";
  check_cuda(x, op, "x");
  check_cuda(y, op, "y");
  check_numel(y, x.numel(), op, "y");
  MCPP_CHECK(x.dtype() == y.dtype(), "{}: x is {}, y is {}; one dtype", op, x.str(), y.str());
  const Index3 ix = make_index(x, g, op);
  const int64_t n = x.numel();
  if (n == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), op, {
    uniform_scale_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
        static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()), n, lo, hi, key.seed,
        key.stream, ix);
  });
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
