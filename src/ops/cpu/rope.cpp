// Rotary position embedding, Megatron's default non-interleaved ("rotate_half") form,
// CPU backend; f32 or f64 (in and out of one dtype).
//
//   qkv_in, qkv_out [S, B, NG, NH/NG + 2, HD]  linear_qkv's grouped layout   (=)
//
// For each query and key head, with half = rot_dim / 2, position t = s + s_offset and
// angle_i = t * inv_freq_i, i < half (inv_freq_i = base^(-2i / rot_dim), Llama 3.x-scaled
// when freqs.scaled: ops/rope_math.h):
//   out[i]        = x[i] cos - x[i + half] sin
//   out[i + half] = x[i + half] cos + x[i] sin
// With YaRN, cos and sin are first multiplied by its concentration factor freqs.mscale (1
// otherwise). Value heads and dims >= rot_dim pass through. out may alias in (each pair is read
// before it is written). The backward is the transposed, i.e. inverse, rotation.
//
// Angles and their sines are computed in double for both dtypes: Megatron forms them
// in fp32, whose rounding of t * inv_freq grows with t; double is the more faithful
// reference and costs S * rot_dim/2 sincos calls, nothing next to the rest.
#include <cmath>
#include <vector>

#include "base/error.h"
#include "ops/ops.h"
#include "ops/rope_math.h"

namespace mcpp::ops::cpu {
namespace {

void check_rope_args(const char* op, const Tensor& in, const AttentionDims& d, int64_t rot_dim,
                     const RopeFreqs& freqs, const Tensor& out, Stream& s) {
  MCPP_CHECK_HINT(s.device == Device::CPU, "pass Stream::cpu() or call mcpp::ops::",
                  "{}: the CPU backend was called with a CUDA stream", op);
  MCPP_CHECK(d.S > 0 && d.B > 0 && d.NH > 0 && d.NG > 0 && d.HD > 0 && d.NH % d.NG == 0,
             "{}: invalid dims S={} B={} NH={} NG={} HD={} (all positive, NG | NH)", op, d.S, d.B,
             d.NH, d.NG, d.HD);
  MCPP_CHECK_HINT(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= d.HD,
                  "check --rotary-percent: rot_dim = HD * rotary_percent must be even",
                  "{}: rot_dim={} must be even and in (0, HD={}]", op, rot_dim, d.HD);
  check_rope_freqs(freqs, op);
  for (const Tensor* t : {&in, &out}) {
    MCPP_CHECK(t->defined() && t->device() == Device::CPU, "{}: tensors must be on the CPU", op);
    MCPP_CHECK(t->dtype() == DType::F32 || t->dtype() == DType::F64, "{}: {} is not f32/f64", op,
               t->str());
    MCPP_CHECK(t->numel() == d.S * d.B * d.qkv_width(),
               "{}: {} does not hold S*B*NG*(NH/NG+2)*HD = {} elements", op, t->str(),
               d.S * d.B * d.qkv_width());
  }
  MCPP_CHECK(in.dtype() == out.dtype(), "{}: in is {} but out is {}", op, in.str(), out.str());
}

// sign = +1: forward rotation; -1: its inverse (the backward).
template <typename T>
void rope_impl(const T* in, const AttentionDims& d, int64_t rot_dim, const RopeFreqs& freqs,
               int64_t s_offset, double sign, T* out) {
  const int64_t HD = d.HD, G = d.NH / d.NG, half = rot_dim / 2;
  const int64_t heads_per_row = d.B * d.NG * (G + 2);  // HD-sized heads per position
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = rope_inv_freq(freqs, i, rot_dim);

#pragma omp parallel
  {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t s = 0; s < d.S; ++s) {
      const double t = double(s + s_offset);
      for (int64_t i = 0; i < half; ++i) {
        const double a = t * inv_freq[size_t(i)];
        cs[size_t(i)] = T(freqs.mscale * std::cos(a));
        sn[size_t(i)] = T(sign * (freqs.mscale * std::sin(a)));
      }
      for (int64_t hh = 0; hh < heads_per_row; ++hh) {
        const int64_t off = (s * heads_per_row + hh) * HD;
        const T* x = in + off;
        T* y = out + off;
        const bool rotated = hh % (G + 2) <= G;  // query heads and the key head
        int64_t c0 = 0;
        if (rotated) {
          for (int64_t i = 0; i < half; ++i) {
            const T a = x[i], b = x[i + half];
            y[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
            y[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
          }
          c0 = rot_dim;
        }
        if (y != x)
          for (int64_t c = c0; c < HD; ++c) y[c] = x[c];
      }
    }
  }
}

void rope_dispatch(const char* op, const Tensor& in, const AttentionDims& d, int64_t rot_dim,
                   const RopeFreqs& freqs, int64_t s_offset, double sign, Tensor& out, Stream& s) {
  check_rope_args(op, in, d, rot_dim, freqs, out, s);
  if (in.dtype() == DType::F32)
    rope_impl<float>(in.data<float>(), d, rot_dim, freqs, s_offset, sign, out.data<float>());
  else
    rope_impl<double>(in.data<double>(), d, rot_dim, freqs, s_offset, sign, out.data<double>());
}

// rope_impl at per-token positions: row r = s*B + b of the [S, B] rows at position pos[r].
template <typename T>
void rope_pos_impl(const T* in, const AttentionDims& d, int64_t rot_dim, const RopeFreqs& freqs,
                   const int64_t* pos, double sign, T* out) {
  const int64_t HD = d.HD, G = d.NH / d.NG, half = rot_dim / 2;
  const int64_t heads = d.NG * (G + 2);  // HD-sized heads of one (s, b) row
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = rope_inv_freq(freqs, i, rot_dim);
#pragma omp parallel
  {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < d.S * d.B; ++r) {
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(pos[r]) * inv_freq[size_t(i)];
        cs[size_t(i)] = T(freqs.mscale * std::cos(a));
        sn[size_t(i)] = T(sign * (freqs.mscale * std::sin(a)));
      }
      for (int64_t hh = 0; hh < heads; ++hh) {
        const int64_t off = (r * heads + hh) * HD;
        const T* x = in + off;
        T* y = out + off;
        int64_t c0 = 0;
        if (hh % (G + 2) <= G) {  // query heads and the key head
          for (int64_t i = 0; i < half; ++i) {
            const T a = x[i], b = x[i + half];
            y[i] = a * cs[size_t(i)] - b * sn[size_t(i)];
            y[i + half] = b * cs[size_t(i)] + a * sn[size_t(i)];
          }
          c0 = rot_dim;
        }
        if (y != x)
          for (int64_t c = c0; c < HD; ++c) y[c] = x[c];
      }
    }
  }
}

}  // namespace

void rope_positions(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                    const RopeFreqs& freqs, const Tensor& positions, bool inverse, Tensor& qkv_out,
                    Stream& s) {
  const char* op = "rope_positions";
  check_rope_args(op, qkv_in, d, rot_dim, freqs, qkv_out, s);
  MCPP_CHECK(positions.device() == Device::CPU && positions.dtype() == DType::I64 &&
                 positions.numel() == d.S * d.B,
             "{}: positions {} must be i64 [S={}, B={}] on the CPU", op, positions.str(), d.S,
             d.B);
  const double sign = inverse ? -1.0 : 1.0;
  const int64_t* pos = positions.data<int64_t>();
  if (qkv_in.dtype() == DType::F32)
    rope_pos_impl<float>(qkv_in.data<float>(), d, rot_dim, freqs, pos, sign, qkv_out.data<float>());
  else
    rope_pos_impl<double>(qkv_in.data<double>(), d, rot_dim, freqs, pos, sign,
                          qkv_out.data<double>());
}

void rope_forward(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                  const RopeFreqs& freqs, int64_t s_offset, Tensor& qkv_out, Stream& s) {
  rope_dispatch("rope_forward", qkv_in, d, rot_dim, freqs, s_offset, +1.0, qkv_out, s);
}

void rope_backward(const Tensor& dqkv_out, const AttentionDims& d, int64_t rot_dim,
                   const RopeFreqs& freqs, int64_t s_offset, Tensor& dqkv_in, Stream& s) {
  rope_dispatch("rope_backward", dqkv_out, d, rot_dim, freqs, s_offset, -1.0, dqkv_in, s);
}

}  // namespace mcpp::ops::cpu
