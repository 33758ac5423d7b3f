// Attention against a KV cache (generation), CPU backend; f32 or f64 (all tensors of one
// dtype T; scores, softmax sums and the output accumulator in double).
//
//   qkv      [Sq, B, NG, NH/NG + 2, HD]  new positions p0 .. p0+Sq-1, grouped layout
//   k_cache  [Tmax, B, NG, HD]           rows [p0, p0+Sq) overwritten (=) with qkv's keys
//   v_cache  [Tmax, B, NG, HD]           rows [p0, p0+Sq) overwritten (=) with qkv's values
//   out      [Sq, B, NH*HD]              (=)
//
// Query head h of new row i (absolute position p0+i) attends to cached rows 0 .. p0+i of
// group h / (NH/NG): softmax(scale * q.k) @ v, the same function as attention_forward with
// dropout off. Decode steps have Sq = 1, so the work is B * NH independent dot-product
// sweeps over the cache; a plain two-pass softmax per (i, b, h) with the scores in a
// thread-local row is simpler than tiling and memory-bound either way.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {
namespace {

template <typename T>
void kv_cache_attention(const T* qkv, const AttentionDims& d, int64_t p0, double scale, T* kc,
                        T* vc, T* out) {
  const int64_t Sq = d.S, B = d.B, NH = d.NH, NG = d.NG, HD = d.HD, G = NH / NG;
  const int64_t W = d.qkv_width();  // qkv elements per (s, b)
  const int64_t C = B * NG * HD;    // cache elements per position
  // 1. Append the new keys and values.
#pragma omp parallel for collapse(2) schedule(static) if (Sq * C > kParallelGrain)
  for (int64_t i = 0; i < Sq; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < NG; ++g) {
        const T* src = qkv + (i * B + b) * W + g * (G + 2) * HD;
        const int64_t dst = (p0 + i) * C + (b * NG + g) * HD;
        std::copy(src + G * HD, src + (G + 1) * HD, kc + dst);
        std::copy(src + (G + 1) * HD, src + (G + 2) * HD, vc + dst);
      }
  // 2. Attend.
  const int64_t items = Sq * B * NH;
#pragma omp parallel if (items * (p0 + Sq) * HD > kParallelGrain)
  {
    std::vector<double> p(static_cast<size_t>(p0 + Sq)), acc(static_cast<size_t>(HD));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t h = it % NH, b = (it / NH) % B, i = it / (NH * B);
      const int64_t g = h / G, len = p0 + i + 1;
      const T* q = qkv + (i * B + b) * W + (g * (G + 2) + h % G) * HD;
      double mx = -INFINITY;
      for (int64_t k = 0; k < len; ++k) {
        const T* kr = kc + k * C + (b * NG + g) * HD;
        double dot = 0;
        for (int64_t c = 0; c < HD; ++c) dot += double(q[c]) * double(kr[c]);
        p[size_t(k)] = dot * scale;
        mx = std::max(mx, p[size_t(k)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < len; ++k) {
        const double e = std::exp(p[size_t(k)] - mx);
        sum += e;
        const T* vr = vc + k * C + (b * NG + g) * HD;
        for (int64_t c = 0; c < HD; ++c) acc[size_t(c)] += e * double(vr[c]);
      }
      T* o = out + (i * B + b) * NH * HD + h * HD;
      for (int64_t c = 0; c < HD; ++c) o[c] = T(acc[size_t(c)] / sum);
    }
  }
}

}  // namespace

void attention_kv_cache_forward(const Tensor& qkv, const AttentionDims& d, int64_t p0,
                                double softmax_scale, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                Stream& s) {
  Check c{"attention_kv_cache_forward"};
  c.stream(s);
  MCPP_CHECK(d.S > 0 && d.B > 0 && d.NH > 0 && d.NG > 0 && d.HD > 0 && d.NH % d.NG == 0,
             "attention_kv_cache_forward: invalid dims S={} B={} NH={} NG={} HD={} (all "
             "positive, NG | NH)",
             d.S, d.B, d.NH, d.NG, d.HD);
  MCPP_CHECK(softmax_scale > 0, "attention_kv_cache_forward: softmax_scale={} must be positive",
             softmax_scale);
  const DType dt = c.floating(qkv, "qkv");
  c.numel(qkv, "qkv", d.S * d.B * d.qkv_width());
  for (const Tensor* t : {&k_cache, &v_cache}) {
    c.dtype(*t, t == &k_cache ? "k_cache" : "v_cache", dt);
    MCPP_CHECK(t->dim() == 4 && t->size(1) == d.B && t->size(2) == d.NG && t->size(3) == d.HD,
               "attention_kv_cache_forward: cache {} is not [Tmax, B={}, NG={}, HD={}]", t->str(),
               d.B, d.NG, d.HD);
  }
  c.shape(v_cache, "v_cache", k_cache.shape());
  MCPP_CHECK(p0 >= 0 && p0 + d.S <= k_cache.size(0),
             "attention_kv_cache_forward: positions [{}, {}) do not fit a cache of {} rows", p0,
             p0 + d.S, k_cache.size(0));
  c.dtype(out, "out", dt);
  c.numel(out, "out", d.S * d.B * d.NH * d.HD);
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    kv_cache_attention<T>(qkv.data<T>(), d, p0, softmax_scale, k_cache.data<T>(), v_cache.data<T>(),
                          out.data<T>());
  });
}

}  // namespace mcpp::ops::cpu
