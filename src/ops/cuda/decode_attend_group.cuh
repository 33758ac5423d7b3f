// The block body of the decode step's grouped-query attention (ops/cuda/decode.cu): one block
// of kWarps warps per (sequence, KV group) attends the group's G query heads over its
// cache rows -- attend_group, shared by decode_attention's group kernel and the fused RoPE +
// append + attention kernel, so the two give the same bits -- and the request of those rows
// ahead of the block's first loads (prefetch_group_rows). Included by decode.cu only.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"

namespace mcpp::ops::cuda::decode_group {

constexpr int kWarps = 8;  // a block's warps

// Attention sinks (AttentionDims::sink) as the decode kernels read them: the heads' sink
// logits in the parameter's dtype (f32, bf16 or f16), or none (p null). One kernel for every
// dtype: the read converts at run time, once a head and block.
struct Sinks {
  const void* p = nullptr;
  int kind = 0;  // 0 f32, 1 bf16, 2 f16
  __device__ __forceinline__ float at(int64_t h) const {
    return kind == 0   ? static_cast<const float*>(p)[h]
           : kind == 1 ? __bfloat162float(static_cast<const bf16*>(p)[h])
                       : __half2float(static_cast<const f16*>(p)[h]);
  }
};

// The first cache row the query at position q sees: q - window under a sliding window
// (AttentionDims::window_left, the same as its first_key), 0 without one (window < 0). The
// kernels attend over rows [first, q] by starting their row pointers at `first`.
__device__ __forceinline__ int64_t window_first_key(int64_t q, int64_t window) {
  return window >= 0 && q > window ? q - window : 0;
}

// Requests the cache rows [0, len) of one (sequence, group) that warp w's chunks will read
// (keys w*32 + lane, w*32 + lane + kWarps*32, ...: each lane its own key's K and V rows, one
// request per 128-byte line) before the block's first dependent loads: the scores' K loads
// and the V loop then find their lines in L1 (level 2) or L2 (level 1) instead of waiting on
// DRAM once per chunk and again per eight V rows. level 0: nothing. A prefetch reads no
// value, so the results are the same bits with and without it.
template <typename T, int HD>
__device__ __forceinline__ void prefetch_group_rows(const T* ks, const T* vs, int64_t len,
                                                    int64_t C, int level) {
  if (level == 0) return;
  constexpr int kLine = 128 / int(sizeof(T));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t k = int64_t(warp) * 32 + lane; k < len; k += kWarps * 32) {
#pragma unroll
    for (int c = 0; c < HD; c += kLine) {
      const T* kp = ks + k * C + c;
      const T* vp = vs + k * C + c;
      if (level == 2) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"(kp));
        asm volatile("prefetch.global.L1 [%0];" ::"l"(vp));
      } else {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kp));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vp));
      }
    }
  }
}

// N elements of a cache row at p (a lane's piece of a V row, N elements into the row times
// the lane) widened to f32: one 4-, 8- or 16-byte word where vec (the row starts on 16
// bytes), element by element otherwise. A plain load: the fused kernel reads rows it wrote.
template <typename T, int N>
__device__ __forceinline__ void load_row_piece(const T* p, bool vec, float (&v)[N]) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (vec) {
      using W = std::conditional_t<kBytes == 4, unsigned, std::conditional_t<kBytes == 8, uint2, uint4>>;
      const W u = *reinterpret_cast<const W*>(p);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = to_f(e[j]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = to_f(p[j]);
}

// G floats between registers and shared memory in 16-byte pieces (G = 4, 8), one 8-byte
// piece (G = 2) or one float: a lane's probabilities in one store, a key's in one load.
template <int G>
__device__ __forceinline__ void store_g(float* s, const float (&x)[G]) {
  if constexpr (G % 4 == 0) {
#pragma unroll
    for (int h = 0; h < G; h += 4)
      *reinterpret_cast<float4*>(s + h) = make_float4(x[h], x[h + 1], x[h + 2], x[h + 3]);
  } else if constexpr (G == 2) {
    *reinterpret_cast<float2*>(s) = make_float2(x[0], x[1]);
  } else {
    s[0] = x[0];
  }
}
template <int G>
__device__ __forceinline__ void load_g(const float* s, float (&x)[G]) {
  if constexpr (G % 4 == 0) {
#pragma unroll
    for (int h = 0; h < G; h += 4) {
      const float4 f = *reinterpret_cast<const float4*>(s + h);
      x[h] = f.x, x[h + 1] = f.y, x[h + 2] = f.z, x[h + 3] = f.w;
    }
  } else if constexpr (G == 2) {
    const float2 f = *reinterpret_cast<const float2*>(s);
    x[0] = f.x, x[1] = f.y;
  } else {
    x[0] = s[0];
  }
}

// A decode step (S = 1) of a grouped-query model: one block per (sequence, query group)
// holding all G = NH/NG query heads of the group, so each key and value row of the cache is
// read once for the G heads instead of once per head (decode.cu's per-head kernel reads the
// group's rows G times and runs B x NH blocks whose warps mostly sit idle at a few hundred
// keys). Warp w takes the 32-key chunks w, w + kWarps, ...; lane l scores key k0 + l against
// the G queries (kept in shared memory as f32, scaled), the chunk's softmax update is one
// warp max and one warp sum per head, and lane l accumulates dims [l*D, l*D + D) of each
// head's output over the chunk's V rows, the probabilities broadcast by shuffles. The warps'
// partial (max, sum, accumulator) per head combine in shared memory as flash-decoding's split-K does.
// attend_group is that block's work once its queries are in q_s: decode_attention's group
// kernel loads them from qkv, rope_attention_decode's kernel rotates them first; one body,
// so the two give the same bits. ks, vs: the group's rows of the sequence's cache slot (row
// stride C); keys 0 .. len - 1; o: the block's G output heads [G, HD]; sinks (p null: none)
// the heads' sinks, sinks.at(h0 + h) the block's head h's: one more logit in its softmax.
// kNc: the 16-byte K loads through the read-only path (__ldg), which is undefined for data
// the kernel itself writes, so decode_attention's kernel only. Otherwise __ldca: ld.global
// with a plain load's caching, coherent with the block's own writes after a barrier; as an
// intrinsic rather than a dereference because with the dereference the compiler schedules
// the loop differently and the 1B model's <bf16, 4, 2> spills 44 bytes, not the 12 of the
// group kernel.
// kPs (MCPP_DECODE_ATTN_PSMEM, default on): the V loop takes each key's G probabilities from
// shared memory in one vector load (each lane stores its key's once a chunk) instead of G
// shuffles, and a lane's D value elements in one 4-16 byte load where vec, instead of D
// loads: the kernel is bound by the instructions it issues (the keys split finer over the
// warps, which leaves lanes idle while they score, was slower: 21.4 against 19.2 us at 64
// sequences). The same products summed in the same order: the same bits either way.
template <typename T, int G, int D, bool kNc, bool kPs>
__device__ __forceinline__ void attend_group(const float (&q_s)[G][32 * D], const T* ks,
                                             const T* vs, int64_t len, int64_t C, bool vec, T* o,
                                             Sinks sinks = {}, int64_t h0 = 0) {
  constexpr int HD = 32 * D;
  __shared__ float m_s[kWarps][G], l_s[kWarps][G];
  __shared__ float acc_s[kWarps][G][HD];
  __shared__ __align__(16) float p_s[kPs ? kWarps : 1][32][G];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float m[G], l[G], acc[G][D];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[h][d] = 0.f;
  }
  for (int64_t k0 = int64_t(warp) * 32; k0 < len; k0 += kWarps * 32) {
    const int64_t k = k0 + lane;
    float sc[G];
#pragma unroll
    for (int h = 0; h < G; ++h) sc[h] = 0.f;
    if (k < len) {
      const T* kr = ks + k * C;
      if (vec) {
        constexpr int E = 16 / sizeof(T);
        const uint4* r4 = reinterpret_cast<const uint4*>(kr);
#pragma unroll 4
        for (int c0 = 0; c0 < HD; c0 += E) {
          uint4 u;
          if constexpr (kNc)
            u = __ldg(r4 + c0 / E);
          else
            u = __ldca(r4 + c0 / E);
          const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
          for (int j = 0; j < E; ++j) {
            const float kv = to_f(e[j]);
#pragma unroll
            for (int h = 0; h < G; ++h) sc[h] += q_s[h][c0 + j] * kv;
          }
        }
      } else {
        for (int c = 0; c < HD; ++c) {
          const float kv = to_f(kr[c]);
#pragma unroll
          for (int h = 0; h < G; ++h) sc[h] += q_s[h][c] * kv;
        }
      }
    }
    float p[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float s = k < len ? sc[h] : -INFINITY;
      float mc = s;
#pragma unroll
      for (int off = 16; off > 0; off /= 2) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
      const float m_new = fmaxf(m[h], mc);  // finite: lane 0's key k0 < len
      const float corr = __expf(m[h] - m_new);
      p[h] = k < len ? __expf(s - m_new) : 0.f;
      float ps = p[h];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) ps += __shfl_xor_sync(0xffffffffu, ps, off);
      l[h] = l[h] * corr + ps;
#pragma unroll
      for (int d = 0; d < D; ++d) acc[h][d] *= corr;
      m[h] = m_new;
    }
    const int n = int(len - k0 < 32 ? len - k0 : 32);
    if constexpr (kPs) {
      __syncwarp();  // (the chunk before has read p_s)
      store_g<G>(p_s[warp][lane], p);
      __syncwarp();
#pragma unroll 4
      for (int t = 0; t < n; ++t) {  // (unrolled: the V-row loads of 4 keys in flight at once)
        float v[D], pt[G];
        load_row_piece<T, D>(vs + (k0 + t) * C + lane * D, vec, v);
        load_g<G>(p_s[warp][t], pt);
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
          for (int d = 0; d < D; ++d) acc[h][d] += pt[h] * v[d];
      }
    } else {
#pragma unroll 8
      for (int t = 0; t < n; ++t) {  // (unrolled: the V-row loads of 8 keys in flight at once)
        const T* vr = vs + (k0 + t) * C + lane * D;
        float v[D];
#pragma unroll
        for (int d = 0; d < D; ++d) v[d] = to_f(vr[d]);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float pt = __shfl_sync(0xffffffffu, p[h], t);
#pragma unroll
          for (int d = 0; d < D; ++d) acc[h][d] += pt * v[d];
        }
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) m_s[warp][h] = m[h], l_s[warp][h] = l[h];
  }
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int d = 0; d < D; ++d) acc_s[warp][h][lane * D + d] = acc[h][d];
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
    const int h = idx / HD, c = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w][h]);
    float L = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wgt = m_s[w][h] == -INFINITY ? 0.f : __expf(m_s[w][h] - M);  // no keys
      L += l_s[w][h] * wgt;
      a += acc_s[w][h][c] * wgt;
    }
    if (sinks.p) L += __expf(sinks.at(h0 + h) - M);  // the sink's logit: no value
    o[idx] = from_f<T>(a / L);
  }
}

}  // namespace mcpp::ops::cuda::decode_group
