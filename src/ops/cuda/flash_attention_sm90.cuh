// Included once, by ops/cuda/flash_attention.cu, inside its anonymous namespace (after
// FaParams, FaDsBuf, the tile loaders and the dropout helpers; wgmma_sm90.cuh is included
// at the top of that file): the flash-attention kernels on Hopper's warpgroup MMA, with the
// algorithms, launch shapes and results of the mma.sync kernels beside which they stand.
// flash_attention.cu launches them where the loaded image has them (sm_90a on a compute-
// capability-9.0 GPU; MCPP_FLASH_WGMMA=0 keeps mma.sync's): the forward, dK/dV and dQ
// from dS, head dims 64 and 128. bench/gpu/bench_flash_kernels.cu --wgmma compares each
// with its mma.sync kernel (on an H200 the results were bit for bit equal). This file holds
// the forward and what the kernels share; the backward kernels are in
// flash_attention_sm90_bwd.cuh, included right after it.
#pragma once

// ---- forward on Hopper's warpgroup MMA (head dims 64 and 128) ------------------------
// The same algorithm, tiles and results as fa_fwd_kernel, with the two products of a tile
// as wgmma.mma_async m64n64k16 over the whole 64-row tile (one warpgroup): S = Q K^T from
// 128B-swizzled Q and K tiles (both K-major; head dim 128: two tiles of 64 columns, k16
// steps 4..7 in the second), O += P V with P from registers and V an MN-major tile (head
// dim 128: one product per 64-column half, so no descriptor spans two tiles). The
// accumulators are in mma.sync's C layout per warp, so the softmax, the causal mask and the
// dropout keep bits are fa_fwd_kernel's.
constexpr int kSw128Tile = 64 * 64;  // elements of a swizzled 64 x 64 tile (8 KiB)
// Its dynamic shared memory: Q, K[2], V[2] of 64 x HD and the 1024-byte alignment slack.
template <int HD>
constexpr size_t fwd_wgmma_bytes() {
  return size_t(5 * kRows * HD) * 2 + 1024;
}

template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsFA) fa_fwd_wgmma_kernel(FaParams P) {
  constexpr int ND = HD / 8, NHALF = HD / 64, TILE = kRows * HD;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  // 1024-byte aligned tiles (the swizzle atom): Q, then K [2], then V [2].
  T* Qs = reinterpret_cast<T*>(smem_from_1024(fa_smem));
  T* Ks = Qs + TILE;
  T* Vs = Ks + 2 * TILE;

  const int nq = int((P.S + kRows - 1) / kRows);
  const int qt = nq - 1 - int(blockIdx.x);  // longest rows first
  const int64_t b = blockIdx.y / P.NH, h = blockIdx.y - b * P.NH, g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const T* qkv = static_cast<const T*>(P.qkv);
  const int64_t stride = P.B * P.W;
  const T* qb = qkv + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const T* kb = qkv + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t q0 = int64_t(qt) * kRows;

  cp_async_tile_sw128<HD>(Qs, qb, stride, q0, P.S);
  cp_async_tile_sw128<HD>(Ks, kb, stride, 0, P.S);
  cp_async_tile_sw128<HD>(Vs, vb, stride, 0, P.S);
  cp_async_commit();
  const uint64_t dq = wgmma_desc_sw128(Qs);

  float o[NHALF][32];
#pragma unroll
  for (int hh = 0; hh < NHALF; ++hh)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[hh][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t row0 = q0 + warp * 16 + gr;  // rows row0 and row0 + 8
  const int nkt = qt + 1;
  uint8_t* mrow0 = nullptr;
  uint8_t* mrow1 = nullptr;
  if constexpr (DROP) {
    mrow0 = mask_row_q(P.mask, P.S, b * P.NH + h, row0);
    mrow1 = mask_row_q(P.mask, P.S, b * P.NH + h, row0 + 8);
  }

  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    const int64_t k0 = int64_t(j) * kRows;
    uint32_t keep = 0;
    if constexpr (DROP)
      keep = keep_bits_rows_q<true>(P.D, b, h, row0, k0, tq, lane,
                                    mrow0 ? mrow0 + k0 / 8 : nullptr,
                                    mrow1 ? mrow1 + k0 / 8 : nullptr);
    if (j + 1 < nkt) {
      cp_async_tile_sw128<HD>(Ks + (buf ^ 1) * TILE, kb, stride, k0 + kRows, P.S);
      cp_async_tile_sw128<HD>(Vs + (buf ^ 1) * TILE, vb, stride, k0 + kRows, P.S);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_smem();
    __syncthreads();
    const uint64_t dk = wgmma_desc_sw128(Ks + buf * TILE);
    const uint64_t dv = wgmma_desc_sw128(Vs + buf * TILE);

    // S = Q K^T: k16 steps along the head dim, 32 bytes of a tile's swizzled rows each
    // (descriptor units of 16 bytes; the second 64-column tile 8 KiB on).
    float sc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const uint64_t off = (kk >> 2) * (8192 >> 4) + 2 * (kk & 3);
      wgmma_64x64x16_ss<T>(sc, dq + off, dk + off, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    const bool diag = j == nkt - 1;
    float mx[2] = {-INFINITY, -INFINITY};
    if (diag) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // (32 bits: positions are below S < 2^31)
          const int row = int(row0) + (e >> 1) * 8, col = int(k0) + n * 8 + 2 * tq + (e & 1);
          if (col > row || col >= int(P.S)) sc[4 * n + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], sc[i]);
    float alpha[2], mref[2];
    online_max(mx, m, l, P.scale_log2, mref, alpha);
#pragma unroll
    for (int hh = 0; hh < NHALF; ++hh)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[hh][i] *= alpha[(i >> 1) & 1];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = ex2_ftz(fmaf(sc[4 * n + e], P.scale_log2, -mref[e >> 1]));
        l[e >> 1] += p;
        if constexpr (DROP)
          sc[4 * n + e] = kept_q(keep, n, e) ? p : 0.f;
        else
          sc[4 * n + e] = p;
      }
    // O += P V: P's C fragments of n8 blocks 2c, 2c + 1 are the A fragment of key chunk c;
    // V's rows 16c .. 16c + 15 start 2048 bytes further each (in each 64-column tile).
    uint32_t a[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      a[c][0] = pack2<T>(sc[8 * c + 0], sc[8 * c + 1]);
      a[c][1] = pack2<T>(sc[8 * c + 2], sc[8 * c + 3]);
      a[c][2] = pack2<T>(sc[8 * c + 4], sc[8 * c + 5]);
      a[c][3] = pack2<T>(sc[8 * c + 6], sc[8 * c + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int hh = 0; hh < NHALF; ++hh)
        wgmma_64x64x16_rs<T>(o[hh], a[c], dv + (8192 >> 4) * hh + (2048 >> 4) * c, true);
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // buffer `buf` is refilled next iteration
  }

  T* ob = static_cast<T*>(P.out) + b * P.NH * HD + h * HD;
  const int64_t ostride = P.B * P.NH * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
    const float inv = (DROP ? P.D.scale : 1.f) / l[r];
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(ob + row * ostride + n * 8 + 2 * tq) =
          pack2<T>(o[n >> 3][4 * (n & 7) + 2 * r] * inv, o[n >> 3][4 * (n & 7) + 2 * r + 1] * inv);
    if (tq == 0) P.lse[(b * P.NH + h) * P.S + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}
