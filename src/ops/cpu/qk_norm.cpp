// --qk-layernorm on the CPU (Megatron-Core's q_layernorm / k_layernorm with RMSNorm; Qwen3's
// q_norm / k_norm): RMSNorm over the HD values of every query and key head of qkv [T,
// NG*(r+2)*HD] in the grouped layout (per group: r query heads, its key head, its value head,
// HD values each); value heads pass through.
//   forward:  y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)  per head row of HD
//   backward: dx = rstd * (g - x * rstd^2 * mean(g * x)),  g = dy * w;  dw += sum dy * x * rstd
// w is 1 + stored under one_plus (the derivative is unchanged). f32 or f64, all tensors one
// dtype, computed in f64 per row, rows in order (dwq, dwk summed serially: deterministic).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

void check(const Check& ck, const Tensor& in, const Tensor& wq, const Tensor& wk, int64_t r) {
  const DType dt = ck.floating(in, "x");
  const int64_t HD = wq.numel();
  ck.dtype(wq, "wq", dt);
  ck.dtype(wk, "wk", dt);
  MCPP_CHECK(r >= 1 && HD > 0 && wk.numel() == HD && in.numel() % (HD * (r + 2)) == 0,
             "{}: qkv of {} values is not [T, NG*({}+2)*{}] or wk not [{}]", ck.op, in.numel(), r,
             HD, HD);
}

// Calls f(row offset, weight) for every query and key head row of qkv.
template <class F>
void for_each_qk_row(int64_t r, int64_t HD, int64_t numel, F&& f) {
  const int64_t slots = numel / HD;  // T * NG * (r + 2) head rows
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t j = i % (r + 2);
    if (j <= r) f(i * HD, j < r);  // j < r: a query head; j == r: the key head
  }
}

template <class T>
void forward_t(const Tensor& in, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
               bool one_plus, Tensor& out) {
  const int64_t HD = wq.numel();
  const double one = one_plus ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* y = out.data<T>();
  if (y != x) std::copy(x, x + in.numel(), y);  // value rows pass through
  for_each_qk_row(r, HD, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    double ss = 0;
    for (int64_t d = 0; d < HD; ++d) ss += double(x[o + d]) * double(x[o + d]);
    const double rstd = 1.0 / std::sqrt(ss / double(HD) + eps);
    for (int64_t d = 0; d < HD; ++d) y[o + d] = T(double(x[o + d]) * rstd * (double(w[d]) + one));
  });
}

template <class T>
void backward_t(const Tensor& in, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dwk) {
  const int64_t HD = wq.numel();
  const double one = one_plus ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* g = dqkv.data<T>();
  std::vector<double> dq(size_t(HD), 0.0), dk(size_t(HD), 0.0);
  for_each_qk_row(r, HD, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    std::vector<double>& dw = q ? dq : dk;
    double ss = 0, gx = 0;
    for (int64_t d = 0; d < HD; ++d) {
      ss += double(x[o + d]) * double(x[o + d]);
      gx += double(g[o + d]) * (double(w[d]) + one) * double(x[o + d]);
    }
    const double rstd = 1.0 / std::sqrt(ss / double(HD) + eps);
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

void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                     bool one_plus, Tensor& y, Stream& s) {
  const Check ck{"qk_norm_forward"};
  ck.stream(s);
  check(ck, x, wq, wk, r);
  ck.dtype(y, "y", x.dtype());
  MCPP_CHECK(y.numel() == x.numel(), "qk_norm_forward: y has {} values, x {}", y.numel(),
             x.numel());
  if (x.dtype() == DType::F64)
    forward_t<double>(x, wq, wk, r, eps, one_plus, y);
  else
    forward_t<float>(x, wq, wk, r, eps, one_plus, y);
}

void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                      bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dwk, Stream& s) {
  const Check ck{"qk_norm_backward"};
  ck.stream(s);
  check(ck, x, wq, wk, r);
  ck.dtype(dqkv, "dqkv", x.dtype());
  ck.dtype(dwq, "dwq", x.dtype());
  ck.dtype(dwk, "dwk", x.dtype());
  MCPP_CHECK(dqkv.numel() == x.numel() && dwq.numel() == wq.numel() && dwk.numel() == wq.numel(),
             "qk_norm_backward: dqkv of {} values (x {}), dwq {}, dwk {} (HD {})", dqkv.numel(),
             x.numel(), dwq.numel(), dwk.numel(), wq.numel());
  if (x.dtype() == DType::F64)
    backward_t<double>(x, wq, wk, r, eps, one_plus, dqkv, dwq, dwk);
  else
    backward_t<float>(x, wq, wk, r, eps, one_plus, dqkv, dwq, dwk);
}

}  // namespace mcpp::ops::cpu
