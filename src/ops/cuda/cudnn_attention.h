// cuDNN's fused scaled-dot-product attention (its flash-attention engines) through the
// backend graph API of cudnn_graph.h, for the calls of attention.cu that it can serve:
// bf16/f16, causal, grouped-query heads, head dim a multiple of 8 up to 128, and no
// attention dropout. cuDNN's dropout draws its own Philox stream over its own element
// order and cannot reproduce our mask (a function of the global (b, h, q, k) index,
// types.h), so every call with p > 0 keeps the kernels of attention.cu.
//
// Same contract as flash_attention.h: qkv [S, B, NG, NH/NG + 2, HD]; out [S, B, NH*HD]
// (=); lse [B, NH, S] f32, natural log of the sum of exp of the scaled scores (=): cuDNN's
// softmax "Stats" tensor is exactly that (max + log sum exp), so no conversion is needed;
// dqkv (=, every element written). The tensors are described to cuDNN in place, with
// strides, as [B*NG, NH/NG, S, HD] query heads against [B*NG, 1, S, HD] key/value heads.
//
// One execution plan per (direction, dtype, S, B, NH, NG, HD), built on first use (cuDNN
// may compile kernels at run time: about a second) and cached for the process. Backward is
// deterministic by default (cuDNN's dP-workspace path: dQ from a second pass, no atomics;
// its workspace is B*NH*S^2*2 bytes); MCPP_ATTENTION_DETERMINISTIC=0 selects the faster
// atomic dQ accumulation. MCPP_ATTENTION_CUDNN=0 disables cuDNN (the own flash kernel runs).
// When the build has no cuDNN, the device or cuDNN is too old, or cuDNN rejects a shape,
// one log line says so and the caller falls back to flash_attention.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/flash_attention.h"

namespace mcpp::ops::cuda {

// True when this build was compiled against cuDNN (MCPP_HAVE_CUDNN).
bool cudnn_attention_built();
// The startup probe (runs once): cuDNN linked and >= 9.0, device sm_80+, not disabled by
// MCPP_ATTENTION_CUDNN=0. Logs one line either way.
bool cudnn_attention_enabled();
// One line for logs and benchmarks: "cuDNN 9.19.0 fused SDPA (deterministic backward)"
// or why it is not used.
std::string cudnn_attention_status();
// Whether a call of this kind may go to cuDNN at all (dtype, head dim, dropout).
bool cudnn_attention_applies(DType dt, int64_t head_dim, double dropout_p);

// Run on cuDNN when enabled and cuDNN accepts the shape; false otherwise (nothing was
// written; the caller runs its own kernel). Errors after a plan exists throw mcpp::Error.
bool cudnn_attention_forward(const FlashArgs& a, void* out, float* lse, cudaStream_t cs);
// out is the forward's output (cuDNN recomputes rowsum(dout * out) itself).
// deterministic: 1 / 0 force the ordered / atomic dQ path; -1 the process default.
// The cap on the deterministic backward's cuDNN workspace (bytes; the batch runs in chunks
// of sequences under it, a sequence over it in chunks of whole key/value groups: ops/types.h's
// attention_bwd_chunking). Default 8 GB or MCPP_ATTENTION_BWD_WORKSPACE_MB; returns the
// previous value.
int64_t set_cudnn_attention_bwd_workspace_cap(int64_t bytes);
bool cudnn_attention_backward(const FlashArgs& a, const void* dout, const void* out,
                              const float* lse, void* dqkv, cudaStream_t cs,
                              int deterministic = -1);

// One context-parallel block (ops/cuda/attention_cp.cu): queries from a.qkv, keys and
// values from kv (same layout), causal or not (no mask: a chunk against an earlier one).
// Forward: out, lse (=). Backward from the FINAL out/lse: dQ (=) into dq's query slots, dK
// and dV (=) into dkv's key/value slots (dq may be dkv; the caller accumulates). Same plan
// cache and deterministic backward as above; false when cuDNN cannot run it.
bool cudnn_block_forward(const FlashArgs& a, const void* kv, bool causal, void* out, float* lse,
                         cudaStream_t cs);
bool cudnn_block_backward(const FlashArgs& a, const void* kv, bool causal, const void* dout,
                          const void* out, const float* lse, void* dq, void* dkv,
                          cudaStream_t cs);
// Whether cuDNN has forward and backward plans for blocks of a.d's shape (building and
// caching them; a.qkv unused): a rectangular block (a.d.S_kv, a.d.lse_ld) has no other
// kernel, so the ring asks before it runs its fused steps.
bool cudnn_block_supported(const FlashArgs& a, bool causal);

struct CudnnAttentionStats {
  int64_t forward_calls = 0, backward_calls = 0;  // calls that ran on cuDNN (blocks too)
  int64_t plans = 0, rejected = 0;                // plans built, shapes cuDNN rejected
};
CudnnAttentionStats cudnn_attention_stats();

}  // namespace mcpp::ops::cuda
