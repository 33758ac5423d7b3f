// --qk-layernorm (Megatron-Core's q_layernorm / k_layernorm with --normalization RMSNorm;
// Qwen3's self_attn.q_norm / k_norm): RMSNorm over the HD values of every query head and of
// every key head, after the QKV projection and before RoPE. One weight [HD] serves all query
// heads (self_attention.q_layernorm.weight), one all key heads (k_layernorm.weight); value
// heads pass through. Acts on qkv [T, NGl*(r+2)*HD] in Megatron's grouped layout (per group:
// r query heads, then its key head, then its value head, HD values each).
//
//   forward:  y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)  per head row of HD
//   backward: dx = rstd * (g - x * rstd^2 * mean(g * x)),  g = dy * w;  dw += sum dy * x * rstd
//
// w is 1 + stored under --apply-layernorm-1p (the derivative is unchanged). CPU only (f32,
// f64), computed in f64 per row; the CUDA device is a start-up error naming the flag.
#pragma once
#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::model {

// out = qk_norm(in); out may alias in. wq, wk: [HD] stored weights.
void qk_norm_forward(const TransformerConfig& c, const Tensor& in, const Tensor& wq,
                     const Tensor& wk, Tensor& out);
// dqkv: in: dL/d(out), out: dL/d(in) (in place; value rows unchanged). in: the forward's
// input. dwq, dwk +=.
void qk_norm_backward(const TransformerConfig& c, const Tensor& in, const Tensor& wq,
                      const Tensor& wk, Tensor& dqkv, Tensor& dwq, Tensor& dwk);

}  // namespace mcpp::model
