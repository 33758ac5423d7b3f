// The MoE dispatch index on the device (catalogue.inc, moe_route_index): the rows of the
// routing's (token, slot) pairs grouped by expert, tokens ascending inside an expert, with
// Megatron's capacity and padding (model/moe/routing.h is the host reference; the CPU op,
// ops/cpu/moe_route.cpp, runs the same steps one after another).
// Determinism: no atomics decide an order. Dropless, a counting sort (tiles of tokens
// counted, scanned per expert, then a warp per tile walks its (token, slot) pairs in order,
// 32 at a time). With capacity or padding, a dense [E, T] table of each (expert, token)'s
// slot (or -1) and one block per (expert, block of tokens) segment:
//   1. drop: position policy, a scan of the segment's pairs in token order (rank >= cap
//      dropped); probs policy, one stable radix sort of all pairs by (segment, descending
//      weight), whose input is in token order, so equal weights keep the earlier token
//      (the host's stable_sort), and each segment's pairs past its first cap are dropped;
//   2. count each segment's kept pairs and its padding rows (moe_math::pad_rows);
//   3. scan the segments' rows (expert-major) into each segment's first row and the counts;
//   4. scan each segment's kept flags: a token's row is moe_math::row_in_block of its kept
//      and not-kept ranks (the first `pad` not-kept tokens are the padding rows);
//   5. the CSR: each token's rows by expert, which is ascending (rows are expert-major).
#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/moe_route_math.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

constexpr int kMaxK = int(kMoeRouteMaxTopkCuda);
constexpr int kTile = 256;  // tokens per counting-sort tile
constexpr int kThreads = 128;
unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// ---- dropless: the counting sort ------------------------------------------------------

// Counting sort, step 1: rows per (tile, expert).
__global__ void tile_count_kernel(const int64_t* __restrict__ idx, int64_t T_, int64_t k, int64_t E,
                                  int64_t* __restrict__ tile_counts) {
  __shared__ int cnt[1024];
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t t0 = blockIdx.x * int64_t(kTile);
  for (int64_t i = threadIdx.x; i < kTile * k; i += blockDim.x) {
    const int64_t t = t0 + i / k;
    if (t < T_) atomicAdd(&cnt[idx[t * k + i % k]], 1);  // integer counts: order-free
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) tile_counts[blockIdx.x * E + e] = cnt[e];
}

// Step 2 (one block of kScanThreads): counts per expert, each tile's first row per expert.
// A warp per expert scans its column of tile counts 32 tiles at a time (shuffles), then
// warp 0 scans the experts' totals the same way and every entry gets its expert's start.
constexpr int kScanThreads = 1024;
__device__ __forceinline__ int64_t warp_inclusive_scan(int64_t v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}
__global__ void __launch_bounds__(kScanThreads)
    tile_scan_kernel(int64_t* __restrict__ tile_counts, int64_t tiles, int64_t E,
                     int64_t* __restrict__ counts) {
  __shared__ int64_t first[1024];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = kScanThreads / 32;
  for (int64_t e = warp; e < E; e += warps) {
    int64_t carry = 0;
    for (int64_t b0 = 0; b0 < tiles; b0 += 32) {
      const int64_t b = b0 + lane;
      const int64_t c = b < tiles ? tile_counts[b * E + e] : 0;
      const int64_t inc = warp_inclusive_scan(c, lane);
      if (b < tiles) tile_counts[b * E + e] = carry + inc - c;  // exclusive, within e
      carry += __shfl_sync(0xffffffffu, inc, 31);
    }
    if (lane == 0) counts[e] = carry;
  }
  __syncthreads();
  if (warp == 0) {  // expert e's first row: the exclusive scan of the counts
    int64_t carry = 0;
    for (int64_t e0 = 0; e0 < E; e0 += 32) {
      const int64_t e = e0 + lane;
      const int64_t c = e < E ? counts[e] : 0;
      const int64_t inc = warp_inclusive_scan(c, lane);
      if (e < E) first[e] = carry + inc - c;
      carry += __shfl_sync(0xffffffffu, inc, 31);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < tiles * E; i += kScanThreads) tile_counts[i] += first[i % E];
}

// Step 3 (a warp per tile): the tile's (token, slot) pairs in order, 32 at a time; the
// lanes holding the same expert (__match_any_sync) take consecutive rows from that
// expert's running count, in lane order, so each expert's rows keep the pairs' order.
__global__ void __launch_bounds__(32)
    tile_fill_kernel(const int64_t* __restrict__ idx, int64_t T_, int64_t k, int64_t E,
                     const int64_t* __restrict__ tile_first, int64_t* __restrict__ src,
                     int64_t* __restrict__ row_slot, int64_t* __restrict__ slot_row) {
  __shared__ int64_t next[1024];
  const int lane = threadIdx.x;
  for (int64_t e = lane; e < E; e += 32) next[e] = tile_first[blockIdx.x * E + e];
  __syncwarp();
  const int64_t t0 = blockIdx.x * int64_t(kTile), t1 = min(T_, t0 + kTile);
  const unsigned below = (1u << lane) - 1u;
  for (int64_t i0 = t0 * k; i0 < t1 * k; i0 += 32) {
    const int64_t i = i0 + lane;
    const bool valid = i < t1 * k;
    const int e = valid ? int(idx[i]) : -1 - lane;  // invalid lanes match no one
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    int64_t n = 0;
    if (valid) n = next[e] + __popc(peers & below);
    __syncwarp();
    if (valid) {
      src[n] = i / k, row_slot[n] = i, slot_row[i] = n;
      if ((peers & below) == 0) next[e] += __popc(peers);  // the group's first lane
    }
    __syncwarp();
  }
}

// Step 4: each token's rows, ascending (moe_unpermute's CSR).
__global__ void csr_kernel(const int64_t* __restrict__ slot_row, int64_t T_, int64_t k,
                           int64_t* __restrict__ offsets, int64_t* __restrict__ rows) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t > T_) return;
  offsets[t] = t * k;
  if (t == T_) return;
  int64_t v[kMaxK];
  for (int64_t j = 0; j < k; ++j) {  // insertion sort of k values
    int64_t x = slot_row[t * k + j], q = j;
    for (; q > 0 && v[q - 1] > x; --q) v[q] = v[q - 1];
    v[q] = x;
  }
  for (int64_t j = 0; j < k; ++j) rows[t * k + j] = v[j];
}

// ---- capacity and padding ----------------------------------------------------------------

constexpr int kSegThreads = 512;  // one block per (expert, block of tokens) segment
using SegScan = cub::BlockScan<int, kSegThreads>;

// dense [E, T] (-1 beforehand): the slot of each of idx's (token, expert) pairs.
__global__ void dense_slot_kernel(const int64_t* __restrict__ idx, int64_t N, int64_t k, int64_t T_,
                                  int32_t* __restrict__ dense) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < N) dense[idx[i] * T_ + i / k] = int32_t(i % k);
}

// Step 1, probs policy: the sort keys, (segment, descending weight) as (high, low) bits.
__device__ __forceinline__ uint32_t descending(float p) {
  const uint32_t b = __float_as_uint(p);
  return ~((b & 0x80000000u) ? ~b : (b | 0x80000000u));  // ascending keys: descending p
}
__global__ void drop_keys_kernel(const int64_t* __restrict__ idx, const float* __restrict__ prob,
                                 int64_t N, int64_t k, int64_t Tb, int64_t nblocks,
                                 uint64_t* __restrict__ keys, int32_t* __restrict__ vals) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const uint64_t seg = uint64_t(idx[i] * nblocks + i / k / Tb);
  keys[i] = (seg << 32) | descending(prob[i]);
  vals[i] = int32_t(i);
}
// Each segment's first position in the sorted order.
__global__ void segment_first_kernel(const uint64_t* __restrict__ keys, int64_t N,
                                     int64_t* __restrict__ first) {
  const int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (q >= N) return;
  const uint64_t seg = keys[q] >> 32;
  if (q == 0 || (keys[q - 1] >> 32) != seg) first[seg] = q;
}
// Pairs past their segment's first cap: dropped (weight 0).
__global__ void drop_sorted_kernel(const uint64_t* __restrict__ keys,
                                   const int32_t* __restrict__ vals,
                                   const int64_t* __restrict__ first,
                                   const int64_t* __restrict__ idx, int64_t N, int64_t k,
                                   int64_t T_, int64_t cap, int32_t* __restrict__ dense,
                                   float* __restrict__ prob) {
  const int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (q >= N || q - first[keys[q] >> 32] < cap) return;
  const int64_t i = vals[q];
  dense[idx[i] * T_ + i / k] = -1;
  prob[i] = 0.f;
}

// Step 1, position policy: a segment's pairs in token order, those of rank >= cap dropped.
__global__ void __launch_bounds__(kSegThreads)
    drop_position_kernel(int64_t T_, int64_t Tb, int64_t nblocks, int64_t k, int64_t cap,
                         int32_t* __restrict__ dense, float* __restrict__ prob) {
  __shared__ SegScan::TempStorage tmp;
  const int64_t e = blockIdx.x / nblocks, t0 = blockIdx.x % nblocks * Tb;
  int32_t* d = dense + e * T_;
  int64_t carry = 0;  // the segment's pairs before this chunk
  for (int64_t c0 = 0; c0 < Tb; c0 += kSegThreads) {
    const int64_t t = t0 + c0 + threadIdx.x;
    const int32_t j = c0 + threadIdx.x < Tb ? d[t] : -1;
    int before = 0, total = 0;
    SegScan(tmp).ExclusiveSum(int(j >= 0), before, total);
    if (j >= 0 && carry + before >= cap) d[t] = -1, prob[t * k + j] = 0.f;
    carry += total;
    __syncthreads();  // tmp is reused
  }
}

// Step 2: a segment's kept pairs and padding rows; seg_rows = kept + pad, seg_bias the
// expert-bias count.
__global__ void __launch_bounds__(kSegThreads)
    segment_rows_kernel(const int32_t* __restrict__ dense, MoeRouteSpec r, int64_t T_, int64_t Tb,
                        int64_t nblocks, int64_t cap, int64_t* __restrict__ seg_rows,
                        int64_t* __restrict__ seg_pad, int64_t* __restrict__ seg_bias) {
  using Reduce = cub::BlockReduce<int, kSegThreads>;
  __shared__ Reduce::TempStorage tmp;
  const int64_t e = blockIdx.x / nblocks, t0 = blockIdx.x % nblocks * Tb;
  const int32_t* d = dense + e * T_;
  int mine = 0;
  for (int64_t t = threadIdx.x; t < Tb; t += kSegThreads) mine += d[t0 + t] >= 0;
  const int kept = Reduce(tmp).Sum(mine);  // thread 0's
  if (threadIdx.x == 0) {
    int64_t bias = 0;
    const int64_t pad = moe_math::pad_rows(r, kept, cap, Tb, &bias);
    seg_rows[blockIdx.x] = kept + pad, seg_pad[blockIdx.x] = pad, seg_bias[blockIdx.x] = bias;
  }
}

// Step 3 (one block): each segment's first row (the exclusive scan of seg_rows, expert-major)
// and each expert's counts.
constexpr int kScanBlock = 1024;
__global__ void __launch_bounds__(kScanBlock)
    segment_scan_kernel(const int64_t* __restrict__ seg_rows, const int64_t* __restrict__ seg_bias,
                        int64_t E, int64_t nblocks, int64_t* __restrict__ seg_row0,
                        int64_t* __restrict__ counts, int64_t* __restrict__ bias_counts) {
  using Scan = cub::BlockScan<int64_t, kScanBlock>;
  __shared__ Scan::TempStorage tmp;
  const int64_t S = E * nblocks;
  int64_t carry = 0;
  for (int64_t c0 = 0; c0 < S; c0 += kScanBlock) {
    const int64_t g = c0 + threadIdx.x;
    int64_t before = 0, total = 0;
    Scan(tmp).ExclusiveSum(g < S ? seg_rows[g] : int64_t(0), before, total);
    if (g < S) seg_row0[g] = carry + before;
    carry += total;
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < E; e += kScanBlock) {
    int64_t c = 0, b = 0;
    for (int64_t q = 0; q < nblocks; ++q)
      c += seg_rows[e * nblocks + q], b += seg_bias[e * nblocks + q];
    counts[e] = c, bias_counts[e] = b;
  }
}

// Step 4: every member of a segment (kept, or one of its first pad not-kept tokens) gets its
// row; dense then holds the row (or -1) for the CSR.
__global__ void __launch_bounds__(kSegThreads)
    segment_fill_kernel(int64_t T_, int64_t Tb, int64_t nblocks, int64_t k,
                        const int64_t* __restrict__ seg_row0, const int64_t* __restrict__ seg_pad,
                        int32_t* __restrict__ dense, int64_t* __restrict__ src,
                        int64_t* __restrict__ row_slot, int64_t* __restrict__ slot_row) {
  __shared__ SegScan::TempStorage tmp;
  const int64_t e = blockIdx.x / nblocks, t0 = blockIdx.x % nblocks * Tb;
  const int64_t row0 = seg_row0[blockIdx.x], pad = seg_pad[blockIdx.x];
  int32_t* d = dense + e * T_;
  int64_t carry = 0;  // kept tokens before this chunk
  for (int64_t c0 = 0; c0 < Tb; c0 += kSegThreads) {
    const bool in = c0 + threadIdx.x < Tb;
    const int64_t t = t0 + c0 + threadIdx.x;
    const int32_t j = in ? d[t] : -1;
    int before = 0, total = 0;
    SegScan(tmp).ExclusiveSum(int(j >= 0), before, total);
    const int64_t kb = carry + before, nk = (t - t0) - kb;
    const int64_t n = row0 + moe_math::row_in_block(kb, nk, pad);
    if (in && j >= 0) {
      src[n] = t, row_slot[n] = t * k + j, slot_row[t * k + j] = n, d[t] = int32_t(n);
    } else if (in && nk < pad) {
      src[n] = t, row_slot[n] = -1, d[t] = int32_t(n);
    }
    carry += total;
    __syncthreads();
  }
}

// Step 5: each token's rows, by expert (ascending): their number, then the rows.
__global__ void token_count_kernel(const int32_t* __restrict__ dense, int64_t T_, int64_t E,
                                   int64_t* __restrict__ per_token) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T_) return;
  int64_t c = 0;
  for (int64_t e = 0; e < E; ++e) c += dense[e * T_ + t] >= 0;
  per_token[t] = c;
}
__global__ void token_rows_kernel(const int32_t* __restrict__ dense, int64_t T_, int64_t E,
                                  const int64_t* __restrict__ offsets, int64_t* __restrict__ rows) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T_) return;
  int64_t m = offsets[t];
  for (int64_t e = 0; e < E; ++e) {
    const int32_t n = dense[e * T_ + t];
    if (n >= 0) rows[m++] = n;
  }
}

void check_i64(const Tensor& t, int64_t n, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::I64, "{}: {} is {}, expected i64", op, name, t.str());
  check_numel(t, n, op, name);
}

void check_rows(const Tensor& t, int64_t n, const char* op, const char* name) {
  check_cuda(t, op, name);
  MCPP_CHECK(t.dtype() == DType::I64 && t.numel() >= n,
             "{}: {} is {}, expected i64 of at least the {} rows the index may need", op, name,
             t.str(), n);
}

}  // namespace

void moe_route_index(const Tensor& idx, Tensor& prob, const MoeRouteSpec& r, int64_t nblocks,
                     Tensor& counts, Tensor& bias_counts, Tensor& src, Tensor& row_slot,
                     Tensor& slot_row, Tensor& offsets, Tensor& rows, Stream& s) {
  const char* op = "moe_route_index";
  const int64_t E = r.E, N = idx.numel(), T_ = offsets.numel() - 1, k = T_ > 0 ? N / T_ : 0;
  MCPP_CHECK(T_ > 0 && T_ * k == N && k >= 1 && k <= std::min<int64_t>(E, kMaxK) && E <= 1024,
             "{}: idx {} for offsets {} and {} experts", op, idx.str(), offsets.str(), E);
  MCPP_CHECK(nblocks >= 1 && T_ % nblocks == 0, "{}: {} tokens in {} blocks", op, T_, nblocks);
  const int64_t Nmax = moe_route_max_rows(r, T_, nblocks);
  check_i64(idx, N, op, "idx");
  check_i64(counts, E, op, "counts");
  check_i64(bias_counts, E, op, "bias_counts");
  check_i64(slot_row, N, op, "slot_row");
  check_i64(offsets, T_ + 1, op, "offsets");
  check_rows(src, Nmax, op, "src");
  check_rows(row_slot, Nmax, op, "row_slot");
  check_rows(rows, Nmax, op, "rows");
  cudaStream_t cs = stream_of(s);
  if (!r.shapes_rows()) {
    const int64_t tiles = (T_ + kTile - 1) / kTile;
    Tensor tile = Tensor::empty({tiles, E}, DType::I64, Device::CUDA);
    tile_count_kernel<<<unsigned(tiles), 256, 0, cs>>>(idx.data<int64_t>(), T_, k, E,
                                                       tile.data<int64_t>());
    tile_scan_kernel<<<1, kScanThreads, 0, cs>>>(tile.data<int64_t>(), tiles, E,
                                                 counts.data<int64_t>());
    tile_fill_kernel<<<unsigned(tiles), 32, 0, cs>>>(
        idx.data<int64_t>(), T_, k, E, tile.data<int64_t>(), src.data<int64_t>(),
        row_slot.data<int64_t>(), slot_row.data<int64_t>());
    csr_kernel<<<blocks(T_ + 1), kThreads, 0, cs>>>(slot_row.data<int64_t>(), T_, k,
                                                    offsets.data<int64_t>(), rows.data<int64_t>());
    MCPP_LAUNCH_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(bias_counts.raw(), counts.raw(), size_t(E) * sizeof(int64_t),
                               cudaMemcpyDeviceToDevice, cs));
    return;
  }
  const int64_t Tb = T_ / nblocks, S = E * nblocks, cap = r.drops() ? moe_capacity(r, Tb) : 0;
  MCPP_CHECK(E * T_ < (int64_t(1) << 31) && Nmax < (int64_t(1) << 31) && S < (int64_t(1) << 31),
             "{}: {} tokens x {} experts: more than 2^31 entries in the capacity index", op, T_, E);
  if (r.drops()) {
    check_f32(prob, op, "prob");
    check_numel(prob, N, op, "prob");
  }
  Tensor dense = Tensor::empty({E * T_}, DType::I32, Device::CUDA);
  CUDA_CHECK(cudaMemsetAsync(dense.raw(), 0xff, size_t(E * T_) * sizeof(int32_t), cs));
  CUDA_CHECK(cudaMemsetAsync(slot_row.raw(), 0xff, size_t(N) * sizeof(int64_t), cs));
  int32_t* dn = dense.data<int32_t>();
  dense_slot_kernel<<<blocks(N), kThreads, 0, cs>>>(idx.data<int64_t>(), N, k, T_, dn);
  if (r.drops() && r.drop_by_position) {
    drop_position_kernel<<<unsigned(S), kSegThreads, 0, cs>>>(T_, Tb, nblocks, k, cap, dn,
                                                              prob.data<float>());
  } else if (r.drops()) {
    Tensor keys = Tensor::empty({2 * N}, DType::I64, Device::CUDA);
    Tensor vals = Tensor::empty({2 * N}, DType::I32, Device::CUDA);
    Tensor first = Tensor::empty({S}, DType::I64, Device::CUDA);
    auto* k_in = reinterpret_cast<uint64_t*>(keys.raw());
    uint64_t* k_out = k_in + N;
    int32_t* v_in = vals.data<int32_t>();
    int32_t* v_out = v_in + N;
    drop_keys_kernel<<<blocks(N), kThreads, 0, cs>>>(idx.data<int64_t>(), prob.data<float>(), N, k,
                                                     Tb, nblocks, k_in, v_in);
    MCPP_LAUNCH_CHECK();
    int end_bit = 33;  // the weight's 32 bits, then the segment's
    while (end_bit < 64 && (int64_t(1) << (end_bit - 32)) < S) ++end_bit;
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, v_in, v_out,
                                               int(N), 0, end_bit, cs));
    Tensor temp =
        Tensor::empty({int64_t(std::max<size_t>(temp_bytes, 1))}, DType::U8, Device::CUDA);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, k_in, k_out, v_in, v_out,
                                               int(N), 0, end_bit, cs));
    segment_first_kernel<<<blocks(N), kThreads, 0, cs>>>(k_out, N, first.data<int64_t>());
    drop_sorted_kernel<<<blocks(N), kThreads, 0, cs>>>(k_out, v_out, first.data<int64_t>(),
                                                       idx.data<int64_t>(), N, k, T_, cap, dn,
                                                       prob.data<float>());
  }
  Tensor seg = Tensor::empty({4, S}, DType::I64, Device::CUDA);  // rows, pad, bias, first row
  int64_t* seg_rows = seg.data<int64_t>();
  int64_t *seg_pad = seg_rows + S, *seg_bias = seg_pad + S, *seg_row0 = seg_bias + S;
  segment_rows_kernel<<<unsigned(S), kSegThreads, 0, cs>>>(dn, r, T_, Tb, nblocks, cap, seg_rows,
                                                           seg_pad, seg_bias);
  segment_scan_kernel<<<1, kScanBlock, 0, cs>>>(seg_rows, seg_bias, E, nblocks, seg_row0,
                                                counts.data<int64_t>(),
                                                bias_counts.data<int64_t>());
  segment_fill_kernel<<<unsigned(S), kSegThreads, 0, cs>>>(
      T_, Tb, nblocks, k, seg_row0, seg_pad, dn, src.data<int64_t>(), row_slot.data<int64_t>(),
      slot_row.data<int64_t>());
  // offsets[0] = 0, offsets[t+1] = the inclusive scan of each token's rows.
  Tensor per_token = Tensor::empty({T_}, DType::I64, Device::CUDA);
  int64_t* off = offsets.data<int64_t>();
  token_count_kernel<<<blocks(T_), kThreads, 0, cs>>>(dn, T_, E, per_token.data<int64_t>());
  MCPP_LAUNCH_CHECK();
  CUDA_CHECK(cudaMemsetAsync(off, 0, sizeof(int64_t), cs));
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, per_token.data<int64_t>(), off + 1,
                                           int(T_), cs));
  Tensor temp = Tensor::empty({int64_t(std::max<size_t>(temp_bytes, 1))}, DType::U8, Device::CUDA);
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp.raw(), temp_bytes, per_token.data<int64_t>(),
                                           off + 1, int(T_), cs));
  token_rows_kernel<<<blocks(T_), kThreads, 0, cs>>>(dn, T_, E, off, rows.data<int64_t>());
  MCPP_LAUNCH_CHECK();
}

}  // namespace mcpp::ops::cuda
