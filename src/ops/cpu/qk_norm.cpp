// --qk-layernorm on the CPU (Megatron-Core's q_layernorm / k_layernorm; Qwen3's q_norm /
// k_norm): a norm over the HD values of every query and key head of qkv [T, NG*(r+2)*HD] in
// the grouped layout (per group: r query heads, its key head, its value head, HD values
// each); value heads pass through. The norm follows --normalization:
//   RMSNorm (qk_norm_*):        xhat = x rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
//     y = xhat w;          dx = rstd (g - xhat mean(g xhat)),             g = dy w
//   LayerNorm (qk_layernorm_*): xhat = (x - mean) rstd,  rstd = 1 / sqrt(var + eps)
//     y = xhat w + b;      dx = rstd (g - mean(g) - xhat mean(g xhat));   db += sum dy
//   both: dw += sum dy xhat (+= into the parameter gradients, = into dqkv).
// w is 1 + stored under one_plus (the derivative is unchanged). f32 or f64, all tensors one
// dtype, computed in f64 per row, rows in order (dw, db summed serially: deterministic).
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

// A parameter (or its gradient) of [HD] values in the dtype of x.
void check_hd(const Check& ck, const Tensor& t, const char* name, DType dt, int64_t HD) {
  ck.dtype(t, name, dt);
  MCPP_CHECK(t.numel() == HD, "{}: tensor '{}' has {} values, expected HD = {}", ck.op, name,
             t.numel(), HD);
}

// Calls f(row offset, is a query head) for every query and key head row of qkv.
template <class F>
void for_each_qk_row(int64_t r, int64_t HD, int64_t numel, F&& f) {
  const int64_t slots = numel / HD;  // T * NG * (r + 2) head rows
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t j = i % (r + 2);
    if (j <= r) f(i * HD, j < r);  // j < r: a query head; j == r: the key head
  }
}

// The row's mean (0 for RMSNorm) and rstd, in two passes for LayerNorm (as the CUDA kernels).
template <bool LN, class T>
void row_stats(const T* x, int64_t HD, double eps, double& mean, double& rstd) {
  mean = 0;
  if constexpr (LN) {
    for (int64_t d = 0; d < HD; ++d) mean += double(x[d]);
    mean /= double(HD);
  }
  double ss = 0;
  for (int64_t d = 0; d < HD; ++d) ss += (double(x[d]) - mean) * (double(x[d]) - mean);
  rstd = 1.0 / std::sqrt(ss / double(HD) + eps);
}

// bq, bk: null for RMSNorm.
template <bool LN, class T>
void forward_t(const Tensor& in, const Tensor& wq, const Tensor* bq, const Tensor& wk,
               const Tensor* bk, int64_t r, double eps, bool one_plus, Tensor& out) {
  const int64_t HD = wq.numel();
  const double one = one_plus ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* y = out.data<T>();
  if (y != x) std::copy(x, x + in.numel(), y);  // value rows pass through
  for_each_qk_row(r, HD, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    double mean, rstd;
    row_stats<LN>(x + o, HD, eps, mean, rstd);
    for (int64_t d = 0; d < HD; ++d) {
      double v = (double(x[o + d]) - mean) * rstd * (double(w[d]) + one);
      if constexpr (LN) v += double((q ? *bq : *bk).data<T>()[d]);
      y[o + d] = T(v);
    }
  });
}

// dbq, dbk: null for RMSNorm.
template <bool LN, class T>
void backward_t(const Tensor& in, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor* dbq, Tensor& dwk, Tensor* dbk) {
  const int64_t HD = wq.numel();
  const double one = one_plus ? 1.0 : 0.0;
  const T* x = in.data<T>();
  T* g = dqkv.data<T>();
  std::vector<double> dw[2], db[2];  // [0]: query heads, [1]: key heads
  for (int p = 0; p < 2; ++p) dw[p].assign(size_t(HD), 0.0), db[p].assign(size_t(HD), 0.0);
  std::vector<double> xhat(size_t(HD), 0.0);
  for_each_qk_row(r, HD, in.numel(), [&](int64_t o, bool q) {
    const T* w = (q ? wq : wk).data<T>();
    const int p = q ? 0 : 1;
    double mean, rstd, sg = 0, sgx = 0;  // sum g, sum g xhat
    row_stats<LN>(x + o, HD, eps, mean, rstd);
    for (int64_t d = 0; d < HD; ++d) {
      xhat[size_t(d)] = (double(x[o + d]) - mean) * rstd;
      const double gw = double(g[o + d]) * (double(w[d]) + one);
      sg += gw;
      sgx += gw * xhat[size_t(d)];
    }
    const double mg = LN ? sg / double(HD) : 0.0, mgx = sgx / double(HD);
    for (int64_t d = 0; d < HD; ++d) {
      const double dy = double(g[o + d]), xh = xhat[size_t(d)];
      dw[p][size_t(d)] += dy * xh;
      if constexpr (LN) db[p][size_t(d)] += dy;
      g[o + d] = T(rstd * (dy * (double(w[d]) + one) - mg - xh * mgx));
    }
  });
  Tensor* dws[2] = {&dwq, &dwk};
  Tensor* dbs[2] = {dbq, dbk};
  for (int p = 0; p < 2; ++p)
    for (int64_t d = 0; d < HD; ++d) {
      dws[p]->data<T>()[d] += T(dw[p][size_t(d)]);
      if constexpr (LN) dbs[p]->data<T>()[d] += T(db[p][size_t(d)]);
    }
}

template <bool LN>
void forward(const char* op, const Tensor& x, const Tensor& wq, const Tensor* bq, const Tensor& wk,
             const Tensor* bk, int64_t r, double eps, bool one_plus, Tensor& y, Stream& s) {
  const Check ck{op};
  ck.stream(s);
  check(ck, x, wq, wk, r);
  if constexpr (LN) {
    check_hd(ck, *bq, "bq", x.dtype(), wq.numel());
    check_hd(ck, *bk, "bk", x.dtype(), wq.numel());
  }
  ck.dtype(y, "y", x.dtype());
  MCPP_CHECK(y.numel() == x.numel(), "{}: y has {} values, x {}", op, y.numel(), x.numel());
  if (x.dtype() == DType::F64)
    forward_t<LN, double>(x, wq, bq, wk, bk, r, eps, one_plus, y);
  else
    forward_t<LN, float>(x, wq, bq, wk, bk, r, eps, one_plus, y);
}

template <bool LN>
void backward(const char* op, const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r,
              double eps, bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor* dbq, Tensor& dwk,
              Tensor* dbk, Stream& s) {
  const Check ck{op};
  ck.stream(s);
  check(ck, x, wq, wk, r);
  ck.dtype(dqkv, "dqkv", x.dtype());
  MCPP_CHECK(dqkv.numel() == x.numel(), "{}: dqkv has {} values, x {}", op, dqkv.numel(),
             x.numel());
  check_hd(ck, dwq, "dwq", x.dtype(), wq.numel());
  check_hd(ck, dwk, "dwk", x.dtype(), wq.numel());
  if constexpr (LN) {
    check_hd(ck, *dbq, "dbq", x.dtype(), wq.numel());
    check_hd(ck, *dbk, "dbk", x.dtype(), wq.numel());
  }
  if (x.dtype() == DType::F64)
    backward_t<LN, double>(x, wq, wk, r, eps, one_plus, dqkv, dwq, dbq, dwk, dbk);
  else
    backward_t<LN, float>(x, wq, wk, r, eps, one_plus, dqkv, dwq, dbq, dwk, dbk);
}

}  // namespace

void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                     bool one_plus, Tensor& y, Stream& s) {
  forward<false>("qk_norm_forward", x, wq, nullptr, wk, nullptr, r, eps, one_plus, y, s);
}

void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r, double eps,
                      bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dwk, Stream& s) {
  backward<false>("qk_norm_backward", x, wq, wk, r, eps, one_plus, dqkv, dwq, nullptr, dwk, nullptr,
                  s);
}

void qk_layernorm_forward(const Tensor& x, const Tensor& wq, const Tensor& bq, const Tensor& wk,
                          const Tensor& bk, int64_t r, double eps, bool one_plus, Tensor& y,
                          Stream& s) {
  forward<true>("qk_layernorm_forward", x, wq, &bq, wk, &bk, r, eps, one_plus, y, s);
}

void qk_layernorm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, int64_t r,
                           double eps, bool one_plus, Tensor& dqkv, Tensor& dwq, Tensor& dbq,
                           Tensor& dwk, Tensor& dbk, Stream& s) {
  backward<true>("qk_layernorm_backward", x, wq, wk, r, eps, one_plus, dqkv, dwq, &dbq, dwk, &dbk,
                 s);
}

}  // namespace mcpp::ops::cpu
