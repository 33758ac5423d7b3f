// linear_decode's split-K tensor-core kernel (DecodeGemm::SplitK): y[M, N] = x[M, K] @
// w[N, K]^T (+ b[N]) (+ residual[M, N]), bf16/f16 in and out, f32 sums, one rounding; M up
// to 64 rows (meant for 9..64: a decode step of many streams), K a multiple of 64.
//
// Why: at 64 rows the layers of a 1B model are still a stream of the weights (2 bytes a
// parameter, 128 flops), but neither kernel before this one streams them at the copy rate.
// cuBLASLt tiles such a skinny product into a few dozen output tiles, too few blocks to keep
// HBM busy (the 1B model's QKV [3072, 2048] took 11.5 us on an H200, ~4x its weights' read
// time); the tensor-core kernel of gemv.cu gives each block 16 weight rows and all of K, so
// its 192 blocks each read all of x (64 x K) for only 16 weight rows. Here a block's x is
// shared by 128 weight rows, and K is split across the blocks of a thread-block cluster so
// that even a layer of 2048 rows fills the GPU.
//
// The decomposition (BN = 128 weight rows a tile, S = 1, 2, 4 or 8 blocks a tile):
//   - Cluster c (S blocks, grid = ceil(N / BN) * S) owns weight rows n0 = BN c .. n0 + BN - 1
//     (the last tile ragged: rows past N are read as row N - 1 and never stored); its rank r
//     takes the K slice [r K/S, (r + 1) K/S).
//   - Warp w of a block owns the tile's rows n0 + 16w .. +15 and walks the whole slice in
//     steps of 64 k, kSkDepth steps of weights in flight in registers: the loads of step
//     s + kSkDepth go out as soon as step s's products are issued. The first kSkDepth steps
//     are requested before pdl_wait (weights are read-only during decode), so they overlap
//     the previous kernel's tail.
//   - x's slice goes through shared memory 256 k (kSkDepth steps, a "chunk") at a time, two
//     chunks double-buffered with cp.async, read by all 8 warps: the block reads x once from
//     L2 for 128 weight rows. Tokens M .. 8 TILES - 1 of the last 8-token tile are zeros.
//   - The product: mma.sync m16n8k16, weights as A (16 rows), 8 tokens as B. Lane (g =
//     lane / 4, t = lane % 4) loads, for each step, "lo" = k 8t .. 8t+7 and "hi" = k 32+8t
//     .. 32+8t+7 of its weight rows g and g + 8 (so each 16-byte load of the warp reads
//     whole 32-byte sectors) and the same k of its token g from shared memory: four 32-bit
//     words of two k each. mma 0 takes words 0 and 1 of lo, mma 1 words 2 and 3 of lo, mmas
//     2 and 3 the same of hi; the first word fills k slots 2t, 2t+1 and the second slots
//     2t+8, 2t+9, of the lane's rows (A) and of its token's column (B) alike. Over t = 0..3
//     an mma's 16 slots are 16 distinct k of the step and the four mma cover its 64: a
//     permutation of k both operands share, which leaves the product as it is.
//   - Each warp's sums (f32, 16 rows x 8 TILES tokens) go to shared memory; after a
//     cluster barrier, rank r finishes a 1/S share of the tile's outputs, adding the S
//     ranks' partials in rank order 0, 1, ..., S - 1 through distributed shared memory,
//     then + b[n], + residual[m, n], rounded once to T. A second cluster barrier keeps every
//     block's shared memory alive until the others have read it.
//
// The rule for S (splitk_clusters): the smallest S that gives every SM a block (ceil(N /
// BN) * S >= SMs), at most 8 (the portable cluster size) and dividing K / 64. One block a
// SM should be enough to stream: its 8 warps keep 8 x 4 x 2 KB = 64 KB of weights in
// flight, about twice an H200 SM's share of HBM's bandwidth-delay product (~4.8 TB/s x ~1
// us / 132 SMs, an estimate, not a measurement); a larger S would only add partial sums to
// reduce and x slices to stage. The 1B model's QKV (24 tiles), projection and fc2 (16
// tiles) get S = 8; a vocabulary-sized output layer gets S = 1.
//
// What else bounds it at 64 rows: each 16-byte weight word meets 8 tiles of x fragments,
// so an SM reads 4 bytes of shared memory per byte of weights (~half its shared-memory
// bandwidth while HBM streams at ~4 TB/s), and issues 32 mma per 2 KB. Giving a warp 32
// weight rows would halve the former at the cost of registers (fewer blocks an SM).
//
// Determinism and batch invariance: S and BN are functions of (N, K) and the SM count,
// never of M, so the k order of every output is fixed for a layer -- within a warp the
// slice's steps in order, 4 mma a step; then the ranks in order; then bias, residual. A
// token's column of an mma is computed alike whichever of the 8 slots it has and whatever
// the other columns hold, so row t's y depends on row t's x alone, bit for bit, in a batch of
// any size (tests/serve/decode_gpu_test.cpp checks it). Which thread finishes an output
// depends on M; what it adds, and in which order, does not.
//
// Needs sm_90 (clusters, distributed shared memory); launched with launch_dependent_clusters
// and keeping its contract (common.cuh): weights before pdl_wait, x, residual and y after.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "ops/cuda/common.cuh"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kSkWarps = 8;             // per block, 16 weight rows each
constexpr int kSkRows = 16 * kSkWarps;  // BN: weight rows of a tile (a cluster)
constexpr int kSkThreads = 32 * kSkWarps;
constexpr int kSkStep = 64;                   // k per warp step: 4 mma of k16
constexpr int kSkDepth = 4;                   // steps of weights in flight per warp
constexpr int kSkChunk = kSkStep * kSkDepth;  // k of x staged at a time (256)
constexpr int kSkMaxRows = 64;                // tokens: 8 tiles of 8
constexpr int kSkMaxCluster = 8;              // the portable cluster size
// A staged x row: the chunk plus 32 elements (64 bytes), so that the 8 lanes of a quarter
// warp -- tokens g, g + 1 at k offsets 8t -- read 8 different 16-byte bank groups.
constexpr int kSkLdx = kSkChunk + 32;
// A row (token) of partial sums: the tile's 128 rows plus 4 floats, so that a warp's store of
// one fragment element (tokens 2t, rows g) hits 32 different banks.
constexpr int kSkLdp = kSkRows + 4;

// Shared memory of a block: two chunks of x, later reused for the partial sums.
template <typename T>
constexpr size_t splitk_smem_bytes(int tiles) {
  const size_t xs = size_t(2) * 8 * tiles * kSkLdx * sizeof(T);
  const size_t part = size_t(8) * tiles * kSkLdp * sizeof(float);
  return xs > part ? xs : part;
}

template <typename T, int TILES>
static __global__ void __launch_bounds__(kSkThreads, 2)
    splitk_mma_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                      const T* __restrict__ res, T* __restrict__ y, int M, int64_t N, int64_t K,
                      int S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90; the launcher does not take this path below it
#else
  constexpr int R = 8 * TILES;  // tokens staged: M rounded up to whole 8-token tiles
  extern __shared__ __align__(16) unsigned char smem[];
  T* xs = reinterpret_cast<T*>(smem);            // [2][R][kSkLdx]: chunks c % 2
  float* part = reinterpret_cast<float*>(smem);  // [R][kSkLdp], after the last chunk
  cg::cluster_group cluster = cg::this_cluster();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane >> 2, t = lane & 3;
  const int rank = int(cluster.block_rank());  // blockIdx.x % S
  const int64_t n0 = int64_t(blockIdx.x / unsigned(S)) * kSkRows;
  const int64_t KS = K / S, k0 = rank * KS;  // the block's slice of K
  const int steps = int(KS / kSkStep), chunks = (steps + kSkDepth - 1) / kSkDepth;
  // A warp whose 16 rows all lie past N (the last tile) loads and multiplies nothing.
  const bool live = n0 + 16 * warp < N;
  const int64_t ra = std::min<int64_t>(n0 + 16 * warp + g, N - 1);
  const int64_t rb = std::min<int64_t>(n0 + 16 * warp + g + 8, N - 1);
  const T* wa = w + ra * K + k0 + 8 * t;
  const T* wb = w + rb * K + k0 + 8 * t;

  // Step s's weights into slot j = s % kSkDepth: rows g, g + 8 at k 8t.. and 32+8t.. of the
  // step. (live and s < steps are the same for the whole warp.)
  uint4 W[kSkDepth][4];  // [slot][row g lo, row g hi, row g+8 lo, row g+8 hi]
#pragma unroll
  for (int j = 0; j < kSkDepth; ++j) W[j][0] = W[j][1] = W[j][2] = W[j][3] = make_uint4(0, 0, 0, 0);
  auto load_step = [&](int j, int s) {
    if (live && s < steps) {
      const int64_t kb = int64_t(s) * kSkStep;
      W[j][0] = __ldg(reinterpret_cast<const uint4*>(wa + kb));
      W[j][1] = __ldg(reinterpret_cast<const uint4*>(wa + kb + 32));
      W[j][2] = __ldg(reinterpret_cast<const uint4*>(wb + kb));
      W[j][3] = __ldg(reinterpret_cast<const uint4*>(wb + kb + 32));
    }
  };
#pragma unroll
  for (int j = 0; j < kSkDepth; ++j) load_step(j, j);
  pdl_wait();  // x and residual are the previous kernels' outputs
  pdl_trigger();

  // Chunk c of the slice (its steps inside the slice only) into buffer c % 2; tokens past M
  // are zero-filled (cp.async reads nothing for them).
  auto stage_x = [&](int c) {
    T* buf = xs + (c & 1) * R * kSkLdx;
    const int64_t kc = k0 + int64_t(c) * kSkChunk;
    const int left = steps - c * kSkDepth;
    const int vecs = (left < kSkDepth ? left : kSkDepth) * (kSkStep / 8);  // 16 B a row
    constexpr int kRowVecs = kSkChunk / 8;
    for (int i = int(threadIdx.x); i < R * kRowVecs; i += kSkThreads) {
      const int m = i / kRowVecs, v = i % kRowVecs;
      if (v < vecs)
        cp_async16(buf + m * kSkLdx + 8 * v, x + int64_t(m < M ? m : 0) * K + kc + 8 * v, m < M);
    }
  };
  stage_x(0);
  cp_async_commit();
  if (chunks > 1) stage_x(1);
  cp_async_commit();  // (possibly empty: the group count stays one per chunk)

  float acc[TILES][4];
#pragma unroll
  for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<1>();  // this thread's copies of chunk c have landed ...
    __syncthreads();     // ... and everyone's
    const T* xc = xs + (c & 1) * R * kSkLdx + g * kSkLdx + 8 * t;
#pragma unroll
    for (int j = 0; j < kSkDepth; ++j) {
      const int s = c * kSkDepth + j;
      if (!live || s >= steps) continue;
#pragma unroll
      for (int tile = 0; tile < TILES; ++tile) {
        const T* xr = xc + tile * 8 * kSkLdx + j * kSkStep;  // token 8 tile + g
        const uint4 X0 = *reinterpret_cast<const uint4*>(xr);
        const uint4 X1 = *reinterpret_cast<const uint4*>(xr + 32);
        mma_step_words<T>(acc[tile], W[j], X0, X1);
      }
      load_step(j, s + kSkDepth);
    }
    __syncthreads();  // nobody reads buffer c % 2 any more
    if (c + 2 < chunks) stage_x(c + 2);
    cp_async_commit();
  }
  cp_async_wait<0>();  // (nothing is in flight: the last groups were empty)

  // The warp's partial sums into part[token][row]; fragment element i is row g (+8 for
  // i >= 2) of the warp's 16, token 8 tile + 2t + (i & 1). part reuses the x buffers: the
  // loop's last barrier has passed, so no warp reads them any more.
#pragma unroll
  for (int tile = 0; tile < TILES; ++tile)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      part[(8 * tile + 2 * t + (i & 1)) * kSkLdp + 16 * warp + g + (i >= 2 ? 8 : 0)] = acc[tile][i];
  cluster.sync();  // every rank's partials are written and visible to the cluster

  // Rank r finishes groups r, r + S, r + 2S, ... of 256 outputs of the tile's [M, BN]
  // (consecutive threads, consecutive n: coalesced y and residual), summing the ranks'
  // partials in rank order.
  const float* ranks[kSkMaxCluster];
#pragma unroll
  for (int q = 0; q < kSkMaxCluster; ++q)
    ranks[q] = q < S ? cluster.map_shared_rank(part, q) : part;
  for (int e = rank * kSkThreads + int(threadIdx.x); e < M * kSkRows; e += S * kSkThreads) {
    const int m = e / kSkRows, nl = e % kSkRows;
    const int64_t n = n0 + nl;
    if (n >= N) continue;
    const int off = m * kSkLdp + nl;
    float v = ranks[0][off];
#pragma unroll
    for (int q = 1; q < kSkMaxCluster; ++q)
      if (q < S) v += ranks[q][off];
    if (bias) v += to_f(bias[n]);
    if (res) v += to_f(res[int64_t(m) * N + n]);
    y[int64_t(m) * N + n] = from_f<T>(v);
  }
  cluster.sync();  // no block leaves while another still reads its partials
#endif
}

// S: blocks a tile, the split of K (the rule and why: the file's first comment).
int splitk_clusters(int64_t N, int64_t K) {
  const int64_t tiles = (N + kSkRows - 1) / kSkRows, steps = K / kSkStep;
  int S = 1;
  while (S < kSkMaxCluster && tiles * S < sm_count() && steps % (2 * S) == 0) S *= 2;
  return S;
}

template <typename T, int TILES>
void launch_tiles(int M, const T* x, const T* w, const T* b, const T* res, T* y, int64_t N,
                  int64_t K, cudaStream_t cs) {
  const int S = splitk_clusters(N, K);
  const size_t smem = splitk_smem_bytes<T>(TILES);
  auto kernel = splitk_mma_kernel<T, TILES>;
  if (smem > 48 * 1024)  // dynamic shared memory past 48 KB needs the kernel's consent
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t blocks = (N + kSkRows - 1) / kSkRows * S;
  launch_dependent_clusters(kernel, dim3(unsigned(blocks)), dim3(kSkThreads), unsigned(S), smem, cs,
                            x, w, b, res, y, M, N, K, S);
}

// launch_tiles for TILES = ceil(M / 8), one instance per tile count 1..8.
template <typename T>
void launch_splitk_typed(int64_t M, const T* x, const T* w, const T* b, const T* res, T* y,
                         int64_t N, int64_t K, cudaStream_t cs) {
  MCPP_CHECK(M >= 1 && M <= kSkMaxRows, "linear_decode: {} rows outside the split-K kernel's 1..{}",
             M, kSkMaxRows);
  const int tiles = int((M + 7) / 8);
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((tiles == I + 1 ? launch_tiles<T, I + 1>(int(M), x, w, b, res, y, N, K, cs) : void()), ...);
  }(std::make_integer_sequence<int, kSkMaxRows / 8>{});
}

}  // namespace

bool splitk_takes(DType dt, int64_t rows, int64_t K) {
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return sm90 && (dt == DType::BF16 || dt == DType::F16) && rows >= 1 && rows <= kSkMaxRows &&
         K >= kSkStep && K % kSkStep == 0;
}

bool splitk_for_auto() {
  static const bool on = [] {
    const char* e = std::getenv("MCPP_DECODE_SPLITK");
    return e && e[0] == '1';
  }();
  return on;
}

void launch_splitk(DType dt, int64_t M, const void* x, const void* w, const void* b,
                   const void* res, void* y, int64_t N, int64_t K, cudaStream_t cs) {
  if (dt == DType::BF16)
    launch_splitk_typed<bf16>(M, static_cast<const bf16*>(x), static_cast<const bf16*>(w),
                              static_cast<const bf16*>(b), static_cast<const bf16*>(res),
                              static_cast<bf16*>(y), N, K, cs);
  else if (dt == DType::F16)
    launch_splitk_typed<f16>(M, static_cast<const f16*>(x), static_cast<const f16*>(w),
                             static_cast<const f16*>(b), static_cast<const f16*>(res),
                             static_cast<f16*>(y), N, K, cs);
  else
    MCPP_FAIL("linear_decode: the split-K path takes bf16/f16, not {}", dtype_name(dt));
}

}  // namespace mcpp::ops::cuda
