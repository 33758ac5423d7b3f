// Vocab-parallel cross-entropy in Megatron's three steps (the caller all-reduces between
// them under TP), and ce_stats: the forward statistics in one pass over the logits.
// logits[T, Vl]: activation dtype; row_max, sum_exp, target_logit, loss, dloss: f32 [T];
// targets[T]: i32/i64; dlogits: activation dtype, `=`, may alias logits.
// One block per row; f32 arithmetic. Probabilities are never stored: backward recomputes
// exp(logit - max) / sum_exp on the fly. Rows whose length is a multiple of 16 bytes
// (every padded vocabulary) are read and written 16 bytes per thread with four loads in
// flight (the passes are bound by memory latency otherwise: 1.3 TB/s with 2-byte loads);
// other rows take the element-wise loop.
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

// ---- 16-byte vector access ------------------------------------------------------------
template <typename T>
constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte vector

template <typename T>
__device__ __forceinline__ void unpack(const uint4& r, float* x) {  // x[kVec<T>]
  const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) x[k] = to_f(e[k]);
}
template <typename T>
__device__ __forceinline__ uint4 pack(const float (&x)[kVec<T>]) {
  uint4 r;
  T* e = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) e[k] = from_f<T>(x[k]);
  return r;
}

// f(acc, x) over a row of nv 16-byte vectors, four loads in flight per thread.
template <typename T, typename F>
__device__ __forceinline__ float row_fold(const uint4* __restrict__ row, int64_t nv, float acc,
                                          F f) {
  const int64_t bd = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + 3 * bd < nv; i += 4 * bd) {
    uint4 r[4] = {row[i], row[i + bd], row[i + 2 * bd], row[i + 3 * bd]};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float x[kVec<T>];
      unpack<T>(r[u], x);
#pragma unroll
      for (int k = 0; k < kVec<T>; ++k) acc = f(acc, x[k]);
    }
  }
  for (; i < nv; i += bd) {
    float x[kVec<T>];
    unpack<T>(row[i], x);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) acc = f(acc, x[k]);
  }
  return acc;
}

template <typename T>
static __global__ void row_max_vec_kernel(const T* __restrict__ logits, int64_t V,
                                          float* row_max) {
  const uint4* row = reinterpret_cast<const uint4*>(logits + blockIdx.x * V);
  float m = row_fold<T>(row, V / kVec<T>, -FLT_MAX, [](float a, float x) { return fmaxf(a, x); });
  m = block_reduce<true>(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T, typename I>
static __global__ void sum_exp_vec_kernel(const T* __restrict__ logits, int64_t V,
                                          const float* __restrict__ row_max,
                                          const I* __restrict__ targets, int64_t vs,
                                          float* sum_exp, float* target_logit) {
  const T* l = logits + blockIdx.x * V;
  const float m = row_max[blockIdx.x];
  float acc = row_fold<T>(reinterpret_cast<const uint4*>(l), V / kVec<T>, 0.f,
                          [m](float a, float x) { return a + __expf(x - m); });
  acc = block_reduce<false>(acc);
  if (threadIdx.x == 0) {
    sum_exp[blockIdx.x] = acc;
    int64_t t = int64_t(targets[blockIdx.x]) - vs;
    target_logit[blockIdx.x] = (t >= 0 && t < V) ? to_f(l[t]) : 0.f;
  }
}

// dlogits and logits of one dtype (dlogits may alias logits: each thread reads a vector
// before it writes the same vector).
template <typename T, typename I>
static __global__ void ce_bwd_vec_kernel(const T* logits, int64_t V,
                                         const float* __restrict__ row_max,
                                         const float* __restrict__ sum_exp,
                                         const I* __restrict__ targets, int64_t vs,
                                         const float* __restrict__ dloss, T* dlogits) {
  const int64_t row = blockIdx.x, nv = V / kVec<T>, bd = blockDim.x;
  const uint4* l = reinterpret_cast<const uint4*>(logits + row * V);
  uint4* d = reinterpret_cast<uint4*>(dlogits + row * V);
  const float m = row_max[row], inv = 1.f / sum_exp[row], g = dloss[row];
  const int64_t t = int64_t(targets[row]) - vs;
  auto grad = [&](const uint4& r, int64_t i) {  // the same arithmetic as ce_bwd_kernel
    float x[kVec<T>];
    unpack<T>(r, x);
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k)
      x[k] = g * (__expf(x[k] - m) * inv - (i * kVec<T> + k == t ? 1.f : 0.f));
    return pack<T>(x);
  };
  int64_t i = threadIdx.x;
  for (; i + 3 * bd < nv; i += 4 * bd) {
    uint4 r[4] = {l[i], l[i + bd], l[i + 2 * bd], l[i + 3 * bd]};
#pragma unroll
    for (int u = 0; u < 4; ++u) d[i + u * bd] = grad(r[u], i + u * bd);
  }
  for (; i < nv; i += bd) d[i] = grad(l[i], i);
}

// ---- one pass: online softmax ------------------------------------------------------
// A running max m and the sum d of exp(x - m) over the values seen so far (Milakov and
// Gimelshein 2018, "Online normalizer calculation for softmax"). {-FLT_MAX, 0}: none yet.
struct MaxSum {
  float m, d;
};

// Adds N values: their max first, the sum so far rescaled once if that max is a new one,
// then their exponentials against the running max. The vector kernel adds four 16-byte
// loads at a time (16 f32 or 32 bf16 values), so the rescale costs at most one exp per 16
// or 32; rescaling per element would double the exps, and with bf16 logits the pass would
// then be bound by the special-function units rather than by memory.
template <int N>
__device__ __forceinline__ void online_add(MaxSum& s, const float* x) {
  float gm = x[0];
#pragma unroll
  for (int k = 1; k < N; ++k) gm = fmaxf(gm, x[k]);
  if (gm > s.m) {
    s.d *= __expf(s.m - gm);
    s.m = gm;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) s.d += __expf(x[k] - s.m);
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.d * __expf(a.m - m) + b.d * __expf(b.m - m)};
}

// The block's states merged in a fixed order (butterflies within each warp, then the
// warps' results in warp order), so the result is the same bits on every run. Valid in
// thread 0.
__device__ __forceinline__ MaxSum block_merge(MaxSum v) {
  __shared__ MaxSum sh[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.d, o)});
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : MaxSum{-FLT_MAX, 0.f};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.d, o)});
  }
  return v;
}

// Thread 0 of row blockIdx.x: the merged state and the target's logit.
template <typename T, typename I>
__device__ __forceinline__ void store_stats(MaxSum st, const T* l, int64_t V, I target, int64_t vs,
                                            float* row_max, float* sum_exp, float* target_logit) {
  row_max[blockIdx.x] = st.m;
  sum_exp[blockIdx.x] = st.d;
  const int64_t t = int64_t(target) - vs;
  target_logit[blockIdx.x] = (t >= 0 && t < V) ? to_f(l[t]) : 0.f;
}

template <typename T, typename I>
static __global__ void ce_stats_vec_kernel(const T* __restrict__ logits, int64_t V,
                                           const I* __restrict__ targets, int64_t vs,
                                           float* row_max, float* sum_exp, float* target_logit) {
  constexpr int N = kVec<T>;
  const T* l = logits + blockIdx.x * V;
  const uint4* row = reinterpret_cast<const uint4*>(l);
  const int64_t nv = V / N, bd = blockDim.x;
  MaxSum st{-FLT_MAX, 0.f};
  int64_t i = threadIdx.x;
  for (; i + 3 * bd < nv; i += 4 * bd) {  // four loads in flight, one rescale for all four
    const uint4 r[4] = {row[i], row[i + bd], row[i + 2 * bd], row[i + 3 * bd]};
    float x[4 * N];
#pragma unroll
    for (int u = 0; u < 4; ++u) unpack<T>(r[u], x + u * N);
    online_add<4 * N>(st, x);
  }
  for (; i < nv; i += bd) {
    float x[N];
    unpack<T>(row[i], x);
    online_add<N>(st, x);
  }
  st = block_merge(st);
  if (threadIdx.x == 0)
    store_stats(st, l, V, targets[blockIdx.x], vs, row_max, sum_exp, target_logit);
}

template <typename T, typename I>
static __global__ void ce_stats_kernel(const T* __restrict__ logits, int64_t V,
                                       const I* __restrict__ targets, int64_t vs, float* row_max,
                                       float* sum_exp, float* target_logit) {
  const T* l = logits + blockIdx.x * V;
  MaxSum st{-FLT_MAX, 0.f};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = to_f(l[v]);
    online_add<1>(st, &x);
  }
  st = block_merge(st);
  if (threadIdx.x == 0)
    store_stats(st, l, V, targets[blockIdx.x], vs, row_max, sum_exp, target_logit);
}

static __global__ void rescale_kernel(const float* __restrict__ local_max,
                                      const float* __restrict__ global_max, float* sum_exp,
                                      int64_t T) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T;
       i += int64_t(gridDim.x) * blockDim.x)
    sum_exp[i] *= expf(local_max[i] - global_max[i]);  // once per row: the accurate expf
}

// True when rows of V elements of `t` (and of `u`, if given) can be read as 16-byte vectors.
bool vec_rows(const Tensor& t, int64_t V, const Tensor* u = nullptr) {
  auto aligned = [](const Tensor& x) { return reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0; };
  const int64_t n = 16 / int64_t(dtype_size(t.dtype()));
  return V % n == 0 && aligned(t) && (u == nullptr || aligned(*u));
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

// The checks of the ops that write the forward statistics (ce_sum_exp_target, ce_stats).
Rows check_stats_args(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                      const Tensor& target_logit, const Tensor& targets, const char* op) {
  Rows r = check_logits(logits, op);
  check_stat(row_max, r.T, op, "row_max");
  check_stat(sum_exp, r.T, op, "sum_exp");
  check_stat(target_logit, r.T, op, "target_logit");
  check_targets(targets, r.T, op);
  return r;
}

// f(targets as const int32_t* or const int64_t*), then the launch check.
template <typename F>
void with_targets(const Tensor& targets, F&& f) {
  if (targets.dtype() == DType::I32)
    f(static_cast<const int32_t*>(targets.raw()));
  else
    f(static_cast<const int64_t*>(targets.raw()));
  MCPP_LAUNCH_CHECK();
}

}  // namespace

void ce_row_max(const Tensor& logits, Tensor& row_max, Stream& s) {
  const char* op = "ce_row_max";
  Rows r = check_logits(logits, op);
  check_stat(row_max, r.T, op, "row_max");
  if (r.T == 0) return;
  const bool vec = vec_rows(logits, r.V);
  MCPP_DISPATCH_ACT(logits.dtype(), op, {
    if (vec)
      row_max_vec_kernel<T><<<unsigned(r.T), kThreads, 0, stream_of(s)>>>(
          static_cast<const T*>(logits.raw()), r.V, static_cast<float*>(row_max.raw()));
    else
      row_max_kernel<T><<<unsigned(r.T), kThreads, 0, stream_of(s)>>>(
          static_cast<const T*>(logits.raw()), r.V, static_cast<float*>(row_max.raw()));
  });
  MCPP_LAUNCH_CHECK();
}

void ce_sum_exp_target(const Tensor& logits, const Tensor& row_max, const Tensor& targets,
                       int64_t vocab_start, Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const char* op = "ce_sum_exp_target";
  const Rows r = check_stats_args(logits, row_max, sum_exp, target_logit, targets, op);
  if (r.T == 0) return;
  cudaStream_t cs = stream_of(s);
  const bool vec = vec_rows(logits, r.V);
  auto run = [&](auto tp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(tp)>>;
    MCPP_DISPATCH_ACT(logits.dtype(), op, {
      auto* k = vec ? sum_exp_vec_kernel<T, I> : sum_exp_kernel<T, I>;
      k<<<unsigned(r.T), kThreads, 0, cs>>>(
          static_cast<const T*>(logits.raw()), r.V, static_cast<const float*>(row_max.raw()), tp,
          vocab_start, static_cast<float*>(sum_exp.raw()),
          static_cast<float*>(target_logit.raw()));
    });
  };
  with_targets(targets, run);
}

void ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, Tensor& row_max,
              Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const char* op = "ce_stats";
  const Rows r = check_stats_args(logits, row_max, sum_exp, target_logit, targets, op);
  if (r.T == 0) return;
  cudaStream_t cs = stream_of(s);
  const bool vec = vec_rows(logits, r.V);
  auto run = [&](auto tp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(tp)>>;
    MCPP_DISPATCH_ACT(logits.dtype(), op, {
      auto* k = vec ? ce_stats_vec_kernel<T, I> : ce_stats_kernel<T, I>;
      k<<<unsigned(r.T), kThreads, 0, cs>>>(static_cast<const T*>(logits.raw()), r.V, tp,
                                            vocab_start, static_cast<float*>(row_max.raw()),
                                            static_cast<float*>(sum_exp.raw()),
                                            static_cast<float*>(target_logit.raw()));
    });
  };
  with_targets(targets, run);
}

void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp,
                        Stream& s) {
  const char* op = "ce_rescale_sum_exp";
  const int64_t T = sum_exp.numel();
  check_stat(local_max, T, op, "local_max");
  check_stat(global_max, T, op, "global_max");
  check_stat(sum_exp, T, op, "sum_exp");
  if (T == 0) return;
  rescale_kernel<<<grid_for(T, 256), 256, 0, stream_of(s)>>>(
      static_cast<const float*>(local_max.raw()), static_cast<const float*>(global_max.raw()),
      static_cast<float*>(sum_exp.raw()), T);
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
  const bool vec = logits.dtype() == dlogits.dtype() && vec_rows(logits, r.V, &dlogits);
  auto run = [&](auto tp) {
    using I = std::remove_cv_t<std::remove_pointer_t<decltype(tp)>>;
    MCPP_DISPATCH_ACT(logits.dtype(), op, MCPP_DISPATCH_ACT2(dlogits.dtype(), op, {
      if constexpr (std::is_same_v<T, T2>) {
        if (vec) {
          ce_bwd_vec_kernel<T, I><<<unsigned(r.T), kThreads, 0, cs>>>(
              static_cast<const T*>(logits.raw()), r.V,
              static_cast<const float*>(row_max.raw()), static_cast<const float*>(sum_exp.raw()),
              tp, vocab_start, static_cast<const float*>(dloss.raw()),
              static_cast<T*>(dlogits.raw()));
          return;
        }
      }
      ce_bwd_kernel<T, T2, I><<<unsigned(r.T), kThreads, 0, cs>>>(
          static_cast<const T*>(logits.raw()), r.V, static_cast<const float*>(row_max.raw()),
          static_cast<const float*>(sum_exp.raw()), tp, vocab_start,
          static_cast<const float*>(dloss.raw()), static_cast<T2*>(dlogits.raw()));
    }));
  };
  with_targets(targets, run);
}

}  // namespace mcpp::ops::cuda
