// The inference ops of the catalogue's `---- inference` section, CUDA backend; the CPU
// backend (ops/cpu/decode.cpp) is the reference (tests/serve/decode_gpu_test.cpp).
//
// decode_attention: one query row per (row, sequence, head) against its cache slot,
//   qkv [S, B, NG, G + 2, HD] (G = NH/NG), pos [B] i64, caches [B, Tmax, NG, HD],
//   out [S, B, NH*HD]; row i of sequence b sees keys 0 .. pos[b] + i (under a sliding
//   window from AttentionDims::first_key: each kernel starts its row pointers there).
//   A decode step (S = 1) runs decode_attention_group_kernel where it has an instance
//   (HD 32/64/128, G = NH/NG 1/2/4/8): a block per (sequence, group) reads each cache row
//   once for the group's G heads (measured on an H200: the per-head kernel below took ~100
//   us a layer at 64 sequences of 130 keys, re-reading each row G times). Otherwise:
//   A decode step reads the whole cache once and does 2*HD flops per key, so it is
//   memory- and latency-bound: a block of kWarps warps per (i, b, h) splits the keys (warp
//   w takes chunks w, w + kWarps, ... of 32 keys), so one sequence's 32 heads still keep
//   8 x 32 warps busy at one stream, each with one or two chunks of a 256-key cache. Within
//   a chunk each lane scores one key (a whole K row from its own cache lines, 16-byte
//   loads), the chunk's softmax update is one warp max and one warp sum, then every lane
//   accumulates HD/32 output dims over the chunk's V rows (coalesced), the probabilities
//   broadcast by shuffles. The warps' partial (max, sum, accumulator) combine in shared
//   memory as flash-decoding's split-K does. f32 throughout.
// rope_decode: ops/cuda/decode_rope.cu.
// rope_attention_decode: a decode step's whole attention, one launch a layer where the group
//   kernel has an instance: rope_attention_group_kernel, a block per (sequence, group),
//   rotates the group's query heads and its key at pos[b], appends the key and value to
//   the cache, then attends with the group kernel's body (attend_group, in
//   ops/cuda/decode_attend_group.cuh), so its bits are
//   those of rope_append_kernel followed by decode_attention -- which is what runs for the
//   other head shapes. The RoPE pieces (the angle, the rotation, the table, rope_decode and
//   the rotate-and-append kernel of the other head shapes): ops/cuda/decode_rope.cu.
// argmax_rows: ops/cuda/argmax.cu.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/decode_attend_group.cuh"
#include "ops/cuda/decode_rope.cuh"
#include "ops/kv_cache_checks.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

using namespace decode_group;  // kWarps, prefetch_group_rows, attend_group (decode_attend_group.cuh)
constexpr int kMaxHD = 256;                 // smem q and 8 dims per lane
constexpr int kDimsPerLane = kMaxHD / 32;

// Weights that a decode step reads after its attention (the projection, then the MLP's
// first weight), requested into L2 by the first `blocks` blocks of rope_attention_decode's
// kernel while its other blocks attend: a one-row step's attention keeps 8 of the H200's
// 132 SMs busy for several microseconds in which DRAM would otherwise idle. Two byte ranges,
// each thread requesting pieces of kPiece bytes (Hopper's bulk L2 prefetch; a line at a time
// before sm_90). Weights are written by no kernel of the step, so the blocks need not wait
// for the kernel before them.
struct L2Ahead {
  const char* p[2] = {nullptr, nullptr};
  int64_t n[2] = {0, 0};
  int blocks = 0;
};

int decode_attention_prefetch();  // (below, with the other switches read on the host)
bool decode_attention_psmem();

__device__ __forceinline__ void l2_ahead(const L2Ahead& a) {
  constexpr int64_t kPiece = 4096;
  const int64_t nt = int64_t(a.blocks) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    for (int64_t off = tid * kPiece; off < a.n[r]; off += nt * kPiece) {
      const char* q = a.p[r] + off;
      const int64_t left = a.n[r] - off;
      const unsigned sz = unsigned(left < kPiece ? left : kPiece) & ~15u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (sz > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q), "r"(sz) : "memory");
#else
      for (unsigned i = 0; i < sz; i += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(q + i));
#endif
    }
  }
}

// dot(q_s[0..HD), row[0..HD)) with 16-byte loads when the row allows them.
template <typename T>
__device__ __forceinline__ float row_dot(const float* q_s, const T* row, int HD, bool vec) {
  float dot = 0.f;
  constexpr int E = 16 / sizeof(T);
  if (vec) {
    const uint4* r4 = reinterpret_cast<const uint4*>(row);
#pragma unroll 4
    for (int c0 = 0; c0 < HD; c0 += E) {
      const uint4 u = __ldg(r4 + c0 / E);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < E; ++j) dot += q_s[c0 + j] * to_f(e[j]);
    }
  } else {
    for (int c = 0; c < HD; ++c) dot += q_s[c] * to_f(row[c]);
  }
  return dot;
}

// sink: attention sinks (AttentionDims::sink, [NH]), or null.
template <typename T, typename W>
static __global__ void __launch_bounds__(kWarps * 32)
    decode_attention_kernel(const T* __restrict__ qkv, const int64_t* __restrict__ pos,
                            const T* __restrict__ kc, const T* __restrict__ vc,
                            T* __restrict__ out, int64_t B, int NH, int NG, int HD,
                            int64_t Tmax, float scale, bool vec, const W* __restrict__ sink,
                            int64_t window) {
  __shared__ float q_s[kMaxHD];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxHD];
  const int h = blockIdx.x % NH;
  const int64_t ib = blockIdx.x / NH, b = ib % B, i = ib / B;  // row i of sequence b
  const int G = NH / NG, g = h / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t lo = window_first_key(pos[b] + i, window), len = pos[b] + i + 1 - lo;
  const int64_t C = int64_t(NG) * HD;
  const T* q = qkv + ib * int64_t(NG) * (G + 2) * HD + (int64_t(g) * (G + 2) + h % G) * HD;
  for (int c = threadIdx.x; c < HD; c += blockDim.x) q_s[c] = to_f(q[c]) * scale;
  __syncthreads();
  const T* ks = kc + (b * Tmax + lo) * C + int64_t(g) * HD;  // keys lo .. pos[b] + i
  const T* vs = vc + (b * Tmax + lo) * C + int64_t(g) * HD;

  float m = -INFINITY, l = 0.f, acc[kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) acc[j] = 0.f;
  for (int64_t k0 = int64_t(warp) * 32; k0 < len; k0 += kWarps * 32) {
    const int64_t k = k0 + lane;
    const float s = k < len ? row_dot(q_s, ks + k * C, HD, vec) : -INFINITY;
    float mc = s;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, off));
    const float m_new = fmaxf(m, mc);  // finite: lane 0's key k0 < len
    const float corr = __expf(m - m_new);
    const float p = k < len ? __expf(s - m_new) : 0.f;
    float ps = p;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) ps += __shfl_xor_sync(0xffffffffu, ps, off);
    l = l * corr + ps;
#pragma unroll
    for (int j = 0; j < kDimsPerLane; ++j) acc[j] *= corr;
    const int n = int(len - k0 < 32 ? len - k0 : 32);
#pragma unroll 8
    for (int t = 0; t < n; ++t) {  // (unrolled: the V-row loads of 8 keys in flight at once)
      const float pt = __shfl_sync(0xffffffffu, p, t);
      const T* vr = vs + (k0 + t) * C;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) {
        const int c = lane + 32 * j;
        if (c < HD) acc[j] += pt * to_f(vr[c]);
      }
    }
    m = m_new;
  }
  // Split-K combine: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M).
  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
#pragma unroll
  for (int j = 0; j < kDimsPerLane; ++j) {
    const int c = lane + 32 * j;
    if (c < HD) acc_s[warp][c] = acc[j];
  }
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_s[w]);
  float L = 0.f, wgt[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = m_s[w] == -INFINITY ? 0.f : __expf(m_s[w] - M);  // a warp without keys
    L += l_s[w] * wgt[w];
  }
  if (sink) L += __expf(to_f(sink[h]) - M);  // the sink's logit: no value
  T* o = out + (ib * NH + h) * int64_t(HD);
  for (int c = threadIdx.x; c < HD; c += blockDim.x) {
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) a += acc_s[w][c] * wgt[w];
    o[c] = from_f<T>(a / L);
  }
}


// Four blocks an SM where G * HD <= 256 (the 1B model's 4 x 64: 66 registers would leave
// three, and 64 sequences x 8 groups = 512 blocks would run in two waves on the H200's 132
// SMs, nearly doubling the kernel's time at 64 streams).
template <typename T, int G, int D, bool kPs>
static __global__ void __launch_bounds__(kWarps * 32, G * 32 * D <= 256 ? 4 : 1)
    decode_attention_group_kernel(const T* __restrict__ qkv, const int64_t* __restrict__ pos,
                                  const T* __restrict__ kc, const T* __restrict__ vc,
                                  T* __restrict__ out, int NG, int64_t Tmax, float scale,
                                  bool vec, int prefetch, Sinks sinks, int64_t window) {
  constexpr int HD = 32 * D;
  __shared__ float q_s[G][HD];
  pdl_wait();  // (launch_dependent: everything below reads the step's tensors)
  pdl_trigger();
  const int g = blockIdx.x % NG;
  const int64_t b = blockIdx.x / NG;
  const int64_t C = int64_t(NG) * HD;
  const int64_t lo = window_first_key(pos[b], window), len = pos[b] + 1 - lo;
  const int64_t cache = (b * Tmax + lo) * C + int64_t(g) * HD;  // from key lo
  prefetch_group_rows<T, HD>(kc + cache, vc + cache, len, C, prefetch);
  const T* q = qkv + (b * NG + g) * int64_t(G + 2) * HD;  // the group's G query heads
  for (int c = threadIdx.x; c < G * HD; c += blockDim.x) q_s[c / HD][c % HD] = to_f(q[c]) * scale;
  __syncthreads();
  attend_group<T, G, D, true, kPs>(q_s, kc + cache, vc + cache, len, C, vec,
                                   out + (b * NG + g) * int64_t(G) * HD, sinks, int64_t(g) * G);
}

// rope_attention_decode where the group kernel has an instance: the whole step of one
// (sequence b, group g) in one block, RoPE and the cache append ahead of attend_group (one
// launch a layer instead of rope_append_kernel's and the group kernel's). Threads [0, half)
// each own a rotary pair i: the angle once, then the pair of each of the G query heads
// rotated in place in qkv and into q_s, and the key's pair rotated into the cache row
// pos[b]; threads [half, half + HD) each own a dim c: the value to the cache row and, past
// rot_dim, the key and the queries as they are. q_s gets the query rounded to T, then
// scaled, as the group kernel reads it from the rotated qkv: scaling the unrounded f32
// would change the scores' bits. qkv's key head stays unrotated, and no thread reads what
// another writes before the barrier.
// Then the block attends over the cache rows it just wrote (key and value pos[b]): kc and
// vc are not __restrict__ const and no load of them takes the read-only path
// (attend_group<..., false>), and __syncthreads makes the block's global writes visible to
// its threads. The group kernel's register bound: the 1B model's 4 blocks an SM.
template <typename T, int G, int D, bool kPs>
static __global__ void __launch_bounds__(kWarps * 32, G * 32 * D <= 256 ? 4 : 1)
    rope_attention_group_kernel(T* qkv, const int64_t* __restrict__ pos, T* kc, T* vc,
                                T* __restrict__ out, int NG, int64_t Tmax, int half, int rot_dim,
                                RopeFreqs freqs, float scale, bool vec, int prefetch, L2Ahead ahead,
                                const float2* __restrict__ rope_tab, Sinks sinks,
                                int64_t window) {
  constexpr int HD = 32 * D;
  __shared__ float q_s[G][HD];
  if (int(blockIdx.x) < ahead.blocks) {  // (the weights read next: no wait, see L2Ahead)
    l2_ahead(ahead);
    return;
  }
  pdl_wait();  // (launch_dependent: everything below reads or writes the step's tensors)
  pdl_trigger();
  const int blk = int(blockIdx.x) - ahead.blocks;
  const int g = blk % NG;
  const int64_t b = blk / NG, p = pos[b];
  const int64_t C = int64_t(NG) * HD;
  T* head = qkv + (b * NG + g) * int64_t(G + 2) * HD;  // G query heads, the key, the value
  const int64_t cache = b * Tmax * C + int64_t(g) * HD;
  // The earlier positions' rows the query sees (from lo), requested while the angles are
  // computed (row p is the block's own append, written below).
  const int64_t lo = window_first_key(p, window);
  prefetch_group_rows<T, HD>(kc + cache + lo * C, vc + cache + lo * C, p - lo, C, prefetch);
  T* kr = kc + cache + p * C;  // the group's cache rows at position p
  T* vr = vc + cache + p * C;
  for (int t = threadIdx.x; t < half + HD; t += blockDim.x) {
    if (t < half) {
      float cs, sn;
      if (rope_tab) {  // (decode_rope_table: the same two floats, computed once)
        const float2 e = rope_tab[p * half + t];
        cs = e.x, sn = e.y;
      } else {
        rope_angle(p, t, rot_dim, freqs, cs, sn);
      }
#pragma unroll
      for (int j = 0; j <= G; ++j) {  // G query heads, then the key
        T o1, o2;
        rope_rotate(to_f(head[j * HD + t]), to_f(head[j * HD + t + half]), cs, sn, o1, o2);
        if (j < G) {
          head[j * HD + t] = o1, head[j * HD + t + half] = o2;
          q_s[j][t] = to_f(o1) * scale, q_s[j][t + half] = to_f(o2) * scale;
        } else {
          kr[t] = o1, kr[t + half] = o2;
        }
      }
    } else {
      const int c = t - half;
      vr[c] = head[(G + 1) * HD + c];  // the value head follows the key head
      if (c >= rot_dim) {              // past the rotary dims the key and queries pass through
        kr[c] = head[G * HD + c];
#pragma unroll
        for (int j = 0; j < G; ++j) q_s[j][c] = to_f(head[j * HD + c]) * scale;
      }
    }
  }
  __syncthreads();
  attend_group<T, G, D, false, kPs>(q_s, kc + cache + lo * C, vc + cache + lo * C, p + 1 - lo,
                                    C, vec, out + (b * NG + g) * int64_t(G) * HD, sinks,
                                    int64_t(g) * G);
}

// f.template operator()<G, D>() for the group kernels' instance of (G, HD) -- G in {1, 2,
// 4, 8}, HD = 32 D in {32, 64, 128}, so G * HD <= 1024 (their shared memory) -- and true;
// false where there is none.
template <typename F>
bool with_group_instance(int64_t G, int64_t HD, F&& f) {
#define MCPP_GROUP_CASE(GG, DD)      \
  if (G == GG && HD == 32 * DD) {    \
    f.template operator()<GG, DD>(); \
    return true;                     \
  }
  MCPP_GROUP_CASE(1, 1) MCPP_GROUP_CASE(1, 2) MCPP_GROUP_CASE(1, 4)
  MCPP_GROUP_CASE(2, 1) MCPP_GROUP_CASE(2, 2) MCPP_GROUP_CASE(2, 4)
  MCPP_GROUP_CASE(4, 1) MCPP_GROUP_CASE(4, 2) MCPP_GROUP_CASE(4, 4)
  MCPP_GROUP_CASE(8, 1) MCPP_GROUP_CASE(8, 2) MCPP_GROUP_CASE(8, 4)
#undef MCPP_GROUP_CASE
  return false;
}

// AttentionDims::sink as the group kernels read it (none when undefined).
Sinks sinks_of(const AttentionDims& d) {
  if (!d.sink.defined()) return {};
  const DType t = d.sink.dtype();
  MCPP_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16,
             "decode attention: sink logits {} are not f32, bf16 or f16", d.sink.str());
  return {d.sink.raw(), t == DType::F32 ? 0 : t == DType::BF16 ? 1 : 2};
}

// The group kernel for d's (G, HD) when it has an instance; false otherwise.
template <typename T>
bool launch_group(const T* qkv, const int64_t* pos, const T* kc, const T* vc, T* out,
                  const AttentionDims& d, int64_t Tmax, float scale, bool vec, cudaStream_t cs) {
  return with_group_instance(d.NH / d.NG, d.HD, [&]<int G, int D>() {
    launch_dependent(decode_attention_psmem() ? decode_attention_group_kernel<T, G, D, true>
                                              : decode_attention_group_kernel<T, G, D, false>,
                     unsigned(d.B * d.NG), kWarps * 32, 0, cs, qkv, pos, kc, vc, out, int(d.NG),
                     Tmax, scale, vec, decode_attention_prefetch(), sinks_of(d), d.window_left);
  });
}

// 16-byte K-row loads (and word loads of V-row pieces): every row starts at a multiple of HD
// elements from the base.
bool vec_rows(const Tensor& qkv, const AttentionDims& d, const Tensor& k_cache,
              const Tensor& v_cache) {
  return (d.HD * int64_t(dtype_size(qkv.dtype()))) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(k_cache.raw()) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v_cache.raw()) % 16 == 0;
}

// MCPP_DECODE_ATTN_PREFETCH (docs/environment.md): 0 none, 1 the cache rows into L2, 2
// into L1 (the default). Read at every launch (a captured step keeps its launch's), so a
// test can compare the levels in one process.
int decode_attention_prefetch() {
  const char* e = std::getenv("MCPP_DECODE_ATTN_PREFETCH");
  if (!e || !*e) return 2;
  const std::string v = e;
  MCPP_CHECK_HINT(v == "0" || v == "1" || v == "2", "set it to 0, 1 or 2 (docs/environment.md)",
                  "MCPP_DECODE_ATTN_PREFETCH={} is not 0, 1 or 2", v);
  return v[0] - '0';
}

// MCPP_DECODE_ATTN_PSMEM (docs/environment.md): 1 (the default) the group kernels' V loop
// with the probabilities in shared memory and word loads (attend_group's kPs), 0 shuffles.
// Read at every launch.
bool decode_attention_psmem() {
  const char* e = std::getenv("MCPP_DECODE_ATTN_PSMEM");
  if (!e || !*e) return true;
  const std::string v = e;
  MCPP_CHECK_HINT(v == "0" || v == "1", "set it to 0 or 1 (docs/environment.md)",
                  "MCPP_DECODE_ATTN_PSMEM={} is not 0 or 1", v);
  return v == "1";
}

// The bytes of the weights read next that rope_attention_decode requests into L2:
// MCPP_DECODE_L2_AHEAD_MB (docs/environment.md; 0 turns it off).
int64_t l2_ahead_budget() {
  const char* e = std::getenv("MCPP_DECODE_L2_AHEAD_MB");
  int64_t mb = 24;
  if (e && *e) {
    char* end = nullptr;
    mb = std::strtoll(e, &end, 10);
    MCPP_CHECK_HINT(end && *end == 0 && mb >= 0 && mb <= 4096,
                    "set it to a number of MiB, 0 to turn it off (docs/environment.md)",
                    "MCPP_DECODE_L2_AHEAD_MB={} is not a number of MiB in [0, 4096]", e);
  }
  return mb << 20;
}

// The ranges of l2_next (device tensors, in order) within the budget, and the blocks that
// request them: one per 512 KiB, at most 32.
L2Ahead l2_ahead_of(std::span<const Tensor* const> next, const char* op) {
  L2Ahead a;
  int64_t left = l2_ahead_budget();
  int r = 0;
  for (const Tensor* t : next) {
    if (!t || !t->defined() || left <= 0 || r == 2) continue;
    check_cuda(*t, op, "l2_next");
    const int64_t n = std::min<int64_t>(t->numel() * int64_t(dtype_size(t->dtype())), left);
    if (n < 16 || !is_aligned16(t->raw())) continue;
    a.p[r] = static_cast<const char*>(t->raw()), a.n[r] = n;
    left -= n, ++r;
  }
  const int64_t total = a.n[0] + a.n[1];
  a.blocks = int(std::min<int64_t>(32, (total + (512 << 10) - 1) >> 19));
  return a;
}

}  // namespace

void decode_attention(const Tensor& qkv, const AttentionDims& d, const Tensor& pos,
                      double softmax_scale, const Tensor& k_cache, const Tensor& v_cache,
                      Tensor& out, Stream& s) {
  const char* op = "decode_attention";
  for (auto [t, name] : {std::pair{&qkv, "qkv"}, {&pos, "pos"}, {&k_cache, "k_cache"},
                         {&v_cache, "v_cache"}, {static_cast<const Tensor*>(&out), "out"}})
    check_cuda(*t, op, name);
  check_kv_cache_args(op, qkv, d, pos, k_cache, v_cache, out);
  MCPP_CHECK(d.HD <= kMaxHD, "{}: head dim {} > {} is not supported", op, d.HD, kMaxHD);
  MCPP_CHECK(d.S * d.B * d.NH < (int64_t(1) << 31), "{}: {} rows x heads exceed a grid", op,
             d.S * d.B * d.NH);
  if (d.sink.defined()) {
    check_cuda(d.sink, op, "sink");
    check_numel(d.sink, d.NH, op, "sink");
  }
  const bool vec = vec_rows(qkv, d, k_cache, v_cache);
  MCPP_DISPATCH_ACT(qkv.dtype(), op, {
    // A decode step: the group kernel where it has an instance; a prefill: per head.
    if (d.S == 1 &&
        launch_group<T>(static_cast<const T*>(qkv.raw()), pos.data<int64_t>(),
                        static_cast<const T*>(k_cache.raw()), static_cast<const T*>(v_cache.raw()),
                        static_cast<T*>(out.raw()), d, k_cache.size(1), float(softmax_scale), vec,
                        stream_of(s))) {
      MCPP_LAUNCH_CHECK();
      break;
    }
    const DType sdt = d.sink.defined() ? d.sink.dtype() : qkv.dtype();
    MCPP_DISPATCH_ACT2(sdt, op,
        decode_attention_kernel<T, T2>
        <<<unsigned(d.S * d.B * d.NH), kWarps * 32, 0, stream_of(s)>>>(
            static_cast<const T*>(qkv.raw()), pos.data<int64_t>(),
            static_cast<const T*>(k_cache.raw()), static_cast<const T*>(v_cache.raw()),
            static_cast<T*>(out.raw()), d.B, int(d.NH), int(d.NG), int(d.HD), k_cache.size(1),
            float(softmax_scale), vec,
            d.sink.defined() ? static_cast<const T2*>(d.sink.raw()) : nullptr, d.window_left));
    MCPP_LAUNCH_CHECK();
  });
}

void rope_attention_decode(Tensor& qkv, const AttentionDims& d, int64_t rot_dim,
                           const RopeFreqs& freqs, const Tensor& pos, double softmax_scale,
                           Tensor& k_cache, Tensor& v_cache, Tensor& out, Stream& s,
                           std::span<const Tensor* const> l2_next) {
  const char* op = "rope_attention_decode";
  for (auto [t, name] : {std::pair{static_cast<const Tensor*>(&qkv), "qkv"}, {&pos, "pos"},
                         {static_cast<const Tensor*>(&k_cache), "k_cache"},
                         {static_cast<const Tensor*>(&v_cache), "v_cache"},
                         {static_cast<const Tensor*>(&out), "out"}})
    check_cuda(*t, op, name);
  check_kv_cache_args(op, qkv, d, pos, k_cache, v_cache, out);
  MCPP_CHECK(d.S == 1, "{}: one row per sequence (S = 1), got S={}", op, d.S);
  MCPP_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= d.HD,
             "{}: rot_dim={} must be even in (0, HD={}]", op, rot_dim, d.HD);
  check_rope_freqs(freqs, op);
  if (d.sink.defined()) {
    check_cuda(d.sink, op, "sink");
    check_numel(d.sink, d.NH, op, "sink");
  }
  MCPP_CHECK(d.B * d.NH < (int64_t(1) << 31), "{}: {} sequences x heads exceed a grid", op,
             d.B * d.NH);
  const int64_t G = d.NH / d.NG;
  const bool vec = vec_rows(qkv, d, k_cache, v_cache);
  cudaStream_t cs = stream_of(s);
  const L2Ahead ahead = l2_ahead_of(l2_next, op);
  bool fused = false;
  MCPP_DISPATCH_ACT(qkv.dtype(), op, {
    T* q = static_cast<T*>(qkv.raw());
    T* kc = static_cast<T*>(k_cache.raw());
    T* vc = static_cast<T*>(v_cache.raw());
    fused = with_group_instance(G, d.HD, [&]<int GG, int DD>() {
      const float2* rope_tab = decode_rope_table(k_cache.size(1), rot_dim, freqs, cs);
      const bool ps = decode_attention_psmem();
      auto kernel = ps ? rope_attention_group_kernel<T, GG, DD, true>
                       : rope_attention_group_kernel<T, GG, DD, false>;
      // The request blocks only where the attention's blocks leave room in the one wave the
      // GPU holds (64 sequences x 8 groups of the 1B model: 512 of 528): more would start a
      // second wave of attention blocks after the first's.
      static const int64_t resident[2] = {
          occupancy_blocks(rope_attention_group_kernel<T, GG, DD, false>, kWarps * 32),
          occupancy_blocks(rope_attention_group_kernel<T, GG, DD, true>, kWarps * 32)};
      L2Ahead a = ahead;
      if (d.B * d.NG < resident[ps])
        a.blocks = int(std::min<int64_t>(a.blocks, resident[ps] - d.B * d.NG));
      launch_dependent(kernel, unsigned(a.blocks + d.B * d.NG), kWarps * 32, 0, cs, q,
                       pos.data<int64_t>(), kc, vc, static_cast<T*>(out.raw()), int(d.NG),
                       k_cache.size(1), int(rot_dim / 2), int(rot_dim), freqs, float(softmax_scale),
                       vec, decode_attention_prefetch(), a, rope_tab, sinks_of(d),
                       d.window_left);
    });
    MCPP_LAUNCH_CHECK();
  });
  if (!fused) launch_rope_append(qkv, d, rot_dim, freqs, pos, k_cache, v_cache, cs);
  if (!fused) cuda::decode_attention(qkv, d, pos, softmax_scale, k_cache, v_cache, out, s);
}

}  // namespace mcpp::ops::cuda
