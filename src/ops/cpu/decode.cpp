// The inference ops of the catalogue's `---- inference` section, CPU backend (the
// reference of the CUDA kernels in ops/cuda/decode.cu):
//
//   decode_attention  qkv [S, B, NG, NH/NG + 2, HD], pos [B] i64, k/v cache [B, Tmax, NG, HD]
//                     -> out [S, B, NH*HD] (=): head h of row i of sequence b attends to its
//                     slot's rows 0 .. pos[b] + i (group h / (NH/NG); from
//                     AttentionDims::first_key under a sliding window; with its sinks):
//                     scores, softmax and the weighted sum in double, a plain two-pass
//                     softmax (the reference; ops/cpu/kv_attend.h, shared with
//                     attention_kv_cache_forward)
//   rope_decode       rope_forward of row b at position pos[b] (row by row through it)
//   argmax_rows       logits [R, Vp] -> ids [R] i64 (=): the first largest of [0, V)
//   linear_decode     linear_forward, then add of the residual (the composition the CUDA
//                     GEMV of ops/cuda/gemv.cu fuses)
//   linear_swiglu_decode, rmsnorm_linear_decode, rope_attention_decode: likewise the
//                     compositions the CUDA backend fuses (linear_forward + swiglu_forward;
//                     rmsnorm_forward + linear_decode / linear_swiglu_decode; rope_decode +
//                     attention_kv_cache_forward)
#include <omp.h>

#include <cmath>
#include <utility>
#include <vector>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/kv_attend.h"
#include "ops/kv_cache_checks.h"

namespace mcpp::ops::cpu {

void decode_attention(const Tensor& qkv, const AttentionDims& d, const Tensor& pos,
                      double softmax_scale, const Tensor& k_cache, const Tensor& v_cache,
                      Tensor& out, Stream& s) {
  Check c{"decode_attention"};
  c.stream(s);
  MCPP_CHECK(softmax_scale > 0, "decode_attention: softmax_scale={} must be positive",
             softmax_scale);
  c.floating(qkv, "qkv");
  for (auto [t, name] : {std::pair{&pos, "pos"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"},
                         {static_cast<const Tensor*>(&out), "out"}})
    c.defined(*t, name);  // on the CPU
  check_kv_cache_args("decode_attention", qkv, d, pos, k_cache, v_cache, out);
  const int64_t Tmax = k_cache.size(1);
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t p = pos.data<int64_t>()[b];
    MCPP_CHECK(p >= 0 && p + d.S <= Tmax,
               "decode_attention: sequence {}'s rows [{}, {}) are outside a cache of {} rows", b,
               p, p + d.S, Tmax);
  }
  kv_cache_attend(qkv, d, pos.data<int64_t>(), softmax_scale, k_cache, v_cache, out);
}

void rope_decode(const Tensor& qkv_in, const AttentionDims& d, int64_t rot_dim,
                 const RopeFreqs& freqs, const Tensor& pos, Tensor& qkv_out, Stream& s) {
  Check c{"rope_decode"};
  c.stream(s);
  MCPP_CHECK(d.S == 1, "rope_decode: one row per sequence (S = 1), got S={}", d.S);
  c.dtype(pos, "pos", DType::I64);
  c.numel(pos, "pos", d.B);
  c.numel(qkv_in, "qkv_in", d.B * d.qkv_width());
  c.numel(qkv_out, "qkv_out", d.B * d.qkv_width());
  // Row by row through rope_forward itself: the same numbers by construction.
  AttentionDims d1 = d;
  d1.B = 1;
  const int64_t W = d.qkv_width();
  for (int64_t b = 0; b < d.B; ++b) {
    const Tensor in = qkv_in.view({d.B, W}).narrow(b, 1);
    Tensor out = qkv_out.view({d.B, W}).narrow(b, 1);
    cpu::rope_forward(in, d1, rot_dim, freqs, pos.data<int64_t>()[b], out, s);
  }
}

void argmax_rows(const Tensor& logits, int64_t V, Tensor& ids, Stream& s) {
  Check c{"argmax_rows"};
  c.stream(s);
  const DType dt = c.floating(logits, "logits");
  c.min_dim(logits, "logits", 1);
  const int64_t Vp = logits.size(-1), R = logits.numel() / std::max<int64_t>(Vp, 1);
  MCPP_CHECK(V > 0 && V <= Vp, "argmax_rows: V={} outside (0, {}]", V, Vp);
  c.dtype(ids, "ids", DType::I64);
  c.numel(ids, "ids", R);
  int64_t* o = ids.data<int64_t>();
  dispatch_float(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data<T>();
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * Vp;
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (row[i] > row[best] || (std::isnan(row[best]) && !std::isnan(row[i]))) best = i;
      o[r] = best;
    }
  });
}

void linear_decode(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual,
                   Tensor& y, Stream& s) {
  MCPP_CHECK(!residual.defined() || residual.raw() != y.raw(),
             "linear_decode: residual must not alias y");
  linear_forward(x, w, b, y, s);
  if (residual.defined()) add(residual.view(y.shape()), y, y, s);
}

void linear_swiglu_decode(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& fc1,
                          Tensor& y, Stream& s) {
  linear_forward(x, w, b, fc1, s);
  swiglu_forward(fc1, y, s);
}

void rmsnorm_linear_decode(const Tensor& x, const Tensor& nw, double eps, Tensor& xn,
                           Tensor& rstd, const Tensor& w, const Tensor& b, bool swiglu,
                           Tensor& fc1, Tensor& y, Stream& s) {
  cpu::rmsnorm_forward(x, nw, eps, xn, rstd, s);
  if (swiglu)
    cpu::linear_swiglu_decode(xn, w, b, fc1, y, s);
  else
    cpu::linear_decode(xn, w, b, Tensor(), y, s);
}

void rope_attention_decode(Tensor& qkv, const AttentionDims& d, int64_t rot_dim,
                           const RopeFreqs& freqs, const Tensor& pos, double softmax_scale,
                           Tensor& k_cache, Tensor& v_cache, Tensor& out, Stream& s,
                           std::span<const Tensor* const> /*l2_next: a GPU cache hint*/) {
  cpu::rope_decode(qkv, d, rot_dim, freqs, pos, qkv, s);
  cpu::attention_kv_cache_forward(qkv, d, pos, softmax_scale, k_cache, v_cache, out, s);
}

}  // namespace mcpp::ops::cpu
