// Included once, by ops/cuda/flash_attention.cu, right after flash_attention_sm90.cuh and
// inside the same anonymous namespace: the backward kernels on Hopper's warpgroup MMA (dK/dV
// and dQ from the handed-over dS), with the algorithms, launch shapes and results of the
// mma.sync kernels beside which they stand (kSw128Tile and the wgmma helpers come from
// there).
#pragma once

// Experimental: -DMCPP_FA_DKV_MIN_BLOCKS=3 holds the head-dim-64 dK/dV kernel without
// dropout to 168 registers, three CTAs an SM instead of two (ptxas: wgmma serialized). On
// an H200 that kernel ran 4-7% faster at GPT-2's shapes but the Llama shape's backward 3%
// slower (bench/RESULTS.md), so the library is built without it.
#if defined(MCPP_FA_DKV_MIN_BLOCKS) && MCPP_FA_DKV_MIN_BLOCKS > 1
#define MCPP_FA_DKV_BOUNDS \
  __launch_bounds__(kThreadsFA, HD == 64 && !DROP ? MCPP_FA_DKV_MIN_BLOCKS : 1)
#else
#define MCPP_FA_DKV_BOUNDS __launch_bounds__(kThreadsFA)
#endif

// ---- backward dK, dV on Hopper's warpgroup MMA (head dims 64 and 128) ----------------
// fa_bwd_dkv_kernel's algorithm and results with the four products of a tile as wgmma
// m64n64k16 over the 64-key tile: S^T = K Q^T and dP^T = V dO^T from 128B-swizzled tiles
// (all K-major; head dim 128: k16 steps 4..7 in the second 64-column tile), dV += P^T dO
// and dK += dS^T Q with P^T, dS^T from registers and dO, Q as MN-major tiles (head dim 128:
// one product per 64-column half).
// dS tiles as the Hopper kernels hand them over: each 64 x 64 tile of FaDsBuf holds the
// bytes of a 128B-swizzled tile (wgmma_sm90.cuh's layout), so the dK/dV kernel writes it
// from shared memory with one bulk copy and the dQ kernel reads it back with a plain copy.
// Head dim 64 stages through two tiles; head dim 128 through one (its dK/dV kernel has room
// for no more at two CTAs an SM), so each step waits for the previous step's copy to have
// read it. (The mma.sync kernels keep row-major tiles.)
template <int HD>
constexpr int kDsStages = HD == 64 ? 2 : 1;  // staging tiles

template <int HD>
constexpr size_t bwd_dkv_wgmma_bytes() {
  return size_t(6 * kSw128Tile * (HD / 64)) * 2 + 4 * kRows * sizeof(float) + 2 * kRows * 8 +
         kDsStages<HD> * kSw128Tile * 2 + 1024;
}

template <typename T, int HD, bool DROP>
__global__ void MCPP_FA_DKV_BOUNDS fa_bwd_dkv_wgmma_kernel(FaParams P) {
  constexpr int ND = HD / 8, NHALF = HD / 64, TILE = NHALF * kSw128Tile;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Ks = reinterpret_cast<T*>(smem_from_1024(fa_smem));
  T* Vs = Ks + TILE;
  T* Qs = Vs + TILE;                                        // [2]
  T* dOs = Qs + 2 * TILE;                                   // [2]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * TILE);  // [2][64], log2 domain
  float* dl_s = lse_s + 2 * kRows;                                // [2][64]
  // [2][64 queries][8 bytes]: the forward's keep bits of a step's 64 x 64 tile (dropout)
  uint8_t* mask_s = reinterpret_cast<uint8_t*>(dl_s + 2 * kRows);
  // [kDsStages] swizzled 64 x 64 dS tiles on their way to FaDsBuf
  unsigned char* ds_s = mask_s + 2 * kRows * 8;

  const int nt = int((P.S + kRows - 1) / kRows);
  const int kt = int(blockIdx.x);
  const int64_t bl = blockIdx.y / P.NG, b = P.b0 + bl, g = blockIdx.y - bl * P.NG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qkv = static_cast<const T*>(P.qkv);
  const T* dout = static_cast<const T*>(P.dout);
  const int64_t stride = P.B * P.W, ostride = P.B * P.NH * HD;
  const T* kb = qkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t k0 = int64_t(kt) * kRows;

  const int per_head = nt - kt, iters = int(P.QPG) * per_head;
  // Step `it`'s lse and delta (threads 0..63, a query each; 0 past S) into registers, and
  // from there into buffer `buf` (put_stats). The head-dim-64 loop reads them two steps
  // ahead, so the loads' latency passes under a step's work instead of stalling the
  // warpgroup where the next tiles are issued (its dK/dV 6-7% faster without dropout,
  // 3-4% with it, on an H200). Head dim 128 reads and writes them at once: the registers
  // held across a step cost it more than the stall.
  auto fetch_stats = [&](int it) -> float2 {
    float2 v{0.f, 0.f};
    if (threadIdx.x < kRows) {
      const int hi = it / per_head, qt = kt + (it - hi * per_head);
      const int64_t q = int64_t(qt) * kRows + threadIdx.x;
      const int64_t row = (b * P.NH + g * P.QPG + hi) * P.S;
      if (q < P.S) v = float2{P.lse[row + q], P.delta[row + q]};
    }
    return v;
  };
  auto put_stats = [&](int buf, float2 v) {
    if (threadIdx.x < kRows)
      lse_s[buf * kRows + threadIdx.x] = v.x * kLog2e, dl_s[buf * kRows + threadIdx.x] = v.y;
  };
  // With dropout the forward's keep bits of a step come into shared memory with its tiles
  // (a query row's 8 bytes of the key tile), not from global memory where they are used:
  // that load stalled the warpgroup (a quarter of its stalls at GPT-2 124M's shape); held
  // in registers a step ahead instead they measured slower.
  // Step `it`'s Q and dO tiles (and keep bits) into buffer `buf` (cp.async; the caller
  // commits).
  auto issue_tiles = [&](int it, int buf) {
    const int hi = it / per_head, qt = kt + (it - hi * per_head);
    const int64_t h = g * P.QPG + hi;
    const T* qb = qkv + b * P.W + (g * (P.QPG + 2) + hi) * HD;
    cp_async_tile_sw128<HD>(Qs + buf * TILE, qb, stride, int64_t(qt) * kRows, P.S);
    cp_async_tile_sw128<HD>(dOs + buf * TILE, dout + b * P.NH * HD + h * HD, ostride,
                            int64_t(qt) * kRows, P.S);
    if constexpr (DROP) {
      if (P.mask_ready && threadIdx.x < kRows) {
        const int64_t q = int64_t(qt) * kRows + threadIdx.x;
        cp_async8(mask_s + (buf * kRows + threadIdx.x) * 8,
                  q < P.S ? P.mask + FaMaskBuf::row(P.S, b * P.NH + h, q) + k0 / 8 : P.mask,
                  q < P.S);
      }
    }
  };
  auto issue = [&](int it, int buf) {
    issue_tiles(it, buf);
    put_stats(buf, fetch_stats(it));
  };

  cp_async_tile_sw128<HD>(Ks, kb, stride, k0, P.S);
  cp_async_tile_sw128<HD>(Vs, vb, stride, k0, P.S);
  issue(0, 0);
  cp_async_commit();
  const uint64_t dk_desc = wgmma_desc_sw128(Ks), dv_desc = wgmma_desc_sw128(Vs);

  float dk[NHALF][32], dv[NHALF][32];
#pragma unroll
  for (int hh = 0; hh < NHALF; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[hh][i] = dv[hh][i] = 0.f;
  const int64_t key0 = k0 + warp * 16 + gr;  // this thread's key rows: key0, key0 + 8
  // The causal and sequence-end tests in 32 bits (positions are below S < 2^31): one
  // compare each where 64-bit ones took two, on every score of every step.
  const int key0_32 = int(key0), S32 = int(P.S);

  // The parts of one (head, query tile) step `it`, whose Q, dO, lse and delta are in buffer
  // it & 1. scores: S^T = K Q^T and dP^T = V dO^T, 64 keys x 64 queries, k16 steps along
  // the head dim (32 bytes of the swizzled rows each; the second 64-column tile 8 KiB on),
  // one commit group. sc, dp: the scores' accumulators (carried from step to step by the
  // pipelined loop, local to a step in the plain one).
  auto scores = [&](float(&sc)[32], float(&dp)[32], int buf) {
    const uint64_t dq_desc = wgmma_desc_sw128(Qs + buf * TILE);
    const uint64_t ddo_desc = wgmma_desc_sw128(dOs + buf * TILE);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint64_t off = (kk >> 2) * (8192 >> 4) + 2 * (kk & 3);
      wgmma_64x64x16_ss<T>(sc, dk_desc + off, dq_desc + off, kk > 0);
      wgmma_64x64x16_ss<T>(dp, dv_desc + off, ddo_desc + off, kk > 0);
    }
    wgmma_commit();
  };
  // The dropout keep bits of the step: read from the forward's, or drawn (and stored).
  auto keep_bits = [&](int it) -> uint32_t {
    if constexpr (DROP) {
      const int hi = it / per_head, qt = kt + (it - hi * per_head);
      const int64_t q0 = int64_t(qt) * kRows, bh = b * P.NH + g * P.QPG + hi;
      if (P.mask_ready) {  // load_mask_blocks_k's two bytes of each of two rows
        const uint8_t* m = mask_s + ((it & 1) * kRows + 8 * gr + 2 * tq) * 8 + 2 * warp;
        return rows_k_from_blocks(uint32_t(*reinterpret_cast<const uint16_t*>(m)) |
                                      uint32_t(*reinterpret_cast<const uint16_t*>(m + 8)) << 16,
                                  gr, tq);
      }
      uint32_t drawn;
      const uint32_t keep =
          keep_bits_rows_k(P.D, b, g * P.QPG + hi, k0 + warp * 16, q0, gr, tq, drawn);
      if (P.mask) store_mask(P.mask, P.S, bh, q0 + 8 * gr + 2 * tq, k0 + warp * 16, drawn);
      return keep;
    }
    return 0;
  };
  // The scores into P^T (dropped, for dV) and dS^T (unscaled), in place.
  auto softmax_grad = [&](float(&sc)[32], float(&dp)[32], int it, uint32_t keep) {
    const int buf = it & 1, hi = it / per_head, qt = kt + (it - hi * per_head);
    const int q0 = qt * kRows;
    const float* lse2 = lse_s + buf * kRows;
    const float* dl = dl_s + buf * kRows;
    // The causal and sequence-end tests on every tile, not only on edge tiles (where they
    // can be true): one code path, 4-6% faster on an H200 (bench/RESULTS.md).
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 4 * n + e, qc = n * 8 + 2 * tq + (e & 1);
        const int key = key0_32 + (e >> 1) * 8, q = q0 + qc;
        float p = ex2_ftz(sc[i] * P.scale_log2 - lse2[qc]);
        if (key > q || q >= S32 || key >= S32) p = 0.f;
        if constexpr (DROP) {  // dV from the dropped P (the keep scale once at the end)
          const bool kp = kept_k(keep, n, e);
          sc[i] = kp ? p : 0.f;
          dp[i] = p * ((kp ? dp[i] * P.D.scale : 0.f) - dl[qc]);
        } else {
          sc[i] = p;
          dp[i] = p * (dp[i] - dl[qc]);
        }
      }
  };
  // The step's dS tile in FaDsBuf.
  auto ds_tile = [&](int it) {
    const int hi = it / per_head, qt = kt + (it - hi * per_head);
    return static_cast<T*>(P.ds) + FaDsBuf::tile(P.NH, P.S, bl * P.NH + g * P.QPG + hi, qt, kt);
  };
  // The staging tile of step `it`.
  auto ds_stage = [&](int it) { return ds_s + (kDsStages<HD> == 2 ? it & 1 : 0) * kSw128Tile * 2; };
  // dS^T for the dQ kernel, into the step's staging tile by stmatrix (ds_copy then writes
  // it out, after a barrier).
  auto store_ds = [&](const float(&dp)[32], int it) {
    if (!P.ds) return;
    // Matrices n = 4 nh .. 4 nh + 3 of rows 16 warp + 8 r ..: this lane addresses row
    // lane % 8 of matrix lane / 8 (chunk n of a swizzled row: n ^ (row & 7)).
    unsigned char* st = ds_stage(it);
    const int rr = lane & 7, mi = lane >> 3;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int nh = 0; nh < 2; ++nh) {
        const int n = 4 * nh;
        stmatrix_x4(st + (warp * 16 + 8 * r + rr) * 128 + (((n + mi) ^ rr) << 4),
                    pack2<T>(dp[4 * n + 2 * r], dp[4 * n + 2 * r + 1]),
                    pack2<T>(dp[4 * (n + 1) + 2 * r], dp[4 * (n + 1) + 2 * r + 1]),
                    pack2<T>(dp[4 * (n + 2) + 2 * r], dp[4 * (n + 2) + 2 * r + 1]),
                    pack2<T>(dp[4 * (n + 3) + 2 * r], dp[4 * (n + 3) + 2 * r + 1]));
      }
    fence_proxy_async_smem();
  };
  // The tile store_ds staged for step `it` out to FaDsBuf (thread 0, after a barrier
  // behind every thread's stmatrix).
  auto ds_copy = [&](int it) {
    if (P.ds && threadIdx.x == 0) bulk_store(ds_tile(it), ds_stage(it), kSw128Tile * 2);
  };
  // dV += P^T dO, dK += dS^T Q: k16 chunks of queries (16 rows of dO and Q: 2048 bytes),
  // one commit group.
  auto grads = [&](const float(&sc)[32], const float(&dp)[32], int buf) {
    uint32_t ap[4][4], ad[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        ap[c][k] = pack2<T>(sc[8 * c + 2 * k], sc[8 * c + 2 * k + 1]);
        ad[c][k] = pack2<T>(dp[8 * c + 2 * k], dp[8 * c + 2 * k + 1]);
      }
    const uint64_t dq_desc = wgmma_desc_sw128(Qs + buf * TILE);
    const uint64_t ddo_desc = wgmma_desc_sw128(dOs + buf * TILE);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int hh = 0; hh < NHALF; ++hh) {
        const uint64_t off = (8192 >> 4) * hh + (2048 >> 4) * c;
        wgmma_64x64x16_rs<T>(dv[hh], ap[c], ddo_desc + off, true);
        wgmma_64x64x16_rs<T>(dk[hh], ad[c], dq_desc + off, true);
      }
    wgmma_commit();
  };

  if constexpr (HD == 64) {
    // Software-pipelined: step it + 1's scores are queued right behind step it's gradient
    // products, so the tensor cores have work while this warpgroup waits (the keep bits
    // are read or drawn meanwhile); step it + 2's tiles go into the buffer step it read once
    // its products are done. Head dim 128 keeps the plain loop below, written out: there
    // the pipelined one spilled registers (XL's dK/dV 1.78 -> 1.93 ms on an H200), and the
    // plain loop through these lambdas measured 7% slower than written out.
    if (iters > 1) {
      issue(1, 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_smem();
    __syncthreads();
    float sc[32], dp[32];
    scores(sc, dp, 0);
    // `more` (compile-time: the loop-carried scores stay the products' alone, no copies
    // while they run) says whether a step follows.
    auto step = [&](int it, auto more) {
      const int buf = it & 1;
      const float2 stats = it + 2 < iters ? fetch_stats(it + 2) : float2{0.f, 0.f};
      const uint32_t keep = keep_bits(it);
      wgmma_wait<0>();  // this step's scores (and the previous step's gradient products)
      softmax_grad(sc, dp, it, keep);
      store_ds(dp, it);
      grads(sc, dp, buf);
      if constexpr (decltype(more)::value) {  // the next step's tiles are in: queue its scores
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();
        ds_copy(it);
        scores(sc, dp, buf ^ 1);
      }
      wgmma_wait<1>();  // this step's gradient products are done with buffer `buf`
      // The previous step's dS copy has read its buffer, which the next step refills.
      if (decltype(more)::value && threadIdx.x == 0) bulk_wait_read<1>();
      __syncthreads();
      if constexpr (!decltype(more)::value) ds_copy(it);
      if (it + 2 < iters) {
        issue_tiles(it + 2, buf);
        put_stats(buf, stats);
        cp_async_commit();
      }
    };
    for (int it = 0; it + 1 < iters; ++it) step(it, std::true_type{});
    step(iters - 1, std::false_type{});
    wgmma_wait<0>();
    if (threadIdx.x == 0) bulk_wait_all();  // the dS copies, before the CTA's memory goes
  } else {
    for (int it = 0; it < iters; ++it) {
      const int buf = it & 1;
      const int hi = it / per_head, qt = kt + (it - hi * per_head);
      const int64_t q0 = int64_t(qt) * kRows;
      // Drawn keep bits before the tiles are waited for; read ones after (shared memory).
      uint32_t keep = P.mask_ready ? 0u : keep_bits(it);
      if (it + 1 < iters) {
        issue(it + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      // The previous step's dS copy has read the staging tile this step refills.
      if (threadIdx.x == 0) bulk_wait_read<0>();
      fence_proxy_async_smem();
      __syncthreads();
      if (P.mask_ready) keep = keep_bits(it);
      const uint64_t dq_desc = wgmma_desc_sw128(Qs + buf * TILE);
      const uint64_t ddo_desc = wgmma_desc_sw128(dOs + buf * TILE);
      const float* lse2 = lse_s + buf * kRows;
      const float* dl = dl_s + buf * kRows;
      float sc[32], dp[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint64_t off = (kk >> 2) * (8192 >> 4) + 2 * (kk & 3);
        wgmma_64x64x16_ss<T>(sc, dk_desc + off, dq_desc + off, kk > 0);
        wgmma_64x64x16_ss<T>(dp, dv_desc + off, ddo_desc + off, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      const bool edge = DROP || qt == kt || q0 + kRows > P.S || k0 + kRows > P.S;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * n + e, qc = n * 8 + 2 * tq + (e & 1);
          const int64_t key = key0 + (e >> 1) * 8, q = q0 + qc;
          float p = ex2_ftz(sc[i] * P.scale_log2 - lse2[qc]);
          if (edge && (key > q || q >= P.S || key >= P.S)) p = 0.f;
          if constexpr (DROP) {
            const bool kp = kept_k(keep, n, e);
            sc[i] = kp ? p : 0.f;
            dp[i] = p * ((kp ? dp[i] * P.D.scale : 0.f) - dl[qc]);
          } else {
            sc[i] = p;
            dp[i] = p * (dp[i] - dl[qc]);
          }
        }
      store_ds(dp, it);
      uint32_t ap[4][4], ad[4][4];
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          ap[c][k] = pack2<T>(sc[8 * c + 2 * k], sc[8 * c + 2 * k + 1]);
          ad[c][k] = pack2<T>(dp[8 * c + 2 * k], dp[8 * c + 2 * k + 1]);
        }
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int hh = 0; hh < NHALF; ++hh) {
          const uint64_t off = (8192 >> 4) * hh + (2048 >> 4) * c;
          wgmma_64x64x16_rs<T>(dv[hh], ap[c], ddo_desc + off, true);
          wgmma_64x64x16_rs<T>(dk[hh], ad[c], dq_desc + off, true);
        }
      wgmma_commit();
      wgmma_wait<0>();
      __syncthreads();
      ds_copy(it);
    }
    if (threadIdx.x == 0) bulk_wait_all();
  }


  T* dqkv = static_cast<T*>(P.out);
  T* dkb = dqkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  T* dvb = dkb + HD;
  const float dvs = DROP ? P.D.scale : 1.f;  // dV's keep scale
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = key0 + r * 8;
    if (key >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const int i = 4 * (n & 7) + 2 * r;
      *reinterpret_cast<uint32_t*>(dkb + key * stride + n * 8 + 2 * tq) =
          pack2<T>(dk[n >> 3][i] * P.scale, dk[n >> 3][i + 1] * P.scale);
      *reinterpret_cast<uint32_t*>(dvb + key * stride + n * 8 + 2 * tq) =
          pack2<T>(dv[n >> 3][i] * dvs, dv[n >> 3][i + 1] * dvs);
    }
  }
}

// ---- backward dQ = dS K from the handed-over dS, on Hopper's warpgroup MMA -------------
// fa_bwd_dq_ds_kernel's work and launch shape: the 64-query tile of one head sums, over its
// key tiles in order, dS (64 x 64, stored key-major by the dK/dV kernel: an MN-major A)
// times the key tile (an MN-major B; head dim 128: one product per 64-column half).
template <int HD>
constexpr size_t dq_ds_wgmma_bytes() {
  return size_t(2 * kSw128Tile * (HD / 64 + 1)) * 2 + 1024;
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreadsFA) fa_bwd_dq_ds_wgmma_kernel(FaParams P) {
  constexpr int NHALF = HD / 64, ND = HD / 8, KT = NHALF * kSw128Tile;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Ks = reinterpret_cast<T*>(smem_from_1024(fa_smem));
  T* Ds = Ks + 2 * KT;  // [2] 64 keys x 64 queries

  const int nq = int((P.S + kRows - 1) / kRows);
  const int qt = nq - 1 - int(blockIdx.x);
  const int64_t bl = blockIdx.y / P.NH, b = P.b0 + bl, h = blockIdx.y - bl * P.NH,
                g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qkv = static_cast<const T*>(P.qkv);
  const int64_t stride = P.B * P.W;
  const T* kb = qkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* ds = static_cast<const T*>(P.ds) + FaDsBuf::tile(P.NH, P.S, bl * P.NH + h, qt, 0);

  // One dS tile into `dst`: the stored bytes of a swizzled tile, as they are.
  auto load_ds = [&](T* dst, const T* src) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned e = (i * kThreadsFA + threadIdx.x) * 8;
      cp_async16(dst + e, src + e, true);
    }
  };
  cp_async_tile_sw128<HD>(Ks, kb, stride, 0, P.S);
  load_ds(Ds, ds);
  cp_async_commit();
  float dq[NHALF][32];
#pragma unroll
  for (int hh = 0; hh < NHALF; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[hh][i] = 0.f;
  const int nkt = qt + 1;
  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    if (j + 1 < nkt) {
      cp_async_tile_sw128<HD>(Ks + (buf ^ 1) * KT, kb, stride, int64_t(j + 1) * kRows, P.S);
      load_ds(Ds + (buf ^ 1) * kSw128Tile, ds + int64_t(j + 1) * 4096);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_smem();
    __syncthreads();
    const uint64_t dd = wgmma_desc_sw128(Ds + buf * kSw128Tile);
    const uint64_t dk = wgmma_desc_sw128(Ks + buf * KT);
    // k16 chunks of keys: 16 rows of both tiles, 2048 bytes.
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int hh = 0; hh < NHALF; ++hh)
        wgmma_64x64x16_ss<T, 1, 1>(dq[hh], dd + (2048 >> 4) * c,
                                   dk + (8192 >> 4) * hh + (2048 >> 4) * c, true);
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // buffer `buf` is refilled next iteration
  }

  T* dqb = static_cast<T*>(P.out) + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const int64_t row0 = int64_t(qt) * kRows + warp * 16 + gr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(dqb + row * stride + n * 8 + 2 * tq) =
          pack2<T>(dq[n >> 3][4 * (n & 7) + 2 * r] * P.scale,
                   dq[n >> 3][4 * (n & 7) + 2 * r + 1] * P.scale);
  }
}
