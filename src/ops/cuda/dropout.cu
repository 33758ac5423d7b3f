// Dropout with the mask drawn from Philox over the element's *global* index (types.h):
// keep iff Philox::uniform(seed, stream, global_index) >= p, kept values scaled by
// 1/(1-p). The same function as the CPU backend, so any partition of a tensor, on any
// backend, drops the same elements. The mask is never stored; backward redraws it.
// x, dout, dx: activation dtype; residual and out: one activation dtype (may differ
// from x's). out = residual + dropout(x) (`=`; out may alias residual).
// Vector paths (16-byte packs, common.cuh) when every pointer is 16-byte aligned: p == 0 is
// a flat add / copy; p > 0 also needs whole packs per row (d2 % N == 0) and global indices
// that are 0 mod 4 at each pack's start (o2 % 4 == 0, G2 % 4 == 0), so each group of four
// elements is one Philox block, exactly the block Philox::u32 assigns them. Every element
// still sees u32(seed, stream, its global index): the masks are the scalar kernels', bit
// for bit, as is the float math. Anything else takes the scalar kernels.
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

// The 24-bit draws of the 4 consecutive local elements [4j, 4j + 4). When they are 4
// consecutive global indices starting at a multiple of 4 (same row, aligned: the usual
// case for H % 4 == 0), one Philox block serves all four lanes, exactly as Philox::u32
// assigns them; otherwise each element is drawn on its own.
__device__ __forceinline__ void draw4(uint64_t seed, uint64_t stream, const Index3& ix,
                                      int64_t i0, int64_t n, uint32_t (&u)[4]) {
  uint64_t g0 = ix.global(i0);
  if (ix.d2 % 4 == 0 && (g0 & 3) == 0 && i0 + 3 < n) {
    uint32_t c[4] = {uint32_t(g0 >> 2), uint32_t(g0 >> 34), uint32_t(stream),
                     uint32_t(stream >> 32)};
    Philox::block(c, uint32_t(seed), uint32_t(seed >> 32));
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = c[k] >> 8;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      u[k] = i0 + k < n ? Philox::u32(seed, stream, ix.global(i0 + k)) >> 8 : 0u;
  }
}

// keep iff uniform >= p, with uniform = u / 2^24: u >= ceil(p 2^24) (exact, as the CPU).
template <typename TX, typename TO>
static __global__ void dropout_add_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                          int64_t n, uint32_t threshold, bool drop, float scale,
                                          uint64_t seed, uint64_t stream, Index3 ix) {
  int64_t groups = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < groups;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u[4] = {threshold, threshold, threshold, threshold};
    if (drop) draw4(seed, stream, ix, 4 * j, n, u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int64_t i = 4 * j + k;
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
  int64_t groups = (n + 3) / 4;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < groups;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u[4] = {threshold, threshold, threshold, threshold};
    if (drop) draw4(seed, stream, ix, 4 * j, n, u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int64_t i = 4 * j + k;
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
// packs per row; the pack's first global index g0 is 0 mod 4, so lanes 4b..4b+3 are the
// four outputs of the Philox block at counter g0 / 4 + b.
template <typename TX, typename TO>
static __global__ void dropout_vec_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                          int64_t nv, uint32_t W, uint32_t threshold, float scale,
                                          uint64_t seed, uint64_t stream, Index3 ix) {
  constexpr int N = kPackN<TX, TO>;
  static_assert(N % 4 == 0, "a pack is whole Philox blocks");
  uint32_t d1 = uint32_t(ix.d1);
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < nv;
       j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t r = uint32_t(j) / W, c = uint32_t(j) - r * W;  // local row i0 * d1 + i1, pack
    uint32_t i0 = r / d1, i1 = r - i0 * d1;
    uint64_t g0 = uint64_t((ix.row0(i0) * ix.G1 + (int64_t(i1) + ix.o1)) * ix.G2 +
                           (int64_t(c) * N + ix.o2));
    uint32_t u[N];
#pragma unroll
    for (int b = 0; b < N / 4; ++b) {
      uint64_t q = (g0 >> 2) + uint64_t(b);
      uint32_t ctr[4] = {uint32_t(q), uint32_t(q >> 32), uint32_t(stream), uint32_t(stream >> 32)};
      Philox::block(ctr, uint32_t(seed), uint32_t(seed >> 32));
#pragma unroll
      for (int k = 0; k < 4; ++k) u[4 * b + k] = ctr[k] >> 8;
    }
    Pack<TX, N> a = ld_pack<N>(x + j * N);
    Pack<TO, N> o;
    if (residual) {
      Pack<TO, N> rr = ld_pack<N>(residual + j * N);
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
  if (ix.d2 % N != 0 || ix.o2 % 4 != 0 || ix.G2 % 4 != 0 || n / N > int64_t(UINT32_MAX))
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
  float scale = p < 1 ? float(1.0 / (1.0 - p)) : 0.f;
  uint32_t threshold = uint32_t(std::ceil(p * 16777216.0));
  MCPP_DISPATCH_ACT(
      x.dtype(), op, MCPP_DISPATCH_ACT2(out.dtype(), op, {
        auto xp = static_cast<const T*>(x.raw());
        auto rp = residual.defined() ? static_cast<const T2*>(residual.raw()) : nullptr;
        auto op_ = static_cast<T2*>(out.raw());
        if (!launch_vec<T, T2>(xp, rp, op_, n, p > 0, threshold, scale, key, ix, stream_of(s)))
          dropout_add_kernel<T, T2><<<grid_for((n + 3) / 4, 256), 256, 0, stream_of(s)>>>(
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
  float scale = p < 1 ? float(1.0 / (1.0 - p)) : 0.f;
  uint32_t threshold = uint32_t(std::ceil(p * 16777216.0));
  MCPP_DISPATCH_ACT(dout.dtype(), op, {
    auto dp = static_cast<const T*>(dout.raw());
    auto dxp = static_cast<T*>(dx.raw());
    if (!launch_vec<T, T>(dp, nullptr, dxp, n, p > 0, threshold, scale, key, ix, stream_of(s)))
      dropout_bwd_kernel<T><<<grid_for((n + 3) / 4, 256), 256, 0, stream_of(s)>>>(
          dp, dxp, n, threshold, p > 0, scale, key.seed, key.stream, ix);
  });
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
