// Attention against a KV cache (generation), CPU backend; f32 or f64 (all tensors of one
// dtype T; scores, softmax sums and the output accumulator in double).
//
//   qkv      [Sq, B, NG, NH/NG + 2, HD]  new rows; sequence b's row i is at position pos[b]+i
//   pos      [B] i64                     each sequence's first new position (its cache length)
//   k_cache  [B, Tmax, NG, HD]           slot b's rows [pos[b], pos[b]+Sq) overwritten (=)
//   v_cache  [B, Tmax, NG, HD]           likewise with qkv's values
//   out      [Sq, B, NH*HD]              (=)
//
// Query head h of row i of sequence b attends to rows 0 .. pos[b]+i of its own cache slot
// (d.first_key(pos[b]+i) .. pos[b]+i under a sliding window), group h / (NH/NG):
// softmax(scale * q.k) @ v, the same function as attention_forward with dropout off (a
// window layer's there comes as key_start). Sequences of one batch may sit at different positions (prompts of
// different lengths). Decode steps have Sq = 1, so the work is B * NH independent
// dot-product sweeps over the cache; a plain two-pass softmax per (i, b, h) with the
// scores in a thread-local row is simpler than tiling and memory-bound either way.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/kv_attend.h"
#include "ops/kv_cache_checks.h"

namespace mcpp::ops::cpu {
namespace {

// 1. Append the new keys and values of qkv's Sq rows to their slots.
template <typename T>
void kv_append(const T* qkv, const AttentionDims& d, const int64_t* pos, int64_t Tmax, T* kc,
               T* vc) {
  const int64_t Sq = d.S, B = d.B, NG = d.NG, HD = d.HD, G = d.NH / NG;
  const int64_t W = d.qkv_width(), C = NG * HD;
#pragma omp parallel for collapse(2) schedule(static) if (Sq * C > kParallelGrain)
  for (int64_t i = 0; i < Sq; ++i)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < NG; ++g) {
        const T* src = qkv + (i * B + b) * W + g * (G + 2) * HD;
        const int64_t dst = (b * Tmax + pos[b] + i) * C + g * HD;
        std::copy(src + G * HD, src + (G + 1) * HD, kc + dst);
        std::copy(src + (G + 1) * HD, src + (G + 2) * HD, vc + dst);
      }
}

// 2. Attend: row i of sequence b, head h, over its slot's keys d.first_key(pos[b] + i) ..
// pos[b] + i, with the sinks of d.sink.
template <typename T>
void kv_attend(const T* qkv, const AttentionDims& d, const int64_t* pos, int64_t Tmax,
               double scale, const T* kc, const T* vc, T* out) {
  const int64_t Sq = d.S, B = d.B, NH = d.NH, NG = d.NG, HD = d.HD, G = NH / NG;
  const int64_t W = d.qkv_width();  // qkv elements per (s, b)
  const int64_t C = NG * HD;        // cache elements per position of one slot
  int64_t reach = 0;                // the most keys any query row reads
  for (int64_t b = 0; b < B; ++b) reach = std::max(reach, pos[b] + Sq);
  // Attention sinks (d.sink, [NH] f32 or f64): one more logit a head, with no value.
  std::function<double(int64_t)> sink;
  if (d.sink.defined()) {
    MCPP_CHECK(d.sink.device() == Device::CPU && d.sink.numel() >= NH &&
                   (d.sink.dtype() == DType::F32 || d.sink.dtype() == DType::F64),
               "attention over a KV cache: sink {} is not {} f32/f64 CPU values", d.sink.str(),
               NH);
    const Tensor z = d.sink;
    sink = [z](int64_t h) {
      return z.dtype() == DType::F32 ? double(z.data<float>()[h]) : z.data<double>()[h];
    };
  }
  const int64_t items = Sq * B * NH;
#pragma omp parallel if (items * reach * HD > kParallelGrain)
  {
    std::vector<double> p(static_cast<size_t>(reach)), acc(static_cast<size_t>(HD));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t h = it % NH, b = (it / NH) % B, i = it / (NH * B);
      const int64_t g = h / G, lo = d.first_key(pos[b] + i), len = pos[b] + i + 1 - lo;
      const T* kslot = kc + (b * Tmax + lo) * C + g * HD;  // keys lo .. pos[b] + i
      const T* vslot = vc + (b * Tmax + lo) * C + g * HD;
      const T* q = qkv + (i * B + b) * W + (g * (G + 2) + h % G) * HD;
      double mx = -INFINITY;
      for (int64_t k = 0; k < len; ++k) {
        const T* kr = kslot + k * C;
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
        const T* vr = vslot + k * C;
        for (int64_t c = 0; c < HD; ++c) acc[size_t(c)] += e * double(vr[c]);
      }
      if (sink) sum += std::exp(sink(h) - mx);  // the sink's logit: no value
      T* o = out + (i * B + b) * NH * HD + h * HD;
      for (int64_t c = 0; c < HD; ++c) o[c] = T(acc[size_t(c)] / sum);
    }
  }
}

}  // namespace

void attention_kv_cache_forward(const Tensor& qkv, const AttentionDims& d, const Tensor& pos,
                                double softmax_scale, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                Stream& s) {
  Check c{"attention_kv_cache_forward"};
  c.stream(s);
  MCPP_CHECK(softmax_scale > 0, "attention_kv_cache_forward: softmax_scale={} must be positive",
             softmax_scale);
  const DType dt = c.floating(qkv, "qkv");
  for (auto [t, name] : {std::pair{&pos, "pos"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"},
                         {static_cast<const Tensor*>(&out), "out"}})
    c.defined(*t, name);  // on the CPU
  check_kv_cache_args("attention_kv_cache_forward", qkv, d, pos, k_cache, v_cache, out);
  const int64_t Tmax = k_cache.size(1);
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t p0 = pos.data<int64_t>()[b];
    MCPP_CHECK(p0 >= 0 && p0 + d.S <= Tmax,
               "attention_kv_cache_forward: sequence {}'s positions [{}, {}) do not fit a cache "
               "of {} rows",
               b, p0, p0 + d.S, Tmax);
  }
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    kv_append<T>(qkv.data<T>(), d, pos.data<int64_t>(), Tmax, k_cache.data<T>(),
                 v_cache.data<T>());
  });
  kv_cache_attend(qkv, d, pos.data<int64_t>(), softmax_scale, k_cache, v_cache, out);
}

void kv_cache_attend(const Tensor& qkv, const AttentionDims& d, const int64_t* pos,
                     double softmax_scale, const Tensor& k_cache, const Tensor& v_cache,
                     Tensor& out) {
  dispatch_float(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    kv_attend<T>(qkv.data<T>(), d, pos, k_cache.size(1), softmax_scale, k_cache.data<T>(),
                 v_cache.data<T>(), out.data<T>());
  });
}

// A prefill from position 0: the same op with every position 0 (lse is not written).
void attention_prefill(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                       Tensor& k_cache, Tensor& v_cache, Tensor& out, Tensor& /*lse*/,
                       Stream& s) {
  const Tensor pos = Tensor::zeros({d.B}, DType::I64);
  cpu::attention_kv_cache_forward(qkv, d, pos, softmax_scale, k_cache, v_cache, out, s);
}

}  // namespace mcpp::ops::cpu
