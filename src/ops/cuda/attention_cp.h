// The attention kernels behind the catalogue's `context parallel` section and the
// document mask (--reset-attention-mask) on the GPU. One attention BLOCK: queries from
// q_src, keys and values from kv_src (grouped layout, d.S rows each; the same tensor for
// self-attention), causal or not, d.key_start (i64 [B, S] on the GPU) masking keys before
// each row's document. attention_cp.cu checks the arguments and picks the kernel:
//   * flash_block_*: the tensor-core kernels of attention_block.cu (bf16/f16, head dim 64
//     or 128; MCPP_ATTENTION_FALLBACK turns them off);
//   * attention_core_block_*: the CUDA-core kernels of attention.cu (every dtype).
// Backward: with accumulate, dQ += into dq's query slots and dK, dV += into dkv's key/value
// slots (dq may be dkv); without, = (every element of those slots written).
#pragma once
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

void attention_core_block_forward(const Tensor& q_src, const Tensor& kv_src,
                                  const AttentionDims& d, bool causal, double softmax_scale,
                                  double dropout_p, DropoutKey key, Tensor& out, Tensor& lse,
                                  Stream& s);
// Always accumulates (+=).
void attention_core_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                                   const Tensor& out, const Tensor& lse, const AttentionDims& d,
                                   bool causal, double softmax_scale, double dropout_p,
                                   DropoutKey key, Tensor& dq, Tensor& dkv, Stream& s);

bool flash_block_takes(DType dt, int64_t head_dim);
void flash_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                         bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                         Tensor& out, Tensor& lse, Stream& s);
void flash_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                          const Tensor& out, const Tensor& lse, const AttentionDims& d,
                          bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                          bool accumulate, Tensor& dq, Tensor& dkv, Stream& s);

// ops::attention_forward / attention_backward with d.key_start defined (attention.cu
// hands them here): one causal block over the whole sequence; dqkv (=).
void attention_doc_forward(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                           double dropout_p, DropoutKey key, Tensor& out, Tensor& lse, Stream& s);
void attention_doc_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, const AttentionDims& d, double softmax_scale,
                            double dropout_p, DropoutKey key, Tensor& dqkv, Stream& s);

}  // namespace mcpp::ops::cuda
