// --qk-layernorm: RMSNorm of every query and key head of qkv [T, NG*(r+2)*HD] (grouped layout:
// per group r query heads, its key head, its value head, HD values each), value heads passed
// through. Included by norms.cu (Param, warp_sum, partial_sum_kernel, max_bwd_blocks).
//   forward:  y = x rstd (w + one), rstd = 1 / sqrt(mean(x^2) + eps)    (y may alias x)
//   backward: dx = rstd (g - x rstd^2 mean(g x)), g = dy (w + one);  dw += sum dy x rstd
// x, y, dqkv: one activation dtype (f32, bf16, f16); wq, wk: [HD] f32, bf16 or f16; dwq, dwk:
// f32 [HD] (+=). Computed in f32. A warp holds a head row (HD <= 256: PL values a lane, read
// once, written back in place). Backward: each warp sums its rows' dw in registers; a block
// adds its warps' sums in warp order into an f32 workspace [blocks, 2, HD] (2: q, k), and
// partial_sum_kernel adds the blocks in order. The grid depends only on the shape, so dwq
// and dwk are bitwise reproducible.

constexpr int kQkMaxHD = 256;

template <typename T, int PL>
static __global__ void __launch_bounds__(kThreads)
    qk_norm_fwd_kernel(const T* x, Param wq, Param wk, int64_t slots, int r, int HD, float eps,
                       float one, T* y) {
  const int lane = threadIdx.x % 32;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t i = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; i < slots; i += stride) {
    const int j = int(i % (r + 2));
    const T* xr = x + i * HD;
    T* yr = y + i * HD;
    if (j == r + 1) {  // the value head
      if (y != x)
        for (int d = lane; d < HD; d += 32) yr[d] = xr[d];
      continue;
    }
    const Param w = j < r ? wq : wk;
    float v[PL];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      v[k] = d < HD ? to_f(xr[d]) : 0.f;
      ss += v[k] * v[k];
    }
    ss = warp_sum(ss);
    const float rstd = rsqrtf(ss / float(HD) + eps);
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      if (d < HD) yr[d] = from_f<T>(v[k] * rstd * (w[d] + one));
    }
  }
}

// qk_rows = T * NG * (r + 1) query and key head rows; partial: [gridDim.x, 2, HD].
template <typename T, int PL>
static __global__ void __launch_bounds__(kThreads)
    qk_norm_bwd_kernel(const T* __restrict__ x, Param wq, Param wk, int64_t qk_rows, int r, int HD,
                       float eps, float one, T* __restrict__ g, float* __restrict__ partial) {
  __shared__ float red[kWarps][2][kQkMaxHD];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float aq[PL], ak[PL];
#pragma unroll
  for (int k = 0; k < PL; ++k) aq[k] = ak[k] = 0.f;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t q = blockIdx.x * int64_t(kWarps) + warp; q < qk_rows; q += stride) {
    const int j = int(q % (r + 1));
    const int64_t i = q / (r + 1) * (r + 2) + j;  // its slot in the grouped layout
    const bool is_q = j < r;
    const Param w = is_q ? wq : wk;
    const T* xr = x + i * HD;
    T* gr = g + i * HD;
    float xv[PL], dy[PL], wv[PL];
    float s[2] = {0.f, 0.f};  // sum x^2, sum dy w x
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      const bool in = d < HD;
      xv[k] = in ? to_f(xr[d]) : 0.f;
      dy[k] = in ? to_f(gr[d]) : 0.f;
      wv[k] = in ? w[d] + one : 0.f;
      s[0] += xv[k] * xv[k];
      s[1] += dy[k] * wv[k] * xv[k];
    }
    s[0] = warp_sum(s[0]);
    s[1] = warp_sum(s[1]);
    const float rstd = rsqrtf(s[0] / float(HD) + eps), m = rstd * rstd * s[1] / float(HD);
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      if (d >= HD) continue;
      const float gw = dy[k] * xv[k] * rstd;
      if (is_q)
        aq[k] += gw;
      else
        ak[k] += gw;
      gr[d] = from_f<T>(rstd * (dy[k] * wv[k] - xv[k] * m));
    }
  }
#pragma unroll
  for (int k = 0; k < PL; ++k) {
    const int d = lane + 32 * k;
    if (d < HD) red[warp][0][d] = aq[k], red[warp][1][d] = ak[k];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * HD; c += kThreads) {
    const int p = c / HD, d = c % HD;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w][p][d];
    partial[(int64_t(blockIdx.x) * 2 + p) * HD + d] = sum;
  }
}

// Calls f(Int<PL>) with the values a lane holds for a head of HD (HD <= kQkMaxHD).
template <typename F>
void with_qk_lanes(int HD, F&& f) {
  if (HD <= 32)
    f(std::integral_constant<int, 1>{});
  else if (HD <= 64)
    f(std::integral_constant<int, 2>{});
  else if (HD <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

template <typename T>
void launch_qk_norm_forward(const T* x, Param wq, Param wk, int64_t slots, int r, int HD, float eps,
                            float one, T* y, cudaStream_t cs) {
  with_qk_lanes(HD, [&](auto pl) {
    qk_norm_fwd_kernel<T, decltype(pl)::value>
        <<<unsigned(std::min<int64_t>((slots + kWarps - 1) / kWarps, kMaxBlocks)), kThreads, 0,
           cs>>>(x, wq, wk, slots, r, HD, eps, one, y);
  });
  MCPP_LAUNCH_CHECK();
}

template <typename T>
void launch_qk_norm_backward(const T* x, Param wq, Param wk, int64_t qk_rows, int r, int HD,
                             float eps, float one, T* g, float* dwq, float* dwk, cudaStream_t cs) {
  const int64_t nb = std::min<int64_t>((qk_rows + kWarps - 1) / kWarps, max_bwd_blocks());
  Tensor partial = Tensor::empty({nb, 2, HD}, DType::F32, Device::CUDA);
  float* pp = static_cast<float*>(partial.raw());
  with_qk_lanes(HD, [&](auto pl) {
    qk_norm_bwd_kernel<T, decltype(pl)::value>
        <<<unsigned(nb), kThreads, 0, cs>>>(x, wq, wk, qk_rows, r, HD, eps, one, g, pp);
  });
  MCPP_LAUNCH_CHECK();
  dim3 grid{unsigned((HD + kSumCols - 1) / kSumCols), 2u}, block{kSumCols, kSumSlices};
  partial_sum_kernel<<<grid, block, 0, cs>>>(pp, nb, 2, HD, dwq, dwk);
  MCPP_LAUNCH_CHECK();
}
