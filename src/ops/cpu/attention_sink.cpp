// Attention sinks on the CPU (catalogue.inc, attention_sink_forward / _backward): the sink
// logit joins each softmax row after the attention, through the row's log-sum-exp.
#include <cmath>
#include <limits>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

void check_args(const Check& c, const Tensor& out, const Tensor& lse, const Tensor& sink,
                int64_t h0, const AttentionDims& d) {
  const DType dt = c.floating(out, "out");
  c.dtype(lse, "lse", dt);
  c.floating(sink, "sink");
  c.numel(out, "out", d.S * d.B * d.NH * d.HD);
  MCPP_CHECK(lse.numel() >= d.lse_span(), "{}: lse has {} elements, the layout needs {}", c.op,
             lse.numel(), d.lse_span());
  MCPP_CHECK(h0 >= 0 && sink.numel() >= h0 + d.NH,
             "{}: sink has {} heads, heads {}..{} asked for", c.op, sink.numel(), h0,
             h0 + d.NH - 1);
}

template <class T, class W>
void forward_impl(T* out, T* lse, const W* sink, const AttentionDims& d, int64_t h0) {
  const int64_t rows = d.S * d.B * d.NH, HD = d.HD, ld = d.lse_stride();
#pragma omp parallel for if (rows * HD > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {  // r = (s * B + b) * NH + h
    const int64_t h = r % d.NH, sb = r / d.NH, b = sb % d.B, s = sb / d.B;
    T& l = lse[(b * d.NH + h) * ld + s];
    const double z = double(sink[h0 + h]), lv = double(l);
    // f = exp(l) / (exp(l) + exp(z)); l' = logaddexp(l, z).
    const double f =
        lv == -std::numeric_limits<double>::infinity() ? 0.0 : 1 / (1 + std::exp(z - lv));
    const double hi = std::max(lv, z), lo = std::min(lv, z);
    l = T(hi + std::log1p(std::exp(lo - hi)));
    T* o = out + r * HD;
    for (int64_t k = 0; k < HD; ++k) o[k] = T(double(o[k]) * f);
  }
}

template <class T, class W>
void backward_impl(const T* dout, const T* out, const T* lse, const W* sink,
                   const AttentionDims& d, int64_t h0, T* dsink) {
  const int64_t HD = d.HD, ld = d.lse_stride();
  for (int64_t h = 0; h < d.NH; ++h) {  // rows in a fixed order: the same sum every run
    const double z = double(sink[h0 + h]);
    double acc = 0;
    for (int64_t s = 0; s < d.S; ++s)
      for (int64_t b = 0; b < d.B; ++b) {
        const int64_t r = (s * d.B + b) * d.NH + h;
        double delta = 0;
        for (int64_t k = 0; k < HD; ++k)
          delta += double(dout[r * HD + k]) * double(out[r * HD + k]);
        acc += std::exp(z - double(lse[(b * d.NH + h) * ld + s])) * delta;
      }
    dsink[h0 + h] = T(double(dsink[h0 + h]) - acc);
  }
}

template <class F>
void with_sink(const Tensor& sink, F&& f) {
  if (sink.dtype() == DType::F32) return f(sink.data<float>());
  return f(sink.data<double>());
}

}  // namespace

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink, int64_t h0,
                            const AttentionDims& d, Stream& s) {
  const Check c{"attention_sink_forward"};
  c.stream(s);
  check_args(c, out, lse, sink, h0, d);
  dispatch_float(out.dtype(), [&](auto t) {
    using T = decltype(t);
    with_sink(sink, [&](const auto* w) { forward_impl(out.data<T>(), lse.data<T>(), w, d, h0); });
  });
}

void attention_sink_backward(const Tensor& dout, const Tensor& out, const Tensor& lse,
                             const Tensor& sink, int64_t h0, const AttentionDims& d,
                             Tensor& dsink, Stream& s) {
  const Check c{"attention_sink_backward"};
  c.stream(s);
  check_args(c, out, lse, sink, h0, d);
  c.dtype(dout, "dout", out.dtype());
  c.numel(dout, "dout", out.numel());
  c.dtype(dsink, "dsink", out.dtype());
  MCPP_CHECK(dsink.numel() >= h0 + d.NH, "{}: dsink has {} elements, heads up to {} asked for",
             c.op, dsink.numel(), h0 + d.NH - 1);
  dispatch_float(out.dtype(), [&](auto t) {
    using T = decltype(t);
    with_sink(sink, [&](const auto* w) {
      backward_impl(dout.data<T>(), out.data<T>(), lse.data<T>(), w, d, h0, dsink.data<T>());
    });
  });
}

}  // namespace mcpp::ops::cpu
