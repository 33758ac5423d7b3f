// Included once, by ops/cuda/attention.cu, inside its anonymous namespace (after
// ops/cuda/common.cuh and base/philox.h): the CUDA-core attention kernels -- their
// parameters (AttnParams, with the dropout mask keyed by the global (b, h, q, k) index), the
// forward, the delta = rowsum(dO * O) kernel and the two deterministic backward kernels (dK/dV
// per key tile, dQ per query tile). attention.cu keeps the launchers and the choice between
// cuDNN, the flash kernel and these. Kept apart so the dispatch reads on its own.
#pragma once

constexpr int kTile = 64;      // query and key rows per tile
constexpr int kThreads = 256;  // 16 x 16 threads, each a 4x4 block of the 64x64 tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct AttnParams {
  const void* qkv;  // queries (and, for self-attention, keys and values)
  const void* kv;   // keys and values: qkv itself, or another chunk's (context parallelism)
  void* out;     // forward: out; backward: dQ's destination
  void* dkv;     // backward: dK/dV's destination (out for self-attention)
  bool causal = true;  // false: every key visible (a chunk against an earlier one)
  bool accum = false;  // backward: += into out/dkv instead of =
  float* lse;    // [B, NH, S]
  const void* dout;
  const void* o;
  const float* delta;  // backward: rowsum(dO * O) [B, NH, S]
  int64_t S, B, NH, NG, QPG, W;  // W = qkv row width per token
  float scale;                   // softmax scale
  double p;                      // dropout probability
  float drop_scale;              // DropoutMask::keep_scale(p)
  uint64_t seed, stream;
  int64_t b_off, h_off, NHg, q_off, k_off, Sg;
  // Document mask (--reset-attention-mask): key_start [B, S] (global positions) or null;
  // key row k sits at global position k + kg0.
  const int64_t* ks;
  int64_t kg0;
  __device__ __forceinline__ bool before_doc(int64_t b, int64_t q, int64_t k) const {
    return ks != nullptr && q < S && k + kg0 < ks[b * S + q];
  }

  __device__ __forceinline__ bool keep(int64_t b, int64_t h, int64_t q, int64_t k) const {
    uint64_t gi = uint64_t((((b + b_off) * NHg + h + h_off) * Sg + q + q_off) * Sg + k + k_off);
    return double(DropoutMask::uniform(seed, stream, gi)) >= p;  // base/philox.h
  }
};

// Loads rows [r0, r0 + 64) of a strided [rows, HD] slab into smem as f32 (zeros past S),
// multiplied by `mul`.
template <typename T, int HD>
__device__ __forceinline__ void load_tile(float* dst, const T* base, int64_t row_stride,
                                          int64_t r0, int64_t S, float mul) {
  constexpr int HDP = HD + 1;
  for (int idx = threadIdx.x; idx < kTile * HD; idx += kThreads) {
    int r = idx / HD, d = idx - r * HD;
    int64_t row = r0 + r;
    dst[r * HDP + d] = row < S ? to_f(base[row * row_stride + d]) * mul : 0.f;
  }
}

template <typename T, int HD>
static __global__ void __launch_bounds__(kThreads)
    attn_fwd_kernel(AttnParams P) {
  constexpr int HDP = HD + 1, NI = HD / 16;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + kTile * HDP;
  float* Vs = Ks + kTile * HDP;
  float* Ps = Vs + kTile * HDP;  // [64][65]

  const int qt = blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / P.NH, h = bh - b * P.NH;
  const int64_t g = h / P.QPG;
  const int64_t HDW = HD;
  const T* qkv = static_cast<const T*>(P.qkv);
  const T* qbase = qkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HDW;
  const T* kbase = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HDW;
  const T* vbase = kbase + HDW;
  const int64_t rs = P.B * P.W;  // stride between sequence positions
  const int tid = threadIdx.x, rg = tid / 16, cl = tid % 16;
  const int64_t q0 = int64_t(qt) * kTile;
  const int nkt = P.causal ? qt + 1 : int((P.S + kTile - 1) / kTile);

  load_tile<T, HD>(Qs, qbase, rs, q0, P.S, P.scale * kLog2e);

  float o[4][NI], m[4], l[4];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    m[ii] = -FLT_MAX, l[ii] = 0.f;
#pragma unroll
    for (int i = 0; i < NI; ++i) o[ii][i] = 0.f;
  }

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = int64_t(kt) * kTile;
    __syncthreads();  // previous tile's Ks/Vs/Ps are consumed
    load_tile<T, HD>(Ks, kbase, rs, k0, P.S, 1.f);
    load_tile<T, HD>(Vs, vbase, rs, k0, P.S, 1.f);
    __syncthreads();
    float sc[4][4];
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) sc[ii][jj] = 0.f;
#pragma unroll 8
    for (int d = 0; d < HD; ++d) {
      float a[4], bk[4];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) a[ii] = Qs[(rg * 4 + ii) * HDP + d];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) bk[jj] = Ks[(cl + 16 * jj) * HDP + d];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) sc[ii][jj] = fmaf(a[ii], bk[jj], sc[ii][jj]);
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int64_t q = q0 + rg * 4 + ii;
      float mt = -FLT_MAX;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int64_t k = k0 + cl + 16 * jj;
        if ((P.causal && k > q) || k >= P.S || P.before_doc(b, q, k)) sc[ii][jj] = -FLT_MAX;
        mt = fmaxf(mt, sc[ii][jj]);
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      const float mn = fmaxf(m[ii], mt);
      const float alpha = exp2f(m[ii] - mn);
      float lt = 0.f;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int64_t k = k0 + cl + 16 * jj;
        float pr = sc[ii][jj] == -FLT_MAX ? 0.f : exp2f(sc[ii][jj] - mn);
        lt += pr;
        if (P.p > 0 && pr != 0.f) pr = P.keep(b, h, q, k) ? pr * P.drop_scale : 0.f;
        Ps[(rg * 4 + ii) * (kTile + 1) + cl + 16 * jj] = pr;
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, off);
      l[ii] = l[ii] * alpha + lt;
      m[ii] = mn;
#pragma unroll
      for (int i = 0; i < NI; ++i) o[ii][i] *= alpha;
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kTile; ++c) {
      float pv[4], vv[NI];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) pv[ii] = Ps[(rg * 4 + ii) * (kTile + 1) + c];
#pragma unroll
      for (int i = 0; i < NI; ++i) vv[i] = Vs[c * HDP + cl + 16 * i];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int i = 0; i < NI; ++i) o[ii][i] = fmaf(pv[ii], vv[i], o[ii][i]);
    }
  }
  T* out = static_cast<T*>(P.out);
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int64_t q = q0 + rg * 4 + ii;
    if (q >= P.S) continue;
    const float inv = l[ii] > 0.f ? 1.f / l[ii] : 0.f;  // 0: a document-masked row sees no key
    T* orow = out + (q * P.B + b) * P.NH * HDW + h * HDW;
#pragma unroll
    for (int i = 0; i < NI; ++i) orow[cl + 16 * i] = from_f<T>(o[ii][i] * inv);
    if (cl == 0)
      P.lse[(b * P.NH + h) * P.S + q] = l[ii] > 0.f ? (m[ii] + log2f(l[ii])) * kLn2 : -INFINITY;
  }
}

// delta[b, h, q] = sum_d dO[q, b, h, d] * O[q, b, h, d]. One warp per row.
template <typename T>
static __global__ void attn_delta_kernel(const T* __restrict__ dout, const T* __restrict__ o,
                                         float* __restrict__ delta, int64_t S, int64_t B,
                                         int64_t NH, int64_t HD) {
  int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;  // (s * B + b) * NH + h
  if (row >= S * B * NH) return;
  float acc = 0.f;
  for (int64_t d = threadIdx.x; d < HD; d += 32)
    acc += to_f(dout[row * HD + d]) * to_f(o[row * HD + d]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x == 0) {
    int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
    delta[(b * NH + h) * S + s] = acc;
  }
}

// Scores and their gradient for one (query tile, key tile) pair, the thread's 4x4 part:
// p = exp(s - lse) (masked), pd = dropped/scaled p, ds = p * (dP_dropped - delta).
template <int HD>
__device__ __forceinline__ void attn_bwd_scores(const float* Qs, const float* dOs,
                                                const float* Ks, const float* Vs,
                                                const float* lse2, const float* dl,
                                                const AttnParams& P, int64_t b, int64_t h,
                                                int64_t q0, int64_t k0, float (&pd)[4][4],
                                                float (&ds)[4][4]) {
  constexpr int HDP = HD + 1;
  const int tid = threadIdx.x, rg = tid / 16, cl = tid % 16;
  float sc[4][4], dp[4][4];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) sc[ii][jj] = 0.f, dp[ii][jj] = 0.f;
#pragma unroll 4
  for (int d = 0; d < HD; ++d) {
    float a[4], da[4], bk[4], bv[4];
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      a[ii] = Qs[(rg * 4 + ii) * HDP + d];
      da[ii] = dOs[(rg * 4 + ii) * HDP + d];
    }
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      bk[jj] = Ks[(cl + 16 * jj) * HDP + d];
      bv[jj] = Vs[(cl + 16 * jj) * HDP + d];
    }
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        sc[ii][jj] = fmaf(a[ii], bk[jj], sc[ii][jj]);
        dp[ii][jj] = fmaf(da[ii], bv[jj], dp[ii][jj]);
      }
  }
  const float c = P.scale * kLog2e;
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int64_t q = q0 + rg * 4 + ii;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int64_t k = k0 + cl + 16 * jj;
      float p = 0.f, dpm = dp[ii][jj];
      if ((!P.causal || k <= q) && k < P.S && q < P.S && !P.before_doc(b, q, k))
        p = exp2f(sc[ii][jj] * c - lse2[rg * 4 + ii]);
      float pdrop = p;
      if (P.p > 0 && p != 0.f) {
        bool kp = P.keep(b, h, q, k);
        pdrop = kp ? p * P.drop_scale : 0.f;
        dpm = kp ? dpm * P.drop_scale : 0.f;
      }
      pd[ii][jj] = pdrop;
      ds[ii][jj] = p * (dpm - dl[rg * 4 + ii]);
    }
  }
}

// Per-query-tile row statistics into smem: lse in log2 units, delta.
__device__ __forceinline__ void load_row_stats(float* lse2, float* dl, const AttnParams& P,
                                               int64_t b, int64_t h, int64_t q0) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    int64_t q = q0 + r;
    bool ok = q < P.S;
    lse2[r] = ok ? P.lse[(b * P.NH + h) * P.S + q] * kLog2e : 0.f;
    dl[r] = ok ? P.delta[(b * P.NH + h) * P.S + q] : 0.f;
  }
}

// dK, dV for key tile blockIdx.x of (b, group g = blockIdx.y % NG).
template <typename T, int HD>
static __global__ void __launch_bounds__(kThreads)
    attn_bwd_dkv_kernel(AttnParams P) {
  constexpr int HDP = HD + 1, NI = HD / 16;
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = Ks + kTile * HDP;
  float* Qs = Vs + kTile * HDP;
  float* dOs = Qs + kTile * HDP;
  float* Ps = dOs + kTile * HDP;       // [64 q][65]
  float* dSs = Ps + kTile * (kTile + 1);
  float* lse2 = dSs + kTile * (kTile + 1);
  float* dl = lse2 + kTile;

  const int kt = blockIdx.x;
  const int64_t bg = blockIdx.y, b = bg / P.NG, g = bg - b * P.NG;
  const int64_t HDW = HD;
  const T* qkv = static_cast<const T*>(P.qkv);
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t rs = P.B * P.W, ors = P.B * P.NH * HDW;
  const T* kbase = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HDW;
  const T* vbase = kbase + HDW;
  const int tid = threadIdx.x, rg = tid / 16, cl = tid % 16;
  const int64_t k0 = int64_t(kt) * kTile;
  const int nqt = int((P.S + kTile - 1) / kTile);

  load_tile<T, HD>(Ks, kbase, rs, k0, P.S, 1.f);
  load_tile<T, HD>(Vs, vbase, rs, k0, P.S, 1.f);
  float dk[4][NI], dv[4][NI];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int i = 0; i < NI; ++i) dk[ii][i] = 0.f, dv[ii][i] = 0.f;

  for (int64_t j = 0; j < P.QPG; ++j) {
    const int64_t h = g * P.QPG + j;
    const T* qbase = qkv + b * P.W + (g * (P.QPG + 2) + j) * HDW;
    const T* dobase = dout + b * P.NH * HDW + h * HDW;
    for (int qt = P.causal ? kt : 0; qt < nqt; ++qt) {
      const int64_t q0 = int64_t(qt) * kTile;
      __syncthreads();
      load_tile<T, HD>(Qs, qbase, rs, q0, P.S, 1.f);
      load_tile<T, HD>(dOs, dobase, ors, q0, P.S, 1.f);
      load_row_stats(lse2, dl, P, b, h, q0);
      __syncthreads();
      float pd[4][4], ds[4][4];
      attn_bwd_scores<HD>(Qs, dOs, Ks, Vs, lse2, dl, P, b, h, q0, k0, pd, ds);
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          Ps[(rg * 4 + ii) * (kTile + 1) + cl + 16 * jj] = pd[ii][jj];
          dSs[(rg * 4 + ii) * (kTile + 1) + cl + 16 * jj] = ds[ii][jj];
        }
      __syncthreads();
      // dV[k] += sum_q Pd[q][k] dO[q]; dK[k] += sum_q dS[q][k] Q[q]  (k = rg*4+ii).
#pragma unroll 4
      for (int qq = 0; qq < kTile; ++qq) {
        float pk[4], sk[4], dov[NI], qv[NI];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          pk[ii] = Ps[qq * (kTile + 1) + rg * 4 + ii];
          sk[ii] = dSs[qq * (kTile + 1) + rg * 4 + ii];
        }
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          dov[i] = dOs[qq * HDP + cl + 16 * i];
          qv[i] = Qs[qq * HDP + cl + 16 * i];
        }
#pragma unroll
        for (int ii = 0; ii < 4; ++ii)
#pragma unroll
          for (int i = 0; i < NI; ++i) {
            dv[ii][i] = fmaf(pk[ii], dov[i], dv[ii][i]);
            dk[ii][i] = fmaf(sk[ii], qv[i], dk[ii][i]);
          }
      }
    }
  }
  T* dkv = static_cast<T*>(P.dkv);
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int64_t k = k0 + rg * 4 + ii;
    if (k >= P.S) continue;
    T* krow = dkv + k * rs + b * P.W + (g * (P.QPG + 2) + P.QPG) * HDW;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      T& kd = krow[cl + 16 * i];
      T& vd = krow[HDW + cl + 16 * i];
      if (P.accum) {
        kd = from_f<T>(to_f(kd) + dk[ii][i] * P.scale);
        vd = from_f<T>(to_f(vd) + dv[ii][i]);
      } else {
        kd = from_f<T>(dk[ii][i] * P.scale);
        vd = from_f<T>(dv[ii][i]);
      }
    }
  }
}

// dQ for query tile blockIdx.x of (b, h).
template <typename T, int HD>
static __global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_kernel(AttnParams P) {
  constexpr int HDP = HD + 1, NI = HD / 16;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* dOs = Qs + kTile * HDP;
  float* Ks = dOs + kTile * HDP;
  float* Vs = Ks + kTile * HDP;
  float* dSs = Vs + kTile * HDP;  // [64 q][65]
  float* lse2 = dSs + kTile * (kTile + 1);
  float* dl = lse2 + kTile;

  const int qt = blockIdx.x;
  const int64_t bh = blockIdx.y, b = bh / P.NH, h = bh - b * P.NH;
  const int64_t g = h / P.QPG;
  const int64_t HDW = HD;
  const T* qkv = static_cast<const T*>(P.qkv);
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t rs = P.B * P.W, ors = P.B * P.NH * HDW;
  const T* qbase = qkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HDW;
  const T* kbase = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HDW;
  const T* vbase = kbase + HDW;
  const T* dobase = dout + b * P.NH * HDW + h * HDW;
  const int nkt = P.causal ? qt + 1 : int((P.S + kTile - 1) / kTile);
  const int tid = threadIdx.x, rg = tid / 16, cl = tid % 16;
  const int64_t q0 = int64_t(qt) * kTile;

  load_tile<T, HD>(Qs, qbase, rs, q0, P.S, 1.f);
  load_tile<T, HD>(dOs, dobase, ors, q0, P.S, 1.f);
  load_row_stats(lse2, dl, P, b, h, q0);
  float dq[4][NI];
#pragma unroll
  for (int ii = 0; ii < 4; ++ii)
#pragma unroll
    for (int i = 0; i < NI; ++i) dq[ii][i] = 0.f;

  for (int kt = 0; kt < nkt; ++kt) {
    const int64_t k0 = int64_t(kt) * kTile;
    __syncthreads();
    load_tile<T, HD>(Ks, kbase, rs, k0, P.S, 1.f);
    load_tile<T, HD>(Vs, vbase, rs, k0, P.S, 1.f);
    __syncthreads();
    float pd[4][4], ds[4][4];
    attn_bwd_scores<HD>(Qs, dOs, Ks, Vs, lse2, dl, P, b, h, q0, k0, pd, ds);
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) dSs[(rg * 4 + ii) * (kTile + 1) + cl + 16 * jj] = ds[ii][jj];
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kTile; ++kk) {
      float sq[4], kv[NI];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) sq[ii] = dSs[(rg * 4 + ii) * (kTile + 1) + kk];
#pragma unroll
      for (int i = 0; i < NI; ++i) kv[i] = Ks[kk * HDP + cl + 16 * i];
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int i = 0; i < NI; ++i) dq[ii][i] = fmaf(sq[ii], kv[i], dq[ii][i]);
    }
  }
  T* dqkv = static_cast<T*>(P.out);
#pragma unroll
  for (int ii = 0; ii < 4; ++ii) {
    const int64_t q = q0 + rg * 4 + ii;
    if (q >= P.S) continue;
    T* qrow = dqkv + q * rs + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HDW;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      T& qd = qrow[cl + 16 * i];
      qd = P.accum ? from_f<T>(to_f(qd) + dq[ii][i] * P.scale) : from_f<T>(dq[ii][i] * P.scale);
    }
  }
}

constexpr size_t fwd_smem(int HD) {
  return size_t(3 * kTile * (HD + 1) + kTile * (kTile + 1)) * sizeof(float);
}
constexpr size_t dkv_smem(int HD) {
  return size_t(4 * kTile * (HD + 1) + 2 * kTile * (kTile + 1) + 2 * kTile) * sizeof(float);
}
constexpr size_t dq_smem(int HD) {
  return size_t(4 * kTile * (HD + 1) + kTile * (kTile + 1) + 2 * kTile) * sizeof(float);
}

