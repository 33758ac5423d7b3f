// LayerNorm and RMSNorm over the last dim of x[T, H], forward above backward.
// x, y, dy, dx: one activation dtype; w, b: f32, bf16 or f16; mean, rstd: f32 [T];
// dw, db: f32 [H], accumulated (+=); dx: `=`, or `+=` with accumulate_dx (the residual
// stream's gradient).
//   LayerNorm: xhat = (x - mean) rstd, y = xhat w + b,
//              dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w
//   RMSNorm:   xhat = x rstd, y = xhat w, dx = rstd (g - xhat mean(g xhat))
//
// Blocks walk the rows with a stride of the grid. Two kernel families:
// - Register rows (the common case: H * sizeof(T) a multiple of 16 bytes, 16-byte aligned
//   tensors, and H up to 16384 (forward) or 12288 (backward) for 16-bit dtypes, half that for
//   f32): WPR warps hold a row, each lane V 16-byte vectors of it, read once with 16-byte
//   loads; a block of 8 warps takes 8 / WPR rows at a time (16 warps and one row for the
//   longest rows). The weights are converted to f32 once per block into shared memory.
// - Streaming rows (any other H or alignment): a block of 8 warps on one row, scalar accesses,
//   the row read again from L1/L2 for each pass.
// The statistics in two passes over the row (mean, then squared deviations) for accuracy.
// Backward is one kernel for dx and the parameter gradients: each block accumulates dw (db)
// over its rows per column (in registers for register rows) and writes the sums to an f32
// workspace [blocks, H]; a second kernel adds the blocks' sums into dw (db) in a fixed order.
// The grid depends only on (T, H), so dw and db are bitwise reproducible.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/norm_shape.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// Warps of a register-row block: 8, or one row's WPR warps when a row needs more.
constexpr int block_warps(int WPR) { return WPR > kWarps ? WPR : kWarps; }
// Blocks of a launch at most (each then walks several row groups).
constexpr int64_t kMaxBlocks = 1024;
// The backward's blocks at most. It fixes the partial sums of dw/db (each block writes one
// [NP, H] row of them), so it is a constant, not the device's multiprocessor count: 264 is
// one wave of two 8-warp blocks on an H100/H200's 132 SMs. Each block pays a fixed cost
// (the weight staged, its sums written, later read back by partial_sum_kernel), which at
// 1024 blocks was ~20 us a call whatever the rows: four times as many calls with 4-way
// gradient accumulation (bench/RESULTS.md). MCPP_NORM_BWD_BLOCKS overrides it
// (read once; docs/environment.md): another value gives other dw/db bits.
int64_t max_bwd_blocks() {
  static const int64_t n = [] {
    const char* e = std::getenv("MCPP_NORM_BWD_BLOCKS");
    const long v = e ? std::strtol(e, nullptr, 10) : 0;
    return v > 0 ? int64_t(v) : int64_t(264);
  }();
  return n;
}

// A parameter vector of run-time dtype.
struct Param {
  const void* p = nullptr;
  DType t = DType::F32;
  __device__ __forceinline__ float operator[](int64_t i) const {
    switch (t) {
      case DType::BF16:
        return __bfloat162float(static_cast<const bf16*>(p)[i]);
      case DType::F16:
        return __half2float(static_cast<const f16*>(p)[i]);
      default:
        return static_cast<const float*>(p)[i];
    }
  }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the WPR warps that hold one row (the xor butterfly leaves the same bits in every
// lane). With WPR > 1 this is a barrier of the whole block: every thread of the block must
// call it, the same number of times. Consecutive calls alternate between the two slots of
// `red`, so one barrier per call suffices: a slot is written again only after the barrier of
// the call in between, which every thread reaches after reading it.
template <int WPR, int BW, int K>
__device__ __forceinline__ void group_sum(float (&v)[K], float (*red)[BW][K], int& slot) {
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(v[k]);
  if constexpr (WPR > 1) {
    const int warp = threadIdx.x / 32, first = warp / WPR * WPR;
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int k = 0; k < K; ++k) red[slot][warp][k] = v[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) {
      v[k] = 0.f;
#pragma unroll
      for (int i = 0; i < WPR; ++i) v[k] += red[slot][first + i][k];
    }
    slot ^= 1;
  }
}

// ---- 16-byte vectors ----------------------------------------------------------------------

template <typename T>
constexpr int kVec = 16 / int(sizeof(T));  // elements of T in 16 bytes

__device__ __forceinline__ void unpack(const uint4& u, float (&f)[4]) {
  f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y);
  f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack2(unsigned v, bf16*, float& a, float& b) {
  a = __uint_as_float(v << 16), b = __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ void unpack2(unsigned v, f16*, float& a, float& b) {
  a = __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu)));
  b = __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16)));
}
template <typename T>
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[8]) {
  unpack2(u.x, static_cast<T*>(nullptr), f[0], f[1]);
  unpack2(u.y, static_cast<T*>(nullptr), f[2], f[3]);
  unpack2(u.z, static_cast<T*>(nullptr), f[4], f[5]);
  unpack2(u.w, static_cast<T*>(nullptr), f[6], f[7]);
}
template <typename T>
__device__ __forceinline__ void to_floats(const uint4& u, float (&f)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>)
    unpack(u, f);
  else
    unpack<T>(u, f);
}

// Round to nearest even, as from_f.
__device__ __forceinline__ unsigned pack2(float a, float b, bf16*) {
  return unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         unsigned(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}
__device__ __forceinline__ unsigned pack2(float a, float b, f16*) {
  return unsigned(__half_as_ushort(__float2half_rn(a))) |
         unsigned(__half_as_ushort(__float2half_rn(b))) << 16;
}
template <typename T>
__device__ __forceinline__ uint4 from_floats(const float (&f)[kVec<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
  } else {
    T* tag = nullptr;
    return make_uint4(pack2(f[0], f[1], tag), pack2(f[2], f[3], tag), pack2(f[4], f[5], tag),
                      pack2(f[6], f[7], tag));
  }
}

// A parameter as f32 in shared memory, laid out so that each lane's float4 reads of its
// vectors are consecutive across the warp (no bank conflicts): float4 number q * nvec + v
// holds elements v N + 4q .. v N + 4q + 3 (N elements a vector, q < N / 4).
template <int N>
__device__ void stage_param(Param p, float* dst, int H) {
  const int nvec = H / N;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    const int v = c / N, r = c % N;
    dst[((r / 4) * nvec + v) * 4 + r % 4] = p[c];
  }
}
template <int N>
__device__ __forceinline__ void staged(const float* src, int nvec, int v, float (&f)[N]) {
  const float4* s4 = reinterpret_cast<const float4*>(src);
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 a = s4[q * nvec + v];
    f[4 * q] = a.x, f[4 * q + 1] = a.y, f[4 * q + 2] = a.z, f[4 * q + 3] = a.w;
  }
}

// ---- forward --------------------------------------------------------------------------

// Register rows: rows [base, base + R) at a time, row base + (warp / WPR) on WPR warps, lane
// t of the row holding vectors t, t + 32 WPR, ... (V of them; those past H / N are empty).
// Dynamic shared memory: w, then b, staged as f32 (2 H floats).
// Vector vi of a parameter as f32, straight from global memory: one 16-byte load where the
// parameter has x's dtype and is aligned, else element by element. The values are those
// stage_param writes: the same bits either way.
template <typename T>
__device__ __forceinline__ void param_vec(Param p, int vi, float (&f)[kVec<T>]) {
  constexpr int N = kVec<T>;
  constexpr DType kT = std::is_same_v<T, bf16>  ? DType::BF16
                       : std::is_same_v<T, f16> ? DType::F16
                                                : DType::F32;
  if (p.t == kT && (reinterpret_cast<uintptr_t>(p.p) & 15) == 0) {
    to_floats<T>(__ldg(static_cast<const uint4*>(p.p) + vi), f);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) f[k] = p[int64_t(vi) * N + k];
  }
}

// BW: the block's warps -- block_warps(WPR), or WPR (a row a block) where a launch has few
// rows (launch_forward). Which block holds a row changes nothing in its sums. DIRECT: each
// lane loads its vectors of w (and b) into registers once, with x's first row, instead of
// the block staging them in shared memory first -- for few-row launches, where staging
// (each thread's elements one dependent load after another: 32 of them for a 64-thread
// block at H = 2048) is most of the kernel's time.
template <typename T, bool RMS, int WPR, int V, int BW = block_warps(WPR), bool DIRECT = false>
static __global__ void __launch_bounds__(32 * BW)
    norm_fwd_reg_kernel(const T* __restrict__ x, Param w, Param b, float eps, T* __restrict__ y,
                        float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                        int H) {
  constexpr int N = kVec<T>, R = BW / WPR, G = 32 * WPR;
  extern __shared__ float4 smem4[];
  __shared__ float red[2][BW][1];
  float* sw = reinterpret_cast<float*>(smem4);
  float* sb = sw + H;
  const bool has_b = !RMS && b.p;
  const int nvec = H / N, grp = threadIdx.x / 32 / WPR, t = threadIdx.x % G;
  float v[V][N];
  auto load_row = [&](int64_t row) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int vi = t + j * G;
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (row < rows && vi < nvec) u = reinterpret_cast<const uint4*>(x + row * H)[vi];
      to_floats<T>(u, v[j]);
    }
  };
  float wr[DIRECT ? V : 1][N], br[DIRECT && !RMS ? V : 1][N];
  if constexpr (DIRECT) {
    // The first row's x and the lane's parameter vectors requested together: one round trip
    // (a few-row launch is little more than that).
    load_row(blockIdx.x * int64_t(R) + grp);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int vi = t + j * G;
      if (vi >= nvec) continue;
      param_vec<T>(w, vi, wr[j]);
      if constexpr (!RMS)
        if (has_b) param_vec<T>(b, vi, br[j]);
    }
  } else {
    stage_param<N>(w, sw, H);
    if (has_b) stage_param<N>(b, sb, H);
    __syncthreads();
  }
  int slot = 0;
  for (int64_t base = blockIdx.x * int64_t(R); base < rows; base += int64_t(gridDim.x) * R) {
    const int64_t row = base + grp;
    const bool active = row < rows;
    if (!DIRECT || base != blockIdx.x * int64_t(R)) load_row(row);
    float mean = 0.f;
    if constexpr (!RMS) {
      float s[1] = {0.f};
#pragma unroll
      for (int j = 0; j < V; ++j)
#pragma unroll
        for (int k = 0; k < N; ++k) s[0] += v[j][k];  // empty vectors hold zeros
      group_sum<WPR>(s, red, slot);
      mean = s[0] / float(H);
    }
    float ss[1] = {0.f};
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (t + j * G < nvec)
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float d = v[j][k] - mean;
          ss[0] += d * d;
        }
    group_sum<WPR>(ss, red, slot);
    const float rstd = rsqrtf(ss[0] / float(H) + eps);
    if (!active) continue;  // after the last barrier of the row
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int vi = t + j * G;
      if (vi >= nvec) continue;
      float wv[N], o[N];
      if constexpr (DIRECT) {
#pragma unroll
        for (int k = 0; k < N; ++k) wv[k] = wr[j][k];
      } else {
        staged<N>(sw, nvec, vi, wv);
      }
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] = (v[j][k] - mean) * rstd * wv[k];
      if (has_b) {
        if constexpr (DIRECT) {
          if constexpr (!RMS)
#pragma unroll
            for (int k = 0; k < N; ++k) wv[k] = br[j][k];
        } else {
          staged<N>(sb, nvec, vi, wv);
        }
#pragma unroll
        for (int k = 0; k < N; ++k) o[k] += wv[k];
      }
      reinterpret_cast<uint4*>(y + row * H)[vi] = from_floats<T>(o);
    }
    if (t == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// Streaming rows: one row per block at a time, the row read from L1/L2 for each pass.
template <typename T, bool RMS>
static __global__ void __launch_bounds__(kThreads)
    norm_fwd_stream_kernel(const T* __restrict__ x, Param w, Param b, float eps, T* __restrict__ y,
                           float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                           int64_t H) {
  __shared__ float red[2][kWarps][1];
  int slot = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * H;
    float mean = 0.f;
    if constexpr (!RMS) {
      float s[1] = {0.f};
      for (int64_t i = threadIdx.x; i < H; i += kThreads) s[0] += to_f(xr[i]);
      group_sum<kWarps, kWarps>(s, red, slot);
      mean = s[0] / float(H);
    }
    float ss[1] = {0.f};
    for (int64_t i = threadIdx.x; i < H; i += kThreads) {
      const float d = to_f(xr[i]) - mean;
      ss[0] += d * d;
    }
    group_sum<kWarps, kWarps>(ss, red, slot);
    const float rstd = rsqrtf(ss[0] / float(H) + eps);
    T* yr = y + row * H;
    for (int64_t i = threadIdx.x; i < H; i += kThreads) {
      float o = (to_f(xr[i]) - mean) * rstd * w[i];
      if (!RMS && b.p) o += b[i];
      yr[i] = from_f<T>(o);
    }
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

#include "ops/cuda/norms_backward.cuh"

// ---- launch configuration -------------------------------------------------------------------

template <int I>
using Int = std::integral_constant<int, I>;

// Call f(Int<WPR>, Int<V>) with the register-row shape for a row of nvec 16-byte vectors
// (norm_fwd_row_shape, ops/cuda/norm_shape.h: the decode GEMM's folded RMSNorm reads the same
// table), and return false when the row is too long to hold in registers.
template <typename F>
bool with_fwd_shape(int64_t nvec, F&& f) {
  const NormRowShape sh = norm_fwd_row_shape(nvec);
#define MCPP_FWD_SHAPE(W, V) \
  if (sh.wpr == W && sh.nv == V) return f(Int<W>{}, Int<V>{}), true;
  MCPP_FWD_SHAPE(1, 1) MCPP_FWD_SHAPE(1, 2) MCPP_FWD_SHAPE(1, 3) MCPP_FWD_SHAPE(1, 4)
  MCPP_FWD_SHAPE(2, 3) MCPP_FWD_SHAPE(2, 4) MCPP_FWD_SHAPE(4, 3) MCPP_FWD_SHAPE(4, 4)
  MCPP_FWD_SHAPE(8, 3) MCPP_FWD_SHAPE(8, 4) MCPP_FWD_SHAPE(16, 3) MCPP_FWD_SHAPE(16, 4)
#undef MCPP_FWD_SHAPE
  return false;
}
// Backward holds x, dy, the old dx and two column sums a vector: at most 3 vectors a lane,
// which keeps it within 128 registers (two blocks of 8 warps a multiprocessor).
template <typename F>
bool with_bwd_shape(int64_t nvec, F&& f) {
  if (nvec <= 32) return f(Int<1>{}, Int<1>{}), true;
  if (nvec <= 64) return f(Int<1>{}, Int<2>{}), true;
  if (nvec <= 96) return f(Int<1>{}, Int<3>{}), true;
  if (nvec <= 128) return f(Int<2>{}, Int<2>{}), true;
  if (nvec <= 192) return f(Int<2>{}, Int<3>{}), true;
  if (nvec <= 256) return f(Int<4>{}, Int<2>{}), true;
  if (nvec <= 384) return f(Int<4>{}, Int<3>{}), true;
  if (nvec <= 512) return f(Int<8>{}, Int<2>{}), true;
  if (nvec <= 768) return f(Int<8>{}, Int<3>{}), true;
  if (nvec <= 1024) return f(Int<16>{}, Int<2>{}), true;
  if (nvec <= 1536) return f(Int<16>{}, Int<3>{}), true;
  return false;
}

// Register rows need whole 16-byte vectors: H * sizeof(T) a multiple of 16, aligned rows.
template <typename T>
bool vector_rows(int64_t H, std::initializer_list<const void*> ptrs) {
  if (H * int64_t(sizeof(T)) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Blocks for `rows` rows taken R at a time: a function of (T, H) only.
unsigned blocks_for(int64_t rows, int R, int64_t cap = kMaxBlocks) {
  return unsigned(std::min<int64_t>((rows + R - 1) / R, cap));
}

// Whether rows taken R at a time would leave SMs without a block (and a row a block would
// not): the forward then runs a row a block. MCPP_NORM_ROW_BLOCKS=0 turns it off (read at
// each launch; docs/environment.md).
bool few_row_blocks(int64_t rows, int R) {
  if ((rows + R - 1) / R >= sm_count() || rows > kMaxBlocks) return false;  // (training)
  const char* e = std::getenv("MCPP_NORM_ROW_BLOCKS");
  return !(e && e[0] == '0');
}

// Dynamic shared memory past 48 KB (less the static part) needs the kernel's consent.
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 40 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <typename T, bool RMS>
void launch_forward(const T* x, Param w, Param b, float eps, T* y, float* mean, float* rstd,
                    int64_t rows, int64_t H, cudaStream_t cs) {
  const bool reg = vector_rows<T>(H, {x, y}) &&
                   with_fwd_shape(H * int64_t(sizeof(T)) / 16, [&](auto wpr, auto v) {
                     constexpr int WPR = decltype(wpr)::value, V = decltype(v)::value;
                     const size_t smem = size_t(!RMS && b.p ? 2 : 1) * H * sizeof(float);
                     constexpr int BW = block_warps(WPR);
                     if (BW > WPR && few_row_blocks(rows, BW / WPR)) {
                       // Fewer blocks than SMs at BW / WPR rows a block (a decode step's
                       // 64 rows of H = 2048 would be 16 blocks): a row a block, the
                       // parameters loaded directly (DIRECT), no shared memory.
                       auto kernel = norm_fwd_reg_kernel<T, RMS, WPR, V, WPR, true>;
                       kernel<<<blocks_for(rows, 1), 32 * WPR, 0, cs>>>(x, w, b, eps, y, mean,
                                                                      rstd, rows, int(H));
                       return;
                     }
                     auto kernel = norm_fwd_reg_kernel<T, RMS, WPR, V>;
                     allow_smem(kernel, smem);
                     kernel<<<blocks_for(rows, BW / WPR), 32 * BW, smem, cs>>>(
                         x, w, b, eps, y, mean, rstd, rows, int(H));
                   });
  if (!reg)
    norm_fwd_stream_kernel<T, RMS>
        <<<blocks_for(rows, 1), kThreads, 0, cs>>>(x, w, b, eps, y, mean, rstd, rows, H);
  MCPP_LAUNCH_CHECK();
}

template <typename T, bool RMS>
void launch_backward(const T* dy, const T* x, Param w, const float* mean, const float* rstd, T* dx,
                     bool acc, float* dw, float* db, int64_t rows, int64_t H, cudaStream_t cs) {
  constexpr int NP = RMS ? 1 : 2;
  const bool grads = dw || db;
  Tensor partial;
  int64_t blocks = 0;
  auto workspace = [&](int64_t nb) -> float* {
    blocks = nb;
    if (!grads) return nullptr;
    partial = Tensor::empty({nb, NP, H}, DType::F32, Device::CUDA);
    return static_cast<float*>(partial.raw());
  };
  const bool reg =
      vector_rows<T>(H, {dy, x, dx}) &&
      with_bwd_shape(H * int64_t(sizeof(T)) / 16, [&](auto wpr, auto v) {
        constexpr int WPR = decltype(wpr)::value, V = decltype(v)::value;
        constexpr int BW = block_warps(WPR), R = BW / WPR;
        auto kernel = norm_bwd_reg_kernel<T, RMS, WPR, V>;
        const unsigned nb = blocks_for(rows, R, max_bwd_blocks());
        float* pp = workspace(nb);
        const size_t smem =
            size_t(std::max<int64_t>(H, R > 1 && grads ? NP * H : 0)) * sizeof(float);
        allow_smem(kernel, smem);
        kernel<<<nb, 32 * BW, smem, cs>>>(dy, x, w, mean, rstd, dx, acc, pp, rows, int(H));
      });
  if (!reg) {
    const unsigned nb = blocks_for(rows, 1, max_bwd_blocks());
    float* pp = workspace(nb);
    norm_bwd_stream_kernel<T, RMS>
        <<<nb, kThreads, 0, cs>>>(dy, x, w, mean, rstd, dx, acc, pp, rows, H);
  }
  MCPP_LAUNCH_CHECK();
  if (!grads) return;
  dim3 grid{unsigned((H + kSumCols - 1) / kSumCols), unsigned(NP)}, block{kSumCols, kSumSlices};
  partial_sum_kernel<<<grid, block, 0, cs>>>(static_cast<const float*>(partial.raw()), blocks, NP,
                                             H, dw, db);
  MCPP_LAUNCH_CHECK();
}

// ---- argument checks ------------------------------------------------------------------------

Param param(const Tensor& t, int64_t H, const char* op, const char* name) {
  if (!t.defined()) return {};
  check_cuda(t, op, name);
  check_numel(t, H, op, name);
  MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16 || t.dtype() == DType::F16,
             "{}: {} is {}; f32, bf16 or f16 expected", op, name, t.str());
  return {t.raw(), t.dtype()};
}

template <bool RMS>
void norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                  Tensor* mean, Tensor& rstd, Stream& s, const char* op) {
  check_cuda(x, op, "x");
  check_cuda(y, op, "y");
  MCPP_CHECK(x.dtype() == y.dtype(), "{}: x is {}, y is {}; one dtype expected", op, x.str(),
             y.str());
  int64_t H = x.size(-1), rows = x.numel() / std::max<int64_t>(H, 1);
  check_numel(y, x.numel(), op, "y");
  MCPP_CHECK(w.defined(), "{}: the weight is undefined", op);
  Param pw = param(w, H, op, "w"), pb = param(b, H, op, "b");
  float* mp = nullptr;
  if (mean) {
    check_f32(*mean, op, "mean");
    check_numel(*mean, rows, op, "mean");
    mp = static_cast<float*>(mean->raw());
  }
  check_f32(rstd, op, "rstd");
  check_numel(rstd, rows, op, "rstd");
  if (rows == 0) return;
  MCPP_DISPATCH_ACT(x.dtype(), op,
                    launch_forward<T, RMS>(static_cast<const T*>(x.raw()), pw, pb, float(eps),
                                           static_cast<T*>(y.raw()), mp,
                                           static_cast<float*>(rstd.raw()), rows, H, stream_of(s)));
}

template <bool RMS>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor* mean,
                   const Tensor& rstd, Tensor& dx, bool acc, Tensor& dw, Tensor* db, Stream& s,
                   const char* op) {
  check_cuda(x, op, "x");
  check_cuda(dy, op, "dy");
  int64_t H = x.size(-1), rows = x.numel() / std::max<int64_t>(H, 1);
  MCPP_CHECK(dy.dtype() == x.dtype(), "{}: dy is {}, x is {}; one dtype expected", op, dy.str(),
             x.str());
  check_numel(dy, x.numel(), op, "dy");
  Param pw = param(w, H, op, "w");
  const float* mp = nullptr;
  if (mean) {
    check_f32(*mean, op, "mean");
    check_numel(*mean, rows, op, "mean");
    mp = static_cast<const float*>(mean->raw());
  }
  check_f32(rstd, op, "rstd");
  check_numel(rstd, rows, op, "rstd");
  void* dxp = nullptr;
  if (dx.defined()) {
    check_cuda(dx, op, "dx");
    MCPP_CHECK(dx.dtype() == x.dtype(), "{}: dx is {}, x is {}; one dtype expected", op, dx.str(),
               x.str());
    check_numel(dx, x.numel(), op, "dx");
    MCPP_CHECK(w.defined(), "{}: the weight is undefined (dx needs it)", op);
    dxp = dx.raw();
  }
  float* dwp = nullptr;
  float* dbp = nullptr;
  if (dw.defined()) {
    check_f32(dw, op, "dw");
    check_numel(dw, H, op, "dw");
    dwp = static_cast<float*>(dw.raw());
  }
  if (db && db->defined()) {
    check_f32(*db, op, "db");
    check_numel(*db, H, op, "db");
    dbp = static_cast<float*>(db->raw());
  }
  if (rows == 0 || (!dxp && !dwp && !dbp)) return;
  MCPP_DISPATCH_ACT(
      x.dtype(), op,
      launch_backward<T, RMS>(static_cast<const T*>(dy.raw()), static_cast<const T*>(x.raw()), pw,
                              mp, static_cast<const float*>(rstd.raw()), static_cast<T*>(dxp), acc,
                              dwp, dbp, rows, H, stream_of(s)));
}

// --qk-layernorm's per-head norms: kernels, launchers and argument checks.
#include "ops/cuda/qk_norm.cuh"

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                       Tensor& mean, Tensor& rstd, Stream& s) {
  norm_forward<false>(x, w, b, eps, y, &mean, rstd, s, "layernorm_forward");
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, bool accumulate_dx, Tensor& dw, Tensor& db,
                        Stream& s) {
  norm_backward<false>(dy, x, w, &mean, rstd, dx, accumulate_dx, dw, &db, s, "layernorm_backward");
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
                     Stream& s) {
  norm_forward<true>(x, w, Tensor(), eps, y, nullptr, rstd, s, "rmsnorm_forward");
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, bool accumulate_dx, Tensor& dw, Stream& s) {
  norm_backward<true>(dy, x, w, nullptr, rstd, dx, accumulate_dx, dw, nullptr, s,
                      "rmsnorm_backward");
}

void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                     bool one_plus, Tensor& y, Stream& s) {
  qk_norm_fwd<false>("qk_norm_forward", x, wq, Tensor(), wk, Tensor(), r, eps, one_plus, y, s);
}

void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                      bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dwk, Stream& s) {
  qk_norm_bwd<false>("qk_norm_backward", x, wq, wk, r, eps, one_plus, dqkv, dwq, nullptr, dwk,
                     nullptr, s);
}

void qk_layernorm_forward(const Tensor& x, const Tensor& wq, const Tensor& bq, const Tensor& wk,
                          const Tensor& bk, int64_t r, double eps, bool one_plus, Tensor& y,
                          Stream& s) {
  qk_norm_fwd<true>("qk_layernorm_forward", x, wq, bq, wk, bk, r, eps, one_plus, y, s);
}

void qk_layernorm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r,
                           double eps, bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dbq,
                           Tensor& dwk, Tensor& dbk, Stream& s) {
  qk_norm_bwd<true>("qk_layernorm_backward", x, wq, wk, r, eps, one_plus, dqkv, dwq, &dbq, dwk,
                    &dbk, s);
}

}  // namespace mcpp::ops::cuda
