// PTX wrappers for Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): shared-memory matrix
// descriptors for 128-byte-swizzled tiles, the m64n64k16 products with f32 accumulation
// (both operands from shared memory, or A from registers), and the fences and waits around
// them (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"). The code is
// emitted only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere the products trap, and
// callers launch their kernels only on a compute-capability-9.0 device.
//
// Tile layout (what the descriptors describe): 64 rows of 64 two-byte elements, 128 bytes a
// row, rows contiguous, 16-byte chunk j of row r stored at chunk j ^ (r & 7); the tile
// starts on a 1024-byte boundary. Eight rows (1024 bytes) are one swizzle atom. Rows of 128
// elements are two such tiles, columns 0-63 and 64-127, one after the other.
#pragma once
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/mma_sm80.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MCPP_WGMMA 1
#else
#define MCPP_WGMMA 0
#endif

namespace mcpp::ops::cuda {

// The descriptor of a 128B-swizzled tile (layout above) starting at `p`; stepping the
// start by 32 bytes moves 16 elements along the 128-byte rows (a k16 step of a K-major
// operand), by 2048 bytes 16 rows (a k16 step of an MN-major one). Both byte offsets are
// the 1024 bytes between 8-row groups: a K-major operand steps 8 rows of M/N by one of
// them and an MN-major one 8 rows of K by the other, and with 64-element rows each has a
// single atom to address along the row.
// The dynamic shared memory from its first 1024-byte boundary (the 128B swizzle's atom),
// as a pointer the compiler still knows is shared: rounding the address through an integer
// loses that, and every plain load or store through it becomes a generic one (`LD`, not
// `LDS`).
__device__ __forceinline__ unsigned char* smem_from_1024(unsigned char* smem) {
  return smem + ((1024u - uint32_t(reinterpret_cast<uintptr_t>(smem) & 1023u)) & 1023u);
}

__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return uint64_t((a & 0x3FFFFu) >> 4) | uint64_t(1024 >> 4) << 16 | uint64_t(1024 >> 4) << 32 |
         uint64_t(1) << 62;
}

__device__ __forceinline__ void wgmma_fence() {
#if MCPP_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if MCPP_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if MCPP_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to the async
// proxy that wgmma reads through (then a barrier, before the products).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if MCPP_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// stmatrix: four 8 x 8 two-byte matrices from registers into shared memory; lane l gives
// the address of row l % 8 of matrix l / 8, and register i of lane l holds row l / 4,
// columns 2 (l % 4), + 1 of matrix i (mma.sync's C layout of an n8 block).
__device__ __forceinline__ void stmatrix_x4(void* p, uint32_t a, uint32_t b, uint32_t c,
                                            uint32_t d) {
#if MCPP_WGMMA
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(s),
               "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
#endif
}
// A bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared to
// global memory by the issuing thread alone (the async proxy: the writers of the shared
// bytes fence_proxy_async_smem() and meet at a barrier first), committed as one bulk group.
__device__ __forceinline__ void bulk_store(void* g, const void* smem, uint32_t bytes) {
#if MCPP_WGMMA
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(g),
      "r"(s), "r"(bytes)
      : "memory");
#endif
}
// The issuing thread's bulk groups but the newest N have read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if MCPP_WGMMA
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
// The issuing thread's bulk groups are complete (their global writes performed).
__device__ __forceinline__ void bulk_wait_all() {
#if MCPP_WGMMA
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

#define MCPP_WGMMA_D32(d)                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d[64 x 64] (+)= A[64 x 16] B[16 x 64]; A and B tiles in shared memory, K-major by
// default (desc_a: 64 rows of M, desc_b: 64 rows of N), MN-major with TA / TB = 1 (16 rows
// of K, the 64 elements of M / N contiguous in each). accumulate = false overwrites d.
// d: warp w of the warpgroup holds rows 16w + lane / 4 (+ 8); d[4n + e] is column 8n +
// 2 (lane % 4) + (e & 1) of that row + 8 (e >> 1): mma.sync's C layout for each n8 block.
template <typename T, int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_64x64x16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                  bool accumulate) {
  static_assert((TA == 0 || TA == 1) && (TB == 0 || TB == 1));
#if MCPP_WGMMA
  if constexpr (std::is_same_v<T, bf16>)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, %35, %36;\n}\n"
        : MCPP_WGMMA_D32(d)
        : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TA), "n"(TB));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, %35, %36;\n}\n"
        : MCPP_WGMMA_D32(d)
        : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TA), "n"(TB));
#else
  __trap();
#endif
}

// d[64 x 64] (+)= A[64 x 16] B[16 x 64] with A in registers (warp w: rows 16w.., mma.sync's
// m16n8k16 A fragment) and B an MN-major tile in shared memory (16 rows of K, the 64
// elements of N contiguous in each).
template <typename T>
__device__ __forceinline__ void wgmma_64x64x16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                  uint64_t desc_b, bool accumulate) {
#if MCPP_WGMMA
  if constexpr (std::is_same_v<T, bf16>)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : MCPP_WGMMA_D32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : MCPP_WGMMA_D32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)));
#else
  __trap();
#endif
}

#undef MCPP_WGMMA_D32

// 64 rows x HD two-byte elements (HD = 64 or 128) of a strided [rows, HD] slab into
// HD / 64 128B-swizzled tiles (the layout above; columns 64h .. 64h + 63 in tile h, 8 KiB
// apart) with cp.async, by 128 threads; rows r0 + r >= S are zero-filled.
template <int HD, typename T>
__device__ __forceinline__ void cp_async_tile_sw128(T* dst, const T* src, int64_t stride,
                                                    int64_t r0, int64_t S) {
  static_assert(HD == 64 || HD == 128);
  constexpr int CH = HD / 8, STEP = 128 / CH;  // 16-byte chunks a row, rows a step
  const int r = int(threadIdx.x) / CH, j = int(threadIdx.x) % CH;
  const int64_t left = S - r0 - r;
  const T* g = src + (r0 + r) * stride + j * 8;
  // STEP is a multiple of 8: r & 7, and so the swizzled chunk, is every step's row's.
  unsigned char* d = reinterpret_cast<unsigned char*>(dst) + (j >> 3) * 8192 + r * 128 +
                     (((j & 7) ^ (r & 7)) << 4);
#pragma unroll
  for (int it = 0; it < 64 / STEP; ++it) {
    const bool ok = it * STEP < left;
    cp_async16(d + it * STEP * 128, ok ? g : src, ok);
    g += STEP * stride;
  }
}

}  // namespace mcpp::ops::cuda
