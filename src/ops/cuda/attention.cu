// Causal grouped-query attention on linear_qkv's grouped layout, flash-attention style
// (Dao et al., FlashAttention-2): scores are computed in 64x64 tiles with an online
// softmax, so memory is O(S * tile) per head; lse[B, NH, S] (f32, natural log of the
// scaled scores' sum of exponentials) is saved and backward recomputes the
// probabilities from it.
//   qkv[S, B, NG, NH/NG + 2, HD]: activation dtype; out[S, B, NH*HD]: same dtype;
//   dqkv: same layout and dtype as qkv, overwritten.
// Attention dropout acts on the probabilities, keyed by the global (b, h, q, k) index
// exactly as the CPU backend (types.h: AttentionDims); the row normaliser uses the
// undropped probabilities.
//
// Dispatch (ops::choose_attention_backend, attention_backend.h, which also writes the
// start-up log line): bf16/f16 calls without attention dropout go to cuDNN's fused
// attention (cudnn_attention.cpp) when it takes them; bf16/f16 at head dim 64 or 128 with
// dropout (or rejected by cuDNN) to the tensor-core kernel of flash_attention.cu, which
// draws the same mask; the kernels of this file serve the rest (f32, other head dims).
//
// This file's kernels (attention_core_kernels.cuh): tiles are held in shared memory as f32 and multiplied on the CUDA
// cores with 4x4 register tiles per thread (correct for every dtype; no tensor cores).
// Backward is deterministic, without atomics: one kernel accumulates dK, dV per key tile
// (looping over the group's query heads and the query tiles), another dQ per query tile.
#include <cfloat>

#include "base/philox.h"
#include "ops/attention_backend.h"
#include "ops/cuda/attention_cp.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/flash_attention.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

#include "ops/cuda/attention_core_kernels.cuh"

template <typename K>
void set_smem(K kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(bytes)));
}

// The CUDA-core kernels' head dims (cuDNN and the flash kernel check their own).
void check_cuda_core_hd(const AttentionDims& d, const char* op) {
  MCPP_CHECK(d.HD == 32 || d.HD == 64 || d.HD == 128,
             "{}: head dim {} not supported by the CUDA-core attention kernel (32, 64, 128 are)",
             op, d.HD);
}

AttnParams make_params(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                       double p, DropoutKey key, const char* op) {
  check_cuda(qkv, op, "qkv");
  MCPP_CHECK(d.NG > 0 && d.NH % d.NG == 0, "{}: NH {} is not a multiple of NG {}", op, d.NH,
             d.NG);
  check_numel(qkv, d.S * d.B * d.qkv_width(), op, "qkv");
  MCPP_CHECK(p >= 0 && p < 1, "{}: dropout probability {} outside [0, 1)", op, p);
  AttnParams P{};
  P.qkv = qkv.raw();
  P.kv = qkv.raw();
  P.causal = true, P.accum = false;
  P.S = d.S, P.B = d.B, P.NH = d.NH, P.NG = d.NG, P.QPG = d.NH / d.NG, P.W = d.qkv_width();
  P.scale = float(softmax_scale);
  P.p = p;
  P.drop_scale = float(DropoutMask::keep_scale(p));
  P.seed = key.seed, P.stream = key.stream;
  P.b_off = d.b_offset, P.h_off = d.h_offset, P.q_off = d.q_offset, P.k_off = d.k_offset;
  P.NHg = d.NH_global > 0 ? d.NH_global : d.NH;
  P.Sg = d.S_global > 0 ? d.S_global : d.S;
  // The document mask (device i64 [B, S], checked by attention_cp.cu), keys from k_offset.
  P.ks = d.key_start.defined() ? static_cast<const int64_t*>(d.key_start.raw()) : nullptr;
  P.kg0 = d.k_offset;
  return P;
}

template <typename T, int HD>
void launch_fwd(const AttnParams& P, cudaStream_t cs) {
  static bool once = (set_smem(attn_fwd_kernel<T, HD>, fwd_smem(HD)), true);
  (void)once;
  dim3 grid(unsigned((P.S + kTile - 1) / kTile), unsigned(P.B * P.NH));
  attn_fwd_kernel<T, HD><<<grid, kThreads, fwd_smem(HD), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

template <typename T, int HD>
void launch_bwd(const AttnParams& P, cudaStream_t cs) {
  static bool once = (set_smem(attn_bwd_dkv_kernel<T, HD>, dkv_smem(HD)),
                      set_smem(attn_bwd_dq_kernel<T, HD>, dq_smem(HD)), true);
  (void)once;
  unsigned tiles = unsigned((P.S + kTile - 1) / kTile);
  attn_bwd_dkv_kernel<T, HD><<<dim3(tiles, unsigned(P.B * P.NG)), kThreads, dkv_smem(HD), cs>>>(
      P);
  MCPP_LAUNCH_CHECK();
  attn_bwd_dq_kernel<T, HD><<<dim3(tiles, unsigned(P.B * P.NH)), kThreads, dq_smem(HD), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

// delta[B, NH, S] = rowsum(dO * O) (f32), the backward's softmax correction.
Tensor row_delta(const Tensor& dout, const Tensor& out, const AttentionDims& d, DType dt,
                 const char* op, cudaStream_t cs) {
  Tensor delta = Tensor::empty({d.B, d.NH, d.S}, DType::F32, Device::CUDA);
  const int64_t rows = d.S * d.B * d.NH;
  MCPP_DISPATCH_ACT(dt, op,
                    attn_delta_kernel<T><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, cs>>>(
                        static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()),
                        static_cast<float*>(delta.raw()), d.S, d.B, d.NH, d.HD));
  MCPP_LAUNCH_CHECK();
  return delta;
}

// The backend the start-up log line names (attention_backend.h). Cudnn may still fall
// back to the flash kernel when cuDNN rejects the shape (cudnn_attention_* return false).
AttentionBackend backend_for(DType dt, int64_t HD, double p) {
  return choose_attention_backend(attention_backend_query(Device::CUDA, dt, HD, p)).backend;
}

// The caller's buffer for the flash kernel's keep bits (AttentionDims::keep_bits), or null
// where there is none or the call has no bits to keep (no dropout, unaligned).
void* keep_bits_of(const FlashArgs& fa, const char* op) {
  const Tensor& t = fa.d.keep_bits;
  const int64_t mb = flash_attention_mask_bytes(fa);
  if (!t.defined() || mb == 0) return nullptr;
  check_cuda(t, op, "keep_bits");
  MCPP_CHECK(int64_t(t.nbytes()) >= mb,
             "{}: keep_bits {} holds fewer than the {} bytes of the dropout mask", op, t.str(),
             mb);
  return t.raw();
}

#define MCPP_DISPATCH_HD(hd, ...)                    \
  do {                                               \
    switch (hd) {                                    \
      case 32: { constexpr int HD = 32; __VA_ARGS__; break; }   \
      case 64: { constexpr int HD = 64; __VA_ARGS__; break; }   \
      default: { constexpr int HD = 128; __VA_ARGS__; break; }  \
    }                                                \
  } while (0)

}  // namespace

void attention_forward(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                       double dropout_p, DropoutKey key, Tensor& out, Tensor& lse, Stream& s) {
  if (d.key_start.defined())  // --reset-attention-mask: attention_cp.h's block kernels
    return attention_doc_forward(qkv, d, softmax_scale, dropout_p, key, out, lse, s);
  const char* op = "attention_forward";
  AttnParams P = make_params(qkv, d, softmax_scale, dropout_p, key, op);
  check_cuda(out, op, "out");
  MCPP_CHECK(out.dtype() == qkv.dtype(), "{}: out {} and qkv {} differ in dtype", op, out.str(),
             qkv.str());
  check_numel(out, d.S * d.B * d.NH * d.HD, op, "out");
  check_f32(lse, op, "lse");
  check_numel(lse, d.B * d.NH * d.S, op, "lse");
  if (d.S * d.B * d.NH == 0) return;
  cudaStream_t cs = stream_of(s);
  // cuDNN's fused attention first (dropout-free bf16/f16), then the own tensor-core flash
  // kernel (also with dropout), then the CUDA-core kernel below (f32, other head dims).
  const FlashArgs fa{qkv.raw(), d, qkv.dtype(), softmax_scale, dropout_p, key};
  const AttentionBackend be = backend_for(qkv.dtype(), d.HD, dropout_p);
  if (be == AttentionBackend::Cudnn &&
      cudnn_attention_forward(fa, out.raw(), static_cast<float*>(lse.raw()), cs))
    return;
  if (be != AttentionBackend::CudaCore && flash_attention_applies(qkv.dtype(), d.HD, dropout_p)) {
    flash_attention_forward(fa, out.raw(), static_cast<float*>(lse.raw()), cs,
                            keep_bits_of(fa, op));
    return;
  }
  check_cuda_core_hd(d, op);
  P.out = out.raw();
  P.lse = static_cast<float*>(lse.raw());
  MCPP_DISPATCH_ACT(qkv.dtype(), op, MCPP_DISPATCH_HD(d.HD, launch_fwd<T, HD>(P, cs)));
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttentionDims& d, double softmax_scale,
                        double dropout_p, DropoutKey key, Tensor& dqkv, Stream& s) {
  if (d.key_start.defined())  // --reset-attention-mask: attention_cp.h's block kernels
    return attention_doc_backward(dout, qkv, out, lse, d, softmax_scale, dropout_p, key, dqkv, s);
  const char* op = "attention_backward";
  AttnParams P = make_params(qkv, d, softmax_scale, dropout_p, key, op);
  int64_t on = d.S * d.B * d.NH * d.HD;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dout, &out, &dqkv}) {
    check_cuda(*t, op, "dout/out/dqkv");
    MCPP_CHECK(t->dtype() == qkv.dtype(), "{}: {} and qkv {} differ in dtype", op, t->str(),
               qkv.str());
  }
  check_numel(dout, on, op, "dout");
  check_numel(out, on, op, "out");
  check_numel(dqkv, qkv.numel(), op, "dqkv");
  check_f32(lse, op, "lse");
  check_numel(lse, d.B * d.NH * d.S, op, "lse");
  if (d.S * d.B * d.NH == 0) return;
  cudaStream_t cs = stream_of(s);
  const FlashArgs fa{qkv.raw(), d, qkv.dtype(), softmax_scale, dropout_p, key};
  const AttentionBackend be = backend_for(qkv.dtype(), d.HD, dropout_p);
  if (be == AttentionBackend::Cudnn &&
      cudnn_attention_backward(fa, dout.raw(), out.raw(), static_cast<const float*>(lse.raw()),
                               dqkv.raw(), cs))
    return;
  if (be == AttentionBackend::CudaCore || !flash_attention_applies(qkv.dtype(), d.HD, dropout_p))
    check_cuda_core_hd(d, op);
  const Tensor delta = row_delta(dout, out, d, qkv.dtype(), op, cs);
  if (be != AttentionBackend::CudaCore && flash_attention_applies(qkv.dtype(), d.HD, dropout_p)) {
    // With dropout the keep bits (about B NH S^2 / 16 bytes, 1/32 of cuDNN's deterministic dP
    // workspace) come from the forward when the caller kept them (d.keep_bits: no draw in
    // the backward), else the dK/dV kernel draws them and hands them to the dQ kernel.
    // dS goes from the dK/dV kernel to the dQ kernel in a workspace (flash_ds_bytes, in
    // sequence chunks under the cuDNN workspace cap), and then the mask needs no hand-over.
    void* saved = keep_bits_of(fa, op);
    const int64_t chunk = flash_attention_ds_chunk(fa, attention_bwd_workspace_cap_from_env());
    Tensor ds;
    if (chunk > 0)
      ds = Tensor::empty({flash_ds_bytes(chunk, d.NH, d.S) / 2}, qkv.dtype(), Device::CUDA);
    const int64_t mb = saved || chunk > 0 ? 0 : flash_attention_mask_bytes(fa);
    Tensor mask;
    if (mb > 0) mask = Tensor::empty({(mb + 7) / 8}, DType::I64, Device::CUDA);
    flash_attention_backward(fa, dout.raw(), static_cast<const float*>(lse.raw()),
                             static_cast<const float*>(delta.raw()), dqkv.raw(), cs,
                             saved ? saved : mb > 0 ? mask.raw() : nullptr, saved != nullptr,
                             chunk > 0 ? ds.raw() : nullptr, chunk);
    return;
  }
  P.out = dqkv.raw();
  P.dkv = dqkv.raw();
  P.lse = const_cast<float*>(static_cast<const float*>(lse.raw()));
  P.dout = dout.raw();
  P.o = out.raw();
  P.delta = static_cast<const float*>(delta.raw());
  MCPP_DISPATCH_ACT(qkv.dtype(), op, MCPP_DISPATCH_HD(d.HD, launch_bwd<T, HD>(P, cs)));
}

// ---- context parallel: the CUDA-core kernels for one block (attention_cp.h) ------------

void attention_core_block_forward(const Tensor& q_src, const Tensor& kv_src,
                                  const AttentionDims& d, bool causal, double softmax_scale,
                                  double dropout_p, DropoutKey key, Tensor& out, Tensor& lse,
                                  Stream& s) {
  const char* op = "attention_block_forward";
  check_cuda_core_hd(d, op);
  AttnParams P = make_params(q_src, d, softmax_scale, dropout_p, key, op);
  P.kv = kv_src.raw(), P.causal = causal;
  P.out = out.raw();
  P.lse = static_cast<float*>(lse.raw());
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(q_src.dtype(), op, MCPP_DISPATCH_HD(d.HD, launch_fwd<T, HD>(P, cs)));
}

void attention_core_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                                   const Tensor& out, const Tensor& lse, const AttentionDims& d,
                                   bool causal, double softmax_scale, double dropout_p,
                                   DropoutKey key, Tensor& dq, Tensor& dkv, Stream& s) {
  const char* op = "attention_block_backward";
  check_cuda_core_hd(d, op);
  AttnParams P = make_params(q_src, d, softmax_scale, dropout_p, key, op);
  cudaStream_t cs = stream_of(s);
  const Tensor delta = row_delta(dout, out, d, q_src.dtype(), op, cs);
  P.kv = kv_src.raw(), P.causal = causal, P.accum = true;
  P.out = dq.raw();
  P.dkv = dkv.raw();
  P.lse = const_cast<float*>(static_cast<const float*>(lse.raw()));
  P.dout = dout.raw();
  P.o = out.raw();
  P.delta = static_cast<const float*>(delta.raw());
  MCPP_DISPATCH_ACT(q_src.dtype(), op, MCPP_DISPATCH_HD(d.HD, launch_bwd<T, HD>(P, cs)));
}

}  // namespace mcpp::ops::cuda
