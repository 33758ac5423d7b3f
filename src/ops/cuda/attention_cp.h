// The CUDA-core attention kernels of attention.cu for one context-parallel block: queries
// from q_src, keys and values from kv_src (grouped layout, d.S rows each), causal or not;
// the backward += into dq's query slots and dkv's key/value slots. attention_cp.cu checks
// the arguments and serves the catalogue's `context parallel` entries through these.
#pragma once
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

void attention_core_block_forward(const Tensor& q_src, const Tensor& kv_src,
                                  const AttentionDims& d, bool causal, double softmax_scale,
                                  double dropout_p, DropoutKey key, Tensor& out, Tensor& lse,
                                  Stream& s);
void attention_core_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                                   const Tensor& out, const Tensor& lse, const AttentionDims& d,
                                   bool causal, double softmax_scale, double dropout_p,
                                   DropoutKey key, Tensor& dq, Tensor& dkv, Stream& s);

}  // namespace mcpp::ops::cuda
