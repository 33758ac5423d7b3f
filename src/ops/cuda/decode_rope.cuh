// The RoPE of a decode step on the GPU, shared by ops/cuda/decode.cu (the fused RoPE +
// append + attention kernel) and ops/cuda/decode_rope.cu (rope_decode, the rotate-and-append
// kernel of head shapes without a fused instance, the angle table): one angle and one
// rotation, so every path rotates to the same bits as rope.cu's rope_forward.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/rope_math.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

// RoPE's angle for rotary pair i at position p, in double with cos and sin rounded to f32 as
// rope.cu's table computes them (the same rope_inv_freq), so a decode step rotates as
// rope_forward at s_offset = p.
__device__ __forceinline__ void rope_angle(int64_t p, int64_t i, int64_t rot_dim,
                                           const RopeFreqs& freqs, float& cs, float& sn) {
  const double a = double(p) * rope_inv_freq(freqs, i, rot_dim);
  cs = float(freqs.mscale * cos(a)), sn = float(freqs.mscale * sin(a));
}

// The pair (x1, x2) = (x[i], x[i + half]) rotated as rope.cu's rope_kernel rotates it: each
// product and difference rounded in f32 (no FMA contraction), then once to T.
template <typename T>
__device__ __forceinline__ void rope_rotate(float x1, float x2, float cs, float sn, T& o1, T& o2) {
  o1 = from_f<T>(__fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn)));
  o2 = from_f<T>(__fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn)));
}

// The (cos, sin) table of the decode steps' RoPE for positions 0 .. rows - 1 (see
// decode_rope.cu), or null where there is none (MCPP_DECODE_ROPE_TABLE=0, or a stream that
// is capturing a CUDA graph before the table was built).
const float2* decode_rope_table(int64_t rows, int64_t rot_dim, const RopeFreqs& freqs,
                                cudaStream_t cs);

// rope_attention_decode's first half where the fused kernel has no instance: the query heads
// of qkv rotated in place, the rotated key and the value appended to the caches at pos[b].
void launch_rope_append(Tensor& qkv, const AttentionDims& d, int64_t rot_dim,
                        const RopeFreqs& freqs, const Tensor& pos, Tensor& k_cache, Tensor& v_cache,
                        cudaStream_t cs);

}  // namespace mcpp::ops::cuda
