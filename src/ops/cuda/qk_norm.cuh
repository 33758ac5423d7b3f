// --qk-layernorm: a norm of every query and key head of qkv [T, NG*(r+2)*HD] (grouped layout:
// per group r query heads, its key head, its value head, HD values each), value heads passed
// through; the norm follows --normalization. Included by norms.cu inside its anonymous
// namespace, after the argument checks (Param, param, warp_sum, partial_sum_kernel,
// max_bwd_blocks).
//   RMSNorm (LN false):  y = x rstd (w + one),  rstd = 1 / sqrt(mean(x^2) + eps)
//     dx = rstd (g - x rstd^2 mean(g x)),  g = dy (w + one);  dw += sum dy x rstd
//   LayerNorm (LN true): xhat = (x - mean) rstd,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//     y = xhat (w + one) + b;  dx = rstd (g - mean(g) - xhat mean(g xhat));
//     dw += sum dy xhat;  db += sum dy
// x, y, dqkv: one activation dtype (f32, bf16, f16); y may alias x; wq, wk, bq, bk: [HD] f32,
// bf16 or f16; dwq, dwk, dbq, dbk: f32 [HD] (+=). Computed in f32. A warp holds a head row
// (HD <= 256: PL values a lane, read once, written back in place; the LayerNorm statistics in
// two passes over the registers). Backward: each warp sums its rows' dw (db) in registers; a
// block adds its warps' sums in warp order into an f32 workspace [blocks, NP, HD] (NP: dwq,
// dwk, then dbq, dbk for LayerNorm), and partial_sum_kernel adds the blocks in order. The grid
// depends only on the shape, so the gradients are bitwise reproducible.

constexpr int kQkMaxHD = 256;

// The row's rstd from its PL values a lane (zero past HD); LayerNorm first centres v on the
// row's mean (v then holds x - mean, zero past HD).
template <bool LN, int PL>
__device__ __forceinline__ float qk_row_rstd(float (&v)[PL], int HD, float eps) {
  const int lane = threadIdx.x % 32;
  if constexpr (LN) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < PL; ++k) s += v[k];
    const float mean = warp_sum(s) / float(HD);
#pragma unroll
    for (int k = 0; k < PL; ++k) v[k] = lane + 32 * k < HD ? v[k] - mean : 0.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < PL; ++k) ss += v[k] * v[k];
  return rsqrtf(warp_sum(ss) / float(HD) + eps);
}

template <typename T, bool LN, int PL>
static __global__ void __launch_bounds__(kThreads)
    qk_norm_fwd_kernel(const T* x, Param wq, Param bq, Param wk, Param bk, int64_t slots, int r,
                       int HD, float eps, float one, T* y) {
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
    const Param w = j < r ? wq : wk, b = j < r ? bq : bk;
    float v[PL];
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      v[k] = d < HD ? to_f(xr[d]) : 0.f;
    }
    const float rstd = qk_row_rstd<LN>(v, HD, eps);
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      if (d >= HD) continue;
      float o = v[k] * rstd * (w[d] + one);
      if (LN) o += b[d];  // b is null for RMSNorm: a branch the compiler drops
      yr[d] = from_f<T>(o);
    }
  }
}

// qk_rows = T * NG * (r + 1) query and key head rows; partial: [gridDim.x, NP, HD].
template <typename T, bool LN, int PL>
static __global__ void __launch_bounds__(kThreads)
    qk_norm_bwd_kernel(const T* __restrict__ x, Param wq, Param wk, int64_t qk_rows, int r, int HD,
                       float eps, float one, T* __restrict__ g, float* __restrict__ partial) {
  constexpr int NP = LN ? 4 : 2;  // dwq, dwk (, dbq, dbk)
  __shared__ float red[kWarps][NP][kQkMaxHD];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[NP][PL];
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int k = 0; k < PL; ++k) acc[p][k] = 0.f;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t q = blockIdx.x * int64_t(kWarps) + warp; q < qk_rows; q += stride) {
    const int j = int(q % (r + 1));
    const int64_t i = q / (r + 1) * (r + 2) + j;  // its slot in the grouped layout
    const bool is_q = j < r;
    const Param w = is_q ? wq : wk;
    const T* xr = x + i * HD;
    T* gr = g + i * HD;
    float xv[PL], dy[PL], wv[PL];
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      const bool in = d < HD;
      xv[k] = in ? to_f(xr[d]) : 0.f;
      dy[k] = in ? to_f(gr[d]) : 0.f;
      wv[k] = in ? w[d] + one : 0.f;
    }
    float rstd, s[2] = {0.f, 0.f};
    if constexpr (LN) {  // xv becomes xhat; s: sum g, sum g xhat
      rstd = qk_row_rstd<true>(xv, HD, eps);
#pragma unroll
      for (int k = 0; k < PL; ++k) {
        xv[k] *= rstd;
        s[0] += dy[k] * wv[k];
        s[1] += dy[k] * wv[k] * xv[k];
      }
    } else {  // s: sum x^2, sum g x
#pragma unroll
      for (int k = 0; k < PL; ++k) {
        s[0] += xv[k] * xv[k];
        s[1] += dy[k] * wv[k] * xv[k];
      }
    }
    s[0] = warp_sum(s[0]);
    s[1] = warp_sum(s[1]);
    if constexpr (!LN) rstd = rsqrtf(s[0] / float(HD) + eps);
    // dx = rstd (g - a - xv c): LayerNorm a = mean(g), c = mean(g xhat) (xv is xhat);
    // RMSNorm a = 0, c = rstd^2 mean(g x).
    const float a = LN ? s[0] / float(HD) : 0.f;
    const float c = LN ? s[1] / float(HD) : rstd * rstd * s[1] / float(HD);
#pragma unroll
    for (int k = 0; k < PL; ++k) {
      const int d = lane + 32 * k;
      if (d >= HD) continue;
      // Constant register indices (is_q branches): acc stays in registers.
      const float gw = LN ? dy[k] * xv[k] : dy[k] * xv[k] * rstd;
      if (is_q)
        acc[0][k] += gw;
      else
        acc[1][k] += gw;
      if constexpr (LN) {
        if (is_q)
          acc[2][k] += dy[k];
        else
          acc[3][k] += dy[k];
      }
      gr[d] = from_f<T>(rstd * (dy[k] * wv[k] - a - xv[k] * c));
    }
  }
#pragma unroll
  for (int k = 0; k < PL; ++k) {
    const int d = lane + 32 * k;
    if (d < HD)
#pragma unroll
      for (int p = 0; p < NP; ++p) red[warp][p][d] = acc[p][k];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < NP * HD; c += kThreads) {
    const int p = c / HD, d = c % HD;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w][p][d];
    partial[(int64_t(blockIdx.x) * NP + p) * HD + d] = sum;
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

template <typename T, bool LN>
void launch_qk_norm_forward(const T* x, Param wq, Param bq, Param wk, Param bk, int64_t slots,
                            int r, int HD, float eps, float one, T* y, cudaStream_t cs) {
  with_qk_lanes(HD, [&](auto pl) {
    qk_norm_fwd_kernel<T, LN, decltype(pl)::value>
        <<<unsigned(std::min<int64_t>((slots + kWarps - 1) / kWarps, kMaxBlocks)), kThreads, 0,
           cs>>>(x, wq, bq, wk, bk, slots, r, HD, eps, one, y);
  });
  MCPP_LAUNCH_CHECK();
}

// db: {dbq, dbk} for LayerNorm, null for RMSNorm.
template <typename T, bool LN>
void launch_qk_norm_backward(const T* x, Param wq, Param wk, int64_t qk_rows, int r, int HD,
                             float eps, float one, T* g, float* dwq, float* dwk, float* dbq,
                             float* dbk, cudaStream_t cs) {
  constexpr int NP = LN ? 4 : 2;
  const int64_t nb = std::min<int64_t>((qk_rows + kWarps - 1) / kWarps, max_bwd_blocks());
  Tensor partial = Tensor::empty({nb, NP, HD}, DType::F32, Device::CUDA);
  float* pp = static_cast<float*>(partial.raw());
  with_qk_lanes(HD, [&](auto pl) {
    qk_norm_bwd_kernel<T, LN, decltype(pl)::value>
        <<<unsigned(nb), kThreads, 0, cs>>>(x, wq, wk, qk_rows, r, HD, eps, one, g, pp);
  });
  MCPP_LAUNCH_CHECK();
  // partial_sum_kernel adds two of the NP sums a launch: (dwq, dwk), then (dbq, dbk).
  dim3 grid{unsigned((HD + kSumCols - 1) / kSumCols), 2u}, block{kSumCols, kSumSlices};
  partial_sum_kernel<<<grid, block, 0, cs>>>(pp, nb, NP, HD, dwq, dwk);
  MCPP_LAUNCH_CHECK();
  if constexpr (LN) {
    partial_sum_kernel<<<grid, block, 0, cs>>>(pp + 2 * HD, nb, NP, HD, dbq, dbk);
    MCPP_LAUNCH_CHECK();
  }
}

// ---- host entry points (the catalogue's qk_norm_* and qk_layernorm_*) ---------------------

// Checks x and the weights of a qk_norm op; returns HD.
int qk_norm_check(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, const char* op) {
  check_cuda(x, op, "x");
  MCPP_CHECK(wq.defined() && wk.defined(), "{}: a weight is undefined", op);
  const int64_t HD = wq.numel();
  MCPP_CHECK(r >= 1 && HD > 0 && HD <= kQkMaxHD && x.numel() % (HD * (r + 2)) == 0,
             "{}: qkv of {} values is not [T, NG*({}+2)*{}], or HD {} is over {}", op, x.numel(), r,
             HD, HD, kQkMaxHD);
  param(wq, HD, op, "wq");
  param(wk, HD, op, "wk");
  return int(HD);
}

// bq, bk: the LayerNorm form's biases (defined exactly when LN).
template <bool LN>
void qk_norm_fwd(const char* op, const Tensor& x, const Tensor& wq, const Tensor& bq,
                 const Tensor& wk, const Tensor& bk, int64_t r, double eps, bool one_plus,
                 Tensor& y, Stream& s) {
  const int HD = qk_norm_check(x, wq, wk, r, op);
  MCPP_CHECK(bq.defined() == LN && bk.defined() == LN, "{}: biases {} expected", op,
             LN ? "bq, bk" : "none");
  check_cuda(y, op, "y");
  MCPP_CHECK(y.dtype() == x.dtype(), "{}: x is {}, y is {}; one dtype expected", op, x.str(),
             y.str());
  check_numel(y, x.numel(), op, "y");
  const int64_t slots = x.numel() / HD;
  const Param pbq = param(bq, HD, op, "bq"), pbk = param(bk, HD, op, "bk");
  if (slots == 0) return;
  MCPP_DISPATCH_ACT(
      x.dtype(), op,
      launch_qk_norm_forward<T, LN>(static_cast<const T*>(x.raw()), param(wq, HD, op, "wq"), pbq,
                                    param(wk, HD, op, "wk"), pbk, slots, int(r), HD, float(eps),
                                    one_plus ? 1.f : 0.f, static_cast<T*>(y.raw()), stream_of(s)));
}

// dbq, dbk: the LayerNorm form's bias gradients (used exactly when LN).
template <bool LN>
void qk_norm_bwd(const char* op, const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r,
                 double eps, bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor* dbq, Tensor& dwk,
                 Tensor* dbk, Stream& s) {
  const int HD = qk_norm_check(x, wq, wk, r, op);
  check_cuda(dqkv, op, "dqkv");
  MCPP_CHECK(dqkv.dtype() == x.dtype(), "{}: x is {}, dqkv is {}; one dtype expected", op, x.str(),
             dqkv.str());
  check_numel(dqkv, x.numel(), op, "dqkv");
  Tensor* grads[4] = {&dwq, &dwk, dbq, dbk};
  const char* names[4] = {"dwq", "dwk", "dbq", "dbk"};
  for (int p = 0; p < (LN ? 4 : 2); ++p) {
    check_f32(*grads[p], op, names[p]);
    check_numel(*grads[p], HD, op, names[p]);
  }
  const int64_t qk_rows = x.numel() / (int64_t(HD) * (r + 2)) * (r + 1);
  if (qk_rows == 0) return;
  auto f32 = [](Tensor* t) { return t ? static_cast<float*>(t->raw()) : nullptr; };
  MCPP_DISPATCH_ACT(
      x.dtype(), op,
      launch_qk_norm_backward<T, LN>(static_cast<const T*>(x.raw()), param(wq, HD, op, "wq"),
                                     param(wk, HD, op, "wk"), qk_rows, int(r), HD, float(eps),
                                     one_plus ? 1.f : 0.f, static_cast<T*>(dqkv.raw()), f32(&dwq),
                                     f32(&dwk), f32(dbq), f32(dbk), stream_of(s)));
}
