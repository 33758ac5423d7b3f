// The catalogue's `context parallel` section on the GPU and the document mask of
// ops::attention_forward/backward: argument checks here, then a kernel chosen as the
// training attention's (ops::choose_attention_backend, --attention-backend):
//   * cuDNN's fused attention (cudnn_attention.h's block entry points: causal or unmasked
//     graphs with a separate key/value pointer, lse from its Stats) for bf16/f16 blocks
//     without dropout and without a document mask; its backward writes dQ, dK, dV into a
//     scratch chunk that is then added into the destinations' slots;
//   * the tensor-core block kernels of attention_block.cu for bf16/f16 at head dim 64 or
//     128 otherwise (dropout, the document mask: cuDNN can draw neither);
//   * the CUDA-core kernels of attention.cu for the rest (f32, other head dims).
// Plus the fp32 lse merge (one warp per row). (Per-token RoPE, --reset-position-ids, is
// rope_positions in rope.cu.)
#include <cmath>

#include "base/error.h"
#include "ops/attention_backend.h"
#include "ops/cuda/attention_cp.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cudnn_attention.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {
// The document mask of d on the GPU: i64 [B, S] in device memory.
void check_key_start(const char* op, const AttentionDims& d) {
  if (!d.key_start.defined()) return;
  MCPP_CHECK(d.key_start.device() == Device::CUDA && d.key_start.dtype() == DType::I64 &&
                 d.key_start.numel() == d.B * d.S,
             "{}: key_start {} must be i64 [B={}, S={}] on the GPU", op, d.key_start.str(), d.B,
             d.S);
}

enum class BlockKernel { Cudnn, Flash, CudaCore };

// The kernel of one block: the training attention's choice for this dtype, head dim and
// dropout (which also honours --attention-backend and throws for a request it cannot
// serve), with the document mask (which cuDNN cannot express) on the flash kernel.
BlockKernel block_kernel(DType dt, const AttentionDims& d, double p) {
  const AttentionBackend be =
      choose_attention_backend(attention_backend_query(Device::CUDA, dt, d.HD, p)).backend;
  if (be == AttentionBackend::CudaCore) return BlockKernel::CudaCore;
  if (be == AttentionBackend::Cudnn && !d.key_start.defined()) return BlockKernel::Cudnn;
  return flash_block_takes(dt, d.HD) ? BlockKernel::Flash : BlockKernel::CudaCore;
}

FlashArgs cudnn_args(const Tensor& q_src, const AttentionDims& d, double scale) {
  return FlashArgs{q_src.raw(), d, q_src.dtype(), scale, 0.0, DropoutKey{}};
}
FlashArgs cudnn_args_of(DType dt, const AttentionDims& d) {
  return FlashArgs{nullptr, d, dt, 1.0, 0.0, DropoutKey{}};
}

// dq's query slots += t's, dkv's key/value slots += t's (t: a grouped [rows, W] chunk).
// dq or dkv null: those slots are left alone (a rectangular block's two scratch chunks).
template <typename T>
__global__ void add_slots_kernel(const T* __restrict__ t, T* dq, T* dkv, int64_t n, int64_t W,
                                 int64_t GW, int64_t QW) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T* dst = (i % W) % GW < QW ? dq : dkv;  // QW: the group's query columns
    if (dst) dst[i] = from_f<T>(to_f(dst[i]) + to_f(t[i]));
  }
}

// The same in 16-byte packs (every slot a whole number of packs: HD a multiple of a pack,
// 16-byte aligned pointers): one column test a pack, in 32 bits; the same float math.
template <typename T, int N>
__global__ void add_slots_pack_kernel(const T* __restrict__ t, T* dq, T* dkv, int64_t packs,
                                      int Wp, int GWp, int QWp) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < packs;
       i += int64_t(gridDim.x) * blockDim.x) {
    T* dst = int(i % Wp) % GWp < QWp ? dq : dkv;
    if (!dst) continue;
    const Pack<T, N> a = ld_pack<N>(t + i * N);
    Pack<T, N> b = ld_pack<N>(dst + i * N);
#pragma unroll
    for (int e = 0; e < N; ++e) b.v[e] = from_f<T>(to_f(b.v[e]) + to_f(a.v[e]));
    st_pack<N>(dst + i * N, b);
  }
}

template <typename T>
void add_slots(const Tensor& t, T* dq, T* dkv, const AttentionDims& d, cudaStream_t cs) {
  const int64_t n = t.numel(), QPG = d.NH / d.NG;
  constexpr int N = kPackN<T>;
  const bool packed = d.HD % N == 0 && is_aligned16(t.raw()) && (!dq || is_aligned16(dq)) &&
                      (!dkv || is_aligned16(dkv));
  if (packed) {
    const int64_t packs = n / N;
    add_slots_pack_kernel<T, N><<<grid_for(packs, 256), 256, 0, cs>>>(
        static_cast<const T*>(t.raw()), dq, dkv, packs, int(d.qkv_width() / N),
        int((QPG + 2) * d.HD / N), int(QPG * d.HD / N));
  } else {
    add_slots_kernel<T><<<grid_for(n, 256), 256, 0, cs>>>(static_cast<const T*>(t.raw()), dq,
                                                           dkv, n, d.qkv_width(),
                                                           (QPG + 2) * d.HD, QPG * d.HD);
  }
  MCPP_LAUNCH_CHECK();
}

// A rectangular block (or one whose lse is a strided view) has no kernel but cuDNN's.
[[noreturn]] void no_rect_kernel(const char* op, const AttentionDims& d) {
  MCPP_FAIL("{}: a block of {} query and {} key rows (lse stride {}) has no kernel but cuDNN's, "
            "which did not take it; callers ask ops::attention_block_rect_supported first",
            op, d.S, d.kv_rows(), d.lse_stride());
}
}  // namespace

void attention_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                             bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                             Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_block_forward";
  check_key_start(op, d);
  check_cuda(q_src, op, "q_src");
  check_numel(q_src, d.S * d.B * d.qkv_width(), op, "q_src");
  check_cuda(kv_src, op, "kv_src");
  check_numel(kv_src, d.kv_rows() * d.B * d.qkv_width(), op, "kv_src");
  check_cuda(out, op, "out");
  MCPP_CHECK(out.dtype() == q_src.dtype() && kv_src.dtype() == q_src.dtype(),
             "{}: q_src {}, kv_src {} and out {} differ in dtype", op, q_src.str(), kv_src.str(),
             out.str());
  check_numel(out, d.S * d.B * d.NH * d.HD, op, "out");
  check_f32(lse, op, "lse");
  check_numel(lse, d.lse_span(), op, "lse");
  if (d.S * d.B * d.NH == 0) return;
  const BlockKernel k = block_kernel(q_src.dtype(), d, dropout_p);
  if (k == BlockKernel::Cudnn &&
      cudnn_block_forward(cudnn_args(q_src, d, softmax_scale), kv_src.raw(), causal, out.raw(),
                          static_cast<float*>(lse.raw()), stream_of(s)))
    return;
  if (d.rectangular()) no_rect_kernel(op, d);
  if (k != BlockKernel::CudaCore && flash_block_takes(q_src.dtype(), d.HD))
    flash_block_forward(q_src, kv_src, d, causal, softmax_scale, dropout_p, key, out, lse, s);
  else
    attention_core_block_forward(q_src, kv_src, d, causal, softmax_scale, dropout_p, key, out,
                                 lse, s);
}

namespace {
void check_backward(const char* op, const Tensor& dout, const Tensor& q_src,
                    const Tensor& kv_src, const Tensor& out, const Tensor& lse,
                    const AttentionDims& d, const Tensor& dq, const Tensor& dkv) {
  check_key_start(op, d);
  check_cuda(q_src, op, "q_src");
  check_numel(q_src, d.S * d.B * d.qkv_width(), op, "q_src");
  const int64_t on = d.S * d.B * d.NH * d.HD;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&kv_src, &dout, &out, &dq, &dkv}) {
    check_cuda(*t, op, "kv_src/dout/out/dq/dkv");
    MCPP_CHECK(t->dtype() == q_src.dtype(), "{}: {} and q_src {} differ in dtype", op, t->str(),
               q_src.str());
  }
  check_numel(kv_src, d.kv_rows() * d.B * d.qkv_width(), op, "kv_src");
  check_numel(dout, on, op, "dout");
  check_numel(out, on, op, "out");
  check_numel(dq, q_src.numel(), op, "dq");
  check_numel(dkv, kv_src.numel(), op, "dkv");
  check_f32(lse, op, "lse");
  check_numel(lse, d.lse_span(), op, "lse");
}
}  // namespace

void attention_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                              const Tensor& out, const Tensor& lse, const AttentionDims& d,
                              bool causal, double softmax_scale, double dropout_p,
                              DropoutKey key, Tensor& dq, Tensor& dkv, Stream& s) {
  check_backward("attention_block_backward", dout, q_src, kv_src, out, lse, d, dq, dkv);
  if (d.S * d.B * d.NH == 0) return;
  const BlockKernel k = block_kernel(q_src.dtype(), d, dropout_p);
  if (k == BlockKernel::Cudnn) {
    // cuDNN writes (=): dQ, dK, dV into scratch chunks, then added into the slots. A square
    // block shares one chunk (dQ's and dK/dV's slots are disjoint columns of a row); a
    // rectangular one has a chunk of query rows and one of key rows.
    const bool one = d.kv_rows() == d.S;
    Tensor tq = Tensor::empty({q_src.numel()}, q_src.dtype(), Device::CUDA);
    Tensor tkv = one ? tq : Tensor::empty({kv_src.numel()}, q_src.dtype(), Device::CUDA);
    if (cudnn_block_backward(cudnn_args(q_src, d, softmax_scale), kv_src.raw(), causal,
                             dout.raw(), out.raw(), static_cast<const float*>(lse.raw()),
                             tq.raw(), tkv.raw(), stream_of(s))) {
      MCPP_DISPATCH_ACT(q_src.dtype(), "attention_block_backward", {
        T* q = static_cast<T*>(dq.raw());
        T* kv = static_cast<T*>(dkv.raw());
        if (one) {
          add_slots<T>(tq, q, kv, d, stream_of(s));
        } else {
          add_slots<T>(tq, q, nullptr, d, stream_of(s));
          add_slots<T>(tkv, nullptr, kv, d, stream_of(s));
        }
      });
      return;
    }
  }
  if (d.rectangular()) no_rect_kernel("attention_block_backward", d);
  if (k != BlockKernel::CudaCore && flash_block_takes(q_src.dtype(), d.HD))
    flash_block_backward(dout, q_src, kv_src, out, lse, d, causal, softmax_scale, dropout_p, key,
                         true, dq, dkv, s);
  else
    attention_core_block_backward(dout, q_src, kv_src, out, lse, d, causal, softmax_scale,
                                  dropout_p, key, dq, dkv, s);
}

// ---- document masking of self-attention: one causal block over the whole sequence -------

void attention_doc_forward(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                           double dropout_p, DropoutKey key, Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_forward";
  check_key_start(op, d);
  MCPP_CHECK(d.q_offset == d.k_offset, "{}: a self-attention call with q_offset {} != k_offset {}",
             op, d.q_offset, d.k_offset);
  cuda::attention_block_forward(qkv, qkv, d, true, softmax_scale, dropout_p, key, out, lse, s);
}

void attention_doc_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, const AttentionDims& d, double softmax_scale,
                            double dropout_p, DropoutKey key, Tensor& dqkv, Stream& s) {
  const char* op = "attention_backward";
  check_backward(op, dout, qkv, qkv, out, lse, d, dqkv, dqkv);
  MCPP_CHECK(dqkv.raw() != qkv.raw(), "{}: dqkv must not alias qkv", op);
  if (d.S * d.B * d.NH == 0) return;
  if (block_kernel(qkv.dtype(), d, dropout_p) != BlockKernel::CudaCore &&
      flash_block_takes(qkv.dtype(), d.HD)) {
    flash_block_backward(dout, qkv, qkv, out, lse, d, true, softmax_scale, dropout_p, key, false,
                         dqkv, dqkv, s);
    return;
  }
  // The CUDA-core kernels accumulate: from zero, every slot of dqkv is written.
  cuda::fill(dqkv, 0.0, s);
  attention_core_block_backward(dout, qkv, qkv, out, lse, d, true, softmax_scale, dropout_p, key,
                                dqkv, dqkv, s);
}

namespace {
// One warp per (s, b, h) row: the merge of ops::attention_lse_merge in fp32.
// lse and li: [B, NH] rows ld apart.
template <typename T>
__global__ void lse_merge_kernel(const T* __restrict__ oi, const float* __restrict__ li, T* out,
                                 float* lse, int64_t S, int64_t B, int64_t NH, int64_t HD,
                                 int64_t ld) {
  const int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;  // (s * B + b) * NH + h
  if (row >= S * B * NH) return;
  const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
  const int64_t li_at = (b * NH + h) * ld + s;
  const float l = lse[li_at], l2 = li[li_at];
  const float hi = fmaxf(l, l2), lo = fminf(l, l2);
  if (hi == -INFINITY) return;  // neither block saw a key
  const float ln = hi + log1pf(expf(lo - hi));
  const float a = expf(l - ln), c = expf(l2 - ln);
  for (int64_t k = threadIdx.x; k < HD; k += 32)
    out[row * HD + k] = from_f<T>(a * to_f(out[row * HD + k]) + c * to_f(oi[row * HD + k]));
  __syncwarp();
  if (threadIdx.x == 0) lse[li_at] = ln;
}
// The same with PR = HD / N threads a row, each one 16-byte pack of it (PR divides 32, so
// a row's threads share a warp and the lse is written after all of them have read it).
template <typename T, int N>
__global__ void lse_merge_pack_kernel(const T* __restrict__ oi, const float* __restrict__ li,
                                      T* out, float* lse, int64_t rows, int64_t B, int64_t NH,
                                      int PR, int64_t ld) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t row = t / PR;  // (s * B + b) * NH + h
  const int p = int(t % PR);
  const bool active = row < rows;
  int64_t li_at = 0;
  float ln = -INFINITY;
  if (active) {
    const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
    li_at = (b * NH + h) * ld + s;
    const float l = lse[li_at], l2 = li[li_at];
    const float hi = fmaxf(l, l2), lo = fminf(l, l2);
    if (hi != -INFINITY) {  // else neither block saw a key
      ln = hi + log1pf(expf(lo - hi));
      const float a = expf(l - ln), c = expf(l2 - ln);
      const int64_t at = row * PR * N + p * N;
      Pack<T, N> o = ld_pack<N>(out + at);
      const Pack<T, N> x = ld_pack<N>(oi + at);
#pragma unroll
      for (int e = 0; e < N; ++e) o.v[e] = from_f<T>(a * to_f(o.v[e]) + c * to_f(x.v[e]));
      st_pack<N>(out + at, o);
    }
  }
  __syncwarp();
  if (active && p == 0 && ln != -INFINITY) lse[li_at] = ln;
}
}  // namespace

void attention_lse_merge(const Tensor& out_i, const Tensor& lse_i, const AttentionDims& d,
                         Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_lse_merge";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out_i, &out}) {
    check_cuda(*t, op, "out/out_i");
    check_numel(*t, d.S * d.B * d.NH * d.HD, op, "out/out_i");
  }
  MCPP_CHECK(out_i.dtype() == out.dtype(), "{}: out_i {} and out {} differ in dtype", op,
             out_i.str(), out.str());
  check_f32(lse, op, "lse");
  check_f32(lse_i, op, "lse_i");
  check_numel(lse, d.lse_span(), op, "lse");
  check_numel(lse_i, d.lse_span(), op, "lse_i");
  const int64_t rows = d.S * d.B * d.NH;
  if (rows == 0) return;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(out.dtype(), op, {
    constexpr int N = kPackN<T>;
    const int64_t PR = d.HD / N;
    if (d.HD % N == 0 && 32 % PR == 0 && is_aligned16(out.raw()) && is_aligned16(out_i.raw())) {
      const int64_t threads = rows * PR;
      lse_merge_pack_kernel<T, N><<<unsigned((threads + 255) / 256), 256, 0, cs>>>(
          static_cast<const T*>(out_i.raw()), static_cast<const float*>(lse_i.raw()),
          static_cast<T*>(out.raw()), static_cast<float*>(lse.raw()), rows, d.B, d.NH, int(PR),
          d.lse_stride());
      MCPP_LAUNCH_CHECK();
      return;
    }
  });
  MCPP_DISPATCH_ACT(out.dtype(), op,
                    lse_merge_kernel<T><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, cs>>>(
                        static_cast<const T*>(out_i.raw()),
                        static_cast<const float*>(lse_i.raw()), static_cast<T*>(out.raw()),
                        static_cast<float*>(lse.raw()), d.S, d.B, d.NH, d.HD,
                        d.lse_stride()));
  MCPP_LAUNCH_CHECK();
}

bool attention_block_rect_supported(DType dt, const AttentionDims& d, bool causal, double p,
                                    Stream&) {
  if (d.key_start.defined() || block_kernel(dt, d, p) != BlockKernel::Cudnn) return false;
  if (causal && d.kv_rows() != d.S) return false;
  return cudnn_block_supported(cudnn_args_of(dt, d), causal);
}

}  // namespace mcpp::ops::cuda
