// Tensor-core flash attention for one attention BLOCK, with the document mask: queries
// from q_src, keys and values from kv_src (linear_qkv's grouped layout [S, B, NG, NH/NG+2,
// HD], d.S rows each, the same tensor for self-attention), causal (a chunk against itself)
// or not (against an earlier chunk), and optionally key_start (--reset-attention-mask):
// query row q of sample b sees only keys whose global position k + d.k_offset is at least
// key_start[b, q]. It serves
//   * the context-parallel blocks (ops::attention_block_forward/backward on bf16/f16 at
//     head dim 64 or 128): out, lse (=); backward dQ, dK, dV (+=) from the FINAL out/lse;
//   * document-masked self-attention (ops::attention_forward/backward with key_start):
//     one causal block over the whole sequence, backward (=).
// Same numerics as flash_attention.cu (FlashAttention-2, mma.sync m16n8k16 with f32
// accumulation, 64-row tiles, 4 warps of 16 rows, K/V or Q/dO double-buffered with
// cp.async, a deterministic backward: one kernel owns a key tile's dK/dV, another a
// query tile's dQ), and the same attention-dropout mask, drawn by the shared functions of
// flash_attention_dropout.cuh at the global (b, h, q, k) index of types.h.
//
// The document mask makes attention sparse: a query tile's first key tile is the one
// holding its rows' smallest key_start (tile_min, one pass over key_start per call), so
// the work of packed documents is that of the documents alone, up to the tiles the
// document boundaries cut. The backward's key tile visits only the query tiles whose
// smallest key_start reaches it (compacted into shared memory by a ballot). A row that
// sees no key at all (possible in a CP block) gives out = 0 and lse = -inf, as the CPU op.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "base/error.h"
#include "ops/cuda/attention_cp.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_attention_dropout.cuh"
#include "ops/cuda/mma_sm80.cuh"

namespace mcpp::ops::cuda {

namespace {

constexpr int kRows = 64;  // rows per tile (queries or keys)
constexpr int kWarps = 4;
constexpr int kThreadsB = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int64_t kNoKey = INT64_MAX / 4;  // key_start of padding rows: sees nothing

template <int HD>
constexpr int ld() { return HD + 8; }  // smem row stride (elements): 16-byte rows

struct BlkParams {
  const void* q;       // q_src
  const void* kv;      // kv_src
  void* out;           // forward: out [S, B, NH*HD]; backward: dQ's destination (grouped)
  void* dkv;           // backward: dK/dV's destination (grouped; may be `out`)
  float* lse;          // [B, NH, S]
  const void* dout;    // backward
  const float* delta;  // backward: rowsum(dO * O) [B, NH, S]
  const int64_t* ks;   // [B, S] key_start (global), or null: no document mask
  const int64_t* tmin; // [B, nt] smallest key_start of each query tile (with ks)
  int64_t S, B, NH, NG, QPG, W, nt;
  int64_t kg0;         // global position of key row 0 (d.k_offset)
  bool causal, accum;
  float scale_log2, scale;
  FaDrop D;
};

// 64 rows x HD of a strided [rows, HD] slab into smem (zeros for rows >= S).
template <int HD, typename T>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t stride, int64_t r0,
                                          int64_t S) {
  cp_async_tile<kRows, HD, ld<HD>(), kThreadsB>(dst, src, stride, r0, S);
}

// The key tiles [first, end) a query tile visits: causal stops at the diagonal, the
// document mask starts at the tile of the rows' smallest key_start.
__device__ __forceinline__ void key_range(const BlkParams& P, int64_t b, int qt, int& first,
                                          int& end) {
  end = P.causal ? qt + 1 : int(P.nt);
  first = 0;
  if (P.ks) {
    const int64_t k = P.tmin[b * P.nt + qt] - P.kg0;  // first local key any row may see
    first = k <= 0 ? 0 : (k >= P.S ? end : int(k / kRows));
  }
}

// Whether local key `col` is visible from local query `row` (both < S checked here).
__device__ __forceinline__ bool visible(const BlkParams& P, int64_t row, int64_t col,
                                        int64_t ks_row) {
  return !(P.causal && col > row) && col < P.S && row < P.S && col + P.kg0 >= ks_row;
}

// ---- forward -------------------------------------------------------------------------
template <typename T, int HD, bool DROP>
__global__ void __launch_bounds__(kThreadsB) blk_fwd_kernel(BlkParams P) {
  constexpr int LD = ld<HD>(), TILE = kRows * LD, NK = HD / 16, ND = HD / 8;
  extern __shared__ __align__(16) unsigned char blk_smem[];
  T* Qs = reinterpret_cast<T*>(blk_smem);
  T* Ks = Qs + TILE;      // [2][64][LD]
  T* Vs = Ks + 2 * TILE;  // [2][64][LD]

  const int qt = int(P.nt) - 1 - int(blockIdx.x);  // longest rows first
  const int64_t b = blockIdx.y / P.NH, h = blockIdx.y - b * P.NH, g = h / P.QPG;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int64_t stride = P.B * P.W;
  const T* qb = static_cast<const T*>(P.q) + b * P.W + (g * (P.QPG + 2) + (h - g * P.QPG)) * HD;
  const T* kb = static_cast<const T*>(P.kv) + b * P.W + (g * (P.QPG + 2) + P.QPG) * HD;
  const T* vb = kb + HD;
  const int64_t q0 = int64_t(qt) * kRows;
  const int64_t row0 = q0 + warp * 16 + gr;  // rows row0 and row0 + 8
  int first, end;
  key_range(P, b, qt, first, end);
  int64_t ksr[2] = {INT64_MIN / 4, INT64_MIN / 4};
  if (P.ks)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row0 + 8 * r;
      ksr[r] = row < P.S ? P.ks[b * P.S + row] : kNoKey;
    }

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  if (first < end) {
    load_tile<HD>(Qs, qb, stride, q0, P.S);
    load_tile<HD>(Ks, kb, stride, int64_t(first) * kRows, P.S);
    load_tile<HD>(Vs, vb, stride, int64_t(first) * kRows, P.S);
    cp_async_commit();
  }
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
    // The mask: the last tile (diagonal, keys >= S) and, with documents, every tile.
    const bool edge = j == end - 1 || P.ks != nullptr;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[n][e] * P.scale_log2;
        if (edge) {
          const int64_t row = row0 + (e >> 1) * 8, col = k0 + n * 8 + 2 * tq + (e & 1);
          if (!visible(P, row, col, ksr[e >> 1])) x = -INFINITY;
        }
        sc[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2], mref[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      mref[r] = mn == -INFINITY ? 0.f : mn;
      alpha[r] = ex2_ftz(m[r] - mref[r]);  // 0 when m was -inf
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = ex2_ftz(sc[n][e] - mref[e >> 1]);
        l[e >> 1] += p;  // the normaliser of the undropped probabilities
        if constexpr (DROP) sc[n][e] = kept_q(keep, n, e) ? p * P.D.scale : 0.f;
        else sc[n][e] = p;
      }
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
    __syncthreads();
  }

  T* ob = static_cast<T*>(P.out) + b * P.NH * HD + h * HD;
  const int64_t ostride = P.B * P.NH * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = row0 + r * 8;
    if (row >= P.S) continue;
    const bool any = l[r] > 0.f;  // false: the row sees no key (out 0, lse -inf)
    const float inv = any ? 1.f / l[r] : 0.f;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<uint32_t*>(ob + row * ostride + n * 8 + 2 * tq) =
          pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    if (tq == 0) P.lse[(b * P.NH + h) * P.S + row] = any ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
  }
}

#include "ops/cuda/attention_block_bwd.cuh"

// tmin[b, t] = min of key_start[b, q] over the rows q of query tile t.
__global__ void tile_min_kernel(const int64_t* __restrict__ ks, int64_t* __restrict__ tmin,
                                int64_t S, int64_t B, int64_t nt) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= B * nt) return;
  const int64_t b = i / nt, t = i - b * nt;
  int64_t m = kNoKey;
  for (int64_t q = t * kRows; q < S && q < (t + 1) * kRows; ++q) m = min(m, ks[b * S + q]);
  tmin[i] = m;
}

// delta[b, h, q] = sum_d dO[q, b, h, d] * O[q, b, h, d]. One warp per row.
template <typename T>
__global__ void blk_delta_kernel(const T* __restrict__ dout, const T* __restrict__ o,
                                 float* __restrict__ delta, int64_t S, int64_t B, int64_t NH,
                                 int64_t HD) {
  const int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;  // (s * B + b) * NH + h
  if (row >= S * B * NH) return;
  float acc = 0.f;
  for (int64_t d = threadIdx.x; d < HD; d += 32)
    acc += to_f(dout[row * HD + d]) * to_f(o[row * HD + d]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x == 0) {
    const int64_t h = row % NH, sb = row / NH, b = sb % B, s = sb / B;
    delta[(b * NH + h) * S + s] = acc;
  }
}

template <int HD>
constexpr size_t fwd_bytes() { return size_t(5 * kRows * ld<HD>()) * 2; }
template <int HD>
size_t dkv_bytes(int64_t nt) {
  return size_t(6 * kRows * ld<HD>()) * 2 + 4 * kRows * sizeof(float) +
         2 * kRows * sizeof(int64_t) + size_t(nt) * sizeof(int);
}
template <int HD>
constexpr size_t dq_bytes() { return size_t(6 * kRows * ld<HD>()) * 2; }

template <typename K>
void allow_smem(K kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

struct Call {
  const Tensor& q_src;
  const Tensor& kv_src;
  const AttentionDims& d;
  bool causal;
  double scale, p;
  DropoutKey key;
};

// Parameters and, with documents, the per-tile smallest key_start (kept alive in `tmin`).
BlkParams make(const Call& c, Tensor& tmin, cudaStream_t cs) {
  const AttentionDims& d = c.d;
  BlkParams P{};
  P.q = c.q_src.raw(), P.kv = c.kv_src.raw();
  P.S = d.S, P.B = d.B, P.NH = d.NH, P.NG = d.NG, P.QPG = d.NH / d.NG, P.W = d.qkv_width();
  P.nt = (d.S + kRows - 1) / kRows;
  P.kg0 = d.k_offset;
  P.causal = c.causal;
  P.scale = float(c.scale), P.scale_log2 = float(c.scale) * kLog2e;
  if (d.key_start.defined()) {
    P.ks = static_cast<const int64_t*>(d.key_start.raw());
    tmin = Tensor::empty({d.B, P.nt}, DType::I64, Device::CUDA);
    const int64_t n = d.B * P.nt;
    tile_min_kernel<<<unsigned((n + 127) / 128), 128, 0, cs>>>(
        P.ks, static_cast<int64_t*>(tmin.raw()), d.S, d.B, P.nt);
    MCPP_LAUNCH_CHECK();
    P.tmin = static_cast<const int64_t*>(tmin.raw());
  }
  P.D.setup(d, c.p, c.key);  // the mask of flash_attention.cu and the CPU op
  return P;
}

template <typename T, int HD, bool DROP>
void fwd(const Call& c, Tensor& out, Tensor& lse, cudaStream_t cs) {
  static bool once = (allow_smem(blk_fwd_kernel<T, HD, DROP>, fwd_bytes<HD>()), true);
  (void)once;
  Tensor tmin;
  BlkParams P = make(c, tmin, cs);
  P.out = out.raw(), P.lse = static_cast<float*>(lse.raw());
  blk_fwd_kernel<T, HD, DROP>
      <<<dim3(unsigned(P.nt), unsigned(P.B * P.NH)), kThreadsB, fwd_bytes<HD>(), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

template <typename T, int HD, bool DROP>
void bwd(const Call& c, const Tensor& dout, const Tensor& out, const Tensor& lse, bool accum,
         Tensor& dq, Tensor& dkv, cudaStream_t cs) {
  static bool once = (allow_smem(blk_bwd_dq_kernel<T, HD, DROP>, dq_bytes<HD>()), true);
  (void)once;
  Tensor tmin;
  BlkParams P = make(c, tmin, cs);
  const AttentionDims& d = c.d;
  Tensor delta = Tensor::empty({d.B, d.NH, d.S}, DType::F32, Device::CUDA);
  const int64_t rows = d.S * d.B * d.NH;
  blk_delta_kernel<T><<<unsigned((rows + 7) / 8), dim3(32, 8), 0, cs>>>(
      static_cast<const T*>(dout.raw()), static_cast<const T*>(out.raw()),
      static_cast<float*>(delta.raw()), d.S, d.B, d.NH, d.HD);
  MCPP_LAUNCH_CHECK();
  P.lse = const_cast<float*>(static_cast<const float*>(lse.raw()));
  P.delta = static_cast<const float*>(delta.raw());
  P.dout = dout.raw();
  P.out = dq.raw(), P.dkv = dkv.raw(), P.accum = accum;
  const size_t dkv_smem = dkv_bytes<HD>(P.nt);
  static size_t allowed = 0;  // the list of query tiles grows the dK/dV kernel's smem with S
  if (dkv_smem > allowed) allow_smem(blk_bwd_dkv_kernel<T, HD, DROP>, allowed = dkv_smem);
  blk_bwd_dkv_kernel<T, HD, DROP>
      <<<dim3(unsigned(P.nt), unsigned(P.B * P.NG)), kThreadsB, dkv_smem, cs>>>(P);
  MCPP_LAUNCH_CHECK();
  blk_bwd_dq_kernel<T, HD, DROP>
      <<<dim3(unsigned(P.nt), unsigned(P.B * P.NH)), kThreadsB, dq_bytes<HD>(), cs>>>(P);
  MCPP_LAUNCH_CHECK();
}

#define MCPP_BLK_DISPATCH(c, ...)                                                   \
  do {                                                                              \
    const bool drop_ = (c).p > 0;                                                   \
    if ((c).q_src.dtype() == DType::BF16) {                                         \
      using T = bf16;                                                               \
      if ((c).d.HD == 64) { constexpr int HD = 64; if (drop_) { constexpr bool DROP = true; __VA_ARGS__; } else { constexpr bool DROP = false; __VA_ARGS__; } } \
      else { constexpr int HD = 128; if (drop_) { constexpr bool DROP = true; __VA_ARGS__; } else { constexpr bool DROP = false; __VA_ARGS__; } } \
    } else {                                                                        \
      using T = f16;                                                                \
      if ((c).d.HD == 64) { constexpr int HD = 64; if (drop_) { constexpr bool DROP = true; __VA_ARGS__; } else { constexpr bool DROP = false; __VA_ARGS__; } } \
      else { constexpr int HD = 128; if (drop_) { constexpr bool DROP = true; __VA_ARGS__; } else { constexpr bool DROP = false; __VA_ARGS__; } } \
    }                                                                               \
  } while (0)

}  // namespace

bool flash_block_takes(DType dt, int64_t head_dim) {
  static const bool disabled = std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr;
  return !disabled && (dt == DType::BF16 || dt == DType::F16) &&
         (head_dim == 64 || head_dim == 128);
}

void flash_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                         bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                         Tensor& out, Tensor& lse, Stream& s) {
  MCPP_CHECK(flash_block_takes(q_src.dtype(), d.HD),
             "flash_block_forward: {} at head dim {} is not a tensor-core block shape",
             dtype_name(q_src.dtype()), d.HD);
  MCPP_CHECK(d.NG > 0 && d.NH % d.NG == 0, "flash_block_forward: NH {} not a multiple of NG {}",
             d.NH, d.NG);
  const Call c{q_src, kv_src, d, causal, softmax_scale, dropout_p, key};
  cudaStream_t cs = stream_of(s);
  MCPP_BLK_DISPATCH(c, (fwd<T, HD, DROP>(c, out, lse, cs)));
}

void flash_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                          const Tensor& out, const Tensor& lse, const AttentionDims& d,
                          bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                          bool accumulate, Tensor& dq, Tensor& dkv, Stream& s) {
  MCPP_CHECK(flash_block_takes(q_src.dtype(), d.HD),
             "flash_block_backward: {} at head dim {} is not a tensor-core block shape",
             dtype_name(q_src.dtype()), d.HD);
  const Call c{q_src, kv_src, d, causal, softmax_scale, dropout_p, key};
  cudaStream_t cs = stream_of(s);
  MCPP_BLK_DISPATCH(c, (bwd<T, HD, DROP>(c, dout, out, lse, accumulate, dq, dkv, cs)));
}

}  // namespace mcpp::ops::cuda
