// The tensor-core flash attention of flash_attention.cu, called by attention.cu when
// ops::choose_attention_backend picks it (bf16/f16, head dim 64 or 128, with or without
// attention dropout; cuDNN first when there is no dropout); attention.cu's CUDA-core
// kernel serves every other call. MCPP_ATTENTION_FALLBACK=1 in the environment forces the
// CUDA-core kernel (for comparisons).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>

#include "ops/types.h"

namespace mcpp::ops::cuda {

struct FlashArgs {
  const void* qkv;  // [S, B, NG, NH/NG + 2, HD]
  AttentionDims d;  // local shape and the global coordinates of the dropout mask
  DType dtype;
  double softmax_scale;
  double dropout_p = 0;  // attention dropout on the probabilities (0: none)
  DropoutKey key{};
};

bool flash_attention_applies(DType dt, int64_t head_dim, double dropout_p);
// Whether the kernels run on Hopper's warpgroup MMA (flash_attention_sm90.cuh): the image
// loaded for the current device has them (sm_90a on a compute-capability-9.0 GPU) and
// MCPP_FLASH_WGMMA is not 0. Otherwise the mma.sync kernels run (the same results).
bool flash_attention_uses_wgmma();
// out[S, B, NH*HD] (=), lse[B, NH, S] f32 (=). With dropout, `mask` (device memory of
// flash_attention_mask_bytes(a) bytes, or null) receives the keep bits the forward draws,
// for a backward called with mask_ready (0 bytes: the forward writes nothing).
void flash_attention_forward(const FlashArgs& a, void* out, float* lse, cudaStream_t cs,
                             void* mask = nullptr);
// dqkv (=) from dout, lse and delta = rowsum(dout * out) [B, NH, S]. With dropout, `mask`
// (device memory of flash_attention_mask_bytes(a) bytes, or null) carries the keep bits
// from the dK/dV kernel to the dQ kernel, so the backward draws the mask once instead of
// twice; null (or 0 bytes: S_global or k_offset not a multiple of 8) draws it in both.
// mask_ready: `mask` holds the bits the forward of the same call wrote, and neither
// backward kernel draws. Deterministic either way: no atomics, the same bits.
// ds (device memory of flash_ds_bytes(ds_chunk, NH, S), attention_backend.h, or null):
// the dK/dV kernel writes dS there and the dQ kernel reads it instead of recomputing the
// scores, ds_chunk sequences at a time; then the mask needs no hand-over buffer (`mask`
// only serves mask_ready). Null: the dQ kernel recomputes dS.
int64_t flash_attention_mask_bytes(const FlashArgs& a);
void flash_attention_backward(const FlashArgs& a, const void* dout, const float* lse,
                              const float* delta, void* dqkv, cudaStream_t cs,
                              void* mask = nullptr, bool mask_ready = false,
                              void* ds = nullptr, int64_t ds_chunk = 0);
// The sequences per dS chunk whose buffer fits cap_bytes (a divisor of B), or 0: no dS
// hand-over (one sequence alone over the cap, or MCPP_FLASH_DQ_FROM_DS=0).
int64_t flash_attention_ds_chunk(const FlashArgs& a, int64_t cap_bytes);

}  // namespace mcpp::ops::cuda
