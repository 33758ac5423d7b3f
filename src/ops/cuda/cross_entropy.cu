// Vocab-parallel cross-entropy in Megatron's three steps (the caller all-reduces between
// them under TP). logits[T, Vl]: activation dtype; row_max, sum_exp, target_logit, loss,
// dloss: f32 [T]; targets[T]: i32/i64; dlogits: activation dtype, `=`, may alias logits.
// One block per row; f32 arithmetic. Probabilities are never stored: backward recomputes
// exp(logit - max) / sum_exp on the fly.
#include <cfloat>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <bool MAX>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float sh[32];
  __shared__ float result;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = MAX ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : (MAX ? -FLT_MAX : 0.f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = MAX ? fmaxf(v, w) : v + w;
    }
    if (threadIdx.x == 0) result = v;
  }
  __syncthreads();
  return result;
}

template <typename T>
static __global__ void row_max_kernel(const T* __restrict__ logits, int64_t V, float* row_max) {
  const T* l = logits + blockIdx.x * V;
  float m = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, to_f(l[v]));
  m = block_reduce<true>(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T, typename I>
static __global__ void sum_exp_kernel(const T* __restrict__ logits, int64_t V,
                                      const float* __restrict__ row_max,
                                      const I* __restrict__ targets, int64_t vs, float* sum_exp,
                                      float* target_logit) {
  const T* l = logits + blockIdx.x * V;
  float m = row_max[blockIdx.x];
  float acc = 0.f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) acc += __expf(to_f(l[v]) - m);
  acc = block_reduce<false>(acc);
  if (threadIdx.x == 0) {
    sum_exp[blockIdx.x] = acc;
    int64_t t = int64_t(targets[blockIdx.x]) - vs;
    target_logit[blockIdx.x] = (t >= 0 && t < V) ? to_f(l[t]) : 0.f;
  }
}

static __global__ void loss_kernel(const float* row_max, const float* sum_exp, const float* tl,
                                   float* loss, int64_t T) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T;
       i += int64_t(gridDim.x) * blockDim.x)
    loss[i] = logf(sum_exp[i]) + row_max[i] - tl[i];
}

template <typename T, typename TD, typename I>
static __global__ void ce_bwd_kernel(const T* logits, int64_t V, const float* __restrict__ row_max,
                                     const float* __restrict__ sum_exp,
                                     const I* __restrict__ targets, int64_t vs,
                                     const float* __restrict__ dloss, TD* dlogits) {
  int64_t row = blockIdx.x;
  const T* l = logits + row * V;
  TD* d = dlogits + row * V;
  float m = row_max[row], inv = 1.f / sum_exp[row], g = dloss[row];
  int64_t t = int64_t(targets[row]) - vs;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float p = __expf(to_f(l[v]) - m) * inv;
    d[v] = from_f<TD>(g * (p - (v == t ? 1.f : 0.f)));
  }
}

struct Rows {
  int64_t T, V;
};

Rows check_logits(const Tensor& logits, const char* op) {
  check_cuda(logits, op, "logits");
  int64_t V = logits.size(-1);
  return {logits.numel() / std::max<int64_t>(V, 1), V};
}

void check_stat(const Tensor& t, int64_t n, const char* op, const char* name) {
  check_f32(t, op, name);
  check_numel(t, n, op, name);
}

void check_targets(const Tensor& t, int64_t n, const char* op) {
  check_cuda(t, op, "targets");
  check_numel(t, n, op, "targets");
  MCPP_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64,
             "{}: targets is {}; i32 or i64 expected", op, t.str());
}

}  // namespace

void ce_row_max(const Tensor& logits, Tensor& row_max, Stream& s) {
  const char* op = "ce_row_max";
  Rows r = check_logits(logits, op);
  check_stat(row_max, r.T, op, "row_max");
  if (r.T == 0) return;
  MCPP_DISPATCH_ACT(logits.dtype(), op,
                    row_max_kernel<T><<<unsigned(r.T), kThreads, 0, stream_of(s)>>>(
                        static_cast<const T*>(logits.raw()), r.V,
                        static_cast<float*>(row_max.raw())));
  MCPP_LAUNCH_CHECK();
}

void ce_sum_exp_target(const Tensor& logits, const Tensor& row_max, const Tensor& targets,
                       int64_t vocab_start, Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const char* op = "ce_sum_exp_target";
  Rows r = check_logits(logits, op);
  check_stat(row_max, r.T, op, "row_max");
  check_stat(sum_exp, r.T, op, "sum_exp");
  check_stat(target_logit, r.T, op, "target_logit");
  check_targets(targets, r.T, op);
  if (r.T == 0) return;
  cudaStream_t cs = stream_of(s);
  auto run = [&](auto tp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(tp)>>;
    MCPP_DISPATCH_ACT(logits.dtype(), op,
                      sum_exp_kernel<T, I><<<unsigned(r.T), kThreads, 0, cs>>>(
                          static_cast<const T*>(logits.raw()), r.V,
                          static_cast<const float*>(row_max.raw()), tp, vocab_start,
                          static_cast<float*>(sum_exp.raw()),
                          static_cast<float*>(target_logit.raw())));
  };
  if (targets.dtype() == DType::I32)
    run(static_cast<const int32_t*>(targets.raw()));
  else
    run(static_cast<const int64_t*>(targets.raw()));
  MCPP_LAUNCH_CHECK();
}

void ce_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
             Tensor& loss, Stream& s) {
  const char* op = "ce_loss";
  int64_t T = row_max.numel();
  check_stat(row_max, T, op, "row_max");
  check_stat(sum_exp, T, op, "sum_exp");
  check_stat(target_logit, T, op, "target_logit");
  check_stat(loss, T, op, "loss");
  if (T == 0) return;
  loss_kernel<<<grid_for(T, 256), 256, 0, stream_of(s)>>>(
      static_cast<const float*>(row_max.raw()), static_cast<const float*>(sum_exp.raw()),
      static_cast<const float*>(target_logit.raw()), static_cast<float*>(loss.raw()), T);
  MCPP_LAUNCH_CHECK();
}

void ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                 const Tensor& targets, int64_t vocab_start, const Tensor& dloss,
                 Tensor& dlogits, Stream& s) {
  const char* op = "ce_backward";
  Rows r = check_logits(logits, op);
  check_stat(row_max, r.T, op, "row_max");
  check_stat(sum_exp, r.T, op, "sum_exp");
  check_stat(dloss, r.T, op, "dloss");
  check_targets(targets, r.T, op);
  check_cuda(dlogits, op, "dlogits");
  check_numel(dlogits, logits.numel(), op, "dlogits");
  if (r.T == 0) return;
  cudaStream_t cs = stream_of(s);
  auto run = [&](auto tp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(tp)>>;
    MCPP_DISPATCH_ACT(logits.dtype(), op, MCPP_DISPATCH_ACT2(dlogits.dtype(), op, {
      ce_bwd_kernel<T, T2, I><<<unsigned(r.T), kThreads, 0, cs>>>(
          static_cast<const T*>(logits.raw()), r.V, static_cast<const float*>(row_max.raw()),
          static_cast<const float*>(sum_exp.raw()), tp, vocab_start,
          static_cast<const float*>(dloss.raw()), static_cast<T2*>(dlogits.raw()));
    }));
  };
  if (targets.dtype() == DType::I32)
    run(static_cast<const int32_t*>(targets.raw()));
  else
    run(static_cast<const int64_t*>(targets.raw()));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
