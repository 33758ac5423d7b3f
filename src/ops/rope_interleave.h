// --rotary-interleaved (Megatron's RotaryEmbedding with rotary_interleaved): RoPE on the
// pairs (2i, 2i + 1) of a head instead of (i, i + rot_dim / 2). With
// P: y[i] = x[2i], y[i + h] = x[2i + 1] (i < h = rot_dim / 2, the dims past rot_dim kept),
// interleaved RoPE is P^-1 . rope . P, and the attention scores are dot products of a query
// and a key head rotated alike: so the model permutes every query and key head of qkv by P
// once, before the rotate-half RoPE of the rope ops, and never back; scores, the attention
// output and the KV cache are those of the interleaved form. rope_deinterleave applies P (or
// P^-1 in the backward) to the query and key heads of the grouped qkv layout
// [T, NG, NH/NG + 2, HD]; value heads are copied. out must not alias in.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mcpp::ops {

struct RopePermuteDims {
  int64_t groups = 0;           // this rank's query groups NG
  int64_t heads_per_group = 0;  // query heads per group
  int64_t head_dim = 0;         // HD
  int64_t rot_dim = 0;          // the rotated dims of a head (even, <= HD)
};

#define MCPP_ROPE_INTERLEAVE_OPS                                                       \
  void rope_deinterleave(const Tensor& in, const RopePermuteDims& d, bool inverse,     \
                         Tensor& out, Stream& s);

MCPP_ROPE_INTERLEAVE_OPS

namespace cpu {
MCPP_ROPE_INTERLEAVE_OPS
}  // namespace cpu

#ifdef MCPP_HAVE_CUDA
namespace cuda {
MCPP_ROPE_INTERLEAVE_OPS
}  // namespace cuda
#endif

#undef MCPP_ROPE_INTERLEAVE_OPS

// The source dim of output dim t of a rotated head (t < rot_dim): P's, or P^-1's.
inline int64_t rope_permute_source(int64_t t, int64_t rot_dim, bool inverse) {
  const int64_t h = rot_dim / 2;
  if (!inverse) return t < h ? 2 * t : 2 * (t - h) + 1;
  return t % 2 == 0 ? t / 2 : h + t / 2;
}

// The shared argument checks; returns the row count.
int64_t check_rope_deinterleave(const Tensor& in, const RopePermuteDims& d, const Tensor& out,
                                Device dev);

}  // namespace mcpp::ops
