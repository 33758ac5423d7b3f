// MoE routing on the device (catalogue.inc, ---- MoE routing): top-k with the score
// function (softmax, sigmoid, sqrtsoftplus), the load-balancing statistics (any of
// aux_loss, seq_aux_loss and global_aux_loss at once, the z-loss) and the routing's
// backward (the dispatch index is moe_route_index.cu), so that a MoE layer moves only its E
// row counts to the host.
// The per-token math is ops/moe_route_math.h, shared with the CPU reference op; here one
// thread routes one token in f32 (logits of any activation dtype are widened first), with
// its E scores in thread-local arrays (E <= kMaxE).
// Determinism: no floating-point atomics; the statistics are block reductions in a fixed
// tree order.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/moe_route_math.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

namespace mm = moe_math;
constexpr int kMaxE = int(kMoeRouteMaxExpertsCuda);  // a token's scores, thread-local
constexpr int kMaxK = int(kMoeRouteMaxTopkCuda);
constexpr int kThreads = 128;

template <typename T>
__device__ void load_row(const T* __restrict__ logits, int64_t t, int64_t E, float* l) {
  for (int64_t e = 0; e < E; ++e) l[e] = to_f(logits[t * E + e]);
}

template <typename T>
__global__ void topk_kernel(const T* __restrict__ logits, const float* __restrict__ bias,
                            MoeRouteSpec r, int64_t T_, int64_t* __restrict__ idx,
                            float* __restrict__ prob) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T_) return;
  float l[kMaxE], sel[kMaxE], tmp[kMaxE + kMaxK];
  load_row(logits, t, r.E, l);
  mm::route_token(r, l, bias, sel, tmp, idx + t * r.k, prob + t * r.k);
}

template <typename T>
__global__ void gather_kernel(const T* __restrict__ x, const int64_t* __restrict__ index,
                              T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = index[i] >= 0 ? x[index[i]] : from_f<T>(0.f);
}

// Statistics, step 1: per token what the sums over tokens need, each where asked for
// (non-null): its aux scores sc [T,E], a 1 where its aux top-k picks the expert (hit
// [T,E]), and logsumexp^2 (lse2 [T]).
template <typename T>
__global__ void stats_token_kernel(const T* __restrict__ logits, MoeRouteSpec r, int64_t T_,
                                   float* __restrict__ sc, float* __restrict__ hit,
                                   float* __restrict__ lse2) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T_) return;
  const int64_t E = r.E;
  float l[kMaxE], s[kMaxE];
  int64_t top[kMaxK];
  load_row(logits, t, E, l);
  if (sc || hit) mm::aux_scores(r, l, s);
  if (sc)
    for (int64_t e = 0; e < E; ++e) sc[t * E + e] = s[e];
  if (hit) {
    mm::topk(s, E, r.k, top);
    for (int64_t e = 0; e < E; ++e) hit[t * E + e] = 0.f;
    for (int64_t j = 0; j < r.k; ++j) hit[t * E + top[j]] = 1.f;
  }
  if (lse2) {
    const float lse = mm::softmax(l, E, s);
    lse2[t] = lse * lse;
  }
}

// A block's sum of its threads' values, in one fixed tree order (blockDim.x = kThreads).
__device__ float block_sum(float v, float* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const float out = sh[0];
  __syncthreads();
  return out;
}

// Step 2: per (group g, expert e) block, the sum over the group's tokens t = g + G i
// (G = B for seq_aux: token t is in sequence t % B; else G = 1) of v [T,E]: the counts of
// hit, the score sums of sc.
__global__ void stats_column_kernel(const float* __restrict__ v, int64_t T_, int64_t E,
                                    int64_t G, float* __restrict__ out) {
  __shared__ float sh[kThreads];
  const int64_t g = blockIdx.x / E, e = blockIdx.x % E;
  float c = 0.f;
  for (int64_t t = g + G * threadIdx.x; t < T_; t += G * kThreads) c += v[t * E + e];
  c = block_sum(c, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = c;
}

// Step 3 (one block): the losses (aux_loss, seq_aux_loss, global_aux_loss, z-loss) from the
// counts [moe_aux_rows, E] and the score sums col_seq [B,E] (seq_aux_loss) and col [E] (the
// others); f: the aux losses' factors (moe_math::aux_factors).
__global__ void stats_final_kernel(const float* __restrict__ counts,
                                   const float* __restrict__ col_seq, const float* __restrict__ col,
                                   const float* __restrict__ lse2, MoeRouteSpec r, int64_t T_,
                                   int64_t B, float f0, float f1, float f2,
                                   float* __restrict__ losses) {
  __shared__ float sh[kThreads];
  const int64_t E = r.E, ra = moe_aux_row(r, B), rg = moe_aux_global_row(r, B);
  float La = 0.f, Ls = 0.f, Lg = 0.f, z = 0.f;
  for (int64_t e = threadIdx.x; e < E; e += kThreads) {
    if (r.aux) La += counts[ra * E + e] * col[e];
    if (r.global_aux) Lg += counts[rg * E + e] * col[e];
  }
  if (r.seq_aux)
    for (int64_t i = threadIdx.x; i < B * E; i += kThreads) Ls += counts[i] * col_seq[i];
  if (r.z)
    for (int64_t t = threadIdx.x; t < T_; t += kThreads) z += lse2[t];
  La = block_sum(La, sh);
  Ls = block_sum(Ls, sh);
  Lg = block_sum(Lg, sh);
  z = block_sum(z, sh);
  if (threadIdx.x == 0) {
    losses[0] = r.aux ? f0 * La : 0.f;
    losses[1] = r.seq_aux ? f1 * Ls : 0.f;
    losses[2] = r.global_aux ? f2 * Lg : 0.f;
    losses[3] = r.z ? z / float(T_ * r.cp) : 0.f;
  }
}

template <typename T>
__global__ void backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ idx,
                                const float* __restrict__ dprob, const float* __restrict__ counts,
                                MoeRouteSpec r, int64_t T_, int64_t B, float ds0, float ds1,
                                float ds2, float zc, int64_t r0, int64_t r1,
                                T* __restrict__ dlogits) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T_) return;
  const int64_t E = r.E;
  float l[kMaxE], dl[kMaxE], s[kMaxE], tmp[kMaxE];
  load_row(logits, t, E, l);
  const float scale[3] = {ds0, ds1, ds2};
  const mm::AuxGrad<float> ag =
      counts ? mm::aux_grad(r, counts, t, B, scale) : mm::AuxGrad<float>{};
  mm::route_token_backward(r, l, idx + t * r.k, dprob + t * r.k, t >= r0 && t < r1, ag, zc, dl,
                           s, tmp);
  for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = from_f<T>(dl[e]);
}

void check_spec(const MoeRouteSpec& r, const char* op) {
  MCPP_CHECK_HINT(r.E > 0 && r.E <= kMaxE && r.k >= 1 && r.k <= std::min<int64_t>(r.E, kMaxK),
                  "the CUDA routing holds a token's scores in registers; run such a router "
                  "on the CPU",
                  "{}: {} experts, top-{}: the CUDA routing takes E <= {} and k <= {}", op, r.E,
                  r.k, kMaxE, kMaxK);
  MCPP_CHECK(r.group_topk == 0 || (r.num_groups > 0 && r.E % r.num_groups == 0 &&
                                   r.k % r.group_topk == 0 && r.group_topk <= r.num_groups),
             "{}: group-limited routing of {} experts in {} groups, top-{} groups, top-{}", op,
             r.E, r.num_groups, r.group_topk, r.k);
}

void check_i64(const Tensor& t, int64_t n, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::I64, "{}: {} is {}, expected i64", op, name, t.str());
  check_numel(t, n, op, name);
}

unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void moe_route_topk(const Tensor& logits, const Tensor& bias, const MoeRouteSpec& r,
                    Tensor& idx, Tensor& prob, Stream& s) {
  const char* op = "moe_route_topk";
  check_spec(r, op);
  check_cuda(logits, op, "logits");
  const int64_t T_ = logits.numel() / r.E;
  check_numel(logits, T_ * r.E, op, "logits");
  check_i64(idx, T_ * r.k, op, "idx");
  check_f32(prob, op, "prob");
  check_numel(prob, T_ * r.k, op, "prob");
  const float* b = nullptr;
  if (bias.defined()) {
    check_f32(bias, op, "bias");
    check_numel(bias, r.E, op, "bias");
    b = bias.data<float>();
  }
  if (T_ == 0) return;
  MCPP_DISPATCH_ACT(logits.dtype(), op,
                    topk_kernel<T><<<blocks(T_), kThreads, 0, stream_of(s)>>>(
                        static_cast<const T*>(logits.raw()), b, r, T_, idx.data<int64_t>(),
                        prob.data<float>()));
  MCPP_LAUNCH_CHECK();
}

void moe_gather(const Tensor& x, const Tensor& index, Tensor& y, Stream& s) {
  const char* op = "moe_gather";
  check_cuda(x, op, "x");
  check_cuda(y, op, "y");
  check_i64(index, y.numel(), op, "index");
  MCPP_CHECK(x.dtype() == y.dtype(), "{}: x {} and y {} differ in dtype", op, x.str(), y.str());
  const int64_t n = y.numel();
  if (n == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), op,
                    gather_kernel<T><<<grid_for(n, 256), 256, 0, stream_of(s)>>>(
                        static_cast<const T*>(x.raw()), index.data<int64_t>(),
                        static_cast<T*>(y.raw()), n));
  MCPP_LAUNCH_CHECK();
}

void moe_route_counts(const Tensor& logits, const MoeRouteSpec& r, int64_t B, Tensor& aux_counts,
                      Stream& s) {
  const char* op = "moe_route_counts";
  check_spec(r, op);
  check_cuda(logits, op, "logits");
  const int64_t E = r.E, T_ = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T_ > 0 && T_ % B == 0, "{}: {} tokens in {} sequences", op, T_, B);
  check_f32(aux_counts, op, "aux_counts");
  check_numel(aux_counts, R * E, op, "aux_counts");
  if (R == 0) return;
  Tensor hit = Tensor::empty({T_ * E}, DType::F32, Device::CUDA);
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(logits.dtype(), op,
                    stats_token_kernel<T><<<blocks(T_), kThreads, 0, cs>>>(
                        static_cast<const T*>(logits.raw()), r, T_, nullptr, hit.data<float>(),
                        nullptr));
  float* out = aux_counts.data<float>();
  if (r.seq_aux)  // per sequence
    stats_column_kernel<<<unsigned(B * E), kThreads, 0, cs>>>(hit.data<float>(), T_, E, B, out);
  if (r.aux)  // all tokens
    stats_column_kernel<<<unsigned(E), kThreads, 0, cs>>>(hit.data<float>(), T_, E, 1,
                                                          out + moe_aux_row(r, B) * E);
  if (r.global_aux)
    stats_column_kernel<<<unsigned(E), kThreads, 0, cs>>>(hit.data<float>(), T_, E, 1,
                                                          out + moe_aux_global_row(r, B) * E);
  MCPP_LAUNCH_CHECK();
}

void moe_route_stats(const Tensor& logits, const Tensor& aux_counts, const MoeRouteSpec& r,
                     int64_t B, Tensor& losses, Stream& s) {
  const char* op = "moe_route_stats";
  check_spec(r, op);
  check_cuda(logits, op, "logits");
  const int64_t E = r.E, T_ = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T_ > 0 && T_ % B == 0 && r.cp >= 1 && r.global_ranks >= 1,
             "{}: {} tokens in {} sequences, CP {}, DP x CP {}", op, T_, B, r.cp, r.global_ranks);
  const bool aux = r.any_aux();
  if (aux) {
    check_f32(aux_counts, op, "aux_counts");
    check_numel(aux_counts, R * E, op, "aux_counts");
  }
  check_f32(losses, op, "losses");
  check_numel(losses, 4, op, "losses");
  Tensor sc = Tensor::empty({aux ? T_ * E : 1}, DType::F32, Device::CUDA);
  Tensor lse2 = Tensor::empty({r.z ? T_ : 1}, DType::F32, Device::CUDA);
  Tensor col_seq = Tensor::empty({r.seq_aux ? B * E : 1}, DType::F32, Device::CUDA);
  Tensor col = Tensor::empty({E}, DType::F32, Device::CUDA);
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(logits.dtype(), op,
                    stats_token_kernel<T><<<blocks(T_), kThreads, 0, cs>>>(
                        static_cast<const T*>(logits.raw()), r, T_,
                        aux ? sc.data<float>() : nullptr, nullptr,
                        r.z ? lse2.data<float>() : nullptr));
  if (r.seq_aux)
    stats_column_kernel<<<unsigned(B * E), kThreads, 0, cs>>>(sc.data<float>(), T_, E, B,
                                                              col_seq.data<float>());
  if (r.aux || r.global_aux)
    stats_column_kernel<<<unsigned(E), kThreads, 0, cs>>>(sc.data<float>(), T_, E, 1,
                                                          col.data<float>());
  double f[3];
  mm::aux_factors(r, T_, B, f);
  stats_final_kernel<<<1, kThreads, 0, cs>>>(aux ? aux_counts.data<float>() : nullptr,
                                             col_seq.data<float>(), col.data<float>(),
                                             lse2.data<float>(), r, T_, B, float(f[0]),
                                             float(f[1]), float(f[2]), losses.data<float>());
  MCPP_LAUNCH_CHECK();
}

void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dprob,
                        const Tensor& aux_counts, const MoeRouteSpec& r, int64_t B,
                        double aux_scale, int64_t r0, int64_t r1, Tensor& dlogits, Stream& s) {
  const char* op = "moe_route_backward";
  check_spec(r, op);
  check_cuda(logits, op, "logits");
  const int64_t E = r.E, k = r.k, T_ = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T_ % B == 0, "{}: {} tokens in {} sequences", op, T_, B);
  check_i64(idx, T_ * k, op, "idx");
  check_f32(dprob, op, "dprob");
  check_numel(dprob, T_ * k, op, "dprob");
  check_cuda(dlogits, op, "dlogits");
  MCPP_CHECK(dlogits.dtype() == logits.dtype() && dlogits.numel() == T_ * E,
             "{}: dlogits {} for logits {}", op, dlogits.str(), logits.str());
  const float* cnt = nullptr;
  if (r.any_aux()) {
    check_f32(aux_counts, op, "aux_counts");
    check_numel(aux_counts, R * E, op, "aux_counts");
    cnt = aux_counts.data<float>();
  }
  if (T_ == 0) return;
  MCPP_CHECK(r.cp >= 1 && r.global_ranks >= 1, "{}: CP {}, DP x CP {}", op, r.cp,
             r.global_ranks);
  double f[3];
  mm::aux_factors(r, T_, B, f);
  const float ds0 = float(aux_scale * r.aux_coeff * f[0]);
  const float ds1 = float(aux_scale * r.seq_aux_coeff * f[1]);
  const float ds2 = float(aux_scale * r.global_aux_coeff * f[2]);
  const float zc = float(aux_scale * r.z_coeff * 2.0 / double(T_ * r.cp));
  MCPP_DISPATCH_ACT(logits.dtype(), op,
                    backward_kernel<T><<<blocks(T_), kThreads, 0, stream_of(s)>>>(
                        static_cast<const T*>(logits.raw()), idx.data<int64_t>(),
                        dprob.data<float>(), cnt, r, T_, B, ds0, ds1, ds2, zc, r0, r1,
                        static_cast<T*>(dlogits.raw())));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
