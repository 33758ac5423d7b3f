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
// Decoding is memory-bound (every step reads the whole cache once), so the kernel is the
// simple one: a warp per (query row, batch, head) sweeps the keys in order with an
// online softmax (running max and sum); each lane owns HD/32 output dims and the q.k dot
// product is a warp-shuffle reduction. HD <= 256.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kMaxDimsPerLane = 8;  // HD <= 32 * 8

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

template <typename T>
static __global__ void kv_attention_kernel(const T* __restrict__ qkv, const T* __restrict__ kc,
                                           const T* __restrict__ vc, T* __restrict__ out,
                                           int64_t Sq, int64_t B, int64_t NH, int64_t NG,
                                           int64_t HD, const int64_t* __restrict__ pos,
                                           int64_t Tmax, float scale) {
  const int64_t warps_per_block = blockDim.x / 32;
  const int64_t item = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= Sq * B * NH) return;
  const int64_t h = item % NH, b = (item / NH) % B, i = item / (NH * B);
  const int64_t G = NH / NG, g = h / G, len = pos[b] + i + 1;
  const int64_t W = NG * (G + 2) * HD, C = NG * HD;
  const T* kslot = kc + b * Tmax * C + g * HD;
  const T* vslot = vc + b * Tmax * C + g * HD;
  const T* q = qkv + (i * B + b) * W + (g * (G + 2) + h % G) * HD;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    qr[j] = c < HD ? to_f(q[c]) * scale : 0.f;
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t k = 0; k < len; ++k) {
    const T* kr = kslot + k * C;
    const T* vr = vslot + k * C;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int64_t c = lane + 32 * j;
      if (c < HD) dot += qr[j] * to_f(kr[c]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int64_t c = lane + 32 * j;
      if (c < HD) acc[j] = acc[j] * corr + p * to_f(vr[c]);
    }
    m = m_new;
  }
  T* o = out + (i * B + b) * NH * HD + h * HD;
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < HD) o[c] = from_f<T>(acc[j] / l);
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
  MCPP_CHECK(pos.dtype() == DType::I64 && pos.numel() == d.B, "{}: pos {} is not i64 [B={}]", op,
             pos.str(), d.B);
  MCPP_CHECK(d.S > 0 && d.B > 0 && d.NH > 0 && d.NG > 0 && d.HD > 0 && d.NH % d.NG == 0,
             "{}: invalid dims S={} B={} NH={} NG={} HD={} (all positive, NG | NH)", op, d.S, d.B,
             d.NH, d.NG, d.HD);
  MCPP_CHECK(d.HD <= 32 * kMaxDimsPerLane, "{}: head dim {} > {} is not supported", op, d.HD,
             32 * kMaxDimsPerLane);
  for (const Tensor* t : {&k_cache, &v_cache, &out})
    MCPP_CHECK(t->dtype() == qkv.dtype(), "{}: {} differs in dtype from qkv {}", op, t->str(),
               qkv.str());
  check_numel(qkv, d.S * d.B * d.qkv_width(), op, "qkv");
  check_numel(out, d.S * d.B * d.NH * d.HD, op, "out");
  for (const Tensor* t : {&k_cache, &v_cache})
    MCPP_CHECK(t->dim() == 4 && t->size(0) == d.B && t->size(2) == d.NG && t->size(3) == d.HD,
               "{}: cache {} is not [B={}, Tmax, NG={}, HD={}]", op, t->str(), d.B, d.NG, d.HD);
  MCPP_CHECK(v_cache.shape() == k_cache.shape(), "{}: k_cache {} and v_cache {} differ", op,
             k_cache.str(), v_cache.str());
  MCPP_CHECK(d.S <= k_cache.size(1), "{}: {} new rows do not fit a cache of {} rows", op, d.S,
             k_cache.size(1));
  const int64_t Tmax = k_cache.size(1);
  const int64_t* dpos = pos.data<int64_t>();
  cudaStream_t cs = stream_of(s);
  const int64_t G = d.NH / d.NG;
  const int64_t n_append = d.S * d.B * d.NG * d.HD;
  const int64_t items = d.S * d.B * d.NH;
  constexpr int kThreads = 128;
  const unsigned blocks = unsigned((items + kThreads / 32 - 1) / (kThreads / 32));
  MCPP_DISPATCH_ACT(qkv.dtype(), op, {
    const T* q = static_cast<const T*>(qkv.raw());
    T* kc = static_cast<T*>(k_cache.raw());
    T* vc = static_cast<T*>(v_cache.raw());
    kv_append_kernel<T>
        <<<grid_for(n_append, 256), 256, 0, cs>>>(q, kc, vc, d.S, d.B, d.NG, G, d.HD, dpos, Tmax);
    MCPP_LAUNCH_CHECK();
    kv_attention_kernel<T><<<blocks, kThreads, 0, cs>>>(q, kc, vc, static_cast<T*>(out.raw()), d.S,
                                                        d.B, d.NH, d.NG, d.HD, dpos, Tmax,
                                                        float(softmax_scale));
    MCPP_LAUNCH_CHECK();
  });
}

}  // namespace mcpp::ops::cuda
