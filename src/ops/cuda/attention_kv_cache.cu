// Attention against a KV cache (generation), CUDA backend; qkv, caches and out of one
// activation dtype (f32, bf16, f16), computed in f32. Same contract as the CPU op
// (src/ops/cpu/attention_kv_cache.cpp):
//
//   qkv      [Sq, B, NG, NH/NG + 2, HD]  new rows; sequence b's row i at position pos[b]+i
//   pos      [B] i64 on the device       each sequence's cache length (not checked here)
//   k_cache  [B, Tmax, NG, HD]           slot b's rows [pos[b], pos[b]+Sq) overwritten
//   v_cache  [B, Tmax, NG, HD]           likewise with qkv's values
//   out      [Sq, B, NH*HD]
//
// Here the append (one thread per element); the attention is decode_attention
// (ops/cuda/decode.cu: a block of warps per query row and head splitting the keys, an
// online softmax per warp, the warps merged at the end). HD <= 256.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/kv_cache_checks.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

template <typename T>
static __global__ void kv_append_kernel(const T* __restrict__ qkv, T* __restrict__ kc,
                                        T* __restrict__ vc, int64_t Sq, int64_t B, int64_t NG,
                                        int64_t G, int64_t HD, const int64_t* __restrict__ pos,
                                        int64_t Tmax) {
  const int64_t n = Sq * B * NG * HD;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % HD, r = e / HD;  // r = (i * B + b) * NG + g
    const int64_t g = r % NG, ib = r / NG, b = ib % B, i = ib / B;
    const int64_t src = (ib * NG + g) * (G + 2) * HD;
    const int64_t dst = ((b * Tmax + pos[b] + i) * NG + g) * HD + c;
    kc[dst] = qkv[src + G * HD + c];
    vc[dst] = qkv[src + (G + 1) * HD + c];
  }
}

}  // namespace

void attention_kv_cache_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& pos,
                                double softmax_scale, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                Stream& s) {
  const char* op = "attention_kv_cache_forward";
  check_cuda(qkv, op, "qkv");
  check_cuda(k_cache, op, "k_cache");
  check_cuda(v_cache, op, "v_cache");
  check_cuda(out, op, "out");
  check_cuda(pos, op, "pos");
  check_kv_cache_args(op, qkv, d, pos, k_cache, v_cache, out);
  MCPP_CHECK(d.HD <= 256, "{}: head dim {} > 256 is not supported", op, d.HD);
  MCPP_CHECK(d.S <= k_cache.size(1), "{}: {} new rows do not fit a cache of {} rows", op, d.S,
             k_cache.size(1));
  const int64_t Tmax = k_cache.size(1);
  const int64_t* dpos = pos.data<int64_t>();
  cudaStream_t cs = stream_of(s);
  const int64_t G = d.NH / d.NG;
  const int64_t n_append = d.S * d.B * d.NG * d.HD;
  MCPP_DISPATCH_ACT(qkv.dtype(), op, {
    const T* q = static_cast<const T*>(qkv.raw());
    T* kc = static_cast<T*>(k_cache.raw());
    T* vc = static_cast<T*>(v_cache.raw());
    kv_append_kernel<T>
        <<<grid_for(n_append, 256), 256, 0, cs>>>(q, kc, vc, d.S, d.B, d.NG, G, d.HD, dpos, Tmax);
    MCPP_LAUNCH_CHECK();
  });
  // Attend: the split-key kernel of ops/cuda/decode.cu, for every row of a prefill and the
  // one row of a decode step.
  cuda::decode_attention(qkv, d, pos, softmax_scale, k_cache, v_cache, out, s);
}

}  // namespace mcpp::ops::cuda
