// Multi-Latent Attention's tensor ops, CPU backend; f32 or f64, every tensor of one dtype.
// The layouts and formulas are ops/mla.h's:
//
//   mla_qkv_forward   q [R, heads, Dq], kv [R, heads, Dn + Dv], kpe [R, Dr]
//                     -> qkv [R, heads, 3, Dq]                                       (=)
//   mla_qkv_backward  dqkv -> dq, dkv, dkpe                                          (=)
//   mla_ctx_narrow    ctx [R, heads, Dq] -> out [R, heads, Dv]                       (=)
//   mla_ctx_pad       dout [R, heads, Dv] -> dctx [R, heads, Dq]                     (=)
//
// Rotary pair i (i < half = Dr / 2) of a row at position p pairs the de-interleaved inputs
// x[2i] and x[2i + 1] with c = mscale cos(p inv_i), sn = mscale sin(p inv_i) (double, then
// rounded to T):
//   out[i]        = x[2i] c - x[2i + 1] sn
//   out[i + half] = x[2i + 1] c + x[2i] sn
// Its transpose, the backward, is the same rotation with sn -> -sn written back to 2i, 2i + 1:
//   dx[2i]     = g[i] c + g[i + half] sn
//   dx[2i + 1] = g[i + half] c - g[i] sn
// dkpe is linear in the heads' key gradients, so it sums them (in T, head order) and rotates
// the sum once.
#include "ops/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace mcpp::ops::cpu {
namespace {

void check_cpu(const Tensor& t, Stream& s, const char* op) {
  MCPP_CHECK_HINT(s.device == Device::CPU, "pass Stream::cpu() or call mcpp::ops::",
                  "{}: the CPU backend was called with a CUDA stream", op);
  MCPP_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64,
             "{}: {} is not f32/f64 (the CPU backend's dtypes)", op, t.str());
}

// c and sn of row r's position (see the file comment), times mscale, for the half pairs.
template <typename T>
void row_cos_sin(const std::vector<double>& inv_freq, double p, double mscale, T* c, T* sn) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double a = p * inv_freq[i];
    c[i] = T(mscale * std::cos(a));
    sn[i] = T(mscale * std::sin(a));
  }
}

std::vector<double> inv_freqs(const MlaRope& r, int64_t Dr) {
  std::vector<double> f(size_t(Dr / 2));
  for (int64_t i = 0; i < Dr / 2; ++i) f[size_t(i)] = mla_inv_freq(r, i, Dr);
  return f;
}

double row_position(const int64_t* pos, int64_t pos0, int64_t B, int64_t row) {
  return double(pos ? pos[row] : pos0 + row / B);
}

template <typename T>
void qkv_forward_impl(const T* q, const T* kv, const T* kpe, const MlaDims& d, const MlaRope& r,
                      int64_t R, int64_t B, int64_t pos0, const int64_t* pos, T* qkv) {
  const int64_t H = d.heads, Dn = d.Dn, Dr = d.Dr, Dv = d.Dv, Dq = d.Dq(), half = Dr / 2;
  const int64_t KVW = Dn + Dv;  // kv's width per head
  const std::vector<double> inv_freq = inv_freqs(r, Dr);
#pragma omp parallel
  {
    std::vector<T> c(size_t(half), T(0)), sn(size_t(half), T(0)), kr(size_t(Dr), T(0));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < R; ++row) {
      row_cos_sin(inv_freq, row_position(pos, pos0, B, row), r.mscale, c.data(), sn.data());
      // rope(deint(x)) into y[0 : Dr].
      auto rotate = [&](const T* x, T* y) {
        for (int64_t i = 0; i < half; ++i) {
          const T a = x[2 * i], b = x[2 * i + 1];
          y[i] = a * c[size_t(i)] - b * sn[size_t(i)];
          y[i + half] = b * c[size_t(i)] + a * sn[size_t(i)];
        }
      };
      rotate(kpe + row * Dr, kr.data());  // one key position part for all heads
      for (int64_t h = 0; h < H; ++h) {
        const T* qh = q + (row * H + h) * Dq;
        const T* kvh = kv + (row * H + h) * KVW;
        T* out = qkv + (row * H + h) * 3 * Dq;
        rotate(qh + Dn, out);
        std::memcpy(out + Dr, qh, size_t(Dn) * sizeof(T));
        std::memcpy(out + Dq, kr.data(), size_t(Dr) * sizeof(T));
        std::memcpy(out + Dq + Dr, kvh, size_t(Dn) * sizeof(T));
        std::memcpy(out + 2 * Dq, kvh + Dn, size_t(Dv) * sizeof(T));
        for (int64_t j = Dv; j < Dq; ++j) out[2 * Dq + j] = T(0);
      }
    }
  }
}

template <typename T>
void qkv_backward_impl(const T* dqkv, const MlaDims& d, const MlaRope& r, int64_t R, int64_t B,
                       int64_t pos0, const int64_t* pos, T* dq, T* dkv, T* dkpe) {
  const int64_t H = d.heads, Dn = d.Dn, Dr = d.Dr, Dv = d.Dv, Dq = d.Dq(), half = Dr / 2;
  const int64_t KVW = Dn + Dv;
  const std::vector<double> inv_freq = inv_freqs(r, Dr);
#pragma omp parallel
  {
    std::vector<T> c(size_t(half), T(0)), sn(size_t(half), T(0)), gk(size_t(Dr), T(0));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < R; ++row) {
      row_cos_sin(inv_freq, row_position(pos, pos0, B, row), r.mscale, c.data(), sn.data());
      // The transposed rotation of g[0 : Dr], re-interleaved into x[0 : Dr].
      auto unrotate = [&](const T* g, T* x) {
        for (int64_t i = 0; i < half; ++i) {
          const T a = g[i], b = g[i + half];
          x[2 * i] = a * c[size_t(i)] + b * sn[size_t(i)];
          x[2 * i + 1] = b * c[size_t(i)] - a * sn[size_t(i)];
        }
      };
      std::fill(gk.begin(), gk.end(), T(0));
      for (int64_t h = 0; h < H; ++h) {
        const T* g = dqkv + (row * H + h) * 3 * Dq;
        T* dqh = dq + (row * H + h) * Dq;
        T* dkvh = dkv + (row * H + h) * KVW;
        unrotate(g, dqh + Dn);
        std::memcpy(dqh, g + Dr, size_t(Dn) * sizeof(T));
        for (int64_t j = 0; j < Dr; ++j) gk[size_t(j)] += g[Dq + j];
        std::memcpy(dkvh, g + Dq + Dr, size_t(Dn) * sizeof(T));
        std::memcpy(dkvh + Dn, g + 2 * Dq, size_t(Dv) * sizeof(T));
      }
      unrotate(gk.data(), dkpe + row * Dr);
    }
  }
}

// out[r, h, j] = in[r, h, j] for j < Dv; with pad (in of width Dv, out of Dq) zeros after.
template <typename T>
void ctx_impl(const T* in, int64_t R, const MlaDims& d, bool pad, T* out) {
  const int64_t Dq = d.Dq(), Dv = d.Dv, in_w = pad ? Dv : Dq, out_w = pad ? Dq : Dv;
  const int64_t heads = R * d.heads;
#pragma omp parallel for schedule(static)
  for (int64_t rh = 0; rh < heads; ++rh) {
    std::memcpy(out + rh * out_w, in + rh * in_w, size_t(Dv) * sizeof(T));
    for (int64_t j = Dv; j < out_w; ++j) out[rh * out_w + j] = T(0);
  }
}

}  // namespace

void mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& d,
                     const MlaRope& r, int64_t B, int64_t pos0, const Tensor& positions,
                     Tensor& qkv, Stream& s) {
  const char* op = "mla_qkv_forward";
  check_cpu(q, s, op);
  const int64_t R = check_mla_qkv_forward(q, kv, kpe, d, r, B, positions, qkv, Device::CPU, op);
  const int64_t* pos = positions.defined() ? positions.data<int64_t>() : nullptr;
  if (q.dtype() == DType::F32)
    qkv_forward_impl<float>(q.data<float>(), kv.data<float>(), kpe.data<float>(), d, r, R, B, pos0,
                            pos, qkv.data<float>());
  else
    qkv_forward_impl<double>(q.data<double>(), kv.data<double>(), kpe.data<double>(), d, r, R, B,
                             pos0, pos, qkv.data<double>());
}

void mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r, int64_t B,
                      int64_t pos0, const Tensor& positions, Tensor& dq, Tensor& dkv, Tensor& dkpe,
                      Stream& s) {
  const char* op = "mla_qkv_backward";
  check_cpu(dqkv, s, op);
  const int64_t R =
      check_mla_qkv_backward(dqkv, d, r, B, positions, dq, dkv, dkpe, Device::CPU, op);
  const int64_t* pos = positions.defined() ? positions.data<int64_t>() : nullptr;
  if (dqkv.dtype() == DType::F32)
    qkv_backward_impl<float>(dqkv.data<float>(), d, r, R, B, pos0, pos, dq.data<float>(),
                             dkv.data<float>(), dkpe.data<float>());
  else
    qkv_backward_impl<double>(dqkv.data<double>(), d, r, R, B, pos0, pos, dq.data<double>(),
                              dkv.data<double>(), dkpe.data<double>());
}

void mla_ctx_narrow(const Tensor& ctx, const MlaDims& d, Tensor& out, Stream& s) {
  const char* op = "mla_ctx_narrow";
  check_cpu(ctx, s, op);
  const int64_t R = check_mla_ctx(ctx, out, d, Device::CPU, op, "ctx", "out");
  if (ctx.dtype() == DType::F32)
    ctx_impl<float>(ctx.data<float>(), R, d, false, out.data<float>());
  else
    ctx_impl<double>(ctx.data<double>(), R, d, false, out.data<double>());
}

void mla_ctx_pad(const Tensor& dout, const MlaDims& d, Tensor& dctx, Stream& s) {
  const char* op = "mla_ctx_pad";
  check_cpu(dctx, s, op);
  const int64_t R = check_mla_ctx(dctx, dout, d, Device::CPU, op, "dctx", "dout");
  if (dctx.dtype() == DType::F32)
    ctx_impl<float>(dout.data<float>(), R, d, true, dctx.data<float>());
  else
    ctx_impl<double>(dout.data<double>(), R, d, true, dctx.data<double>());
}

}  // namespace mcpp::ops::cpu
