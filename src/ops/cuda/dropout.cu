// Dropout with the mask drawn from Philox over the element's *global* index (types.h):
// keep iff Philox::uniform(seed, stream, global_index) >= p, kept values scaled by
// 1/(1-p). The same function as the CPU backend, so any partition of a tensor, on any
// backend, drops the same elements. The mask is never stored; backward redraws it.
// x, dout, dx: activation dtype; residual and out: one activation dtype (may differ
// from x's). out = residual + dropout(x) (`=`; out may alias residual).
#include "base/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

struct Index3 {
  int64_t d1, d2;      // local inner dims
  int64_t o0, o1, o2;  // offsets of the local block
  int64_t G1, G2;      // global inner dims
  __device__ __forceinline__ uint64_t global(int64_t i) const {
    int64_t i2 = i % d2, r = i / d2;
    int64_t i1 = r % d1, i0 = r / d1;
    return uint64_t(((i0 + o0) * G1 + (i1 + o1)) * G2 + (i2 + o2));
  }
};

template <typename TX, typename TO>
static __global__ void dropout_add_kernel(const TX* __restrict__ x, const TO* residual, TO* out,
                                          int64_t n, double p, float scale, uint64_t seed,
                                          uint64_t stream, Index3 ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = to_f(x[i]);
    // Compared in double, as the CPU backend compares the (exact) float draw with p.
    if (p > 0) v = double(Philox::uniform(seed, stream, ix.global(i))) >= p ? v * scale : 0.f;
    if (residual) v += to_f(residual[i]);
    out[i] = from_f<TO>(v);
  }
}

template <typename T>
static __global__ void dropout_bwd_kernel(const T* __restrict__ dout, T* dx, int64_t n, double p,
                                          float scale, uint64_t seed, uint64_t stream,
                                          Index3 ix) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = to_f(dout[i]);
    // Compared in double, as the CPU backend compares the (exact) float draw with p.
    if (p > 0) v = double(Philox::uniform(seed, stream, ix.global(i))) >= p ? v * scale : 0.f;
    dx[i] = from_f<T>(v);
  }
}

Index3 make_index(const Tensor& x, const GlobalIndex3& g, const char* op) {
  MCPP_CHECK(x.dim() == 3, "{}: x is {}; a 3-D [d0, d1, d2] tensor is expected", op, x.str());
  Index3 ix;
  ix.d1 = x.size(1), ix.d2 = x.size(2);
  ix.o0 = g.offset[0], ix.o1 = g.offset[1], ix.o2 = g.offset[2];
  ix.G1 = g.global[1], ix.G2 = g.global[2];
  MCPP_CHECK(g.global[0] >= x.size(0) + g.offset[0] && ix.G1 >= ix.d1 + ix.o1 &&
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
  MCPP_CHECK(p >= 0 && p < 1, "{}: dropout probability {} outside [0, 1)", op, p);
  if (residual.defined()) {
    check_cuda(residual, op, "residual");
    check_numel(residual, x.numel(), op, "residual");
    MCPP_CHECK(residual.dtype() == out.dtype(), "{}: residual is {}, out is {}; one dtype", op,
               residual.str(), out.str());
  }
  Index3 ix = p > 0 ? make_index(x, g, op) : Index3{1, 1, 0, 0, 0, 1, 1};
  int64_t n = x.numel();
  if (n == 0) return;
  float scale = float(1.0 / (1.0 - p));
  MCPP_DISPATCH_ACT(x.dtype(), op, MCPP_DISPATCH_ACT2(out.dtype(), op, {
    dropout_add_kernel<T, T2><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
        static_cast<const T*>(x.raw()),
        residual.defined() ? static_cast<const T2*>(residual.raw()) : nullptr,
        static_cast<T2*>(out.raw()), n, p, scale, key.seed, key.stream, ix);
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
  MCPP_CHECK(p >= 0 && p < 1, "{}: dropout probability {} outside [0, 1)", op, p);
  Index3 ix = p > 0 ? make_index(dout, g, op) : Index3{1, 1, 0, 0, 0, 1, 1};
  int64_t n = dout.numel();
  if (n == 0) return;
  float scale = float(1.0 / (1.0 - p));
  MCPP_DISPATCH_ACT(dout.dtype(), op,
                    dropout_bwd_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(dout.raw()), static_cast<T*>(dx.raw()), n,
                        p, scale, key.seed, key.stream, ix));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
