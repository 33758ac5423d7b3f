// The catalogue's `context parallel` section on the GPU: the blocks of ring attention
// (argument checks here; the CUDA-core kernels of attention.cu through attention_cp.h: a
// separate key/value chunk, causal or not, the backward accumulating), their fp32 lse merge
// (one warp per row), and per-token RoPE for --reset-position-ids, which is not
// implemented on the GPU yet (an error naming the flag; validate_cp.cpp refuses the flag on
// --device cuda first). The blocks always take the CUDA-core kernels (correct for every
// dtype): cuDNN and the flash kernel assume one self-attention call.
#include <cmath>

#include "base/error.h"
#include "ops/cuda/attention_cp.h"
#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

void attention_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                             bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                             Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_block_forward";
  MCPP_CHECK_HINT(!d.key_start.defined(), "train with --device cpu, or drop --reset-attention-mask",
                  "{}: document masking is not implemented on the GPU yet", op);
  check_cuda(q_src, op, "q_src");
  check_numel(q_src, d.S * d.B * d.qkv_width(), op, "q_src");
  check_cuda(kv_src, op, "kv_src");
  check_numel(kv_src, q_src.numel(), op, "kv_src");
  check_cuda(out, op, "out");
  MCPP_CHECK(out.dtype() == q_src.dtype() && kv_src.dtype() == q_src.dtype(),
             "{}: q_src {}, kv_src {} and out {} differ in dtype", op, q_src.str(), kv_src.str(),
             out.str());
  check_numel(out, d.S * d.B * d.NH * d.HD, op, "out");
  check_f32(lse, op, "lse");
  check_numel(lse, d.B * d.NH * d.S, op, "lse");
  if (d.S * d.B * d.NH == 0) return;
  attention_core_block_forward(q_src, kv_src, d, causal, softmax_scale, dropout_p, key, out, lse,
                               s);
}

void attention_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                              const Tensor& out, const Tensor& lse, const AttentionDims& d,
                              bool causal, double softmax_scale, double dropout_p,
                              DropoutKey key, Tensor& dq, Tensor& dkv, Stream& s) {
  const char* op = "attention_block_backward";
  MCPP_CHECK_HINT(!d.key_start.defined(), "train with --device cpu, or drop --reset-attention-mask",
                  "{}: document masking is not implemented on the GPU yet", op);
  check_cuda(q_src, op, "q_src");
  check_numel(q_src, d.S * d.B * d.qkv_width(), op, "q_src");
  const int64_t on = d.S * d.B * d.NH * d.HD;
  for (const Tensor* t : std::initializer_list<const Tensor*>{&kv_src, &dout, &out, &dq, &dkv}) {
    check_cuda(*t, op, "kv_src/dout/out/dq/dkv");
    MCPP_CHECK(t->dtype() == q_src.dtype(), "{}: {} and q_src {} differ in dtype", op, t->str(),
               q_src.str());
  }
  check_numel(kv_src, q_src.numel(), op, "kv_src");
  check_numel(dout, on, op, "dout");
  check_numel(out, on, op, "out");
  check_numel(dq, q_src.numel(), op, "dq");
  check_numel(dkv, q_src.numel(), op, "dkv");
  check_f32(lse, op, "lse");
  check_numel(lse, d.B * d.NH * d.S, op, "lse");
  if (d.S * d.B * d.NH == 0) return;
  attention_core_block_backward(dout, q_src, kv_src, out, lse, d, causal, softmax_scale,
                                dropout_p, key, dq, dkv, s);
}

namespace {
// One warp per (s, b, h) row: the merge of ops::attention_lse_merge in fp32.
template <typename T>
__global__ void lse_merge_kernel(const T* __restrict__ oi, const float* __restrict__ li, T* out,
                                 float* lse, int64_t S, int64_t B, int64_t NH, int64_t HD) {
  const int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;  // (s * B + b) * NH + h
  if (row >= S * B * NH) return;
  const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
  const int64_t li_at = (b * NH + h) * S + s;
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
  check_numel(lse, d.B * d.NH * d.S, op, "lse");
  check_numel(lse_i, d.B * d.NH * d.S, op, "lse_i");
  const int64_t rows = d.S * d.B * d.NH;
  if (rows == 0) return;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(out.dtype(), op,
                    lse_merge_kernel<T><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, cs>>>(
                        static_cast<const T*>(out_i.raw()),
                        static_cast<const float*>(lse_i.raw()), static_cast<T*>(out.raw()),
                        static_cast<float*>(lse.raw()), d.S, d.B, d.NH, d.HD));
  MCPP_LAUNCH_CHECK();
}

namespace {
[[noreturn]] void not_yet(const char* op) {
  ::mcpp::fail_at(__FILE__, __LINE__,
                  fmt::format("{} is not implemented on the GPU yet", op),
                  "train with --device cpu, or drop --context-parallel-size / "
                  "--reset-position-ids / --reset-attention-mask");
}
}  // namespace

void rope_positions(const Tensor&, const AttentionDims&, int64_t, double, const Tensor&, bool,
                    Tensor&, Stream&) {
  not_yet("rope_positions (--reset-position-ids)");
}

}  // namespace mcpp::ops::cuda
