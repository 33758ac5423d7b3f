// The blockwise FP8 cast on CUDA (catalogue.inc "FP8 blockwise", fp8_block_cast): one read of
// x [R, C] (bf16 or f32) writes the row-wise FP8 copy q [R, C] and/or the column-wise one
// qt [C, R], each with its block scale_inv in cuBLASLt's layout (ops/fp8_grid.h). Blocks lie
// along each copy's own K: 1x128 along x's rows for q, along x's columns for qt (their own
// scales: a different set of 128 values each); with `tile`, 128x128 blocks whose one scale
// serves both copies (the weights). Scales: fp8_block_scale (power of two from the block's
// amax, NaN skipped); conversion: __nv_cvt_float_to_fp8 with saturation (round to nearest
// even, NaN kept: ops/fp8_grid.h's grid). Every byte and scale equals the CPU's
// fp8_block_quantize (tests/gpu/test_fp8_block_gpu.cpp).
//
// One block of 256 threads per 128x128 tile of x: the tile goes to shared memory as f32
// (pitch 129: a column read by a warp touches 8 banks, not 1), then each warp takes 16 rows
// (q: a lane quantises 4 consecutive elements, one 4-byte store, a row is one 128-byte
// store of the warp) and 16 columns (qt: the same along a column, written as a row of qt).
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/fp8_grid.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr int kB = kFp8Block, kPitch = kB + 1, kThreads = 256, kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <bool E4M3>
__device__ __forceinline__ uint32_t cvt4(const float* v, float sc) {
  const __nv_fp8_interpretation_t f = E4M3 ? __NV_E4M3 : __NV_E5M2;
  uint32_t out = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    out |= uint32_t(__nv_cvt_float_to_fp8(v[j] * sc, __NV_SATFINITE, f)) << (8 * j);
  return out;
}

template <typename T, bool E4M3>
__global__ void __launch_bounds__(kThreads)
    block_cast_kernel(const T* __restrict__ x, int64_t R, int64_t C, bool tile,
                      uint8_t* __restrict__ q, float* __restrict__ s_q, uint8_t* __restrict__ qt,
                      float* __restrict__ s_qt) {
  extern __shared__ float sm[];  // [kB][kPitch]
  __shared__ float wmax[kWarps];
  const Fp8Format fmt = E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int64_t cb = blockIdx.x, rb = blockIdx.y, r0 = rb * kB, c0 = cb * kB;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int nr = int(R - r0 < kB ? R - r0 : kB), nc = int(C - c0 < kB ? C - c0 : kB);
  float m = 0.f;
  for (int i = tid; i < kB * kB; i += kThreads) {
    const int r = i / kB, c = i % kB;
    float v = 0.f;
    if (r < nr && c < nc) v = to_f(x[(r0 + r) * C + c0 + c]);
    sm[r * kPitch + c] = v;
    m = fmaxf(m, fabsf(v));  // fmaxf: a NaN is skipped, as Transformer Engine's amax
  }
  float tile_sc = 1.f;
  if (tile) {
    m = warp_max(m);
    if (lane == 0) wmax[w] = m;
  }
  __syncthreads();
  if (tile) {
    float t = 0.f;
    for (int i = 0; i < kWarps; ++i) t = fmaxf(t, wmax[i]);
    tile_sc = fp8_block_scale(t, fmt);
    if (tid == 0) {
      int64_t rows = 0, cols = 0;
      if (q) fp8_block_scale_dims(R, C, true, &rows, &cols), s_q[rb * cols + cb] = 1.f / tile_sc;
      if (qt) fp8_block_scale_dims(C, R, true, &rows, &cols), s_qt[cb * cols + rb] = 1.f / tile_sc;
    }
  }
  // Row-wise copy: warp w quantises rows w, w + 8, ...; lane l elements 4l .. 4l + 3.
  if (q) {
    const int64_t R4 = fp8_round4(R);
    for (int r = w; r < nr; r += kWarps) {
      float v[4];
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = sm[r * kPitch + 4 * lane + j], a = fmaxf(a, fabsf(v[j]));
      const float sc = tile ? tile_sc : fp8_block_scale(warp_max(a), fmt);
      if (!tile && lane == 0) s_q[cb * R4 + r0 + r] = 1.f / sc;
      if (4 * lane < nc)  // C % 16 == 0: a lane's 4 elements are all in or all out
        *reinterpret_cast<uint32_t*>(q + (r0 + r) * C + c0 + 4 * lane) = cvt4<E4M3>(v, sc);
    }
  }
  // Column-wise copy: warp w quantises columns w, w + 8, ... (rows of qt).
  if (qt) {
    const int64_t C4 = fp8_round4(C);
    for (int c = w; c < nc; c += kWarps) {
      float v[4];
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = sm[(4 * lane + j) * kPitch + c], a = fmaxf(a, fabsf(v[j]));
      const float sc = tile ? tile_sc : fp8_block_scale(warp_max(a), fmt);
      if (!tile && lane == 0) s_qt[rb * C4 + c0 + c] = 1.f / sc;
      if (4 * lane < nr)
        *reinterpret_cast<uint32_t*>(qt + (c0 + c) * R + r0 + 4 * lane) = cvt4<E4M3>(v, sc);
    }
  }
}

template <typename T, bool E4M3>
void launch(const Tensor& x, int64_t R, int64_t C, bool tile, uint8_t* q, float* s_q, uint8_t* qt,
            float* s_qt, Stream& s) {
  constexpr size_t smem = size_t(kB) * kPitch * sizeof(float);
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(block_cast_kernel<T, E4M3>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)attr;
  const dim3 grid(unsigned(fp8_block_count(C)), unsigned(fp8_block_count(R)));
  block_cast_kernel<T, E4M3><<<grid, kThreads, smem, stream_of(s)>>>(static_cast<const T*>(x.raw()),
                                                                     R, C, tile, q, s_q, qt, s_qt);
  CUDA_CHECK(cudaGetLastError());
}

// fp8_block_quantize (the emulation on the device; not on the training path): one warp a
// block, lanes striding over its elements; dequantised into y in x's dtype.
template <typename T>
__global__ void block_quantize_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t R,
                                      int64_t C, int64_t br, int64_t bc, Fp8Format fmt,
                                      float* __restrict__ scale_inv) {
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t b = warp; b < nbr * nbc; b += nwarps) {
    const int64_t r0 = b / nbc * br, c0 = b % nbc * bc;
    const int64_t h = (R - r0 < br ? R - r0 : br), w = (C - c0 < bc ? C - c0 : bc);
    float a = 0.f;
    for (int64_t i = lane; i < h * w; i += 32)
      a = fmaxf(a, fabsf(to_f(x[(r0 + i / w) * C + c0 + i % w])));
    const float sc = fp8_block_scale(warp_max(a), fmt), inv = 1.f / sc;
    for (int64_t i = lane; i < h * w; i += 32) {
      const int64_t k = (r0 + i / w) * C + c0 + i % w;
      y[k] = from_f<T>(fp8_round(to_f(x[k]) * sc, fmt) * inv);
    }
    if (scale_inv && lane == 0) scale_inv[b] = inv;
  }
}

}  // namespace

void fp8_block_quantize(const Tensor& x, Fp8Format fmt, int64_t br, int64_t bc, Tensor& y,
                        Tensor& scale_inv, Stream& s) {
  const char* op = "fp8_block_quantize";
  check_cuda(x, op, "x");
  check_cuda(y, op, "y");
  MCPP_CHECK((x.dtype() == DType::BF16 || x.dtype() == DType::F32) && y.dtype() == x.dtype() &&
                 y.numel() == x.numel() && br >= 1 && bc >= 1,
             "{}: x {} / y {} must be bf16 or f32 of one size, blocks {}x{} non-empty", op, x.str(),
             y.str(), br, bc);
  const int64_t C = x.dim() == 0 ? 1 : x.size(-1), R = C ? x.numel() / C : 0;
  const int64_t nb = ((R + br - 1) / br) * ((C + bc - 1) / bc);
  float* si = nullptr;
  if (scale_inv.defined()) {
    check_f32(scale_inv, op, "scale_inv");
    check_numel(scale_inv, nb, op, "scale_inv");
    si = scale_inv.data<float>();
  }
  if (nb == 0) return;
  const unsigned grid = grid_for(nb * 32, 256);
  if (x.dtype() == DType::BF16)
    block_quantize_kernel<bf16><<<grid, 256, 0, stream_of(s)>>>(
        static_cast<const bf16*>(x.raw()), static_cast<bf16*>(y.raw()), R, C, br, bc, fmt, si);
  else
    block_quantize_kernel<float>
        <<<grid, 256, 0, stream_of(s)>>>(x.data<float>(), y.data<float>(), R, C, br, bc, fmt, si);
  CUDA_CHECK(cudaGetLastError());
}

void fp8_block_cast(const Tensor& x, Fp8Format fmt, bool tile, Tensor& q, Tensor& s_q, Tensor& qt,
                    Tensor& s_qt, Stream& s) {
  const char* op = "fp8_block_cast";
  check_cuda(x, op, "x");
  MCPP_CHECK(x.dtype() == DType::BF16 || x.dtype() == DType::F32, "{}: x {} must be bf16 or f32",
             op, x.str());
  MCPP_CHECK(x.dim() == 2, "{}: x {} must be [R, C]", op, x.str());
  const int64_t R = x.size(0), C = x.size(1);
  MCPP_CHECK_HINT(R % 16 == 0 && C % 16 == 0,
                  "FP8 training needs hidden sizes, FFN sizes and micro-batch tokens (seq x "
                  "micro-batch) that are multiples of 16",
                  "{}: x {}: the FP8 GEMMs need every dimension a multiple of 16", op, x.str());
  MCPP_CHECK(fp8_block_count(R) <= 65535, "{}: x {} has too many row blocks", op, x.str());
  const DType dt = fmt == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2;
  int64_t a = 0, b = 0;
  if (q.defined()) {
    check_cuda(q, op, "q");
    MCPP_CHECK(q.dtype() == dt && q.numel() == R * C, "{}: q {} must be {} [{}, {}]", op, q.str(),
               dtype_name(dt), R, C);
    fp8_block_scale_dims(R, C, tile, &a, &b);
    check_f32(s_q, op, "s_q");
    check_numel(s_q, a * b, op, "s_q");
  }
  if (qt.defined()) {
    check_cuda(qt, op, "qt");
    MCPP_CHECK(qt.dtype() == dt && qt.numel() == R * C, "{}: qt {} must be {} [{}, {}]", op,
               qt.str(), dtype_name(dt), C, R);
    fp8_block_scale_dims(C, R, tile, &a, &b);
    check_f32(s_qt, op, "s_qt");
    check_numel(s_qt, a * b, op, "s_qt");
  }
  if ((!q.defined() && !qt.defined()) || R == 0 || C == 0) return;
  uint8_t* qp = q.defined() ? static_cast<uint8_t*>(q.raw()) : nullptr;
  uint8_t* qtp = qt.defined() ? static_cast<uint8_t*>(qt.raw()) : nullptr;
  float* sq = q.defined() ? s_q.data<float>() : nullptr;
  float* sqt = qt.defined() ? s_qt.data<float>() : nullptr;
  const bool e4 = fmt == Fp8Format::E4M3;
  if (x.dtype() == DType::BF16)
    e4 ? launch<bf16, true>(x, R, C, tile, qp, sq, qtp, sqt, s)
       : launch<bf16, false>(x, R, C, tile, qp, sq, qtp, sqt, s);
  else
    e4 ? launch<float, true>(x, R, C, tile, qp, sq, qtp, sqt, s)
       : launch<float, false>(x, R, C, tile, qp, sq, qtp, sqt, s);
}

}  // namespace mcpp::ops::cuda
