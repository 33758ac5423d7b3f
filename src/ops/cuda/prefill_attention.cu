// attention_prefill, CUDA backend (the catalogue's `---- inference` section): the prefill
// of prompts that start at position 0. A prompt attends only to its own rows, so once its
// keys and values are in the cache the attention is exactly the training forward's causal
// attention over [S, B] (no cache read at all): one append kernel, then attention_forward
// (cuDNN's fused attention for bf16/f16, the own flash kernel, or the CUDA-core kernel for
// f32 -- the training dispatch). Before this a prefill attended with the decode kernel, a
// block per (row, head) re-reading the cache: ~2.4 ms per 128-token prompt of the 1B model.
// Head dims other than 32, 64 and 128 (which the training kernels lack) still take that path.
// A sliding window (AttentionDims::window_left) reaches the training attention as its
// key_start, as a window layer's does in training.
//
//   qkv      [S, B, NG, NH/NG + 2, HD]  RoPE applied
//   k_cache  [B, Tmax, NG, HD]          slot b's rows [0, S) overwritten
//   v_cache  [B, Tmax, NG, HD]          likewise
//   out      [S, B, NH*HD] (=), lse [B, NH, S] f32 (scratch)
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/kv_cache_checks.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

// One thread per 16-byte word of a key or value row (W words per head row).
template <typename T>
static __global__ void prefill_append_kernel(const uint4* __restrict__ qkv, uint4* __restrict__ kc,
                                             uint4* __restrict__ vc, int64_t S, int64_t B,
                                             int64_t NG, int64_t G, int64_t W, int64_t Tmax) {
  const int64_t n = S * B * NG * W;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % W, r = e / W;  // r = (i * B + b) * NG + g
    const int64_t g = r % NG, ib = r / NG, b = ib % B, i = ib / B;
    const int64_t src = (ib * NG + g) * (G + 2) * W;
    const int64_t dst = ((b * Tmax + i) * NG + g) * W + c;
    kc[dst] = qkv[src + G * W + c];
    vc[dst] = qkv[src + (G + 1) * W + c];
  }
}

// The same element by element (head rows that are not whole 16-byte words).
template <typename T>
static __global__ void prefill_append_scalar(const T* __restrict__ qkv, T* __restrict__ kc,
                                             T* __restrict__ vc, int64_t S, int64_t B,
                                             int64_t NG, int64_t G, int64_t HD, int64_t Tmax) {
  const int64_t n = S * B * NG * HD;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % HD, r = e / HD;
    const int64_t g = r % NG, ib = r / NG, b = ib % B, i = ib / B;
    const int64_t src = (ib * NG + g) * (G + 2) * HD;
    const int64_t dst = ((b * Tmax + i) * NG + g) * HD + c;
    kc[dst] = qkv[src + G * HD + c];
    vc[dst] = qkv[src + (G + 1) * HD + c];
  }
}

// A sliding window's key starts for prompts from position 0: key_start[b, q] =
// max(0, q - window) (AttentionDims::key_start's layout, [B, S]).
static __global__ void window_key_start_kernel(int64_t* __restrict__ ks, int64_t S, int64_t B,
                                               int64_t window) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < B * S;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = e % S;
    ks[e] = q > window ? q - window : 0;
  }
}

}  // namespace

void attention_prefill(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                       Tensor& k_cache, Tensor& v_cache, Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_prefill";
  check_cuda(qkv, op, "qkv");
  check_cuda(k_cache, op, "k_cache");
  check_cuda(v_cache, op, "v_cache");
  check_cuda(out, op, "out");
  check_cuda(lse, op, "lse");
  const Tensor no_pos = Tensor::empty({d.B}, DType::I64);  // (the shared checks want one)
  check_kv_cache_args(op, qkv, d, no_pos, k_cache, v_cache, out);
  MCPP_CHECK(!d.key_start.defined(), "{}: prompts attend to themselves only (no document mask)",
             op);
  MCPP_CHECK(d.S <= k_cache.size(1), "{}: {} prompt rows do not fit a cache of {} rows", op, d.S,
             k_cache.size(1));
  const int64_t Tmax = k_cache.size(1), G = d.NH / d.NG;
  cudaStream_t cs = stream_of(s);
  if (d.HD != 32 && d.HD != 64 && d.HD != 128) {
    // Head dims the training kernels lack (attention.cu: 32, 64, 128): the decode kernel's
    // attention_kv_cache_forward at position 0, as before this op existed.
    Tensor zero = Tensor::empty({d.B}, DType::I64, Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(zero.raw(), 0, size_t(d.B) * sizeof(int64_t), cs));
    cuda::attention_kv_cache_forward(qkv, d, zero, softmax_scale, k_cache, v_cache, out, s);
    return;
  }
  const int64_t row_bytes = d.HD * int64_t(dtype_size(qkv.dtype()));
  const bool words = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(qkv.raw()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(k_cache.raw()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(v_cache.raw()) % 16 == 0;
  MCPP_DISPATCH_ACT(qkv.dtype(), op, {
    if (words) {
      const int64_t W = row_bytes / 16;
      prefill_append_kernel<T><<<grid_for(d.S * d.B * d.NG * W, 256), 256, 0, cs>>>(
          static_cast<const uint4*>(qkv.raw()), static_cast<uint4*>(k_cache.raw()),
          static_cast<uint4*>(v_cache.raw()), d.S, d.B, d.NG, G, W, Tmax);
    } else {
      prefill_append_scalar<T><<<grid_for(d.S * d.B * d.NG * d.HD, 256), 256, 0, cs>>>(
          static_cast<const T*>(qkv.raw()), static_cast<T*>(k_cache.raw()),
          static_cast<T*>(v_cache.raw()), d.S, d.B, d.NG, G, d.HD, Tmax);
    }
    MCPP_LAUNCH_CHECK();
  });
  // Causal attention of each prompt over its own rows: the training forward, no dropout; then
  // the sinks, as the training layer joins them.
  AttentionDims plain = d;
  plain.sink = Tensor();
  if (d.window_left >= 0 && d.window_left + 1 < d.S) {  // a window that hides keys: key_start
    plain.key_start = Tensor::empty({d.B, d.S}, DType::I64, Device::CUDA);
    window_key_start_kernel<<<grid_for(d.B * d.S, 256), 256, 0, cs>>>(
        plain.key_start.data<int64_t>(), d.S, d.B, d.window_left);
    MCPP_LAUNCH_CHECK();
  }
  plain.window_left = -1;
  cuda::attention_forward(qkv, plain, softmax_scale, 0.0, DropoutKey{}, out, lse, s);
  if (d.sink.defined()) cuda::attention_sink_forward(out, lse, d.sink, 0, plain, s);
}

}  // namespace mcpp::ops::cuda
