// linear_decode, CUDA backend (the catalogue's `---- inference` section): a linear layer of
// a decode step, y[T,out] = x[T,in] @ w[out,in]^T (+ b[out]) (+ residual[T,out]).
//
// Why not cuBLASLt: a decode step multiplies a few rows by every weight once, so it is a
// stream of the weights (2 bytes a parameter in bf16) with 2*T flops per parameter; a GEMM
// library tiles for reuse that is not there. Two kernels stream them:
//
// Tensor cores (bf16/f16, K a multiple of 64, up to 64 rows; the one Auto picks up to 8
// rows, and up to 16 for weights of <= 8M elements -- bench_decode's measurements on the
// H200; cuBLASLt is faster beyond): mma.sync m16n8k16, a block owns 16 weight rows, its 8
// warps split K in steps of 64 (warp w takes steps w, w + 8, ..., two or four in flight:
// decode_gemm_depth; the same steps in the same order either way), and each lane loads 32
// contiguous bytes of each of its two rows per step. The mma's k slots need not be
// consecutive k: lane (g = lane/4, t = lane%4) holds k = 16t .. 16t+15 of the step
// for its weight rows g and g+8 and for its token g of each 8-token tile, and the A and B
// fragments take their slots from those same registers (slots 2t, 2t+1 <- k 16t+4j .. +1,
// slots 2t+8, 2t+9 <- k 16t+4j+2 .. +3 for mma j = 0..3), so both operands see one
// permutation of k and the product is unchanged -- with plain 16-byte global loads and no
// shared-memory staging. The warps' partial sums meet in shared memory and are added in
// warp order. A token's column of the mma is computed alike whichever tile slot it has, so
// row t's y depends on row t's x alone: a sequence decodes to the same numbers alone or in
// any batch this kernel runs (tests/serve/decode_gpu_test.cpp checks it bit for bit).
// Where a layer has more 16-row tiles than the GPU holds blocks at once, the grid is
// persistent (decode_gemm_grid): each block loops over tiles, asking for its next tile's
// weights before it reduces the current one (the same bits; decode_norm_gpu_test.cpp).
//
// CUDA cores (f32/bf16/f16, up to 8 rows: the f32 model, and K not a multiple of 64): each
// warp owns R output rows (R = 1, 2 or 4 by the layer's width, so that a wave has ~16
// warps per SM) and walks their weight rows in 16-byte words, lane l taking words l,
// l + 32, ... (U words of each row in flight at once), every word multiplied into the T
// accumulators of that row with the T matching words of x (L1-resident). Sums are f32,
// added in k order within a lane and reduced by one fixed xor-shuffle tree: batch-invariant
// too.
//
// Both epilogues add the bias, then the residual, in f32, and round once. Anything else --
// more rows, a dtype mix, rows that are not whole 16-byte words, unaligned bases -- runs
// cuBLASLt: linear_residual_forward (the residual as the GEMM's C input, one kernel and one
// rounding instead of a GEMM then an add: 32 kernels fewer in a 64-row step) or
// linear_forward.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemv.h"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/cuda/norm_shape.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

constexpr int kMaxRows = 8;      // the CUDA-core GEMV up to here (its FMAs keep up)
constexpr int kMaxMmaRows = 64;  // the tensor-core kernel takes up to here (Auto: see below)
constexpr int kWarps = 8;        // per block

// acc += dot(x word, w word), element by element in order (E = 16 / sizeof(T) elements).
template <typename T>
__device__ __forceinline__ float dot_word(const uint4& xw, const uint4& ww, float acc) {
  constexpr int E = int(16 / sizeof(T));
  const T* xe = reinterpret_cast<const T*>(&xw);
  const T* we = reinterpret_cast<const T*>(&ww);
#pragma unroll
  for (int j = 0; j < E; ++j) acc = fmaf(to_f(xe[j]), to_f(we[j]), acc);
  return acc;
}

template <typename T, int M, int R>
static __global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                const T* __restrict__ res, T* __restrict__ y, int64_t N, int64_t K) {
  constexpr int E = int(16 / sizeof(T));
  constexpr int U = 4 / R;  // words of each row in flight per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  if (n0 >= N) return;
  const int64_t KW = K / E;  // 16-byte words per row
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r)  // rows past N repeat row N - 1 (computed, never stored)
    wr[r] = reinterpret_cast<const uint4*>(w) + (n0 + r < N ? n0 + r : N - 1) * KW;
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

  for (int64_t c0 = lane; c0 < KW; c0 += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = c < KW ? __ldg(wr[r] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < KW) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xw = __ldg(xv + m * KW + c);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[m][r] = dot_word<T>(xw, wv[u][r], acc[m][r]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      const int64_t n = n0 + r;
      if (lane == (m * R + r) % 32 && n < N) {
        if (bias) v += to_f(bias[n]);
        if (res) v += to_f(res[m * N + n]);
        y[m * N + n] = from_f<T>(v);
      }
    }
}

template <typename T, int M>
void launch_rows(const T* x, const T* w, const T* b, const T* res, T* y, int64_t N, int64_t K,
                 cudaStream_t cs) {
  // R: the most rows per warp that still leave ~16 warps per SM of the H200's 132.
  const int R = N >= 4 * 2112 ? 4 : N >= 2 * 2112 ? 2 : 1;
  const int64_t warps = (N + R - 1) / R;
  const unsigned grid = unsigned((warps + kWarps - 1) / kWarps);
  if (R == 4)
    gemv_kernel<T, M, 4><<<grid, kWarps * 32, 0, cs>>>(x, w, b, res, y, N, K);
  else if (R == 2)
    gemv_kernel<T, M, 2><<<grid, kWarps * 32, 0, cs>>>(x, w, b, res, y, N, K);
  else
    gemv_kernel<T, M, 1><<<grid, kWarps * 32, 0, cs>>>(x, w, b, res, y, N, K);
}

template <typename T>
void launch(int64_t M, const T* x, const T* w, const T* b, const T* res, T* y, int64_t N,
            int64_t K, cudaStream_t cs) {
  switch (M) {
    case 1: return launch_rows<T, 1>(x, w, b, res, y, N, K, cs);
    case 2: return launch_rows<T, 2>(x, w, b, res, y, N, K, cs);
    case 3: return launch_rows<T, 3>(x, w, b, res, y, N, K, cs);
    case 4: return launch_rows<T, 4>(x, w, b, res, y, N, K, cs);
    case 5: return launch_rows<T, 5>(x, w, b, res, y, N, K, cs);
    case 6: return launch_rows<T, 6>(x, w, b, res, y, N, K, cs);
    case 7: return launch_rows<T, 7>(x, w, b, res, y, N, K, cs);
    default: return launch_rows<T, 8>(x, w, b, res, y, N, K, cs);
  }
}

// ---- tensor cores, 9..64 rows
constexpr int kTcWarps = 8;  // per block: the split of K
// Rows the folded RMSNorm runs at (rmsnorm_linear_decode): its prologue -- each row's sum of
// squares before the first product -- pays off at one row (the 1B model's greedy step 1,083
// -> 1,069 us on an H200, the mean of two runs each in one call) but not at 8 (1,139 ->
// 1,250 us: two
// passes of row sums and barriers in every block before its first product); the kernel
// takes up to kMaxRows rows.
constexpr int kFoldRows = 1;
constexpr int kTcStep = 64;  // k per warp step

// SWIGLU: w is [gate | up] (N = 2F rows) and y [M, F]: the block's rows g are gate rows
// n0 + g and its rows g + 8 the matching up rows F + n0 + g (n0 = 8 * block), so each lane
// ends with the gate and up sums of the same (token, output) and applies the SwiGLU there.
__device__ __forceinline__ float swiglu_of(float gate, float up) {
  return gate / (1.f + expf(-gate)) * up;
}

// The RMSNorm folded into the kernel (rmsnorm_linear_decode): x is the norm's input, nw its
// weight (x's dtype); each row's rstd is computed first as ops/cuda/norms.cu's register-row
// kernel computes it for a row of K (wpr warps a row, each lane the 16-byte vectors t, t +
// 32 wpr, ... of it, nv of them: norm_fwd_row_shape; squares summed in that order, the xor
// butterfly, then the warps' sums in order), and each x element is normalised as that kernel
// writes it, (x * rstd) * nw rounded to T, as it is loaded: the norm's output, bit for bit,
// without its kernel or its [M, K] round trip.
struct FoldedNorm {
  const void* nw = nullptr;  // null: no norm
  float eps = 0.f;
  int wpr = 1, nv = 1;
};

// x * rstd * nw of 8 elements as the norm kernel rounds them, repacked.
template <typename T>
__device__ __forceinline__ uint4 norm_word(uint4 xw, uint4 ww, float r) {
  T* xe = reinterpret_cast<T*>(&xw);
  const T* we = reinterpret_cast<const T*>(&ww);
#pragma unroll
  for (int j = 0; j < 8; ++j) xe[j] = from_f<T>(to_f(xe[j]) * r * to_f(we[j]));
  return xw;
}

// A block owns the weight-row tiles blockIdx.x, blockIdx.x + gridDim.x, ... < n_tiles (16
// rows each; 8 gate + 8 up rows for SwiGLU): one tile when the grid has a block per tile;
// several when launch_mma makes the grid persistent (as many
// blocks as the GPU holds at once), where each block computes the folded norm's rstd once
// and requests its next tile's first weights before the reduction and epilogue of the
// current one. Each tile's sums are formed in the same order either way: the same bits.
template <typename T, int TILES, bool SWIGLU, int DEPTH, bool NORM = false>
static __global__ void __launch_bounds__(kTcWarps * 32)
    skinny_mma_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                      const T* __restrict__ res, T* __restrict__ y, int64_t M, int64_t N, int64_t K,
                      int64_t n_tiles, FoldedNorm fn = {}) {
  __shared__ float red[kTcWarps][TILES * 4][32];
  __shared__ float rstd_s[NORM ? TILES * 8 : 1], part[kTcWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const T* __restrict__ nw = static_cast<const T*>(fn.nw);
  const int64_t F = N / 2;
  int64_t wt = blockIdx.x;  // the weight tile
  const T* wa = nullptr;
  const T* wb = nullptr;
  auto rows_of = [&](int64_t tl) {  // this lane's two weight rows of tile tl
    const int64_t n0 = tl * (SWIGLU ? 8 : 16);
    int64_t ra, rb;
    if constexpr (SWIGLU) {
      ra = n0 + g < F ? n0 + g : F - 1;
      rb = F + ra;
    } else {
      ra = n0 + g < N ? n0 + g : N - 1;
      rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
    }
    wa = w + ra * K + 16 * t;
    wb = w + rb * K + 16 * t;
  };
  rows_of(wt);
  float acc[TILES][4];
  const int64_t steps = K / kTcStep;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 A[DEPTH][4];  // per step in flight: row a k 0..7, 8..15; row b k 0..7, 8..15
  auto load_weights = [&](int64_t s0) {
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) {
      const int64_t s = s0 + j * kTcWarps, kb = s * kTcStep;
      const bool in = s < steps;
      A[j][0] = in ? __ldg(reinterpret_cast<const uint4*>(wa + kb)) : zero;
      A[j][1] = in ? __ldg(reinterpret_cast<const uint4*>(wa + kb + 8)) : zero;
      A[j][2] = in ? __ldg(reinterpret_cast<const uint4*>(wb + kb)) : zero;
      A[j][3] = in ? __ldg(reinterpret_cast<const uint4*>(wb + kb + 8)) : zero;
    }
  };
  // The first steps' weights are requested before anything waits on x -- the previous
  // kernel (launched with launch_dependent: common.cuh) and the folded norm's prologue -- so
  // that their DRAM latency overlaps both (the weights do not depend on x).
  load_weights(warp);
  pdl_wait();
  pdl_trigger();
  if constexpr (NORM) {
    // Rows m0 + grp, wpr warps each, 8 / wpr rows a pass (the loop is uniform: every
    // thread reaches the barriers).
    constexpr int E = 16 / int(sizeof(T));
    const int G = 32 * fn.wpr, grp = warp / fn.wpr, tg = int(threadIdx.x) % G;
    const int64_t nvec = K / E;
    for (int64_t m0 = 0; m0 < M; m0 += kTcWarps / fn.wpr) {
      const int64_t m = m0 + grp;
      float ss = 0.f;
      if (m < M)
        for (int j = 0; j < fn.nv; ++j) {
          const int64_t vi = tg + int64_t(j) * G;
          if (vi >= nvec) continue;
          uint4 u = __ldg(reinterpret_cast<const uint4*>(x + m * K) + vi);
          const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
          for (int k = 0; k < E; ++k) {
            const float d = to_f(e[k]);
            ss += d * d;
          }
        }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (fn.wpr > 1) {
        if (lane == 0) part[warp] = ss;
        __syncthreads();
        ss = 0.f;
        for (int i = 0; i < fn.wpr; ++i) ss += part[grp * fn.wpr + i];
        __syncthreads();
      }
      if (m < M && tg == 0) rstd_s[m] = rsqrtf(ss / float(K) + fn.eps);
    }
    __syncthreads();
  }
  for (; wt < n_tiles; wt += gridDim.x) {
    const int64_t n0 = wt * (SWIGLU ? 8 : 16);
#pragma unroll
    for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int64_t s0 = warp; s0 < steps; s0 += DEPTH * kTcWarps) {
      if (s0 != warp) load_weights(s0);
#pragma unroll
      for (int j = 0; j < DEPTH; ++j) {
        const int64_t s = s0 + j * kTcWarps, kb = s * kTcStep;
        if (s >= steps) break;
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
          const int64_t tok = int64_t(tile) * 8 + g;
          const T* xr = x + tok * K + kb + 16 * t;
          uint4 X0 = tok < M ? __ldg(reinterpret_cast<const uint4*>(xr)) : zero;
          uint4 X1 = tok < M ? __ldg(reinterpret_cast<const uint4*>(xr + 8)) : zero;
          if constexpr (NORM) {
            if (tok < M) {
              const float r = rstd_s[tok];
              X0 = norm_word<T>(X0, __ldg(reinterpret_cast<const uint4*>(nw + kb + 16 * t)), r);
              X1 = norm_word<T>(X1, __ldg(reinterpret_cast<const uint4*>(nw + kb + 16 * t + 8)), r);
            }
          }
          mma_step_words<T>(acc[tile], A[j], X0, X1);
        }
      }
    }
    // The next tile's first weights, in flight while this one is reduced and written.
    const bool more = wt + gridDim.x < n_tiles;
    if (more) {
      rows_of(wt + gridDim.x);
      load_weights(warp);
    }
#pragma unroll
    for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][tile * 4 + i][lane] = acc[tile][i];
    __syncthreads();
    // Warp w finishes tiles w, w + kTcWarps, ...: the warps' sums in warp order, then the
    // epilogue. Fragment element i: weight row g (+8 for i >= 2), token 2t + (i & 1).
    for (int tile = warp; tile < TILES; tile += kTcWarps) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = 0.f;
#pragma unroll
        for (int ww = 0; ww < kTcWarps; ++ww) v[i] += red[ww][tile * 4 + i][lane];
      }
      if constexpr (SWIGLU) {
        const int64_t j = n0 + g;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t tok = int64_t(tile) * 8 + 2 * t + e;
          if (j < F && tok < M) {
            float gate = v[e], up = v[e + 2];
            if (bias) gate += to_f(bias[j]), up += to_f(bias[F + j]);
            y[tok * F + j] = from_f<T>(swiglu_of(gate, up));
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t n = n0 + g + (i >= 2 ? 8 : 0), tok = int64_t(tile) * 8 + 2 * t + (i & 1);
          if (n < N && tok < M) {
            float o = v[i];
            if (bias) o += to_f(bias[n]);
            if (res) o += to_f(res[tok * N + n]);
            y[tok * N + n] = from_f<T>(o);
          }
        }
      }
    }
    if (more) __syncthreads();  // red is written again for the next tile
  }
}

// Steps of weights in flight per warp: DEPTH 4 where the layer has few blocks (its rows / 16
// -- 8 for SwiGLU -- under two per SM of an H200: the attention's QKV and projection and
// fc2 of the 1B model, whose warps each walk many steps of K, so with two in flight a warp
// waits on ~8 DRAM round trips at fc2's K = 8192), 2 where the grid alone keeps the memory
// system busy (fc1, the output layer: four in flight cost them occupancy, measured
// 2026-12-02). MCPP_DECODE_GEMM_DEPTH=2 or 4 forces one (bench/gpu comparisons).
int decode_gemm_depth(int64_t blocks) {
  static const int forced = [] {
    const char* e = std::getenv("MCPP_DECODE_GEMM_DEPTH");
    if (!e || !*e) return 0;
    const std::string v(e);
    MCPP_CHECK(v == "2" || v == "4", "MCPP_DECODE_GEMM_DEPTH={} is not 2 or 4", v);
    return std::stoi(v);
  }();
  if (forced) return forced;
  return blocks < 2 * sm_count() ? 4 : 2;
}

// The grid of a tensor-core decode GEMM of `tiles` weight-row tiles: a block per tile, or,
// where that is more blocks than the GPU holds at once, the blocks it holds (the kernel's
// occupancy x SMs), each looping over tiles: the 1B model's fc1 (1,024 tiles, 3 blocks of 76
// registers an SM) and output layer. MCPP_DECODE_PERSISTENT=0 keeps a block per tile (read at
// each launch; docs/environment.md).
template <typename K>
unsigned decode_gemm_grid(K kernel, int64_t tiles) {
  if (const char* e = std::getenv("MCPP_DECODE_PERSISTENT"); e && e[0] == '0')
    return unsigned(tiles);
  static std::mutex mu;
  static std::vector<std::pair<const void*, int64_t>> resident;  // kernel -> blocks at once
  const void* key = reinterpret_cast<const void*>(kernel);
  int64_t held = 0;
  {
    std::lock_guard lk(mu);
    for (const auto& [k, n] : resident)
      if (k == key) held = n;
    if (held == 0) {
      held = occupancy_blocks(kernel, kTcWarps * 32);
      resident.emplace_back(key, held);
    }
  }
  return unsigned(std::min(tiles, held));
}

template <typename T, bool SWIGLU = false>
void launch_mma(int64_t M, const T* x, const T* w, const T* b, const T* res, T* y, int64_t N,
                int64_t K, cudaStream_t cs, const FoldedNorm& fn = {}) {
  if constexpr (std::is_same_v<T, float>) {
    MCPP_FAIL("linear_decode: the tensor-core path takes bf16/f16, not f32");
  } else {
    const int64_t tiles = SWIGLU ? (N / 2 + 7) / 8 : (N + 15) / 16;
    const dim3 blk(kTcWarps * 32);
    const int depth = decode_gemm_depth(tiles);
    auto go = [&](auto kernel, const FoldedNorm& f) {
      launch_dependent(kernel, decode_gemm_grid(kernel, tiles), blk, 0, cs, x, w, b, res, y, M,
                       N, K, tiles, f);
    };
    if (fn.nw) {  // the folded norm: up to kMaxRows rows (one tile)
      MCPP_CHECK(M <= kMaxRows, "rmsnorm_linear_decode: {} rows, the folded norm takes {}", M,
                 kMaxRows);
      if (depth == 4)
        go(skinny_mma_kernel<T, 1, SWIGLU, 4, true>, fn);
      else
        go(skinny_mma_kernel<T, 1, SWIGLU, 2, true>, fn);
      return;
    }
#define MCPP_MMA_CASE(TL)                                                                    \
  case TL:                                                                                   \
    if (depth == 4)                                                                          \
      go(skinny_mma_kernel<T, TL, SWIGLU, 4>, FoldedNorm{});                                 \
    else                                                                                     \
      go(skinny_mma_kernel<T, TL, SWIGLU, 2>, FoldedNorm{});                                 \
    break;
    switch ((M + 7) / 8) {
      MCPP_MMA_CASE(1) MCPP_MMA_CASE(2) MCPP_MMA_CASE(3) MCPP_MMA_CASE(4)
      MCPP_MMA_CASE(5) MCPP_MMA_CASE(6) MCPP_MMA_CASE(7) MCPP_MMA_CASE(8)
      default: MCPP_FAIL("linear_decode: {} rows exceed the tensor-core kernel's 64", M);
    }
#undef MCPP_MMA_CASE
  }
}

bool aligned16(const Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
}

}  // namespace

// ops/cuda/gemv_splitk.cu (DecodeGemm::SplitK): whether its kernel takes the dtype, rows and
// K (the rest as mma_ok); MCPP_DECODE_SPLITK=1; the launch.
bool splitk_takes(DType dt, int64_t rows, int64_t K);
bool splitk_for_auto();
void launch_splitk(DType dt, int64_t M, const void* x, const void* w, const void* b,
                   const void* res, void* y, int64_t N, int64_t K, cudaStream_t cs);

void linear_decode_with(DecodeGemm path, const Tensor& x, const Tensor& w, const Tensor& b,
                        const Tensor& residual, Tensor& y, Stream& s) {
  const char* op = "linear_decode";
  check_cuda(x, op, "x");
  check_cuda(w, op, "w");
  check_cuda(y, op, "y");
  MCPP_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
             "{}: w {} does not take x {} (w is [out, in])", op, w.str(), x.str());
  const int64_t N = w.size(0), K = w.size(1), rows = x.numel() / std::max<int64_t>(K, 1);
  check_numel(y, rows * N, op, "y");
  if (b.defined()) {
    check_cuda(b, op, "b");
    check_numel(b, N, op, "b");
  }
  if (residual.defined()) {
    check_cuda(residual, op, "residual");
    check_numel(residual, rows * N, op, "residual");
    MCPP_CHECK(residual.raw() != y.raw() || rows == 0, "{}: residual must not alias y", op);
  }
  const DType dt = x.dtype();
  const int64_t E = 16 / int64_t(dtype_size(dt));
  const bool same = w.dtype() == dt && y.dtype() == dt && (!b.defined() || b.dtype() == dt) &&
                    (!residual.defined() || residual.dtype() == dt);
  const bool base = rows >= 1 && N >= 1 && same && aligned16(x) && aligned16(w) &&
                    x.raw() != y.raw();
  const bool gemv_ok = base && rows <= kMaxRows && K >= E && K % E == 0 &&
                       (dt == DType::BF16 || dt == DType::F16 || dt == DType::F32);
  const bool mma_ok = base && rows <= kMaxMmaRows && K % kTcStep == 0 &&
                      (dt == DType::BF16 || dt == DType::F16);
  const bool splitk_ok = base && splitk_takes(dt, rows, K);
  // MCPP_DECODE_SPLITK=1: the split-K kernel for 9..64 rows (opt-in until measured).
  if (path == DecodeGemm::Auto && rows > kMaxRows && splitk_ok && splitk_for_auto())
    path = DecodeGemm::SplitK;
  // Measured on the H200 (bench/gpu/bench_decode.cpp, the 1B model's weights): the
  // tensor-core kernel streams at least as fast as the GEMV up to 8 rows and as cuBLASLt at
  // 16 rows for the attention's small weights (<= 8M elements), cuBLASLt wins beyond.
  if (path == DecodeGemm::Auto) {
    if (mma_ok && (rows <= kMaxRows || (rows <= 16 && N * K <= (int64_t(8) << 20))))
      path = DecodeGemm::TensorCore;
    else
      path = gemv_ok ? DecodeGemm::Gemv : DecodeGemm::Library;
  }
  if (path == DecodeGemm::Gemv && !gemv_ok) path = DecodeGemm::Library;
  if (path == DecodeGemm::TensorCore && !mma_ok) path = DecodeGemm::Library;
  if (path == DecodeGemm::SplitK && !splitk_ok) path = DecodeGemm::Library;
  if (path == DecodeGemm::Library) {  // cuBLASLt, the residual as its C input (one rounding)
    if (residual.defined())
      linear_residual_forward(x, w, b, residual.view(y.shape()), y, s);
    else
      linear_forward(x, w, b, y, s);
    return;
  }
  cudaStream_t cs = stream_of(s);
  if (path == DecodeGemm::SplitK) {
    launch_splitk(dt, rows, x.raw(), w.raw(), b.defined() ? b.raw() : nullptr,
                  residual.defined() ? residual.raw() : nullptr, y.raw(), N, K, cs);
    MCPP_LAUNCH_CHECK();
    return;
  }
  MCPP_DISPATCH_ACT(dt, op, {
    const T* xp = static_cast<const T*>(x.raw());
    const T* wp = static_cast<const T*>(w.raw());
    const T* bp = b.defined() ? static_cast<const T*>(b.raw()) : nullptr;
    const T* rp = residual.defined() ? static_cast<const T*>(residual.raw()) : nullptr;
    T* yp = static_cast<T*>(y.raw());
    if (path == DecodeGemm::Gemv)
      launch<T>(rows, xp, wp, bp, rp, yp, N, K, cs);
    else
      launch_mma<T>(rows, xp, wp, bp, rp, yp, N, K, cs);
    MCPP_LAUNCH_CHECK();
  });
}

void linear_decode(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual,
                   Tensor& y, Stream& s) {
  linear_decode_with(DecodeGemm::Auto, x, w, b, residual, y, s);
}

void linear_swiglu_decode(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& fc1,
                          Tensor& y, Stream& s) {
  const char* op = "linear_swiglu_decode";
  check_cuda(x, op, "x");
  check_cuda(w, op, "w");
  check_cuda(y, op, "y");
  MCPP_CHECK(w.dim() == 2 && w.size(0) % 2 == 0 && x.dim() >= 1 && x.size(-1) == w.size(1),
             "{}: w {} does not take x {} (w is [2F, in] = [gate | up])", op, w.str(), x.str());
  const int64_t N = w.size(0), F = N / 2, K = w.size(1), rows = x.numel() / std::max<int64_t>(K, 1);
  check_numel(y, rows * F, op, "y");
  if (b.defined()) {
    check_cuda(b, op, "b");
    check_numel(b, N, op, "b");
  }
  const DType dt = x.dtype();
  const bool fused = rows >= 1 && rows <= kMaxRows && F >= 1 && K % kTcStep == 0 &&
                     (dt == DType::BF16 || dt == DType::F16) && w.dtype() == dt &&
                     y.dtype() == dt && (!b.defined() || b.dtype() == dt) && aligned16(x) &&
                     aligned16(w) && x.raw() != y.raw();
  if (!fused) {  // the composition, through fc1 [rows, 2F]
    check_cuda(fc1, op, "fc1");
    check_numel(fc1, rows * N, op, "fc1");
    linear_forward(x, w, b, fc1, s);
    swiglu_forward(fc1, y, s);
    return;
  }
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(dt, op, {
    launch_mma<T, true>(rows, static_cast<const T*>(x.raw()), static_cast<const T*>(w.raw()),
                        b.defined() ? static_cast<const T*>(b.raw()) : nullptr, nullptr,
                        static_cast<T*>(y.raw()), N, K, cs);
    MCPP_LAUNCH_CHECK();
  });
}

void rmsnorm_linear_decode(const Tensor& x, const Tensor& nw, double eps, Tensor& xn,
                           Tensor& rstd, const Tensor& w, const Tensor& b, bool swiglu,
                           Tensor& fc1, Tensor& y, Stream& s) {
  const char* op = "rmsnorm_linear_decode";
  check_cuda(x, op, "x");
  check_cuda(nw, op, "nw");
  check_cuda(w, op, "w");
  check_cuda(y, op, "y");
  MCPP_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1) && nw.numel() == w.size(1),
             "{}: w {} (as [out, in]) and the norm weight {} do not take x {}", op, w.str(),
             nw.str(), x.str());
  const int64_t N = w.size(0), K = w.size(1), rows = x.numel() / std::max<int64_t>(K, 1);
  const DType dt = x.dtype();
  const int64_t E = 16 / int64_t(dtype_size(dt));
  const NormRowShape sh = norm_fwd_row_shape(K / E);
  // The folded kernel where the unfolded composition would take the tensor-core kernel with
  // the norm's register rows (so both sum and round alike); the composition otherwise.
  const bool fold = rows >= 1 && rows <= kFoldRows && (dt == DType::BF16 || dt == DType::F16) &&
                    nw.dtype() == dt && w.dtype() == dt && y.dtype() == dt &&
                    (!b.defined() || (b.dtype() == dt && b.numel() == N)) && K % kTcStep == 0 &&
                    sh.wpr >= 1 && sh.wpr <= kTcWarps && (!swiglu || N % 2 == 0) &&
                    aligned16(x) && aligned16(w) && aligned16(nw) && x.raw() != y.raw();
  if (!fold) {
    rmsnorm_forward(x, nw, eps, xn, rstd, s);
    if (swiglu)
      linear_swiglu_decode(xn, w, b, fc1, y, s);
    else
      linear_decode(xn, w, b, Tensor(), y, s);
    return;
  }
  check_numel(y, rows * (swiglu ? N / 2 : N), op, "y");
  const FoldedNorm fn{nw.raw(), float(eps), sh.wpr, sh.nv};
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(dt, op, {
    const T* xp = static_cast<const T*>(x.raw());
    const T* wp = static_cast<const T*>(w.raw());
    const T* bp = b.defined() ? static_cast<const T*>(b.raw()) : nullptr;
    T* yp = static_cast<T*>(y.raw());
    if (swiglu)
      launch_mma<T, true>(rows, xp, wp, bp, nullptr, yp, N, K, cs, fn);
    else
      launch_mma<T>(rows, xp, wp, bp, nullptr, yp, N, K, cs, fn);
    MCPP_LAUNCH_CHECK();
  });
}

}  // namespace mcpp::ops::cuda
