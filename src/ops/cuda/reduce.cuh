// Deterministic column reductions over the rows of a [T, H] tensor, for parameter
// gradients (bias, norm weights): out_k[h] += sum_t f_k(t, h), k < NOUT.
// Pass 1: a fixed grid of (column tile, row chunk) blocks writes per-chunk partial sums;
// pass 2 adds the partials in chunk order. The grid depends only on (T, H), never on
// timing or the device, so the result is bitwise reproducible.
#pragma once
#include "ops/cuda/common.cuh"

namespace mcpp::ops::cuda {

namespace colreduce {

constexpr int kCols = 32, kRows = 8;

// F: __device__ void operator()(int64_t row, int64_t col, float (&acc)[NOUT]) const.
template <int NOUT, typename F>
static __global__ void partial_kernel(F f, int64_t T, int64_t H, int64_t rows_per_chunk,
                                      float* __restrict__ partial) {
  __shared__ float sh[NOUT][kRows][kCols + 1];
  int64_t col = blockIdx.x * int64_t(kCols) + threadIdx.x;
  int64_t r0 = blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk < T ? r0 + rows_per_chunk : T;
  float acc[NOUT];
#pragma unroll
  for (int k = 0; k < NOUT; ++k) acc[k] = 0.f;
  if (col < H)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRows) f(r, col, acc);
#pragma unroll
  for (int k = 0; k < NOUT; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < H) {
#pragma unroll
    for (int k = 0; k < NOUT; ++k) {
      float v = 0.f;
      for (int j = 0; j < kRows; ++j) v += sh[k][j][threadIdx.x];
      partial[(blockIdx.y * int64_t(NOUT) + k) * H + col] = v;
    }
  }
}

template <int NOUT>
static __global__ void finish_kernel(const float* __restrict__ partial, int64_t chunks, int64_t H,
                                     float* out0, float* out1) {
  for (int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; col < H;
       col += int64_t(gridDim.x) * blockDim.x) {
#pragma unroll
    for (int k = 0; k < NOUT; ++k) {
      float* out = k == 0 ? out0 : out1;
      if (!out) continue;
      float v = 0.f;
      for (int64_t c = 0; c < chunks; ++c) v += partial[(c * NOUT + k) * H + col];
      out[col] += v;
    }
  }
}

}  // namespace colreduce

// out0[h] += sum_t f(t,h)[0] (and out1 for NOUT == 2; either may be null).
template <int NOUT, typename F>
void column_reduce_add(F f, int64_t T, int64_t H, float* out0, float* out1, cudaStream_t cs) {
  using namespace colreduce;
  if (H == 0) return;
  int64_t tiles = (H + kCols - 1) / kCols;
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((T + 63) / 64, 1056 / tiles));
  int64_t rows_per_chunk = std::max<int64_t>(1, (T + chunks - 1) / chunks);
  chunks = std::max<int64_t>(1, (T + rows_per_chunk - 1) / rows_per_chunk);
  Tensor partial = Tensor::empty({chunks, NOUT, H}, DType::F32, Device::CUDA);
  float* pp = static_cast<float*>(partial.raw());
  if (T > 0) {
    dim3 grid{unsigned(tiles), unsigned(chunks)}, block{kCols, kRows};
    partial_kernel<NOUT><<<grid, block, 0, cs>>>(f, T, H, rows_per_chunk, pp);
    MCPP_LAUNCH_CHECK();
  } else {
    return;
  }
  finish_kernel<NOUT><<<grid_for(H, 256), 256, 0, cs>>>(pp, chunks, H, out0, out1);
  MCPP_LAUNCH_CHECK();
}

// Bias gradient: db[h] += sum_t dy[t, h].
template <typename T>
struct ColSum {
  const T* dy;
  int64_t H;
  __device__ void operator()(int64_t r, int64_t c, float (&acc)[1]) const {
    acc[0] += to_f(dy[r * H + c]);
  }
};

}  // namespace mcpp::ops::cuda
