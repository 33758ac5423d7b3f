#include "model/qk_norm.h"

#include <cmath>
#include <vector>

#include "base/error.h"

namespace mcpp::model {

namespace {

void check(const TransformerConfig& c, const Tensor& in, const Tensor& wq, const Tensor& wk) {
  MCPP_CHECK_HINT(
      in.device() == Device::CPU && (in.dtype() == DType::F32 || in.dtype() == DType::F64),
      "run on the CPU (f32 or f64), or drop --qk-layernorm",
      "--qk-layernorm is implemented on the CPU only (f32, f64), not for {} on {}",
      dtype_name(in.dtype()), in.device() == Device::CPU ? "the CPU" : "CUDA");
  MCPP_CHECK(in.numel() % c.qkv_width_local() == 0 && wq.numel() == c.kv_channels &&
                 wk.numel() == c.kv_channels && wq.dtype() == in.dtype() &&
                 wk.dtype() == in.dtype(),
             "qk_norm: qkv of {} values is not [T, {}] or weights not [{}]", in.numel(),
             c.qkv_width_local(), c.kv_channels);
}

// Calls f(row offset, weight) for every query and key head row of qkv.
template <class F>
void for_each_qk_row(const TransformerConfig& c, int64_t numel, F&& f) {
  const int64_t r = c.heads_per_group(), HD = c.kv_channels;
  const int64_t slots = numel / HD;  // T * NGl * (r + 2) head rows
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t j = i % (r + 2);
    if (j <= r) f(i * HD, j < r);  // j < r: a query head; j == r: the key head
  }
}

template <class T>
void forward_t(const TransformerConfig& c, const Tensor& in, const Tensor& wq, const Tensor& wk,
               Tensor& out) {
  const int64_t HD = c.kv_channels;
  const double one = c.zero_centered_gamma ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* y = out.data<T>();
  if (y != x) std::copy(x, x + in.numel(), y);  // value rows pass through
  for_each_qk_row(c, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    double ss = 0;
    for (int64_t d = 0; d < HD; ++d) ss += double(x[o + d]) * double(x[o + d]);
    const double rstd = 1.0 / std::sqrt(ss / double(HD) + c.norm_epsilon);
    for (int64_t d = 0; d < HD; ++d) y[o + d] = T(double(x[o + d]) * rstd * (double(w[d]) + one));
  });
}

template <class T>
void backward_t(const TransformerConfig& c, const Tensor& in, const Tensor& wq, const Tensor& wk,
                Tensor& dqkv, Tensor& dwq, Tensor& dwk) {
  const int64_t HD = c.kv_channels;
  const double one = c.zero_centered_gamma ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* g = dqkv.data<T>();
  std::vector<double> dq(size_t(HD), 0.0), dk(size_t(HD), 0.0);
  for_each_qk_row(c, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    std::vector<double>& dw = q ? dq : dk;
    double ss = 0, gx = 0;
    for (int64_t d = 0; d < HD; ++d) {
      ss += double(x[o + d]) * double(x[o + d]);
      gx += double(g[o + d]) * (double(w[d]) + one) * double(x[o + d]);
    }
    const double rstd = 1.0 / std::sqrt(ss / double(HD) + c.norm_epsilon);
    const double m = rstd * rstd * gx / double(HD);
    for (int64_t d = 0; d < HD; ++d) {
      const double dy = double(g[o + d]);
      dw[size_t(d)] += dy * double(x[o + d]) * rstd;
      g[o + d] = T(rstd * (dy * (double(w[d]) + one) - double(x[o + d]) * m));
    }
  });
  for (int64_t d = 0; d < HD; ++d) {
    dwq.data<T>()[d] += T(dq[size_t(d)]);
    dwk.data<T>()[d] += T(dk[size_t(d)]);
  }
}

}  // namespace

void qk_norm_forward(const TransformerConfig& c, const Tensor& in, const Tensor& wq,
                     const Tensor& wk, Tensor& out) {
  check(c, in, wq, wk);
  MCPP_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(), "qk_norm: bad output");
  if (in.dtype() == DType::F64)
    forward_t<double>(c, in, wq, wk, out);
  else
    forward_t<float>(c, in, wq, wk, out);
}

void qk_norm_backward(const TransformerConfig& c, const Tensor& in, const Tensor& wq,
                      const Tensor& wk, Tensor& dqkv, Tensor& dwq, Tensor& dwk) {
  check(c, in, wq, wk);
  MCPP_CHECK(dqkv.numel() == in.numel() && dqkv.dtype() == in.dtype() &&
                 dwq.dtype() == in.dtype() && dwk.dtype() == in.dtype(),
             "qk_norm: bad gradient tensors");
  if (in.dtype() == DType::F64)
    backward_t<double>(c, in, wq, wk, dqkv, dwq, dwk);
  else
    backward_t<float>(c, in, wq, wk, dqkv, dwq, dwk);
}

}  // namespace mcpp::model
