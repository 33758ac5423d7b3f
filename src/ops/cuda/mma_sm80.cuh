// PTX wrappers for the sm_80+ tensor-core kernels (flash_attention.cu): mma.sync
// m16n8k16 with f32 accumulation, cp.async 16-byte copies, ldmatrix, and the A/B fragment
// loads from row-major shared-memory tiles (PTX ISA, "Matrix Fragments for mma.m16n8k16").
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"

namespace mcpp::ops::cuda {

// ---- PTX wrappers --------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  if constexpr (std::is_same_v<T, bf16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The four products of one 64-k step of the decode GEMMs (gemv.cu, gemv_splitk.cu), whose
// operands come straight from 16-byte loads: w[0], w[1] two 8-element words of a weight row,
// w[2], w[3] the same k of the row 8 below, x0, x1 the same k of a token. Each product
// takes one 32-bit pair of every word as its k slots, the same pair for both operands -- a
// permutation of k the weights and the tokens share, which leaves the product as it is.
// Which k each word holds is the kernel's choice (its loads).
template <typename T>
__device__ __forceinline__ void mma_step_words(float acc[4], const uint4 (&w)[4], uint4 x0,
                                               uint4 x1) {
  {
    const uint32_t a[4] = {w[0].x, w[2].x, w[0].y, w[2].y}, b[2] = {x0.x, x0.y};
    mma16816<T>(acc, a, b);
  }
  {
    const uint32_t a[4] = {w[0].z, w[2].z, w[0].w, w[2].w}, b[2] = {x0.z, x0.w};
    mma16816<T>(acc, a, b);
  }
  {
    const uint32_t a[4] = {w[1].x, w[3].x, w[1].y, w[3].y}, b[2] = {x1.x, x1.y};
    mma16816<T>(acc, a, b);
  }
  {
    const uint32_t a[4] = {w[1].z, w[3].z, w[1].w, w[3].w}, b[2] = {x1.z, x1.w};
    mma16816<T>(acc, a, b);
  }
}

// 2^x in one MUFU.EX2 (flush-to-zero): exp2f's ex2.approx.f32 adds a range test and two
// conditional multiplies to keep subnormal results, which softmax weights below 2^-126
// never need. ex2(-inf) = +0.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int n = pred ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
  uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int n = pred ? 8 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
// ROWS x (COLS elements of 2 bytes) of a strided [rows, COLS] slab into shared memory
// with row stride LD, by THREADS threads (16 bytes each per step); rows r0 + r >= S are
// zero-filled, nothing read. The trip count is a constant and each thread's address is
// computed once and stepped: a runtime-bounded loop over i = tid, tid + THREADS, ... cost
// ~30 integer instructions and a branch per 16 bytes (64-bit row products, the remainder
// loop), as much as the tile's softmax in the forward kernel.
template <int ROWS, int COLS, int LD, int THREADS, typename T>
__device__ __forceinline__ void cp_async_tile(T* dst, const T* src, int64_t stride, int64_t r0,
                                              int64_t S) {
  static_assert(sizeof(T) == 2 && COLS % 8 == 0);
  constexpr int CH = COLS / 8, STEP = THREADS / CH;
  static_assert(THREADS % CH == 0 && ROWS % STEP == 0);
  const int r = int(threadIdx.x) / CH, c = int(threadIdx.x) % CH;
  const int64_t left = S - r0 - r;  // rows of this thread still inside: it * STEP < left
  const T* g = src + (r0 + r) * stride + c * 8;
  T* d = dst + r * LD + c * 8;
#pragma unroll
  for (int it = 0; it < ROWS / STEP; ++it) {
    const bool ok = it * STEP < left;
    cp_async16(d + it * STEP * LD, ok ? g : src, ok);
    g += STEP * stride;
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}

// The fragment loads below use ldmatrix (one instruction for what took two or four
// 32-bit shared loads a thread); the tiles' rows must start on 16-byte boundaries (the
// kernels' row strides are HD + 8 elements) and r0, c0, n0, k0 be multiples of 8.
//
// A fragment: rows r0..r0+15, cols c0..c0+15 of a row-major smem tile. Lane l addresses
// row r0 + (l & 15) at col c0 + 8 (l >> 4): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15)
// in the order of the fragment's registers a[0..3].
template <int LD, typename T>
__device__ __forceinline__ void load_a(uint32_t a[4], const T* tile, int r0, int c0, int lane) {
  ldsm_x4(a, tile + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8);
}
// B fragment (k16 x n8) from a tile that holds B^T row-major (rows n, cols k): K for Q K^T.
// Lanes 0-7 address rows n0.. at col k0, lanes 8-15 at col k0 + 8 (16-31: unused, valid).
template <int LD, typename T>
__device__ __forceinline__ void load_bt(uint32_t b[2], const T* tile, int n0, int k0, int lane) {
  ldsm_x2(b, tile + (n0 + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// The B fragments of two n8 tiles at once: b[0..1] for rows n0..n0+7, b[2..3] for
// n0+8..n0+15 (load_bt of n0 and of n0 + 8 in one ldmatrix.x4).
template <int LD, typename T>
__device__ __forceinline__ void load_bt2(uint32_t b[4], const T* tile, int n0, int k0, int lane) {
  ldsm_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// B fragments of two n8 tiles (k16 x n16) from a tile holding B row-major (rows k,
// cols n): V for P V. b[0..1]: cols n0..n0+7, b[2..3]: n0+8..n0+15.
template <int LD, typename T>
__device__ __forceinline__ void load_b_trans(uint32_t b[4], const T* tile, int k0, int n0,
                                             int lane) {
  ldsm_x4_trans(b, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + (lane >> 4) * 8);
}

}  // namespace mcpp::ops::cuda
