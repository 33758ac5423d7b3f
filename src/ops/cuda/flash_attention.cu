// Tensor-core flash attention (FlashAttention-2, Dao 2023) for bf16/f16 on sm_80+:
// mma.sync m16n8k16 with f32 accumulation, causal, grouped-query heads read straight
// from linear_qkv's grouped layout [S, B, NG, NH/NG + 2, HD], head dims 64 and 128.
// Same contract as attention.cu (which calls it): out[S, B, NH*HD] (=), lse[B, NH, S]
// f32 natural-log (=), dqkv (=, every element written once).
//
// Attention dropout runs in the kernels (forward and both backward kernels), with the
// mask of the CPU op and of attention.cu's CUDA-core kernel (DropoutMask, base/
// philox.h): element (b, h, q, k) is kept iff its 16-bit uniform u16(i) >= ceil(p 2^16),
// i its global index (((b + b_off) NH_global + h + h_off) S_global + q + q_off) S_global +
// k + k_off (types.h). So a TP split of heads, an SP/DP split of the batch and a recomputed
// forward draw the same mask, and the forward stores none. Eight consecutive indices
// 8j..8j+7 share one Philox-4x32-7 block; when S_global and k_off are multiples of 8 every
// aligned group of eight keys is one block, and the lanes that hold a group's elements
// (four in the forward and dQ layouts, eight in dK/dV's transposed one) each draw a share
// of the blocks and exchange the keep bits by shuffles: one block per eight elements, as
// the CPU. Otherwise every element draws its own block (correct, eight times the work).
// As in FlashAttention, lse and the row normaliser are those of the undropped
// probabilities.
//
// Each block has 4 warps and a 64-row tile; each warp owns 16 rows. Scores live in
// registers (C fragments), and P is fed back to the next MMA as A fragments without a
// trip through shared memory (the C layout of two n8 tiles is the A layout of one k16
// tile). K/V (forward, dQ) or Q/dO (dK/dV) tiles are double-buffered with cp.async.
// Backward is deterministic: one kernel owns dK, dV of a key tile and sums over the
// group's query heads and the query tiles in a fixed order; another owns dQ. By default the
// dK/dV kernel also writes dS (FaDsBuf, scratch in chunks of sequences) and the dQ kernel
// is dQ = dS K; without that buffer the dQ kernel recomputes the scores and dS. With
// dropout the keep bits (a bit per causal score, about B NH S^2 / 16 bytes, FaMaskBuf) are
// drawn once per layer when the caller keeps a buffer from forward to backward (the
// model's layers do): the forward writes them, the backward kernels read them. Without one
// the dK/dV kernel draws the mask again (and, for a recomputing dQ kernel, writes its bits)
// (docs/cuda-backend.md says why not FlashAttention-2's atomic dQ). The dQ kernels are in
// flash_attention_dq.cuh, the Hopper (wgmma) kernels in flash_attention_sm90.cuh (forward)
// and flash_attention_sm90_bwd.cuh, all included below inside this file's anonymous
// namespace. On Hopper (an sm_90a image loaded) the forward, dK/dV and dQ-from-dS kernels
// are the wgmma ones (use_wgmma).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "base/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/attention_backend.h"
#include "ops/cuda/flash_attention.h"
#include "ops/cuda/flash_attention_dropout.cuh"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/cuda/wgmma_sm90.cuh"

namespace mcpp::ops::cuda {

namespace {

constexpr int kRows = 64;    // rows per tile (queries or keys)
constexpr int kWarps = 4;
constexpr int kThreadsFA = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HD>
constexpr int ld() { return HD + 8; }  // smem row stride (elements): 16-byte rows, no conflicts

struct FaParams {
  const void* qkv;
  void* out;          // forward: out; backward: dqkv
  float* lse;         // [B, NH, S]
  const void* dout;   // backward
  const float* delta; // backward: rowsum(dO * O) [B, NH, S]
  int64_t S, B, NH, NG, QPG, W;
  float scale_log2;   // softmax scale * log2(e)
  float scale;
  FaDrop D;
  uint8_t* mask;      // with dropout (aligned path), the keep bits (FaMaskBuf): forward,
                      // written when set; backward, written by dK/dV and read by dQ, or
                      // null: the dQ kernel draws the mask again
  bool mask_ready;    // backward: `mask` holds the forward's bits; dK/dV reads them too
  void* ds;           // backward: the dK/dV kernel's dS tiles for the dQ kernel (FaDsBuf), or
                      // null: the dQ kernel recomputes dS
  int64_t b0;         // backward: the first sequence of this launch (batch chunks)
};

// dS (unscaled, in the compute type) of one launch's causal 64 x 64 tiles, for the dQ
// kernel: tile (qt, kt <= qt) of sequence b (b0 <= b < b0 + chunk) and head h at tile index
// ((b - b0) NH + h) nt (nt + 1) / 2 + qt (qt + 1) / 2 + kt, each stored key-major (64 rows of
// keys, 64 query columns), the layout the dK/dV kernel computes it in.
struct FaDsBuf {
  __device__ __forceinline__ static int64_t tile(int64_t NH, int64_t S, int64_t bh, int qt,
                                                 int kt) {
    const int64_t nt = (S + 63) / 64;
    return ((bh * (nt * (nt + 1) / 2)) + int64_t(qt) * (qt + 1) / 2 + kt) * 4096;
  }
};

// 64 rows x HD of a strided [rows, HD] slab into smem (zeros for rows >= S).
template <int HD, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t stride, int64_t r0,
                                          int64_t S) {
  cp_async_tile<kRows, HD, ld<HD>(), kThreadsFA>(dst, src, stride, r0, S);
}

// ---- forward -------------------------------------------------------------------------
// The forward's online-softmax update of a warp's two rows (this lane's rows row0 and
// row0 + 8) after a tile whose maxima over this lane's scores are mx: the rows' maxima over
// the quad (into mx), the new running maxima m (log2 domain), mref (m, or 0 while a row has
// seen only -inf) and alpha, the factor of the old O and l (0 when m was -inf); l scaled.
__device__ __forceinline__ void online_max(float (&mx)[2], float (&m)[2], float (&l)[2],
                                           float scale_log2, float (&mref)[2],
                                           float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r] * scale_log2);
    mref[r] = mn == -INFINITY ? 0.f : mn;
    alpha[r] = ex2_ftz(m[r] - mref[r]);
    m[r] = mn;
    l[r] *= alpha[r];
  }
}

template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsFA) fa_fwd_kernel(FaParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Qs = reinterpret_cast<T*>(fa_smem);
  T* Ks = Qs + TILE;      // [2][64][LD]
  T* Vs = Ks + 2 * TILE;  // [2][64][LD]

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

  load_tile<HD>(Qs, qb, stride, q0, P.S);
  load_tile<HD>(Ks, kb, stride, 0, P.S);
  load_tile<HD>(Vs, vb, stride, 0, P.S);
  cp_async_commit();

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t row0 = q0 + warp * 16 + gr;  // rows row0 and row0 + 8
  const int nkt = qt + 1;
  // Where the forward's keep bits go (FaMaskBuf), if anywhere.
  uint8_t* mrow0 = nullptr;
  uint8_t* mrow1 = nullptr;
  if constexpr (DROP) {
    mrow0 = mask_row_q(P.mask, P.S, b * P.NH + h, row0);
    mrow1 = mask_row_q(P.mask, P.S, b * P.NH + h, row0 + 8);
  }

  for (int j = 0; j < nkt; ++j) {
    const int buf = j & 1;
    const int64_t k0 = int64_t(j) * kRows;
    // The dropout mask's integer work needs no tile: it overlaps the copies in flight.
    uint32_t keep = 0;
    if constexpr (DROP)
      keep = keep_bits_rows_q<HD == 64>(P.D, b, h, row0, k0, tq, lane,
                                        mrow0 ? mrow0 + k0 / 8 : nullptr,
                                        mrow1 ? mrow1 + k0 / 8 : nullptr);
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

    float sc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      uint32_t a[4];
      load_a<LD>(a, Qs, warp * 16, kk * 16, lane);
#pragma unroll
      for (int n = 0; n < 8; n += 2) {
        uint32_t bb[4];
        load_bt2<LD>(bb, Kt, n * 8, kk * 16, lane);
        mma16816<T>(sc[n], a, bb);
        mma16816<T>(sc[n + 1], a, bb + 2);
      }
    }
    // Causal mask (only the diagonal tile needs it; keys >= S lie there too). The scores
    // stay unscaled: the row max commutes with the positive scale, which the exponent's
    // FFMA applies (m, mref are in the scaled log2 domain).
    const bool diag = j == nkt - 1;
    float mx[2] = {-INFINITY, -INFINITY};
    if (diag) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = row0 + (e >> 1) * 8, col = k0 + n * 8 + 2 * tq + (e & 1);
          if (col > row || col >= P.S) sc[n][e] = -INFINITY;
        }
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], sc[n][e]);
    float alpha[2], mref[2];
    online_max(mx, m, l, P.scale_log2, mref, alpha);
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = ex2_ftz(fmaf(sc[n][e], P.scale_log2, -mref[e >> 1]));
        l[e >> 1] += p;  // the normaliser of the undropped probabilities
        // Dropped probabilities are zeroed; the keep scale multiplies O once at the end.
        if constexpr (DROP) sc[n][e] = kept_q(keep, n, e) ? p : 0.f;
        else sc[n][e] = p;
      }
    // O += P V: P's C fragments of n-tiles 2c, 2c+1 are the A fragment of k-chunk c.
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t a[4];
      a[0] = pack2<T>(sc[2 * c][0], sc[2 * c][1]);
      a[1] = pack2<T>(sc[2 * c][2], sc[2 * c][3]);
      a[2] = pack2<T>(sc[2 * c + 1][0], sc[2 * c + 1][1]);
      a[3] = pack2<T>(sc[2 * c + 1][2], sc[2 * c + 1][3]);
#pragma unroll
      for (int nd = 0; nd < HD / 16; ++nd) {
        uint32_t bb[4];
        load_b_trans<LD>(bb, Vt, c * 16, nd * 16, lane);
        mma16816<T>(o[2 * nd], a, bb);
        mma16816<T>(o[2 * nd + 1], a, bb + 2);
      }
    }
    __syncthreads();  // buffer `buf` is refilled next iteration
  }

  T* out = static_cast<T*>(P.out);
  const int64_t ostride = P.B * P.NH * HD;
  T* ob = out + b * P.NH * HD + h * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
    const float inv = (DROP ? P.D.scale : 1.f) / l[r];
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const uint32_t v = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(ob + row * ostride + n * 8 + 2 * tq) = v;
    }
    if (tq == 0) P.lse[(b * P.NH + h) * P.S + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// ---- backward: dK, dV of one key tile of one (b, group) ------------------------------
template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsFA) fa_bwd_dkv_kernel(FaParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char fa_smem[];
  T* Ks = reinterpret_cast<T*>(fa_smem);
  T* Vs = Ks + TILE;
  T* Qs = Vs + TILE;                                        // [2][64][LD]
  T* dOs = Qs + 2 * TILE;                                   // [2][64][LD]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * TILE);  // [2][64], log2 domain
  float* dl_s = lse_s + 2 * kRows;                          // [2][64]

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
  auto issue = [&](int it, int buf) {
    const int hi = it / per_head, qt = kt + (it - hi * per_head);
    const int64_t h = g * P.QPG + hi;
    const T* qb = qkv + b * P.W + (g * (P.QPG + 2) + hi) * HD;
    load_tile<HD>(Qs + buf * TILE, qb, stride, int64_t(qt) * kRows, P.S);
    load_tile<HD>(dOs + buf * TILE, dout + b * P.NH * HD + h * HD, ostride, int64_t(qt) * kRows,
                  P.S);
    if (threadIdx.x < kRows) {
      const int64_t q = int64_t(qt) * kRows + threadIdx.x;
      const bool ok = q < P.S;
      lse_s[buf * kRows + threadIdx.x] = ok ? P.lse[(b * P.NH + h) * P.S + q] * kLog2e : 0.f;
      dl_s[buf * kRows + threadIdx.x] = ok ? P.delta[(b * P.NH + h) * P.S + q] : 0.f;
    }
  };

  load_tile<HD>(Ks, kb, stride, k0, P.S);
  load_tile<HD>(Vs, vb, stride, k0, P.S);
  issue(0, 0);
  cp_async_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  const int64_t key0 = k0 + warp * 16 + gr;  // this thread's key rows: key0, key0 + 8

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const int hi = it / per_head, qt = kt + (it - hi * per_head);
    const int64_t q0 = int64_t(qt) * kRows;
    uint32_t keep = 0;  // computed while the next tiles load
    if constexpr (DROP) {
      const int64_t bh = b * P.NH + g * P.QPG + hi;
      if (P.mask_ready) {
        keep = rows_k_from_blocks(load_mask_blocks_k(P.mask, P.S, bh, k0 + warp * 16, q0, gr, tq),
                                  gr, tq);
      } else {
        uint32_t drawn;
        keep = keep_bits_rows_k(P.D, b, g * P.QPG + hi, k0 + warp * 16, q0, gr, tq, drawn);
        if (P.mask) store_mask(P.mask, P.S, bh, q0 + 8 * gr + 2 * tq, k0 + warp * 16, drawn);
      }
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

    // S^T = K Q^T and dP^T = V dO^T, 16 keys x 64 queries per warp.
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
        if constexpr (HD == 64) {
          load_bt2<LD>(bq, Qt, n * 8, kk * 16, lane);
          load_bt2<LD>(bo, dOt, n * 8, kk * 16, lane);
        } else {  // two x2 loads each: the x4 ones take the head-dim-128 kernel into spills
          load_bt<LD>(bq, Qt, n * 8, kk * 16, lane);
          load_bt<LD>(bo, dOt, n * 8, kk * 16, lane);
          load_bt<LD>(bq + 2, Qt, n * 8 + 8, kk * 16, lane);
          load_bt<LD>(bo + 2, dOt, n * 8 + 8, kk * 16, lane);
        }
        mma16816<T>(sc[n], ak, bq);
        mma16816<T>(dp[n], av, bo);
        mma16816<T>(sc[n + 1], ak, bq + 2);
        mma16816<T>(dp[n + 1], av, bo + 2);
      }
    }
    // Only the diagonal tile and tiles reaching past S hold entries to zero (above the
    // diagonal; queries or keys >= S). The head-dim-64 dropout kernel tests every tile:
    // measured, the branch made it 3-4% slower (register allocation), while it saves 9%
    // in the head-dim-128 kernels.
    const bool edge = (DROP && HD == 64) || qt == kt || q0 + kRows > P.S || k0 + kRows > P.S;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = n * 8 + 2 * tq + (e & 1);
        const int64_t key = key0 + (e >> 1) * 8, q = q0 + qc;
        float p = ex2_ftz(sc[n][e] * P.scale_log2 - lse2[qc]);
        if (edge && (key > q || q >= P.S || key >= P.S)) p = 0.f;
        if constexpr (DROP) {  // dV from the dropped P (the keep scale once at the end);
                               // dP of the dropped entries is 0
          const bool kp = kept_k(keep, n, e);
          sc[n][e] = kp ? p : 0.f;
          dp[n][e] = p * ((kp ? dp[n][e] * P.D.scale : 0.f) - dl[qc]);
        } else {
          sc[n][e] = p;                        // P^T
          dp[n][e] = p * (dp[n][e] - dl[qc]);  // dS^T (unscaled)
        }
      }
    if (P.ds) {  // dS^T for the dQ kernel: rows key0, key0 + 8 of the tile, two queries each
      T* tile =
          static_cast<T*>(P.ds) + FaDsBuf::tile(P.NH, P.S, bl * P.NH + g * P.QPG + hi, qt, kt);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<uint32_t*>(tile + (warp * 16 + gr + 8 * r) * 64 + n * 8 + 2 * tq) =
              pack2<T>(dp[n][2 * r], dp[n][2 * r + 1]);
    }
    // dV += P^T dO, dK += dS^T Q: k-chunks of 16 queries.
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
      *reinterpret_cast<uint32_t*>(dkb + key * stride + n * 8 + 2 * tq) =
          pack2<T>(dk[n][2 * r] * P.scale, dk[n][2 * r + 1] * P.scale);
      *reinterpret_cast<uint32_t*>(dvb + key * stride + n * 8 + 2 * tq) =
          pack2<T>(dv[n][2 * r] * dvs, dv[n][2 * r + 1] * dvs);
    }
  }
}

#include "ops/cuda/flash_attention_dq.cuh"
#include "ops/cuda/flash_attention_sm90.cuh"
#include "ops/cuda/flash_attention_sm90_bwd.cuh"

template <int HD>
constexpr size_t fwd_bytes() { return size_t(5 * kRows * ld<HD>()) * 2; }
template <int HD>
constexpr size_t dkv_bytes() { return size_t(6 * kRows * ld<HD>()) * 2 + 4 * kRows * sizeof(float); }
template <int HD>
constexpr size_t dq_bytes() { return size_t(6 * kRows * ld<HD>()) * 2; }
template <int HD>
constexpr size_t dq_ds_bytes() { return size_t(2 * kRows * (ld<HD>() + kLdS)) * 2; }

template <typename K>
void allow_smem(K kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

FaParams make(const FlashArgs& a) {
  FaParams P{};
  P.qkv = a.qkv, P.S = a.d.S, P.B = a.d.B, P.NH = a.d.NH, P.NG = a.d.NG;
  P.QPG = a.d.NH / a.d.NG, P.W = a.d.qkv_width();
  P.scale = float(a.softmax_scale), P.scale_log2 = float(a.softmax_scale) * kLog2e;
  P.D.setup(a.d, a.dropout_p, a.key);
  return P;
}

// 1 in the image the runtime loads for this device when it holds the wgmma kernels (an
// sm_90a cubin on a compute-capability-9.0 GPU), 0 in any other (sm_80 SASS, or PTX of
// compute_90 JIT-compiled for a later GPU, where wgmma.mma_async does not exist).
__device__ const int kWgmmaImage = MCPP_WGMMA;

// Whether the Hopper kernels run: the loaded image has them and MCPP_FLASH_WGMMA is not 0.
// Read once per process (the current device's image; a symbol read, no kernel launch).
bool use_wgmma() {
  static const bool on = [] {
    const char* e = std::getenv("MCPP_FLASH_WGMMA");
    if (e && std::string_view(e) == "0") return false;
    int built = 0;
    if (cudaMemcpyFromSymbol(&built, kWgmmaImage, sizeof(int)) != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch check to report
      return false;
    }
    return built == 1;
  }();
  return on;
}

template <typename T, int HD, bool DROP>
void fwd(const FlashArgs& a, void* out, float* lse, cudaStream_t cs, void* mask) {
  const bool wg = use_wgmma();
  static bool once = (wg ? allow_smem(fa_fwd_wgmma_kernel<T, HD, DROP>, fwd_wgmma_bytes<HD>())
                         : allow_smem(fa_fwd_kernel<T, HD, DROP>, fwd_bytes<HD>()),
                      true);
  (void)once;
  FaParams P = make(a);
  P.out = out, P.lse = lse;
  P.mask = DROP && P.D.aligned ? static_cast<uint8_t*>(mask) : nullptr;
  dim3 grid(unsigned((P.S + kRows - 1) / kRows), unsigned(P.B * P.NH));
  if (wg)
    fa_fwd_wgmma_kernel<T, HD, DROP><<<grid, kThreadsFA, fwd_wgmma_bytes<HD>(), cs>>>(P);
  else
    fa_fwd_kernel<T, HD, DROP><<<grid, kThreadsFA, fwd_bytes<HD>(), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

// The dK/dV kernel of a launch: the wgmma one on Hopper, else mma.sync's.
template <typename T, int HD, bool DROP>
void launch_dkv(const FaParams& P, dim3 grid, cudaStream_t cs) {
  if (use_wgmma())
    fa_bwd_dkv_wgmma_kernel<T, HD, DROP><<<grid, kThreadsFA, bwd_dkv_wgmma_bytes<HD>(), cs>>>(P);
  else
    fa_bwd_dkv_kernel<T, HD, DROP><<<grid, kThreadsFA, dkv_bytes<HD>(), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

template <typename T, int HD, bool DROP>
void bwd(const FlashArgs& a, const void* dout, const float* lse, const float* delta, void* dqkv,
         cudaStream_t cs, void* mask, bool mask_ready, void* ds, int64_t ds_chunk) {
  static bool once = (use_wgmma() ? allow_smem(fa_bwd_dkv_wgmma_kernel<T, HD, DROP>,
                                                bwd_dkv_wgmma_bytes<HD>())
                                   : allow_smem(fa_bwd_dkv_kernel<T, HD, DROP>, dkv_bytes<HD>()),
                      allow_smem(fa_bwd_dq_kernel<T, HD, DROP>, dq_bytes<HD>()),
                      use_wgmma()
                          ? allow_smem(fa_bwd_dq_ds_wgmma_kernel<T, HD>, dq_ds_wgmma_bytes<HD>())
                          : allow_smem(fa_bwd_dq_ds_kernel<T, HD>, dq_ds_bytes<HD>()),
                      true);
  (void)once;
  FaParams P = make(a);
  P.out = dqkv, P.lse = const_cast<float*>(lse), P.dout = dout, P.delta = delta;
  P.mask = DROP && P.D.aligned ? static_cast<uint8_t*>(mask) : nullptr;
  P.mask_ready = P.mask && mask_ready;
  const unsigned tiles = unsigned((P.S + kRows - 1) / kRows);
  if (ds) {
    // dS tiles from the dK/dV kernel to the dQ kernel, in chunks of ds_chunk sequences. The
    // mask needs no hand-over: without the forward's bits the dK/dV kernel draws it alone.
    P.ds = ds;
    if (!P.mask_ready) P.mask = nullptr;
    for (int64_t b0 = 0; b0 < P.B; b0 += ds_chunk) {
      const int64_t nb = std::min(ds_chunk, P.B - b0);
      P.b0 = b0;
      launch_dkv<T, HD, DROP>(P, dim3(tiles, unsigned(nb * P.NG)), cs);
      const dim3 grid(tiles, unsigned(nb * P.NH));
      if (use_wgmma())
        fa_bwd_dq_ds_wgmma_kernel<T, HD><<<grid, kThreadsFA, dq_ds_wgmma_bytes<HD>(), cs>>>(P);
      else
        fa_bwd_dq_ds_kernel<T, HD><<<grid, kThreadsFA, dq_ds_bytes<HD>(), cs>>>(P);
      MCPP_LAUNCH_CHECK();
    }
    return;
  }
  launch_dkv<T, HD, DROP>(P, dim3(tiles, unsigned(P.B * P.NG)), cs);
  fa_bwd_dq_kernel<T, HD, DROP><<<dim3(tiles, unsigned(P.B * P.NH)), kThreadsFA, dq_bytes<HD>(), cs>>>(
      P);
  MCPP_LAUNCH_CHECK();
}

}  // namespace

bool flash_attention_uses_wgmma() { return use_wgmma(); }

bool flash_attention_applies(DType dt, int64_t head_dim, double dropout_p) {
  static const bool disabled = std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr;
  (void)dropout_p;  // dropout runs in the kernel
  return !disabled && flash_attention_takes(dt, head_dim);
}

namespace {
template <typename T, int HD>
void fwd_p(const FlashArgs& a, void* out, float* lse, cudaStream_t cs, void* mask) {
  if (a.dropout_p > 0) fwd<T, HD, true>(a, out, lse, cs, mask);
  else fwd<T, HD, false>(a, out, lse, cs, nullptr);
}
template <typename T, int HD>
void bwd_p(const FlashArgs& a, const void* dout, const float* lse, const float* delta,
           void* dqkv, cudaStream_t cs, void* mask, bool mask_ready, void* ds, int64_t chunk) {
  if (a.dropout_p > 0) bwd<T, HD, true>(a, dout, lse, delta, dqkv, cs, mask, mask_ready, ds, chunk);
  else bwd<T, HD, false>(a, dout, lse, delta, dqkv, cs, mask, false, ds, chunk);
}
}  // namespace

void flash_attention_forward(const FlashArgs& a, void* out, float* lse, cudaStream_t cs,
                             void* mask) {
  MCPP_CHECK(a.dropout_p >= 0 && a.dropout_p < 1,
             "flash attention: dropout probability {} outside [0, 1)", a.dropout_p);
  if (a.dtype == DType::BF16) {
    if (a.d.HD == 64) fwd_p<bf16, 64>(a, out, lse, cs, mask);
    else fwd_p<bf16, 128>(a, out, lse, cs, mask);
  } else {
    if (a.d.HD == 64) fwd_p<f16, 64>(a, out, lse, cs, mask);
    else fwd_p<f16, 128>(a, out, lse, cs, mask);
  }
}

int64_t flash_attention_mask_bytes(const FlashArgs& a) {
  if (!(a.dropout_p > 0)) return 0;
  const int64_t Sg = a.d.S_global > 0 ? a.d.S_global : a.d.S;
  if (Sg % 8 != 0 || a.d.k_offset % 8 != 0) return 0;  // FaDrop::aligned
  return flash_dropout_mask_bytes(a.d.B, a.d.NH, a.d.S);
}

int64_t flash_attention_ds_chunk(const FlashArgs& a, int64_t cap_bytes) {
  if (!flash_attention_ds_enabled()) return 0;
  const int64_t per_seq = flash_ds_bytes(1, a.d.NH, a.d.S);
  if (per_seq > cap_bytes) return 0;
  return attention_bwd_chunk(a.d.B, per_seq, cap_bytes);
}

void flash_attention_backward(const FlashArgs& a, const void* dout, const float* lse,
                              const float* delta, void* dqkv, cudaStream_t cs, void* mask,
                              bool mask_ready, void* ds, int64_t ds_chunk) {
  MCPP_CHECK(a.dropout_p >= 0 && a.dropout_p < 1,
             "flash attention: dropout probability {} outside [0, 1)", a.dropout_p);
  MCPP_CHECK(!ds || ds_chunk > 0, "flash attention: a dS buffer needs a chunk of sequences");
  if (a.dtype == DType::BF16) {
    if (a.d.HD == 64) bwd_p<bf16, 64>(a, dout, lse, delta, dqkv, cs, mask, mask_ready, ds, ds_chunk);
    else bwd_p<bf16, 128>(a, dout, lse, delta, dqkv, cs, mask, mask_ready, ds, ds_chunk);
  } else {
    if (a.d.HD == 64) bwd_p<f16, 64>(a, dout, lse, delta, dqkv, cs, mask, mask_ready, ds, ds_chunk);
    else bwd_p<f16, 128>(a, dout, lse, delta, dqkv, cs, mask, mask_ready, ds, ds_chunk);
  }
}

}  // namespace mcpp::ops::cuda
