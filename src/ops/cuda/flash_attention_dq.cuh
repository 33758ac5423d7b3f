// Included once, by ops/cuda/flash_attention.cu, inside its anonymous namespace (after
// FaParams, FaDsBuf, the tile loaders, the dropout helpers and the dK/dV kernel): the two
// dQ kernels of the flash backward -- one recomputes the scores and dS of its query tile,
// the other reads the dS tiles the dK/dV kernel handed over. Kept apart so the forward,
// the dK/dV kernel and the launchers read on their own.
#pragma once

// ---- backward: dQ of one query tile of one (b, h) ------------------------------------
template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsFA) fa_bwd_dq_kernel(FaParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Qs = reinterpret_cast<T*>(fa_smem);
  T* dOs = Qs + TILE;
  T* Ks = dOs + TILE;     // [2][64][LD]
  T* Vs = Ks + 2 * TILE;  // [2][64][LD]

  const int nq = int((P.S + kRows - 1) / kRows);
  const int qt = nq - 1 - int(blockIdx.x);
  const int64_t b = blockIdx.y / P.NH, h = blockIdx.y - b * P.NH, g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qkv = static_cast<const T*>(P.qkv);
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t stride = P.B * P.W, ostride = P.B * P.NH * HD;
  const T* qb = qkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const T* kb = qkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t q0 = int64_t(qt) * kRows;

  load_tile<HD>(Qs, qb, stride, q0, P.S);
  load_tile<HD>(dOs, dout + b * P.NH * HD + h * HD, ostride, q0, P.S);
  load_tile<HD>(Ks, kb, stride, 0, P.S);
  load_tile<HD>(Vs, vb, stride, 0, P.S);
  cp_async_commit();

  const int64_t row0 = q0 + warp * 16 + gr;
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    const bool ok = row < P.S;
    lse2[r] = ok ? P.lse[(b * P.NH + h) * P.S + row] * kLog2e : 0.f;
    dl[r] = ok ? P.delta[(b * P.NH + h) * P.S + row] : 0.f;
  }
  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  const int nkt = qt + 1;

  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    const int64_t k0 = int64_t(j) * kRows;
    // The dropout mask's integer work needs no tile: it overlaps the copies in flight.
    uint32_t keep = 0;
    if constexpr (DROP)
      keep = P.mask ? load_mask_rows_q(P.mask, P.S, b * P.NH + h, row0, k0, tq)
                    : keep_bits_rows_q(P.D, b, h, row0, k0, tq, lane);
    if (j + 1 < nkt) {
      load_tile<HD>(Ks + (buf ^ 1) * TILE, kb, stride, int64_t(j + 1) * kRows, P.S);
      load_tile<HD>(Vs + (buf ^ 1) * TILE, vb, stride, int64_t(j + 1) * kRows, P.S);
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
    const bool diag = j == nkt - 1;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t row = row0 + (e >> 1) * 8, col = k0 + n * 8 + 2 * tq + (e & 1);
        float p = ex2_ftz(sc[n][e] * P.scale_log2 - lse2[e >> 1]);
        if (diag && (col > row || col >= P.S)) p = 0.f;
        float dpm = dp[n][e];
        if constexpr (DROP) dpm = kept_q(keep, n, e) ? dpm * P.D.scale : 0.f;
        dp[n][e] = p * (dpm - dl[e >> 1]);  // dS (unscaled)
      }
    // dQ += dS K: k-chunks of 16 keys; K row-major [key][d] is B row-major.
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

  T* dqkv = static_cast<T*>(P.out);
  T* dqb = dqkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(dqb + row * stride + n * 8 + 2 * tq) =
          pack2<T>(dq[n][2 * r] * P.scale, dq[n][2 * r + 1] * P.scale);
  }
}

// ---- backward: dQ of one query tile of one (b, h) from the dK/dV kernel's dS ----------
// dQ = scale * sum over key tiles of dS K: no scores, softmax or mask again. dS tiles come
// key-major, so their A fragments are ldmatrix.trans loads.
constexpr int kLdS = 64 + 8;  // smem row stride of a dS tile (elements)

template <int LD, typename T>
__device__ __forceinline__ void load_a_from_kmajor(uint32_t a[4], const T* tile, int r0, int c0,
                                                   int lane) {
  // A (rows r0.., cols c0..) = tile^T: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in
  // the order of a[0..3] are the stored blocks (c0 | c0 + 8) x (r0 | r0 + 8), transposed.
  ldsm_x4_trans(a, tile + (c0 + (lane & 7) + (lane >> 4) * 8) * LD + r0 + ((lane >> 3) & 1) * 8);
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreadsFA) fa_bwd_dq_ds_kernel(FaParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, ND = HD / 8, DTILE = kRows * kLdS;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Ks = reinterpret_cast<T*>(fa_smem);  // [2][64][LD]
  T* Ds = Ks + 2 * TILE;                   // [2][64][kLdS]

  const int nq = int((P.S + kRows - 1) / kRows);
  const int qt = nq - 1 - int(blockIdx.x);
  const int64_t bl = blockIdx.y / P.NH, b = P.b0 + bl, h = blockIdx.y - bl * P.NH,
                g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qkv = static_cast<const T*>(P.qkv);
  const int64_t stride = P.B * P.W;
  const T* kb = qkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* ds = static_cast<const T*>(P.ds) + FaDsBuf::tile(P.NH, P.S, bl * P.NH + h, qt, 0);
  auto load_ds = [&](T* dst, int j) {  // 64 rows x 128 bytes, contiguous
    const T* src = ds + int64_t(j) * 4096;
    for (int i = threadIdx.x; i < kRows * 8; i += kThreadsFA)
      cp_async16(dst + (i >> 3) * kLdS + (i & 7) * 8, src + i * 8, true);
  };

  load_tile<HD>(Ks, kb, stride, 0, P.S);
  load_ds(Ds, 0);
  cp_async_commit();
  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  const int nkt = qt + 1;
  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    if (j + 1 < nkt) {
      load_tile<HD>(Ks + (buf ^ 1) * TILE, kb, stride, int64_t(j + 1) * kRows, P.S);
      load_ds(Ds + (buf ^ 1) * DTILE, j + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* Kt = Ks + buf * TILE;
    const T* Dt = Ds + buf * DTILE;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t a[4];
      load_a_from_kmajor<kLdS>(a, Dt, warp * 16, c * 16, lane);
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

  T* dqkv = static_cast<T*>(P.out);
  T* dqb = dqkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const int64_t row0 = int64_t(qt) * kRows + warp * 16 + gr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(dqb + row * stride + n * 8 + 2 * tq) =
          pack2<T>(dq[n][2 * r] * P.scale, dq[n][2 * r + 1] * P.scale);
  }
}
