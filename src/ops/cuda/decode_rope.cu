// RoPE for decode steps, CUDA backend: the catalogue's rope_decode (one launch for the batch,
// each row at its own position, the angle from the device's pos so a captured CUDA graph
// stays valid as positions advance), the rotate-and-append kernel rope_attention_decode runs
// where its fused kernel has no instance, and the angle table the fused kernel reads.
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ops/cuda/decode_rope.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {

// One thread per (b, g, head j <= G (the queries and the key), i < half); the angle in
// double and the rotation rounded as rope.cu's table and rope_kernel do, so the numbers
// equal rope_forward's at s_offset = pos[b].
template <typename T>
static __global__ void rope_decode_kernel(const T* in, T* out, const int64_t* __restrict__ pos,
                                          int64_t B, int64_t NG, int64_t G, int64_t HD,
                                          int64_t half, int64_t rot_dim, RopeFreqs freqs) {
  const int64_t n = B * NG * (G + 1) * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, r = k / half;
    const int64_t j = r % (G + 1), bg = r / (G + 1), b = bg / NG;
    float c, sn;
    rope_angle(pos[b], i, rot_dim, freqs, c, sn);
    const int64_t o = (bg * (G + 2) + j) * HD;
    rope_rotate(to_f(in[o + i]), to_f(in[o + i + half]), c, sn, out[o + i], out[o + i + half]);
  }
}

// rope_attention_decode's first half where the group kernel has no instance (then
// decode_attention attends). Threads [0, B NG half) each own one rotary pair i of one
// (b, g): the angle once, then the pair of each of the G query heads rotated in place and the
// key's pair written rotated to the cache row pos[b]. The next B NG HD threads copy the value
// head and the key's dims past rot_dim to the cache (the key is not written back to qkv, so
// no thread reads a value another writes). One angle per (b, g, i) instead of one per
// rotated element: a sixth of the double-precision pow/cos/sin at G = 4.
template <typename T>
static __global__ void rope_append_kernel(T* qkv, const int64_t* __restrict__ pos,
                                          T* __restrict__ kc, T* __restrict__ vc, int64_t B,
                                          int64_t NG, int64_t G, int64_t HD, int64_t half,
                                          int64_t rot_dim, RopeFreqs freqs, int64_t Tmax) {
  const int64_t n_rot = B * NG * half, n = n_rot + B * NG * HD;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    if (k < n_rot) {
      const int64_t i = k % half, bg = k / half, b = bg / NG, g = bg % NG;
      float cs, sn;
      rope_angle(pos[b], i, rot_dim, freqs, cs, sn);
      T* head = qkv + bg * (G + 2) * HD;
      for (int64_t j = 0; j <= G; ++j, head += HD) {  // G query heads, then the key
        T o1, o2;
        rope_rotate(to_f(head[i]), to_f(head[i + half]), cs, sn, o1, o2);
        if (j < G) {
          head[i] = o1;
          head[i + half] = o2;
        } else {
          T* dst = kc + ((b * Tmax + pos[b]) * NG + g) * HD;
          dst[i] = o1;
          dst[i + half] = o2;
        }
      }
      continue;
    }
    const int64_t k2 = k - n_rot, c = k2 % HD, bg = k2 / HD, b = bg / NG, g = bg % NG;
    const int64_t dst = ((b * Tmax + pos[b]) * NG + g) * HD + c;
    const T* key = qkv + (bg * (G + 2) + G) * HD;
    vc[dst] = key[HD + c];                 // the value head follows the key head
    if (c >= rot_dim) kc[dst] = key[c];    // past the rotary dims the key is copied
  }
}

// Dims >= rot_dim and the value heads pass through (out != in only).
template <typename T>
static __global__ void copy_rows_kernel(const T* in, T* out, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x)
    out[k] = in[k];
}

// RoPE's (cos, sin) for positions 0 .. rows - 1 and pairs 0 .. half - 1, each as
// rope_angle computes it (so a table entry and the angle computed in the kernel are the
// same two floats).
static __global__ void decode_rope_table_kernel(float2* tab, int64_t rows, int64_t half,
                                                int64_t rot_dim, RopeFreqs freqs) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < rows * half;
       k += int64_t(gridDim.x) * blockDim.x) {
    float cs, sn;
    rope_angle(k / half, k % half, rot_dim, freqs, cs, sn);
    tab[k] = make_float2(cs, sn);
  }
}

}  // namespace

// The table rope_attention_decode's kernel reads instead of computing each angle in double
// precision (pow, cos and sin in one warp of each block while the others wait at its
// barrier): 20 us off the 1B model's decode step on an H200 (bench/RESULTS.md).
// One per (device, rot_dim, frequencies), grown to the largest cache seen; rows * half * 8 bytes
// (512 KiB for 2,048 positions of 64 rotary dims), never freed: a captured CUDA graph may
// hold the pointer. Built outside graph capture (the engine's and generate's first step of
// each shape runs eagerly); while capturing, a missing table gives null and the kernel
// computes the angles. MCPP_DECODE_ROPE_TABLE=0 turns it off.
const float2* decode_rope_table(int64_t rows, int64_t rot_dim, const RopeFreqs& freqs,
                                cudaStream_t cs) {
  if (const char* e = std::getenv("MCPP_DECODE_ROPE_TABLE"); e && e[0] == '0') return nullptr;
  struct Entry {
    int dev;
    int64_t rot_dim;
    RopeFreqs freqs;
    int64_t rows;
    float2* tab;
  };
  static std::mutex mu;
  static std::vector<Entry> tables;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard lk(mu);
  for (const Entry& t : tables)
    if (t.dev == dev && t.rot_dim == rot_dim && t.freqs == freqs && t.rows >= rows) return t.tab;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(cs, &st));
  if (st != cudaStreamCaptureStatusNone) return nullptr;
  const int64_t half = rot_dim / 2;
  float2* tab = nullptr;
  CUDA_CHECK(cudaMalloc(&tab, size_t(rows * half) * sizeof(float2)));
  decode_rope_table_kernel<<<grid_for(rows * half, 256), 256, 0, cs>>>(tab, rows, half, rot_dim,
                                                                       freqs);
  MCPP_LAUNCH_CHECK();
  CUDA_CHECK(cudaStreamSynchronize(cs));  // complete before any stream reads it
  tables.push_back({dev, rot_dim, freqs, rows, tab});
  return tab;
}

void launch_rope_append(Tensor& qkv, const AttentionDims& d, int64_t rot_dim,
                        const RopeFreqs& freqs, const Tensor& pos, Tensor& k_cache, Tensor& v_cache,
                        cudaStream_t cs) {
  const int64_t G = d.NH / d.NG, n = d.B * d.NG * (rot_dim / 2 + d.HD);
  MCPP_DISPATCH_ACT(qkv.dtype(), "rope_attention_decode", {
    rope_append_kernel<T><<<grid_for(n, 256), 256, 0, cs>>>(
        static_cast<T*>(qkv.raw()), pos.data<int64_t>(), static_cast<T*>(k_cache.raw()),
        static_cast<T*>(v_cache.raw()), d.B, d.NG, G, d.HD, rot_dim / 2, rot_dim, freqs,
        k_cache.size(1));
    MCPP_LAUNCH_CHECK();
  });
}

void rope_decode(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                 const RopeFreqs& freqs, const Tensor& pos, Tensor& qkv_out, Stream& s) {
  const char* op = "rope_decode";
  check_cuda(qkv_in, op, "qkv_in");
  check_cuda(qkv_out, op, "qkv_out");
  check_cuda(pos, op, "pos");
  MCPP_CHECK(d.S == 1 && d.B > 0 && d.NG > 0 && d.NH % d.NG == 0,
             "{}: invalid dims S={} B={} NH={} NG={} (S = 1)", op, d.S, d.B, d.NH, d.NG);
  MCPP_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= d.HD,
             "{}: rot_dim={} must be even in (0, HD={}]", op, rot_dim, d.HD);
  check_rope_freqs(freqs, op);
  MCPP_CHECK(pos.dtype() == DType::I64 && pos.numel() == d.B, "{}: pos {} is not i64 [B={}]", op,
             pos.str(), d.B);
  MCPP_CHECK(qkv_in.dtype() == qkv_out.dtype(), "{}: in {} and out {} differ", op, qkv_in.str(),
             qkv_out.str());
  check_numel(qkv_in, d.B * d.qkv_width(), op, "qkv_in");
  check_numel(qkv_out, d.B * d.qkv_width(), op, "qkv_out");
  const int64_t G = d.NH / d.NG, half = rot_dim / 2;
  const int64_t n = d.B * d.NG * (G + 1) * half;
  cudaStream_t cs = stream_of(s);
  MCPP_DISPATCH_ACT(qkv_in.dtype(), op, {
    const T* in = static_cast<const T*>(qkv_in.raw());
    T* out = static_cast<T*>(qkv_out.raw());
    if (in != out) {
      copy_rows_kernel<T><<<grid_for(qkv_in.numel(), 256), 256, 0, cs>>>(in, out, qkv_in.numel());
      MCPP_LAUNCH_CHECK();
    }
    rope_decode_kernel<T><<<grid_for(n, 256), 256, 0, cs>>>(in, out, pos.data<int64_t>(), d.B, d.NG,
                                                            G, d.HD, half, rot_dim, freqs);
    MCPP_LAUNCH_CHECK();
  });
}

}  // namespace mcpp::ops::cuda
