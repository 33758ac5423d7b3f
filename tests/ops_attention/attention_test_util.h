// Shared helpers of the attention and RoPE tests: random tensors and a naive O(S^2)
// reference of causal GQA attention with dropout, written independently of the tiled
// kernels (full softmax per query row, mask drawn with DropoutMask::uniform directly).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/philox.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace attn_test {

using mcpp::DType;
using mcpp::Tensor;
using mcpp::ops::AttentionDims;
using mcpp::ops::DropoutKey;

inline AttentionDims dims(int64_t S, int64_t B, int64_t NH, int64_t NG, int64_t HD) {
  AttentionDims d;
  d.S = S, d.B = B, d.NH = NH, d.NG = NG, d.HD = HD;
  return d;
}

// Standard normal values from Philox, so every test input is reproducible.
template <typename T>
Tensor randn(const mcpp::Shape& shape, uint64_t stream, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, mcpp::dtype_of<T>());
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(scale * mcpp::Philox::normal(1234, stream, i));
  return t;
}

template <typename To, typename From>
Tensor convert(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), mcpp::dtype_of<To>());
  for (int64_t i = 0; i < x.numel(); ++i) y.data<To>()[i] = To(x.data<From>()[i]);
  return y;
}

struct Reference {
  std::vector<double> out, lse;
};

// out[s, b, h*HD + c] and lse[b, h, s] by the textbook formula, in double.
inline Reference naive_attention(const std::vector<double>& qkv, const AttentionDims& d,
                                 double scale, double p, DropoutKey key) {
  const int64_t S = d.S, B = d.B, NH = d.NH, NG = d.NG, HD = d.HD, G = NH / NG;
  const int64_t W = d.qkv_width();
  const int64_t NHg = d.NH_global ? d.NH_global : NH, Sg = d.S_global ? d.S_global : S;
  Reference r;
  r.out.assign(size_t(S * B * NH * HD), 0.0);
  r.lse.assign(size_t(B * NH * S), 0.0);
  auto at = [&](int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
    return qkv[size_t(s * B * W + b * W + (g * (G + 2) + slot) * HD + c)];
  };
  std::vector<double> sc(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / G, j = h % G;
      for (int64_t q = 0; q < S; ++q) {
        double m = -INFINITY;
        for (int64_t k = 0; k <= q; ++k) {
          double acc = 0;
          for (int64_t c = 0; c < HD; ++c) acc += at(q, b, g, j, c) * at(k, b, g, G, c);
          sc[size_t(k)] = scale * acc;
          m = std::max(m, sc[size_t(k)]);
        }
        double l = 0;
        for (int64_t k = 0; k <= q; ++k) l += std::exp(sc[size_t(k)] - m);
        r.lse[size_t((b * NH + h) * S + q)] = m + std::log(l);
        for (int64_t k = 0; k <= q; ++k) {
          double prob = std::exp(sc[size_t(k)] - m) / l;
          if (p > 0) {
            const uint64_t idx =
                uint64_t((((b + d.b_offset) * NHg + h + d.h_offset) * Sg + q + d.q_offset) * Sg +
                         k + d.k_offset);
            prob = mcpp::DropoutMask::uniform(key.seed, key.stream, idx) >= p
                       ? prob * mcpp::DropoutMask::keep_scale(p) : 0.0;
          }
          for (int64_t c = 0; c < HD; ++c)
            r.out[size_t((q * B + b) * NH * HD + h * HD + c)] += prob * at(k, b, g, G + 1, c);
        }
      }
    }
  return r;
}

inline std::vector<double> to_vec(const Tensor& t) {
  const double* p = t.data<double>();
  return std::vector<double>(p, p + t.numel());
}

}  // namespace attn_test
