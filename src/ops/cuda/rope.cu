// Rotary position embedding, Megatron's non-interleaved rotate-half form, applied in
// place on the grouped qkv layout [S, B, NG, NH/NG + 2, HD] to every query and key head;
// value heads and dims >= rot_dim pass through. With h = rot_dim / 2 and
// angle(s, i) = (s + s_offset) * inv_freq_i, i < h (ops/rope_math.h: base^(-2i / rot_dim),
// Llama 3.x-scaled when freqs.scaled):
//   out[i]     = x[i] cos - x[i + h] sin
//   out[i + h] = x[i + h] cos + x[i] sin
// Backward applies the inverse rotation (sin -> -sin) to the gradient. rope_positions
// (--reset-position-ids) takes each row's position from a device tensor instead of
// s + s_offset: the table then has a row per (s, b) and the kernels see S*B rows of B = 1.
// The cos/sin table is computed in f64 (angles reach thousands of radians), times YaRN's
// concentration factor freqs.mscale (1 otherwise), and kept f32.
// Vector path: a thread rotates N = 16 / sizeof(T) consecutive pairs (i, i + h) with 16-byte
// loads and stores, when h and HD are whole numbers of packs and qkv is 16-byte aligned;
// otherwise one pair per thread. Both compute the same float expressions per element.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/ops.h"
#include "ops/rope_math.h"

namespace mcpp::ops::cuda {

namespace {

// The rotation with every product rounded before the add (no FMA contraction), so the
// scalar and the vector kernels give the same bits whatever the compiler fuses.
__device__ __forceinline__ float rot_a(float x1, float x2, float c, float sn) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
}
__device__ __forceinline__ float rot_b(float x1, float x2, float c, float sn) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
}

static __global__ void rope_table_kernel(float2* table, int64_t S, int64_t half, RopeFreqs freqs,
                                         int64_t off, int64_t rot_dim) {
  int64_t n = S * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = k / half, i = k - s * half;
    double a = double(s + off) * rope_inv_freq(freqs, i, rot_dim);
    table[k] = make_float2(float(freqs.mscale * cos(a)), float(freqs.mscale * sin(a)));
  }
}

// The same table at per-row positions: row r of the S*B rows at pos[r].
static __global__ void rope_pos_table_kernel(float2* table, const int64_t* __restrict__ pos,
                                             int64_t rows, int64_t half, RopeFreqs freqs,
                                             int64_t rot_dim) {
  int64_t n = rows * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = k / half, i = k - r * half;
    double a = double(pos[r]) * rope_inv_freq(freqs, i, rot_dim);
    table[k] = make_float2(float(freqs.mscale * cos(a)), float(freqs.mscale * sin(a)));
  }
}

template <typename T>
static __global__ void rope_kernel(const T* in, T* out, const float2* __restrict__ table,
                                   int64_t S, int64_t B, int64_t NG, int64_t QPG, int64_t HD,
                                   int64_t half, float sign) {
  // One thread per (s, b, g, head j < QPG + 1, i < half).
  int64_t heads = QPG + 1;
  int64_t n = S * B * NG * heads * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = k % half, r = k / half;
    int64_t j = r % heads;
    r /= heads;
    int64_t g = r % NG;
    r /= NG;  // r = s * B + b
    int64_t s = r / B;
    int64_t base = ((r * NG + g) * (QPG + 2) + j) * HD;
    float2 cs = table[s * half + i];
    float sn = sign * cs.y;
    float x1 = to_f(in[base + i]), x2 = to_f(in[base + i + half]);
    out[base + i] = from_f<T>(rot_a(x1, x2, cs.x, sn));
    out[base + i + half] = from_f<T>(rot_b(x1, x2, cs.x, sn));
  }
}

// Vector form: one thread per (s, b, g, head j < QPG + 1, pack vi < HV = half / N); the
// packs of one head are adjacent threads, so a warp reads whole runs of a head. n < 2^32
// (the launcher checks): the index splits with 32-bit divisions. BNG = B * NG.
template <typename T>
static __global__ void rope_vec_kernel(const T* in, T* out, const float2* __restrict__ table,
                                       int64_t n, uint32_t HV, uint32_t heads, uint32_t BNG,
                                       int64_t HD, int64_t half, float sign) {
  constexpr int N = kPackN<T>;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n;
       k += int64_t(gridDim.x) * blockDim.x) {
    uint32_t hr = uint32_t(k) / HV, vi = uint32_t(k) - hr * HV;
    uint32_t rg = hr / heads, j = hr - rg * heads;  // rg = (s * B + b) * NG + g
    uint32_t s = rg / BNG;
    int64_t i = int64_t(vi) * N;
    int64_t base = (int64_t(rg) * (heads + 1) + j) * HD + i;  // QPG + 2 heads per group
    // N float2 (cos, sin) entries, 8N-byte aligned since half % N == 0: N / 2 float4 loads.
    const float4* tb = reinterpret_cast<const float4*>(table + int64_t(s) * half + i);
    float c[N], sn[N];
#pragma unroll
    for (int e = 0; e < N / 2; ++e) {
      float4 t = tb[e];
      c[2 * e] = t.x, sn[2 * e] = sign * t.y;
      c[2 * e + 1] = t.z, sn[2 * e + 1] = sign * t.w;
    }
    Pack<T, N> a = ld_pack<N>(in + base), b = ld_pack<N>(in + base + half), oa, ob;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float x1 = to_f(a.v[e]), x2 = to_f(b.v[e]);
      oa.v[e] = from_f<T>(rot_a(x1, x2, c[e], sn[e]));
      ob.v[e] = from_f<T>(rot_b(x1, x2, c[e], sn[e]));
    }
    st_pack(out + base, oa);
    st_pack(out + base + half, ob);
  }
}

// positions: null, or [S*B] i64 on the device (rope_positions; s_offset unused).
void rope_apply(const Tensor& in, const AttentionDims& d_in, int64_t rot_dim,
                const RopeFreqs& freqs, int64_t s_offset, Tensor& out, Stream& s, float sign,
                const char* op, const int64_t* positions = nullptr) {
  AttentionDims d = d_in;
  check_cuda(in, op, "input");
  check_cuda(out, op, "output");
  MCPP_CHECK(in.dtype() == out.dtype(), "{}: input {} and output {} differ in dtype", op,
             in.str(), out.str());
  MCPP_CHECK(d.NG > 0 && d.NH % d.NG == 0, "{}: NH {} is not a multiple of NG {}", op, d.NH,
             d.NG);
  int64_t n = d.S * d.B * d.qkv_width();
  check_numel(in, n, op, "input");
  check_numel(out, n, op, "output");
  MCPP_CHECK(rot_dim > 0 && rot_dim <= d.HD && rot_dim % 2 == 0,
             "{}: rot_dim {} must be even and in (0, HD={}]", op, rot_dim, d.HD);
  check_rope_freqs(freqs, op);
  cudaStream_t cs = stream_of(s);
  if (n == 0) return;
  if (out.raw() != in.raw())
    CUDA_CHECK(cudaMemcpyAsync(out.raw(), in.raw(), in.nbytes(), cudaMemcpyDeviceToDevice, cs));
  int64_t half = rot_dim / 2;
  if (positions) d.S *= d.B, d.B = 1;  // a table row per (s, b): S*B rows of one sequence
  Tensor table = Tensor::empty({d.S, half, 2}, DType::F32, Device::CUDA);
  float2* tp = static_cast<float2*>(table.raw());
  if (positions)
    rope_pos_table_kernel<<<grid_for(d.S * half, 256), 256, 0, cs>>>(tp, positions, d.S, half,
                                                                     freqs, rot_dim);
  else
    rope_table_kernel<<<grid_for(d.S * half, 256), 256, 0, cs>>>(tp, d.S, half, freqs, s_offset,
                                                                 rot_dim);
  MCPP_LAUNCH_CHECK();
  int64_t QPG = d.NH / d.NG;
  int64_t work = d.S * d.B * d.NG * (QPG + 1) * half;
  MCPP_DISPATCH_ACT(in.dtype(), op, {
    constexpr int N = kPackN<T>;
    auto ip = static_cast<const T*>(in.raw());
    auto outp = static_cast<T*>(out.raw());
    int64_t nvec = work / half * (half / N);
    if (half % N == 0 && d.HD % N == 0 && is_aligned16(ip) && is_aligned16(outp) &&
        is_aligned16(tp) && nvec <= int64_t(UINT32_MAX) && d.B * d.NG <= int64_t(UINT32_MAX))
      rope_vec_kernel<T><<<grid_for(nvec, 256), 256, 0, cs>>>(
          ip, outp, tp, nvec, uint32_t(half / N), uint32_t(QPG + 1), uint32_t(d.B * d.NG), d.HD,
          half, sign);
    else
      rope_kernel<T><<<grid_for(work, 256), 256, 0, cs>>>(ip, outp, tp, d.S, d.B, d.NG, QPG, d.HD,
                                                          half, sign);
  });
  MCPP_LAUNCH_CHECK();
}

}  // namespace

void rope_forward(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                  const RopeFreqs& freqs, int64_t s_offset, Tensor& qkv_out, Stream& s) {
  rope_apply(qkv_in, d, rot_dim, freqs, s_offset, qkv_out, s, 1.f, "rope_forward");
}

void rope_backward(const Tensor& dqkv_out, const AttentionDims& d, int64_t rot_dim,
                   const RopeFreqs& freqs, int64_t s_offset, Tensor& dqkv_in, Stream& s) {
  rope_apply(dqkv_out, d, rot_dim, freqs, s_offset, dqkv_in, s, -1.f, "rope_backward");
}

void rope_positions(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                    const RopeFreqs& freqs, const Tensor& positions, bool inverse, Tensor& qkv_out,
                    Stream& s) {
  const char* op = "rope_positions";
  MCPP_CHECK(positions.defined() && positions.device() == Device::CUDA &&
                 positions.dtype() == DType::I64 && positions.numel() == d.S * d.B,
             "{}: positions {} must be i64 [S={}, B={}] on the GPU", op,
             positions.defined() ? positions.str() : std::string("(undefined)"), d.S, d.B);
  rope_apply(qkv_in, d, rot_dim, freqs, 0, qkv_out, s, inverse ? -1.f : 1.f, op,
             static_cast<const int64_t*>(positions.raw()));
}

}  // namespace mcpp::ops::cuda
