// Fused FP8 casts on CUDA (catalogue.inc's FP8 section, docs/fp8.md "Fused casts"): the
// element functions next to an FP8 GEMM taken inside the cast that feeds it, so each
// removes a whole pass over a bf16 tensor:
//   fp8_cast_transpose_dbias  the cast of an output gradient + its column sums (the bias
//                             gradient) from the same registers
//   fp8_gelu_cast             a = gelu(pre) cast for fc2 (GELU MLP), a kept in bf16 only
//                             when asked
//   fp8_dgelu_cast            g = dact * gelu'(pre) cast for fc1's backward, + its bias
//                             gradient, g kept in bf16 only when asked
//   fp8_swiglu_cast           a = swiglu(pre) = silu(gate) * up cast for fc2 (SwiGLU MLP)
//   fp8_dswiglu_cast          g = [d gate | d up] of swiglu at pre, from dact, cast for
//                             fc1's backward (+ its bias gradient)
// Each applies the element function of ops/cuda/activations.cu (the same float
// expression, rounded to bf16 as gelu_forward / gelu_backward / swiglu_forward /
// swiglu_backward write it) and then exactly
// fp8_cast_transpose's conversion (cvt.rn.satfinite of v * scale) and amax (packed max over
// the bf16 magnitudes, NaN above Inf): its FP8 bytes and amax equal the unfused composition
// byte for byte (tests/gpu/test_fp8_fused_gpu.cpp). The column sums go through a fixed
// order (per 128-row tile, then the tiles in order): deterministic, but not the order of
// linear_backward's column_reduce_add, so db may differ from it in the last bits.
//
// Layout: bf16 x [R, C], R and C multiples of 16, 16-byte aligned pointers; a block of
// 32 x 4 threads owns a 128 x 64 tile, thread (tx, ty) rows 4tx..4tx+3 and columns
// 16ty..16ty+15, a warp 8 row quads x the 4 column groups (so that a 16-byte load
// instruction touches 8 rows of 128 contiguous bytes, not 32 rows of 32: 8-12% faster);
// both copies leave through shared memory. Without an element function this is also
// fp8_cast_transpose's kernel whenever a column-wise copy is asked for (fp8.cu).
#include <cuda_fp8.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/activation_math.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kRows = 128, kCols = 64, kPitch = kRows / 4 + 4;  // pitch: 32-bit words


enum Pro : int { kNone = 0, kGelu = 1, kDgelu = 2, kSwiglu = 3, kDswiglu = 4 };

__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Two bf16 values (one word) through the element function; b: pre for kDgelu.
// kSwiglu: a gate, b up (kDswiglu is evaluated once for both halves in the kernel).
template <int PRO>
__device__ __forceinline__ uint32_t apply(uint32_t a, uint32_t b) {
  constexpr bool F = kFastMath<bf16>;
  if (PRO == kGelu) return bf_bits(gelu_f<F>(lo_f(a))) | (bf_bits(gelu_f<F>(hi_f(a))) << 16);
  if (PRO == kDgelu)
    return bf_bits(lo_f(a) * gelu_grad_f<F>(lo_f(b))) |
           (bf_bits(hi_f(a) * gelu_grad_f<F>(hi_f(b))) << 16);
  if (PRO == kSwiglu)
    return bf_bits(swiglu_f<F>(lo_f(a), lo_f(b))) | (bf_bits(swiglu_f<F>(hi_f(a), hi_f(b))) << 16);
  return a;
}

// The 16-byte slot of row r's chunk c (of 8) in the row-wise staging tile: the two rows a
// quarter warp touches (r and r + 4 when writing, r and r + 1 when reading) sit in opposite
// halves of the 128-byte row, so neither side conflicts on a bank.
__device__ __forceinline__ int row_slot(int r, int c) { return c + 4 * ((r ^ (r >> 2)) & 1); }

template <bool E4M3>
__device__ __forceinline__ uint32_t cvt2(uint32_t bf2, float sc) {
  const float2 f = make_float2(lo_f(bf2) * sc, hi_f(bf2) * sc);
  return __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// q, qt, out16, amax, scale_inv, dbp: each skipped when null. dbp: [gridDim.y, C] partial
// column sums (one row per 128-row tile). The inputs by PRO (the output is [R, C]):
//   kNone, kGelu: x [R, C];  kDgelu: x = dact, x2 = pre, both [R, C];
//   kSwiglu: x = pre [R, 2C] (gate | up);  kDswiglu: x = dact [R, C/2], x2 = pre [R, C],
//   C/2 a multiple of the tile's 64 columns: a block reads its dact, gate and up tiles
//   once and writes the gate's gradient tile, then the up's (gridDim.x = C/2 / 64).
// Both copies leave through shared memory so that a warp stores whole sectors: the
// column-wise one as a transposed tile, the row-wise one as 128 rows of 64 bytes (a
// thread's 16-byte chunk of row r at slot chunk ^ ((r / 4) % 8) of a 128-byte row, so the
// writes of 8 consecutive threads hit 8 different bank groups), then 16-byte stores, 4
// threads a row: 8 rows of 64 contiguous bytes a warp instruction, against 32 half-used
// sectors when each thread stored its own 4 rows.
// The blocks per SM each element function's register budget is sized for (kDgelu's 5
// spills a few registers and still runs 5% faster than at 4; bench_gpu_ops --only fp8).
constexpr int kMinBlocks[5] = {6, 6, 5, 4, 2};

template <bool E4M3, int PRO>
__global__ void __launch_bounds__(128, kMinBlocks[PRO])
    fused_cast_kernel(const bf16* x, const bf16* __restrict__ x2, int64_t R, int64_t C,
                      const float* __restrict__ scale, uint8_t* __restrict__ q,
                      uint8_t* __restrict__ qt, bf16* out16, float* amax,
                      float* scale_inv, float* __restrict__ dbp) {
  __shared__ uint4 tile_storage[kCols * kPitch / 4];
  __shared__ uint4 rows[kRows * 8];
  __shared__ unsigned wmax[4];
  __shared__ float csum[4][kCols];
  uint32_t* tile = reinterpret_cast<uint32_t*>(tile_storage);
  const float sc = *scale;
  // (tx, ty): the thread's row quad and column group.
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int tx = warp * 8 + (lane >> 2), ty = lane & 3;
  constexpr int kHalves = PRO == kDswiglu ? 2 : 1;
  const int64_t half = C / 2;
  const int64_t r0 = int64_t(blockIdx.y) * kRows, c0 = int64_t(blockIdx.x) * kCols;
  // This thread's 16 input columns: ic.. of x (and x2) with row strides ld (ld2).
  const int64_t ic = c0 + 16 * ty;
  const int64_t in_cols = PRO == kDswiglu ? half : C;
  const int64_t ld = PRO == kSwiglu ? 2 * C : PRO == kDswiglu ? half : C;
  const int64_t ld2 = PRO == kSwiglu ? 2 * C : C;
  const bf16* p2 = PRO == kSwiglu ? x + C : x2;  // kSwiglu: up; kDgelu: pre; kDswiglu: gate
  uint4 in[4][2], in2[4][2], in3[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * tx + i;
    const bool ok = ic < in_cols && r < R;
    const uint4 z = make_uint4(0, 0, 0, 0);  // zeros: f(0) = 0, no amax, no sum, not stored
    const bool two = PRO == kDgelu || PRO == kSwiglu || PRO == kDswiglu;
    in[i][0] = ok ? reinterpret_cast<const uint4*>(x + r * ld + ic)[0] : z;
    in[i][1] = ok ? reinterpret_cast<const uint4*>(x + r * ld + ic)[1] : z;
    in2[i][0] = two && ok ? reinterpret_cast<const uint4*>(p2 + r * ld2 + ic)[0] : z;
    in2[i][1] = two && ok ? reinterpret_cast<const uint4*>(p2 + r * ld2 + ic)[1] : z;
    in3[i][0] = PRO == kDswiglu && ok ? reinterpret_cast<const uint4*>(x2 + r * C + half + ic)[0] : z;
    in3[i][1] = PRO == kDswiglu && ok ? reinterpret_cast<const uint4*>(x2 + r * C + half + ic)[1] : z;
  }
  // kDswiglu: both halves' gradients from one evaluation of the sigmoid per (gate, up)
  // pair (fused_swiglu_grad_f gives dg and du together), kept as bf16 pairs for the halves.
  uint32_t dg2[4][8], du2[4][8];
  if constexpr (PRO == kDswiglu) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t d[8] = {in[i][0].x, in[i][0].y, in[i][0].z, in[i][0].w,
                             in[i][1].x, in[i][1].y, in[i][1].z, in[i][1].w};
      const uint32_t g[8] = {in2[i][0].x, in2[i][0].y, in2[i][0].z, in2[i][0].w,
                             in2[i][1].x, in2[i][1].y, in2[i][1].z, in2[i][1].w};
      const uint32_t u[8] = {in3[i][0].x, in3[i][0].y, in3[i][0].z, in3[i][0].w,
                             in3[i][1].x, in3[i][1].y, in3[i][1].z, in3[i][1].w};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float glo, ulo, ghi, uhi;
        swiglu_grad_f<kFastMath<bf16>>(lo_f(d[k]), lo_f(g[k]), lo_f(u[k]), glo, ulo);
        swiglu_grad_f<kFastMath<bf16>>(hi_f(d[k]), hi_f(g[k]), hi_f(u[k]), ghi, uhi);
        dg2[i][k] = bf_bits(glo) | (bf_bits(ghi) << 16);
        du2[i][k] = bf_bits(ulo) | (bf_bits(uhi) << 16);
      }
    }
  }
  uint32_t m2 = 0;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int64_t ch = c0 + h * half, cb = ch + 16 * ty;  // the output's tile and columns
    float cs[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) cs[j] = 0.f;
    uint32_t w[4][4];  // w[i][k]: the FP8 bytes of row i, columns 4k..4k+3
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t v[8] = {in[i][0].x, in[i][0].y, in[i][0].z, in[i][0].w,
                       in[i][1].x, in[i][1].y, in[i][1].z, in[i][1].w};
      if constexpr (PRO == kDswiglu) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = h == 1 ? du2[i][k] : dg2[i][k];
      } else if (PRO != kNone) {
        const uint32_t p[8] = {in2[i][0].x, in2[i][0].y, in2[i][0].z, in2[i][0].w,
                               in2[i][1].x, in2[i][1].y, in2[i][1].z, in2[i][1].w};
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = apply<PRO>(v[k], p[k]);
      }
      const int64_t r = r0 + 4 * tx + i;
      if (out16 && cb < C && r < R) {
        uint4* o = reinterpret_cast<uint4*>(out16 + r * C + cb);
        o[0] = make_uint4(v[0], v[1], v[2], v[3]);
        o[1] = make_uint4(v[4], v[5], v[6], v[7]);
      }
      if (dbp)
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          cs[2 * k] += lo_f(v[k]);
          cs[2 * k + 1] += hi_f(v[k]);
        }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        m2 = __vmaxu2(m2, __vmaxu2(v[2 * k] & 0x7fff7fffu, v[2 * k + 1] & 0x7fff7fffu));
        w[i][k] = cvt2<E4M3>(v[2 * k], sc) | (cvt2<E4M3>(v[2 * k + 1], sc) << 16);
      }
      if (q) rows[(4 * tx + i) * 8 + row_slot(4 * tx + i, ty)] =
          make_uint4(w[i][0], w[i][1], w[i][2], w[i][3]);
    }
    if (qt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // columns 4k..4k+3 of rows 0..3 -> 4 words of 4 rows
        const uint32_t lo01 = __byte_perm(w[0][k], w[1][k], 0x5140),
                       lo23 = __byte_perm(w[2][k], w[3][k], 0x5140),
                       hi01 = __byte_perm(w[0][k], w[1][k], 0x7362),
                       hi23 = __byte_perm(w[2][k], w[3][k], 0x7362);
        // row quad tx of column c at word (tx + 8 (c / 16)) % 32: a warp's 32 stores hit
        // 32 banks
        uint32_t* col = tile + (16 * ty + 4 * k) * kPitch + ((tx + 8 * ty) & 31);
        col[0] = __byte_perm(lo01, lo23, 0x5410);
        col[kPitch] = __byte_perm(lo01, lo23, 0x7632);
        col[2 * kPitch] = __byte_perm(hi01, hi23, 0x5410);
        col[3 * kPitch] = __byte_perm(hi01, hi23, 0x7632);
      }
    }
    if (dbp) {
      // The warp holds 32 of the 128 rows of columns ch..ch+63: a butterfly over its 8 row
      // quads, then the 4 warps' sums in warp order (after the barrier below).
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int o = 16; o >= 4; o >>= 1) cs[j] += __shfl_xor_sync(0xffffffffu, cs[j], o);
      if (lane < 4)
#pragma unroll
        for (int j = 0; j < 16; ++j) csum[warp][16 * ty + j] = cs[j];
    }
    __syncthreads();
    const int t = warp * 32 + lane;
    if (dbp && t < kCols && ch + t < C)
      dbp[int64_t(blockIdx.y) * C + ch + t] =
          ((csum[0][t] + csum[1][t]) + csum[2][t]) + csum[3][t];
    if (qt) {
#pragma unroll
      for (int it = 0; it < kCols * 8 / 128; ++it) {
        const int idx = t + 128 * it, c = idx / 8, part = idx % 8;  // rows 16 part .. +15
        const int64_t cg = ch + c, rr = r0 + 16 * part;
        if (cg < C && rr < R)
          *reinterpret_cast<uint4*>(qt + cg * R + rr) =
              *reinterpret_cast<const uint4*>(tile + c * kPitch +
                                              ((4 * part + 8 * (c / 16)) & 31));
      }
    }
    if (q) {
#pragma unroll
      for (int it = 0; it < kRows * 4 / 128; ++it) {
        const int idx = t + 128 * it, row = idx / 4, c = idx % 4;  // columns 16 c .. +15
        const int64_t rr = r0 + row, cg = ch + 16 * c;
        if (cg < C && rr < R)
          *reinterpret_cast<uint4*>(q + rr * C + cg) = rows[row * 8 + row_slot(row, c)];
      }
    }
    if (h + 1 < kHalves) __syncthreads();  // the next half writes the tiles again
  }
  if (amax) {
    unsigned m = max(m2 & 0xffffu, m2 >> 16);
    m = m > 0x7f80u ? 0x7fc00000u : m << 16;  // as abs_bits of the float
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) wmax[warp] = m;
  }
  __syncthreads();
  if (amax && lane == 0 && warp == 0)
    atomicMax(reinterpret_cast<unsigned*>(amax), max(max(wmax[0], wmax[1]), max(wmax[2], wmax[3])));
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && lane == 0 && warp == 0)
    *scale_inv = 1.0f / sc;
}

// db[c] += the tiles' partial sums, in tile order.
__global__ void dbias_finish_kernel(const float* __restrict__ p, int64_t tiles, int64_t C,
                                    float* __restrict__ db) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t t = 0; t < tiles; ++t) s += p[t * C + c];
    db[c] += s;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The checks every fused cast shares, then the launch. x2: pre (kDgelu, kDswiglu) or
// undefined. The output's shape [R, C]: x's, but [R, C/2] from kSwiglu's pre and [R, 2C]
// from kDswiglu's dact.
void fused_cast(const char* op, int pro, const Tensor& x, const Tensor& x2, Fp8Format fmt,
                const Tensor& scale, Tensor& out16, Tensor& q, Tensor& qt, Tensor& amax,
                Tensor& scale_inv, Tensor& db, Stream& s) {
  check_cuda(x, op, "x");
  MCPP_CHECK(x.dtype() == DType::BF16 && x.dim() == 2, "{}: x {} must be bf16 [R, C]", op, x.str());
  const int64_t R = x.size(0),
                C = pro == kSwiglu ? x.size(1) / 2 : pro == kDswiglu ? 2 * x.size(1) : x.size(1);
  MCPP_CHECK_HINT(R % 16 == 0 && C % 16 == 0 && aligned16(x.raw()) && R <= 65535LL * kRows,
                  "the FP8 path keeps every dimension a multiple of 16 (docs/fp8.md)",
                  "{}: x {} needs both dimensions multiples of 16, 16-byte aligned", op, x.str());
  if (pro == kSwiglu)
    MCPP_CHECK_HINT(x.size(1) % 32 == 0, "the FP8 path keeps every dimension a multiple of 16",
                    "{}: pre {} must be [R, 2F], F a multiple of 16", op, x.str());
  if (pro == kDswiglu)
    MCPP_CHECK_HINT(x.size(1) % kCols == 0,
                    "other FFN sizes take swiglu_backward then the cast (Fp8Linear checks)",
                    "{}: dact {} needs F a multiple of {} (a tile in one half of [gate | up])",
                    op, x.str(), kCols);
  check_f32(scale, op, "scale");
  check_numel(scale, 1, op, "scale");
  const DType f8 = fmt == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2;
  auto check_same = [&](const Tensor& t, const char* name, DType dt, const Shape& shape) {
    if (!t.defined()) return;
    check_cuda(t, op, name);
    MCPP_CHECK(t.dtype() == dt && t.shape() == shape && aligned16(t.raw()),
               "{}: {} is {}, expected {} [{}, {}], 16-byte aligned", op, name, t.str(),
               dtype_name(dt), shape[0], shape[1]);
  };
  check_same(x2, "pre", DType::BF16, Shape{R, pro == kDswiglu ? C : x.size(1)});
  check_same(out16, "out", DType::BF16, Shape{R, C});
  check_same(q, "q", f8, Shape{R, C});
  check_same(qt, "qt", f8, Shape{C, R});
  if (R == 0 || C == 0) return;
  // kDswiglu: one block for a tile of the gate's gradient and the matching tile of the up's
  const int64_t tiled_cols = pro == kDswiglu ? C / 2 : C;
  const dim3 block(32, 4),
      grid(unsigned((tiled_cols + kCols - 1) / kCols), unsigned((R + kRows - 1) / kRows));
  Tensor partial;
  if (db.defined()) partial = Tensor::empty({int64_t(grid.y), C}, DType::F32, Device::CUDA);
  const auto* xp = static_cast<const bf16*>(x.raw());
  const auto* x2p = x2.defined() ? static_cast<const bf16*>(x2.raw()) : nullptr;
  auto* qp = q.defined() ? static_cast<uint8_t*>(q.raw()) : nullptr;
  auto* qtp = qt.defined() ? static_cast<uint8_t*>(qt.raw()) : nullptr;
  auto* op16 = out16.defined() ? static_cast<bf16*>(out16.raw()) : nullptr;
  float* ap = amax.defined() ? amax.data<float>() : nullptr;
  float* sip = scale_inv.defined() ? scale_inv.data<float>() : nullptr;
  float* pp = partial.defined() ? partial.data<float>() : nullptr;
  const float* scp = scale.data<float>();
  cudaStream_t st = stream_of(s);
#define MCPP_FUSED_LAUNCH(E4, P) \
  fused_cast_kernel<E4, P><<<grid, block, 0, st>>>(xp, x2p, R, C, scp, qp, qtp, op16, ap, sip, pp)
  const bool e4 = fmt == Fp8Format::E4M3;
  if (pro == kGelu) {
    if (e4) MCPP_FUSED_LAUNCH(true, kGelu); else MCPP_FUSED_LAUNCH(false, kGelu);
  } else if (pro == kDgelu) {
    if (e4) MCPP_FUSED_LAUNCH(true, kDgelu); else MCPP_FUSED_LAUNCH(false, kDgelu);
  } else if (pro == kSwiglu) {
    if (e4) MCPP_FUSED_LAUNCH(true, kSwiglu); else MCPP_FUSED_LAUNCH(false, kSwiglu);
  } else if (pro == kDswiglu) {
    if (e4) MCPP_FUSED_LAUNCH(true, kDswiglu); else MCPP_FUSED_LAUNCH(false, kDswiglu);
  } else {
    if (e4) MCPP_FUSED_LAUNCH(true, kNone); else MCPP_FUSED_LAUNCH(false, kNone);
  }
#undef MCPP_FUSED_LAUNCH
  CUDA_CHECK(cudaGetLastError());
  if (pp) {
    dbias_finish_kernel<<<grid_for(C, 256), 256, 0, st>>>(pp, int64_t(grid.y), C, db.data<float>());
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void fp8_cast_transpose_dbias(const Tensor& x, Fp8Format fmt, const Tensor& scale, Tensor& q,
                              Tensor& qt, Tensor& amax, Tensor& scale_inv, Tensor& db,
                              Stream& s) {
  Tensor none;
  fused_cast("fp8_cast_transpose_dbias", kNone, x, none, fmt, scale, none, q, qt, amax, scale_inv,
             db, s);
}

void fp8_gelu_cast(const Tensor& pre, Fp8Format fmt, const Tensor& scale, Tensor& act, Tensor& q,
                   Tensor& qt, Tensor& amax, Tensor& scale_inv, Stream& s) {
  Tensor none;
  fused_cast("fp8_gelu_cast", kGelu, pre, none, fmt, scale, act, q, qt, amax, scale_inv, none, s);
}

void fp8_dgelu_cast(const Tensor& dact, const Tensor& pre, Fp8Format fmt, const Tensor& scale,
                    Tensor& dpre, Tensor& q, Tensor& qt, Tensor& amax, Tensor& scale_inv,
                    Tensor& db, Stream& s) {
  MCPP_CHECK(pre.defined(), "fp8_dgelu_cast: pre is required");
  fused_cast("fp8_dgelu_cast", kDgelu, dact, pre, fmt, scale, dpre, q, qt, amax, scale_inv, db, s);
}

void fp8_swiglu_cast(const Tensor& pre, Fp8Format fmt, const Tensor& scale, Tensor& act, Tensor& q,
                     Tensor& qt, Tensor& amax, Tensor& scale_inv, Stream& s) {
  Tensor none;
  fused_cast("fp8_swiglu_cast", kSwiglu, pre, none, fmt, scale, act, q, qt, amax, scale_inv, none,
             s);
}

void fp8_dswiglu_cast(const Tensor& dact, const Tensor& pre, Fp8Format fmt, const Tensor& scale,
                      Tensor& dpre, Tensor& q, Tensor& qt, Tensor& amax, Tensor& scale_inv,
                      Tensor& db, Stream& s) {
  MCPP_CHECK(pre.defined(), "fp8_dswiglu_cast: pre is required");
  fused_cast("fp8_dswiglu_cast", kDswiglu, dact, pre, fmt, scale, dpre, q, qt, amax, scale_inv, db,
             s);
}

}  // namespace mcpp::ops::cuda
