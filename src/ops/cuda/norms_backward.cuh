// Included once, by ops/cuda/norms.cu, inside its anonymous namespace after the forward
// kernels and the 16-byte vector helpers they share: the LayerNorm/RMSNorm backward kernels
// (dx per row block, the weight and bias gradients as deterministic column sums; the
// contract is at the top of norms.cu).
#pragma once

// ---- backward -------------------------------------------------------------------------

// dx for the block's rows (when dx is set) and, when partial is set, the block's column sums
// partial[blockIdx.x][0][h] = sum dy xhat, [1][h] = sum dy (LayerNorm). dy and dx may be one
// buffer: a thread writes only the vectors it has read. Dynamic shared memory: w staged as
// f32 (H floats, when dx is set); later, with R > 1 row groups, the groups' column sums
// (NP H floats).
template <typename T, bool RMS, int WPR, int V>
static __global__ void __launch_bounds__(32 * block_warps(WPR), 16 / block_warps(WPR))
    norm_bwd_reg_kernel(const T* dy, const T* __restrict__ x, Param w,
                        const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* dx,
                        bool acc, float* __restrict__ partial, int64_t rows, int H) {
  constexpr int N = kVec<T>, BW = block_warps(WPR), R = BW / WPR, G = 32 * WPR;
  constexpr int NP = RMS ? 1 : 2;
  extern __shared__ float4 smem4[];
  __shared__ float red[2][BW][2];
  float* sm = reinterpret_cast<float*>(smem4);
  if (dx) stage_param<N>(w, sm, H);
  __syncthreads();
  const int nvec = H / N, grp = threadIdx.x / 32 / WPR, t = threadIdx.x % G;
  const float inv_h = 1.f / float(H);
  float accw[V][N], accb[V][N];
#pragma unroll
  for (int j = 0; j < V; ++j)
#pragma unroll
    for (int k = 0; k < N; ++k) accw[j][k] = 0.f, accb[j][k] = 0.f;
  int slot = 0;
  for (int64_t base = blockIdx.x * int64_t(R); base < rows; base += int64_t(gridDim.x) * R) {
    const int64_t row = base + grp;
    const bool active = row < rows;
    // The dx being accumulated into is read with x and dy, so that a row waits on memory once.
    uint4 xu[V], du[V], ou[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int vi = t + j * G;
      xu[j] = du[j] = ou[j] = make_uint4(0u, 0u, 0u, 0u);
      if (active && vi < nvec) {
        xu[j] = reinterpret_cast<const uint4*>(x + row * H)[vi];
        du[j] = reinterpret_cast<const uint4*>(dy + row * H)[vi];
        if (dx && acc) ou[j] = reinterpret_cast<const uint4*>(dx + row * H)[vi];
      }
    }
    const float mean = !RMS && active ? mean_in[row] : 0.f;
    const float rstd = active ? rstd_in[row] : 0.f;
    if (dx) {
      float sums[2] = {0.f, 0.f};  // sum g, sum g xhat
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int vi = t + j * G;
        if (vi >= nvec) continue;
        float xv[N], dv[N], wv[N];
        to_floats<T>(xu[j], xv);
        to_floats<T>(du[j], dv);
        staged<N>(sm, nvec, vi, wv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float g = dv[k] * wv[k], xh = (xv[k] - mean) * rstd;
          sums[0] += g;
          sums[1] += g * xh;
        }
      }
      group_sum<WPR>(sums, red, slot);
      const float mg = RMS ? 0.f : sums[0] * inv_h, mgx = sums[1] * inv_h;
      if (active) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int vi = t + j * G;
          if (vi >= nvec) continue;
          float xv[N], dv[N], wv[N], o[N];
          to_floats<T>(xu[j], xv);
          to_floats<T>(du[j], dv);
          staged<N>(sm, nvec, vi, wv);
#pragma unroll
          for (int k = 0; k < N; ++k) {
            const float xh = (xv[k] - mean) * rstd;
            o[k] = rstd * (dv[k] * wv[k] - mg - xh * mgx);
          }
          if (acc) {
            float old[N];
            to_floats<T>(ou[j], old);
#pragma unroll
            for (int k = 0; k < N; ++k) o[k] += old[k];
          }
          reinterpret_cast<uint4*>(dx + row * H)[vi] = from_floats<T>(o);
        }
      }
    }
    if (partial && active) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (t + j * G >= nvec) continue;
        float xv[N], dv[N];
        to_floats<T>(xu[j], xv);
        to_floats<T>(du[j], dv);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          accw[j][k] += dv[k] * ((xv[k] - mean) * rstd);
          if constexpr (!RMS) accb[j][k] += dv[k];
        }
      }
    }
  }
  if (!partial) return;
  // The block's sums: the R row groups added in group order through shared memory (which
  // held w: hence the first barrier), the last group writing the result.
  float* pw = partial + int64_t(blockIdx.x) * NP * H;
  if constexpr (R > 1) __syncthreads();
#pragma unroll 1
  for (int r = 0; r < R; ++r) {
    if (grp == r) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int vi = t + j * G;
        if (vi >= nvec) continue;
#pragma unroll
        for (int q = 0; q < N / 4; ++q) {
#pragma unroll
          for (int p = 0; p < NP; ++p) {
            const int c = p * H + vi * N + 4 * q;
            float4 s;
            if (p == 0)
              s = make_float4(accw[j][4 * q], accw[j][4 * q + 1], accw[j][4 * q + 2],
                              accw[j][4 * q + 3]);
            else
              s = make_float4(accb[j][4 * q], accb[j][4 * q + 1], accb[j][4 * q + 2],
                              accb[j][4 * q + 3]);
            if (r > 0) {
              const float4 o = *reinterpret_cast<const float4*>(sm + c);
              s.x = o.x + s.x, s.y = o.y + s.y, s.z = o.z + s.z, s.w = o.w + s.w;
            }
            *reinterpret_cast<float4*>((r == R - 1 ? pw : sm) + c) = s;
          }
        }
      }
    }
    if (r < R - 1) __syncthreads();
  }
}

// Streaming rows: one row per block at a time; the block's column sums accumulate directly in
// its row of `partial` (each column always by the same thread).
template <typename T, bool RMS>
static __global__ void __launch_bounds__(kThreads)
    norm_bwd_stream_kernel(const T* dy, const T* __restrict__ x, Param w,
                           const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                           T* dx, bool acc, float* __restrict__ partial, int64_t rows, int64_t H) {
  constexpr int NP = RMS ? 1 : 2;
  __shared__ float red[2][kWarps][2];
  int slot = 0;
  const float inv_h = 1.f / float(H);
  float* pw = partial ? partial + int64_t(blockIdx.x) * NP * H : nullptr;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * H;
    const T* dyr = dy + row * H;
    const float mean = RMS ? 0.f : mean_in[row], rstd = rstd_in[row];
    if (dx) {
      float sums[2] = {0.f, 0.f};
      for (int64_t i = threadIdx.x; i < H; i += kThreads) {
        const float g = to_f(dyr[i]) * w[i], xh = (to_f(xr[i]) - mean) * rstd;
        sums[0] += g;
        sums[1] += g * xh;
      }
      group_sum<kWarps, kWarps>(sums, red, slot);
      const float mg = RMS ? 0.f : sums[0] * inv_h, mgx = sums[1] * inv_h;
      T* dxr = dx + row * H;
      for (int64_t i = threadIdx.x; i < H; i += kThreads) {
        const float xh = (to_f(xr[i]) - mean) * rstd;
        float o = rstd * (to_f(dyr[i]) * w[i] - mg - xh * mgx);
        if (acc) o += to_f(dxr[i]);
        dxr[i] = from_f<T>(o);
      }
    }
    if (pw) {
      const bool first = row == blockIdx.x;
      for (int64_t i = threadIdx.x; i < H; i += kThreads) {
        const float d = to_f(dyr[i]), gw = d * ((to_f(xr[i]) - mean) * rstd);
        pw[i] = first ? gw : pw[i] + gw;
        if constexpr (!RMS) pw[H + i] = first ? d : pw[H + i] + d;
      }
    }
  }
}

// out_p[h] += sum_b partial[b][p][h] (out_p may be null): thread (c, s) adds blocks s, s + 32,
// ... in order, then thread (c, 0) adds the 32 sums in order.
constexpr int kSumCols = 32, kSumSlices = 32;
static __global__ void __launch_bounds__(kSumCols* kSumSlices)
    partial_sum_kernel(const float* __restrict__ partial, int64_t blocks, int np, int64_t H,
                       float* out0, float* out1) {
  __shared__ float sh[kSumSlices][kSumCols + 1];
  const int p = blockIdx.y;
  float* out = p == 0 ? out0 : out1;
  if (!out) return;  // the whole block
  const int64_t col = blockIdx.x * int64_t(kSumCols) + threadIdx.x;
  float v = 0.f;
  if (col < H)
#pragma unroll 4
    for (int64_t b = threadIdx.y; b < blocks; b += kSumSlices) v += partial[(b * np + p) * H + col];
  sh[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && col < H) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kSumSlices; ++i) s += sh[i][threadIdx.x];
    out[col] += s;
  }
}
