// Included once, by ops/cuda/attention_block.cu, inside its anonymous namespace (after
// BlkParams, load_tile, visible and the shared dropout helpers): the two backward kernels
// of the block attention -- dK, dV of one key tile of one (b, group), visiting only the
// query tiles that see it; dQ of one query tile of one (b, h) -- each `=` or `+=` (accum).
// Kept apart so the forward, the launchers and the dispatch read on their own.
#pragma once

// dst[0..1] (=) v, or (+=) with accumulation.
template <typename T>
__device__ __forceinline__ void store2(T* dst, float v0, float v1, bool accum) {
  if (accum) v0 += to_f(dst[0]), v1 += to_f(dst[1]);
  *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
}

// ---- backward: dK, dV of one key tile of one (b, group) ------------------------------
template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsB) blk_bwd_dkv_kernel(BlkParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char blk_smem[];
  T* Ks = reinterpret_cast<T*>(blk_smem);
  T* Vs = Ks + TILE;
  T* Qs = Vs + TILE;       // [2][64][LD]
  T* dOs = Qs + 2 * TILE;  // [2][64][LD]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * TILE);  // [2][64], log2 domain
  float* dl_s = lse_s + 2 * kRows;                           // [2][64]
  int64_t* ks_s = reinterpret_cast<int64_t*>(dl_s + 2 * kRows);  // [2][64]
  int* qlist = reinterpret_cast<int*>(ks_s + 2 * kRows);          // [nt]
  __shared__ int wcount[kWarps];

  const int kt = int(blockIdx.x);
  const int64_t b = blockIdx.y / P.NG, g = blockIdx.y - b * P.NG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qsrc = static_cast<const T*>(P.q);
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t stride = P.B * P.W, ostride = P.B * P.NH * HD;
  const T* kb = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t k0 = int64_t(kt) * kRows;

  // The query tiles that see this key tile, in order: from the diagonal (causal) on, and
  // with documents only those whose smallest key_start is at most the tile's last key.
  int count = 0;
  for (int base = P.causal ? kt : 0; base < int(P.nt); base += kThreadsB) {
    const int t = base + int(threadIdx.x);
    const bool vis = t < int(P.nt) && (!P.ks || P.tmin[b * P.nt + t] - P.kg0 <= k0 + kRows - 1);
    const unsigned bal = __ballot_sync(0xffffffffu, vis);
    if (lane == 0) wcount[warp] = __popc(bal);
    __syncthreads();
    int off = count;
    for (int w = 0; w < warp; ++w) off += wcount[w];
    if (vis) qlist[off + __popc(bal & ((1u << lane) - 1u))] = t;
    for (int w = 0; w < kWarps; ++w) count += wcount[w];
    __syncthreads();
  }

  const int iters = int(P.QPG) * count;
  auto issue = [&](int it, int buf) {
    const int hi = it / count, qt = qlist[it - hi * count];
    const int64_t h = g * P.QPG + hi;
    const T* qb = qsrc + b * P.W + (g * (P.QPG + 2) + hi) * HD;
    load_tile<HD>(Qs + buf * TILE, qb, stride, int64_t(qt) * kRows, P.S);
    load_tile<HD>(dOs + buf * TILE, dout + b * P.NH * HD + h * HD, ostride, int64_t(qt) * kRows,
                  P.S);
    if (threadIdx.x < kRows) {
      const int64_t q = int64_t(qt) * kRows + threadIdx.x;
      const bool ok = q < P.S;
      lse_s[buf * kRows + threadIdx.x] = ok ? P.lse[(b * P.NH + h) * P.S + q] * kLog2e : 0.f;
      dl_s[buf * kRows + threadIdx.x] = ok ? P.delta[(b * P.NH + h) * P.S + q] : 0.f;
      ks_s[buf * kRows + threadIdx.x] = !P.ks ? INT64_MIN / 4 : ok ? P.ks[b * P.S + q] : kNoKey;
    }
  };

  load_tile<HD>(Ks, kb, stride, k0, P.S);
  load_tile<HD>(Vs, vb, stride, k0, P.S);
  if (iters > 0) issue(0, 0);
  cp_async_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  const int64_t key0 = k0 + warp * 16 + gr;  // this thread's key rows: key0, key0 + 8

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const int hi = it / count, qt = qlist[it - hi * count];
    const int64_t q0 = int64_t(qt) * kRows;
    uint32_t keep = 0;
    if constexpr (DROP) {
      uint32_t drawn;  // the blocks' own bits: the block dQ kernel draws its mask again
      keep = keep_bits_rows_k(P.D, b, g * P.QPG + hi, k0 + warp * 16, q0, gr, tq, drawn);
    }
    if (it + 1 < iters) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Qt = Qs + buf * TILE;
    const T* dOt = dOs + buf * TILE;
    const float* lse2 = lse_s + buf * kRows;
    const float* dl = dl_s + buf * kRows;
    const int64_t* kss = ks_s + buf * kRows;

    float sc[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      uint32_t ak[4], av[4];
      load_a<LD>(ak, Ks, warp * 16, kk * 16, lane);
      load_a<LD>(av, Vs, warp * 16, kk * 16, lane);
#pragma unroll
      for (int n = 0; n < 8; n += 2) {
        uint32_t bq[4], bo[4];
        load_bt2<LD>(bq, Qt, n * 8, kk * 16, lane);
        load_bt2<LD>(bo, dOt, n * 8, kk * 16, lane);
        mma16816<T>(sc[n], ak, bq);
        mma16816<T>(dp[n], av, bo);
        mma16816<T>(sc[n + 1], ak, bq + 2);
        mma16816<T>(dp[n + 1], av, bo + 2);
      }
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + 2 * tq + (e & 1);
        const int64_t key = key0 + (e >> 1) * 8, q = q0 + qc;
        float p = ex2_ftz(sc[n][e] * P.scale_log2 - lse2[qc]);
        if (!visible(P, q, key, kss[qc])) p = 0.f;
        if constexpr (DROP) {
          const bool kp = kept_k(keep, n, e);
          sc[n][e] = kp ? p * P.D.scale : 0.f;
          dp[n][e] = p * ((kp ? dp[n][e] * P.D.scale : 0.f) - dl[qc]);
        } else {
          sc[n][e] = p;                        // P^T
          dp[n][e] = p * (dp[n][e] - dl[qc]);  // dS^T (unscaled)
        }
      }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t ap[4], ad[4];
      ap[0] = pack2<T>(sc[2 * c][0], sc[2 * c][1]);
      ap[1] = pack2<T>(sc[2 * c][2], sc[2 * c][3]);
      ap[2] = pack2<T>(sc[2 * c + 1][0], sc[2 * c + 1][1]);
      ap[3] = pack2<T>(sc[2 * c + 1][2], sc[2 * c + 1][3]);
      ad[0] = pack2<T>(dp[2 * c][0], dp[2 * c][1]);
      ad[1] = pack2<T>(dp[2 * c][2], dp[2 * c][3]);
      ad[2] = pack2<T>(dp[2 * c + 1][0], dp[2 * c + 1][1]);
      ad[3] = pack2<T>(dp[2 * c + 1][2], dp[2 * c + 1][3]);
#pragma unroll
      for (int nd = 0; nd < HD / 16; ++nd) {
        uint32_t bo[4], bq[4];
        load_b_trans<LD>(bo, dOt, c * 16, nd * 16, lane);
        load_b_trans<LD>(bq, Qt, c * 16, nd * 16, lane);
        mma16816<T>(dv[2 * nd], ap, bo);
        mma16816<T>(dv[2 * nd + 1], ap, bo + 2);
        mma16816<T>(dk[2 * nd], ad, bq);
        mma16816<T>(dk[2 * nd + 1], ad, bq + 2);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // (nothing in flight when iters == 0 either)

  T* dkb = static_cast<T*>(P.dkv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  T* dvb = dkb + HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = key0 + r * 8;
    if (key >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      store2<T>(dkb + key * stride + n * 8 + 2 * tq, dk[n][2 * r] * P.scale,
                dk[n][2 * r + 1] * P.scale, P.accum);
      store2<T>(dvb + key * stride + n * 8 + 2 * tq, dv[n][2 * r], dv[n][2 * r + 1], P.accum);
    }
  }
}

// ---- backward: dQ of one query tile of one (b, h) ------------------------------------
template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsB) blk_bwd_dq_kernel(BlkParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char blk_smem[];
  T* Qs = reinterpret_cast<T*>(blk_smem);
  T* dOs = Qs + TILE;
  T* Ks = dOs + TILE;     // [2][64][LD]
  T* Vs = Ks + 2 * TILE;  // [2][64][LD]

  const int qt = int(P.nt) - 1 - int(blockIdx.x);
  const int64_t b = blockIdx.y / P.NH, h = blockIdx.y - b * P.NH, g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t stride = P.B * P.W, ostride = P.B * P.NH * HD;
  const T* qb = static_cast<const T*>(P.q) + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const T* kb = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t q0 = int64_t(qt) * kRows;
  const int64_t row0 = q0 + warp * 16 + gr;
  int first, end;
  key_range(P, b, qt, first, end);

  if (first < end) {
    load_tile<HD>(Qs, qb, stride, q0, P.S);
    load_tile<HD>(dOs, dout + b * P.NH * HD + h * HD, ostride, q0, P.S);
    load_tile<HD>(Ks, kb, stride, int64_t(first) * kRows, P.S);
    load_tile<HD>(Vs, vb, stride, int64_t(first) * kRows, P.S);
    cp_async_commit();
  }
  float lse2[2], dl[2];
  int64_t ksr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    const bool ok = row < P.S;
    lse2[r] = ok ? P.lse[(b * P.NH + h) * P.S + row] * kLog2e : 0.f;
    dl[r] = ok ? P.delta[(b * P.NH + h) * P.S + row] : 0.f;
    ksr[r] = !P.ks ? INT64_MIN / 4 : ok ? P.ks[b * P.S + row] : kNoKey;
  }
  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  for (int j = first; j < end; ++j) {
    const int buf = (j - first) & 1;
    const int64_t k0 = int64_t(j) * kRows;
    uint32_t keep = 0;
    if constexpr (DROP) keep = keep_bits_rows_q(P.D, b, h, row0, k0, tq, lane);
    if (j + 1 < end) {
      load_tile<HD>(Ks + (buf ^ 1) * TILE, kb, stride, k0 + kRows, P.S);
      load_tile<HD>(Vs + (buf ^ 1) * TILE, vb, stride, k0 + kRows, P.S);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Kt = Ks + buf * TILE;
    const T* Vt = Vs + buf * TILE;
    float sc[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      uint32_t aq[4], ao[4];
      load_a<LD>(aq, Qs, warp * 16, kk * 16, lane);
      load_a<LD>(ao, dOs, warp * 16, kk * 16, lane);
#pragma unroll
      for (int n = 0; n < 8; n += 2) {
        uint32_t bk[4], bv[4];
        load_bt2<LD>(bk, Kt, n * 8, kk * 16, lane);
        load_bt2<LD>(bv, Vt, n * 8, kk * 16, lane);
        mma16816<T>(sc[n], aq, bk);
        mma16816<T>(dp[n], ao, bv);
        mma16816<T>(sc[n + 1], aq, bk + 2);
        mma16816<T>(dp[n + 1], ao, bv + 2);
      }
    }
    const bool edge = j == end - 1 || P.ks != nullptr;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + (e >> 1) * 8, col = k0 + n * 8 + 2 * tq + (e & 1);
        float p = ex2_ftz(sc[n][e] * P.scale_log2 - lse2[e >> 1]);
        if (edge && !visible(P, row, col, ksr[e >> 1])) p = 0.f;
        float dpm = dp[n][e];
        if constexpr (DROP) dpm = kept_q(keep, n, e) ? dpm * P.D.scale : 0.f;
        dp[n][e] = p * (dpm - dl[e >> 1]);  // dS (unscaled)
      }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t a[4];
      a[0] = pack2<T>(dp[2 * c][0], dp[2 * c][1]);
      a[1] = pack2<T>(dp[2 * c][2], dp[2 * c][3]);
      a[2] = pack2<T>(dp[2 * c + 1][0], dp[2 * c + 1][1]);
      a[3] = pack2<T>(dp[2 * c + 1][2], dp[2 * c + 1][3]);
#pragma unroll
      for (int nd = 0; nd < HD / 16; ++nd) {
        uint32_t bb[4];
        load_b_trans<LD>(bb, Kt, c * 16, nd * 16, lane);
        mma16816<T>(dq[2 * nd], a, bb);
        mma16816<T>(dq[2 * nd + 1], a, bb + 2);
      }
    }
    __syncthreads();
  }

  T* dqb = static_cast<T*>(P.out) + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      store2<T>(dqb + row * stride + n * 8 + 2 * tq, dq[n][2 * r] * P.scale,
                dq[n][2 * r + 1] * P.scale, P.accum);
  }
}
