// Attention sinks on CUDA (catalogue.inc, attention_sink_forward / _backward). The forward
// scales each (row, head) of the output in 16-byte packs, a row's packs within one warp (its
// first lane then joins the lse, after the warp has read it); the backward's sink gradient is
// a two-pass sum in a fixed order (per-block partials, then one thread per head), so every run
// gives the same bits. Head rows that are not whole packs (or unaligned tensors) take the
// scalar kernels: a warp per row.
#include <cmath>

#include "base/error.h"
#include "ops/cuda/common.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kWarps = 8;             // warps a block (backward)
constexpr int64_t kRowsPerBlock = 512;  // a backward block's rows of one head

// Packs of N elements, R = HD / N a row (R divides 32): thread i holds pack i % R of row i / R.
template <typename T, typename W, int N>
__global__ void sink_forward_vec_kernel(T* out, float* lse, const W* __restrict__ sink,
                                        int64_t h0, int64_t S, int64_t B, int64_t NH, int R,
                                        int64_t ld) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t row = i / R;  // (s * B + b) * NH + h
  const bool in = row < S * B * NH;
  float l = 0.f, z = 0.f;
  int64_t at = 0;
  if (in) {
    const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
    at = (b * NH + h) * ld + s;
    l = lse[at], z = to_f(sink[h0 + h]);
    const float f = l == -INFINITY ? 0.f : 1.f / (1.f + expf(z - l));
    T* p = out + i * N;
    Pack<T, N> v = ld_pack<N>(p);
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = from_f<T>(to_f(v.v[k]) * f);
    st_pack<N>(p, v);
  }
  __syncwarp();  // every lane of the row has read its lse
  if (in && i % R == 0) {
    const float hi = fmaxf(l, z), lo = fminf(l, z);
    lse[at] = hi + log1pf(expf(lo - hi));
  }
}

// Block (p, h): head h's rows sb in [p * kRowsPerVecBlock, +kRowsPerVecBlock), a thread per row
// in turn, each row's dout . out in packs of N; the threads' sums added in a fixed tree.
constexpr int kVecThreads = 256;
constexpr int64_t kRowsPerVecBlock = 512;
template <typename T, typename W, int N>
__global__ void __launch_bounds__(kVecThreads)
    sink_backward_vec_kernel(const T* __restrict__ dout, const T* __restrict__ out,
                             const float* __restrict__ lse, const W* __restrict__ sink,
                             int64_t h0, int64_t S, int64_t B, int64_t NH, int R, int64_t ld,
                             float* partial) {
  __shared__ float sum[kVecThreads];
  const int64_t h = blockIdx.y, P = gridDim.x, HD = int64_t(R) * N;
  const float z = to_f(sink[h0 + h]);
  const int64_t first = blockIdx.x * kRowsPerVecBlock;
  const int64_t last = first + kRowsPerVecBlock < S * B ? first + kRowsPerVecBlock : S * B;
  float acc = 0.f;
  for (int64_t sb = first + threadIdx.x; sb < last; sb += kVecThreads) {
    const int64_t row = sb * NH + h, b = sb % B, s = sb / B;
    float delta = 0.f;
    for (int r = 0; r < R; ++r) {
      const Pack<T, N> g = ld_pack<N>(dout + row * HD + r * N);
      const Pack<T, N> o = ld_pack<N>(out + row * HD + r * N);
#pragma unroll
      for (int k = 0; k < N; ++k) delta += to_f(g.v[k]) * to_f(o.v[k]);
    }
    acc += expf(z - lse[(b * NH + h) * ld + s]) * delta;
  }
  sum[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kVecThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) sum[threadIdx.x] += sum[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[h * P + blockIdx.x] = sum[0];
}

template <typename T, typename W>
__global__ void sink_forward_kernel(T* out, float* lse, const W* __restrict__ sink, int64_t h0,
                                    int64_t S, int64_t B, int64_t NH, int64_t HD, int64_t ld) {
  const int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;  // (s * B + b) * NH + h
  if (row >= S * B * NH) return;
  const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
  const int64_t at = (b * NH + h) * ld + s;
  const float l = lse[at], z = to_f(sink[h0 + h]);
  const float f = l == -INFINITY ? 0.f : 1.f / (1.f + expf(z - l));
  for (int64_t k = threadIdx.x; k < HD; k += 32)
    out[row * HD + k] = from_f<T>(to_f(out[row * HD + k]) * f);
  __syncwarp();
  if (threadIdx.x == 0) {
    const float hi = fmaxf(l, z), lo = fminf(l, z);
    lse[at] = hi + log1pf(expf(lo - hi));
  }
}

// Block (p, h): head h's rows sb = s * B + b in [p * kRowsPerBlock, +kRowsPerBlock), a warp
// per row in turn; partial[h * P + p] = sum of exp(sink - lse) * (dout . out) over them.
template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * 32)
    sink_backward_kernel(const T* __restrict__ dout, const T* __restrict__ out,
                         const float* __restrict__ lse, const W* __restrict__ sink, int64_t h0,
                         int64_t S, int64_t B, int64_t NH, int64_t HD, int64_t ld,
                         float* partial) {
  __shared__ float warp_sum[kWarps];
  const int64_t h = blockIdx.y, P = gridDim.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float z = to_f(sink[h0 + h]);
  const int64_t first = blockIdx.x * kRowsPerBlock;
  const int64_t last = first + kRowsPerBlock < S * B ? first + kRowsPerBlock : S * B;
  float acc = 0.f;
  for (int64_t sb = first + warp; sb < last; sb += kWarps) {
    const int64_t row = sb * NH + h, b = sb % B, s = sb / B;
    float delta = 0.f;
    for (int64_t k = lane; k < HD; k += 32)
      delta += to_f(dout[row * HD + k]) * to_f(out[row * HD + k]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) delta += __shfl_xor_sync(0xffffffffu, delta, off);
    acc += expf(z - lse[(b * NH + h) * ld + s]) * delta;
  }
  if (lane == 0) warp_sum[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += warp_sum[w];
    partial[h * P + blockIdx.x] = t;
  }
}

__global__ void sink_grad_sum_kernel(const float* __restrict__ partial, int64_t P, int64_t NH,
                                     int64_t h0, float* dsink) {
  const int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (h >= NH) return;
  float t = 0.f;
  for (int64_t p = 0; p < P; ++p) t += partial[h * P + p];
  dsink[h0 + h] -= t;
}

// Whether a [rows, HD] tensor's head rows are whole 16-byte packs of N, a row's packs fitting
// one warp, at an aligned address.
bool packs_fit(const Tensor& t, int64_t HD, int N) {
  return HD % N == 0 && 32 % (HD / N) == 0 && is_aligned16(t.raw());
}

void check_args(const char* op, const Tensor& out, const Tensor& lse, const Tensor& sink,
                int64_t h0, const AttentionDims& d) {
  check_cuda(out, op, "out");
  check_cuda(sink, op, "sink");
  check_numel(out, d.S * d.B * d.NH * d.HD, op, "out");
  check_f32(lse, op, "lse");
  MCPP_CHECK(lse.numel() >= d.lse_span(), "{}: lse has {} elements, the layout needs {}", op,
             lse.numel(), d.lse_span());
  MCPP_CHECK(h0 >= 0 && sink.numel() >= h0 + d.NH,
             "{}: sink has {} heads, heads {}..{} asked for", op, sink.numel(), h0,
             h0 + d.NH - 1);
}

}  // namespace

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink, int64_t h0,
                            const AttentionDims& d, Stream& s) {
  const char* op = "attention_sink_forward";
  check_args(op, out, lse, sink, h0, d);
  const int64_t rows = d.S * d.B * d.NH;
  if (rows == 0) return;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(out.dtype(), op, MCPP_DISPATCH_ACT2(sink.dtype(), op, {
    constexpr int N = kPackN<T>;
    const int64_t R = d.HD / N;
    if (packs_fit(out, d.HD, N)) {
      sink_forward_vec_kernel<T, T2, N><<<unsigned((rows * R + 255) / 256), 256, 0, cs>>>(
          static_cast<T*>(out.raw()), static_cast<float*>(lse.raw()),
          static_cast<const T2*>(sink.raw()), h0, d.S, d.B, d.NH, int(R), d.lse_stride());
    } else {
      sink_forward_kernel<T, T2><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, cs>>>(
          static_cast<T*>(out.raw()), static_cast<float*>(lse.raw()),
          static_cast<const T2*>(sink.raw()), h0, d.S, d.B, d.NH, d.HD, d.lse_stride());
    }
  }));
  MCPP_LAUNCH_CHECK();
}

void attention_sink_backward(const Tensor& dout, const Tensor& out, const Tensor& lse,
                             const Tensor& sink, int64_t h0, const AttentionDims& d,
                             Tensor& dsink, Stream& s) {
  const char* op = "attention_sink_backward";
  check_args(op, out, lse, sink, h0, d);
  check_cuda(dout, op, "dout");
  check_numel(dout, out.numel(), op, "dout");
  MCPP_CHECK(dout.dtype() == out.dtype(), "{}: dout {} and out {} differ in dtype", op,
             dout.str(), out.str());
  check_f32(dsink, op, "dsink");
  MCPP_CHECK(dsink.numel() >= h0 + d.NH, "{}: dsink has {} elements, heads up to {} asked for",
             op, dsink.numel(), h0 + d.NH - 1);
  if (d.NH == 0) return;
  cudaStream_t cs = stream_of(s);
  Tensor partial;
  int64_t P = 0;
  MCPP_DISPATCH_ACT(out.dtype(), op, MCPP_DISPATCH_ACT2(sink.dtype(), op, {
    constexpr int N = kPackN<T>;
    const bool vec = packs_fit(out, d.HD, N) && packs_fit(dout, d.HD, N);
    const int64_t per = vec ? kRowsPerVecBlock : kRowsPerBlock;
    P = std::max<int64_t>(1, (d.S * d.B + per - 1) / per);
    partial = Tensor::empty({d.NH * P}, DType::F32, Device::CUDA);
    const dim3 grid(unsigned(P), unsigned(d.NH));
    if (vec)
      sink_backward_vec_kernel<T, T2, N><<<grid, kVecThreads, 0, cs>>>(
          static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()),
          static_cast<const float*>(lse.raw()), static_cast<const T2*>(sink.raw()), h0, d.S,
          d.B, d.NH, int(d.HD / N), d.lse_stride(), static_cast<float*>(partial.raw()));
    else
      sink_backward_kernel<T, T2><<<grid, kWarps * 32, 0, cs>>>(
          static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()),
          static_cast<const float*>(lse.raw()), static_cast<const T2*>(sink.raw()), h0, d.S,
          d.B, d.NH, d.HD, d.lse_stride(), static_cast<float*>(partial.raw()));
  }));
  MCPP_LAUNCH_CHECK();
  sink_grad_sum_kernel<<<unsigned((d.NH + 127) / 128), 128, 0, cs>>>(
      static_cast<const float*>(partial.raw()), P, d.NH, h0, static_cast<float*>(dsink.raw()));
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
