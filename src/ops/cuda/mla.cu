// Multi-Latent Attention's tensor ops, CUDA backend; f32, bf16 or f16, every tensor of one
// dtype, math in f32. The layouts and formulas are ops/mla.h's; ops/cpu/mla.cpp is the
// reference:
//
//   mla_qkv_forward   q [R, heads, Dq], kv [R, heads, Dn + Dv], kpe [R, Dr]
//                     -> qkv [R, heads, 3, Dq]                                       (=)
//   mla_qkv_backward  dqkv -> dq, dkv, dkpe                                          (=)
//   mla_ctx_narrow    ctx [R, heads, Dq] -> out [R, heads, Dv]                       (=)
//   mla_ctx_pad       dout [R, heads, Dv] -> dctx [R, heads, Dq]                     (=)
//
// A table kernel first forms each row's (c, sn) = mscale (cos, sin)(p inv_i) in f64 and keeps
// them f32, [R, Dr / 2] (the angles reach thousands of radians; one sincos per row and pair,
// not per head). Then a block per row writes every output element of that row with one
// thread each, consecutive threads on consecutive elements; the rotation (pair i of the
// de-interleaved x[2i], x[2i + 1]) is
//   out[i] = x[2i] c - x[2i + 1] sn,  out[i + half] = x[2i + 1] c + x[2i] sn,
// and its transpose in the backward
//   dx[2i] = g[i] c + g[i + half] sn,  dx[2i + 1] = g[i + half] c - g[i] sn.
// dkpe, a sum over the heads, has a thread per (row, pe dim) adding the heads in order in f32
// before the one rotation: deterministic, no atomics, as the CPU backend adds them.
#include <algorithm>
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/mla.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kThreads = 256;

static __global__ void mla_table_kernel(float2* table, const int64_t* __restrict__ pos,
                                        int64_t pos0, int64_t B, int64_t R, int64_t half,
                                        MlaRope rope, int64_t Dr) {
  const int64_t n = R * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / half, i = k - r * half;
    const double p = pos ? double(pos[r]) : double(pos0 + r / B);
    const double a = p * mla_inv_freq(rope, i, Dr);
    table[k] = make_float2(float(rope.mscale * cos(a)), float(rope.mscale * sin(a)));
  }
}

// A block per row (grid-stride over rows); H * 3 * Dq < 2^31 (the launcher checks).
template <typename T>
static __global__ void mla_qkv_forward_kernel(const T* __restrict__ q, const T* __restrict__ kv,
                                              const T* __restrict__ kpe,
                                              const float2* __restrict__ table, T* __restrict__ qkv,
                                              int64_t R, int H, int Dn, int Dr, int Dv) {
  const int Dq = Dn + Dr, half = Dr / 2, W = 3 * Dq, KVW = Dn + Dv, n = H * W;
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float2* cs = table + row * half;
    const T* qr = q + row * H * Dq;
    const T* kvr = kv + row * H * KVW;
    const T* kper = kpe + row * Dr;
    T* out = qkv + row * n;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      const int h = k / W, j = k - h * W, blk = j / Dq, c = j - blk * Dq;
      float v;
      if (blk == 2) {  // value block: kv's value part, then zeros
        v = c < Dv ? to_f(kvr[h * KVW + Dn + c]) : 0.f;
      } else if (c >= Dr) {  // query / key block's nope part
        v = to_f(blk == 0 ? qr[h * Dq + c - Dr] : kvr[h * KVW + c - Dr]);
      } else {  // rope(deint(x)), x the head's q pe part or the shared kpe
        const T* x = blk == 0 ? qr + h * Dq + Dn : kper;
        const int i = c < half ? c : c - half;
        const float a = to_f(x[2 * i]), b = to_f(x[2 * i + 1]);
        const float2 t = cs[i];
        v = c < half ? a * t.x - b * t.y : b * t.x + a * t.y;
      }
      out[k] = from_f<T>(v);
    }
  }
}

// A block per row: elements [0, Dr) of the loop are dkpe's, then dq's H * Dq, then dkv's
// H * (Dn + Dv); the dkpe threads come first as each sums over the H heads.
template <typename T>
static __global__ void mla_qkv_backward_kernel(const T* __restrict__ dqkv,
                                               const float2* __restrict__ table, T* __restrict__ dq,
                                               T* __restrict__ dkv, T* __restrict__ dkpe, int64_t R,
                                               int H, int Dn, int Dr, int Dv) {
  const int Dq = Dn + Dr, half = Dr / 2, W = 3 * Dq, KVW = Dn + Dv;
  const int nq = H * Dq, n = Dr + nq + H * KVW;
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float2* cs = table + row * half;
    const T* g = dqkv + row * H * W;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      if (k < Dr) {  // dkpe[row, k]: the heads' key pe gradients summed, then unrotated
        const int i = k >> 1;
        float a = 0.f, b = 0.f;
        for (int h = 0; h < H; ++h) {
          a += to_f(g[h * W + Dq + i]);
          b += to_f(g[h * W + Dq + i + half]);
        }
        const float2 t = cs[i];
        dkpe[row * Dr + k] = from_f<T>((k & 1) ? b * t.x - a * t.y : a * t.x + b * t.y);
      } else if (k < Dr + nq) {  // dq[row, h, c]
        const int kq = k - Dr, h = kq / Dq, c = kq - h * Dq;
        const T* gh = g + h * W;
        float v;
        if (c < Dn) {
          v = to_f(gh[Dr + c]);
        } else {
          const int m = c - Dn, i = m >> 1;
          const float a = to_f(gh[i]), b = to_f(gh[i + half]);
          const float2 t = cs[i];
          v = (m & 1) ? b * t.x - a * t.y : a * t.x + b * t.y;
        }
        dq[row * nq + kq] = from_f<T>(v);
      } else {  // dkv[row, h, c]: the key block's nope part, then the value block's first Dv
        const int kk = k - Dr - nq, h = kk / KVW, c = kk - h * KVW;
        const T* gh = g + h * W;
        dkv[row * H * KVW + kk] = c < Dn ? gh[Dq + Dr + c] : gh[2 * Dq + c - Dn];
      }
    }
  }
}

// out[rh, j] = j < Dv ? in[rh, j] : 0 over rows rh of out_w (in rows of in_w).
template <typename T>
static __global__ void mla_ctx_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n,
                                      int64_t in_w, int64_t out_w, int64_t Dv) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t rh = k / out_w, j = k - rh * out_w;
    out[k] = j < Dv ? in[rh * in_w + j] : from_f<T>(0.f);
  }
}

void check_act(const Tensor& t, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
             "{}: {} is {}, expected f32, bf16 or f16 (the CUDA backend's activations)", op, name,
             t.str());
}

// The kernels index a row's elements with int.
void check_row_width(const MlaDims& d, const char* op) {
  MCPP_CHECK(d.heads * (3 * d.Dq() + d.Dn + d.Dv) + d.Dr < int64_t(INT32_MAX),
             "{}: heads={} x (3 Dq + Dn + Dv) is too wide for a row", op, d.heads);
}

// (c, sn) of every row: f32 [R, Dr / 2, 2] on the stream.
Tensor rope_table(int64_t R, const MlaDims& d, const MlaRope& r, int64_t B, int64_t pos0,
                  const Tensor& positions, cudaStream_t cs) {
  const int64_t half = d.Dr / 2;
  Tensor table = Tensor::empty({R, half, 2}, DType::F32, Device::CUDA);
  const int64_t* pos = positions.defined() ? static_cast<const int64_t*>(positions.raw()) : nullptr;
  mla_table_kernel<<<grid_for(R * half, kThreads), kThreads, 0, cs>>>(
      static_cast<float2*>(table.raw()), pos, pos0, B, R, half, r, d.Dr);
  MCPP_LAUNCH_CHECK();
  return table;
}

unsigned row_blocks(int64_t R) { return unsigned(std::min<int64_t>(R, int64_t(1) << 20)); }

}  // namespace

void mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& d,
                     const MlaRope& r, int64_t B, int64_t pos0, const Tensor& positions,
                     Tensor& qkv, Stream& s) {
  const char* op = "mla_qkv_forward";
  check_act(q, op, "q");
  const int64_t R = check_mla_qkv_forward(q, kv, kpe, d, r, B, positions, qkv, Device::CUDA, op);
  check_row_width(d, op);
  if (R == 0) return;
  cudaStream_t cs = stream_of(s);
  Tensor table = rope_table(R, d, r, B, pos0, positions, cs);
  const auto* tp = static_cast<const float2*>(table.raw());
  MCPP_DISPATCH_ACT(q.dtype(), op, {
    mla_qkv_forward_kernel<T><<<row_blocks(R), kThreads, 0, cs>>>(
        static_cast<const T*>(q.raw()), static_cast<const T*>(kv.raw()),
        static_cast<const T*>(kpe.raw()), tp, static_cast<T*>(qkv.raw()), R, int(d.heads),
        int(d.Dn), int(d.Dr), int(d.Dv));
  });
  MCPP_LAUNCH_CHECK();
}

void mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r, int64_t B,
                      int64_t pos0, const Tensor& positions, Tensor& dq, Tensor& dkv, Tensor& dkpe,
                      Stream& s) {
  const char* op = "mla_qkv_backward";
  check_act(dqkv, op, "dqkv");
  const int64_t R =
      check_mla_qkv_backward(dqkv, d, r, B, positions, dq, dkv, dkpe, Device::CUDA, op);
  check_row_width(d, op);
  if (R == 0) return;
  cudaStream_t cs = stream_of(s);
  Tensor table = rope_table(R, d, r, B, pos0, positions, cs);
  const auto* tp = static_cast<const float2*>(table.raw());
  MCPP_DISPATCH_ACT(dqkv.dtype(), op, {
    mla_qkv_backward_kernel<T><<<row_blocks(R), kThreads, 0, cs>>>(
        static_cast<const T*>(dqkv.raw()), tp, static_cast<T*>(dq.raw()),
        static_cast<T*>(dkv.raw()), static_cast<T*>(dkpe.raw()), R, int(d.heads), int(d.Dn),
        int(d.Dr), int(d.Dv));
  });
  MCPP_LAUNCH_CHECK();
}

void mla_ctx_narrow(const Tensor& ctx, const MlaDims& d, Tensor& out, Stream& s) {
  const char* op = "mla_ctx_narrow";
  check_act(ctx, op, "ctx");
  const int64_t R = check_mla_ctx(ctx, out, d, Device::CUDA, op, "ctx", "out");
  const int64_t n = R * d.heads * d.Dv;
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(ctx.dtype(), op, {
    mla_ctx_kernel<T><<<grid_for(n, kThreads), kThreads, 0, cs>>>(
        static_cast<const T*>(ctx.raw()), static_cast<T*>(out.raw()), n, d.Dq(), d.Dv, d.Dv);
  });
  MCPP_LAUNCH_CHECK();
}

void mla_ctx_pad(const Tensor& dout, const MlaDims& d, Tensor& dctx, Stream& s) {
  const char* op = "mla_ctx_pad";
  check_act(dctx, op, "dctx");
  const int64_t R = check_mla_ctx(dctx, dout, d, Device::CUDA, op, "dctx", "dout");
  const int64_t n = R * d.heads * d.Dq();
  if (n == 0) return;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(dctx.dtype(), op, {
    mla_ctx_kernel<T><<<grid_for(n, kThreads), kThreads, 0, cs>>>(
        static_cast<const T*>(dout.raw()), static_cast<T*>(dctx.raw()), n, d.Dv, d.Dq(), d.Dv);
  });
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
