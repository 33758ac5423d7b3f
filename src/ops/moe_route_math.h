// The per-token math of the routing ops (catalogue.inc, ---- MoE routing), written once for
// both backends: the CPU op (ops/cpu/moe.cpp) and the CUDA kernels (ops/cuda/moe_route.cu)
// call these same functions, so their sums run in the same order and their top-k decisions
// can differ only where the two libraries' exp differs in the last bit. F is the compute
// type (the CUDA kernels use float; the CPU op the logits' dtype). The formulas are
// model/moe/routing.h's (Megatron's topk_routing_with_score_function and aux losses).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/moe_route.h"  // MCPP_MOE_HD: host and device functions under nvcc

namespace mcpp::ops::moe_math {

MCPP_MOE_HD inline float exp_(float x) { return expf(x); }
MCPP_MOE_HD inline double exp_(double x) { return exp(x); }
MCPP_MOE_HD inline float log_(float x) { return logf(x); }
MCPP_MOE_HD inline double log_(double x) { return log(x); }
MCPP_MOE_HD inline float log1p_(float x) { return log1pf(x); }
MCPP_MOE_HD inline double log1p_(double x) { return log1p(x); }
MCPP_MOE_HD inline float sqrt_(float x) { return sqrtf(x); }
MCPP_MOE_HD inline double sqrt_(double x) { return sqrt(x); }
template <class F> MCPP_MOE_HD inline F sigmoid_(F x) { return F(1) / (F(1) + exp_(-x)); }

// The sigmoid-like score of a logit (r.score sigmoid or sqrtsoftplus, softplus in its
// overflow-free form), and its derivative given a = score_(r, x): a (1 - a), or
// sigmoid(x) / (2 a), 0 where a underflows to 0 (the limit).
template <class F> MCPP_MOE_HD inline F score_(const MoeRouteSpec& r, F x) {
  if (r.score == MoeScore::Sigmoid) return sigmoid_(x);
  const F ax = x < F(0) ? -x : x;
  return sqrt_(log1p_(exp_(-ax)) + (x > F(0) ? x : F(0)));
}
template <class F> MCPP_MOE_HD inline F dscore_(const MoeRouteSpec& r, F x, F a) {
  if (r.score == MoeScore::Sigmoid) return a * (F(1) - a);
  return a > F(0) ? sigmoid_(x) / (F(2) * a) : F(0);
}
template <class F> MCPP_MOE_HD inline F neg_inf() { return F(-INFINITY); }

// The k largest of v[0..n) in descending order, ties to the lower index: k passes of a
// first-maximum scan (k is small), skipping what earlier passes took.
template <class F>
MCPP_MOE_HD inline void topk(const F* v, int64_t n, int64_t k, int64_t* out) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int64_t q = 0; q < j; ++q) taken = taken || out[q] == e;
      if (taken) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    out[j] = best;
  }
}

// softmax of l[0..n) into s; returns logsumexp.
template <class F>
MCPP_MOE_HD inline F softmax(const F* l, int64_t n, F* s) {
  F mx = neg_inf<F>();
  for (int64_t e = 0; e < n; ++e) mx = l[e] > mx ? l[e] : mx;
  F sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += (s[e] = exp_(l[e] - mx));
  for (int64_t e = 0; e < n; ++e) s[e] /= sum;
  return mx + log_(sum);
}

// One token's routing: l [E] logits, bias [E] or null -> idx [k], p [k].
// sel [E] and tmp [max(E, G) + k] are scratch.
template <class F>
MCPP_MOE_HD inline void route_token(const MoeRouteSpec& r, const F* l, const float* bias, F* sel,
                                F* tmp, int64_t* idx, F* p) {
  const int64_t E = r.E, k = r.k;
  if (r.sigmoid_like()) {
    for (int64_t e = 0; e < E; ++e) sel[e] = score_(r, l[e]) + (bias ? F(bias[e]) : F(0));
  } else if (r.pre_softmax) {
    softmax(l, E, sel);
  } else {
    for (int64_t e = 0; e < E; ++e) sel[e] = l[e];
  }
  if (r.group_topk > 0) {  // Megatron's group_limited_topk
    const int64_t G = r.num_groups, per = E / G, kg = k / r.group_topk;
    int64_t* top = idx;  // idx is free until the final top-k; kg <= k
    F* gscore = tmp;
    for (int64_t g = 0; g < G; ++g) {
      topk(sel + g * per, per, kg, top);
      F s = 0;
      for (int64_t i = 0; i < kg; ++i) s += sel[g * per + top[i]];
      gscore[g] = s;
    }
    topk(gscore, G, r.group_topk, top);
    for (int64_t e = 0; e < E; ++e) {
      bool on = false;
      for (int64_t i = 0; i < r.group_topk; ++i) on = on || top[i] == e / per;
      if (!on) sel[e] = neg_inf<F>();
    }
  }
  topk(sel, E, k, idx);
  if (!r.sigmoid_like() && !r.pre_softmax) {  // softmax over the k selected logits
    for (int64_t j = 0; j < k; ++j) tmp[j] = l[idx[j]];
    softmax(tmp, k, p);
  } else if (r.pre_softmax) {  // the full softmax's values (sel was it before the masking)
    softmax(l, E, sel);
    for (int64_t j = 0; j < k; ++j) p[j] = sel[idx[j]];
  } else {
    F sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (tmp[j] = score_(r, l[idx[j]]));
    for (int64_t j = 0; j < k; ++j) p[j] = k > 1 ? tmp[j] / (sum + F(1e-20)) : tmp[j];
  }
  if (r.scaling > 0)
    for (int64_t j = 0; j < k; ++j) p[j] *= F(r.scaling);
}

// Token dropping in one block of Tb tokens (model/moe/routing.h, per block): an expert kept
// `kept` of its (token, slot) pairs (at most cap). Pad-to-capacity fills it to cap and
// pad_multiple rounds its rows up to a multiple, both with the block's earliest tokens not
// kept (at most Tb - kept of them: an expert holds each token once). Returns the padding
// rows; *bias gets the expert-bias count (kept + the pad-to-capacity rows, without
// pad_multiple's, as the host routing counts them).
MCPP_MOE_HD inline int64_t pad_rows(const MoeRouteSpec& r, int64_t kept, int64_t cap, int64_t Tb,
                                    int64_t* bias) {
  const int64_t to_cap = r.capacity_factor > 0 && r.pad_to_capacity ? cap - kept : 0;
  const int64_t pm = r.pad_multiple, base = kept + to_cap;
  const int64_t more = pm > 1 ? (pm - base % pm) % pm : 0;
  *bias = base;
  return to_cap + more < Tb - kept ? to_cap + more : Tb - kept;
}

// The row, within its (expert, block) rows, of a token of the block: before it come the kept
// tokens before it (kb) and those of the `pad` earliest not-kept tokens that are before it
// (nk: the not-kept tokens before it). Rows stay in token order. A not-kept token is a
// padding row when nk < pad.
MCPP_MOE_HD inline int64_t row_in_block(int64_t kb, int64_t nk, int64_t pad) {
  return kb + (nk < pad ? nk : pad);
}

// The aux losses' scores of one token: the full softmax, or the sigmoid-like scores
// normalised over E.
template <class F>
MCPP_MOE_HD inline void aux_scores(const MoeRouteSpec& r, const F* l, F* s) {
  if (!r.sigmoid_like()) {
    softmax(l, r.E, s);
    return;
  }
  F z = 0;
  for (int64_t e = 0; e < r.E; ++e) z += (s[e] = score_(r, l[e]));
  for (int64_t e = 0; e < r.E; ++e) s[e] /= z + F(1e-20);
}

// The aux losses' gradient of one token: dL/ds[e] = sum_i scale[i] * row[i][e] over the aux
// losses that are on (row[i] null: off), s its aux scores; the rows are the counts of the
// token's group (moe_aux_rows), scale[i] carries coeff E / (k Tg^2) / G.
template <class F>
struct AuxGrad {
  const F* row[3] = {nullptr, nullptr, nullptr};
  F scale[3] = {F(0), F(0), F(0)};
};

// The aux losses' factors E / (k Tg^2) / G (no coefficients) for T tokens in B sequences:
// f[0] aux_loss (Tg = T cp, G = 1), f[1] seq_aux_loss (Tg = T/B cp, G = B), f[2]
// global_aux_loss (Tg = T global_ranks, G = 1).
MCPP_MOE_HD inline void aux_factors(const MoeRouteSpec& r, int64_t T, int64_t B, double* f) {
  const double Ta = double(T) * double(r.cp), Ts = double(T / B) * double(r.cp);
  const double Tgl = double(T) * double(r.global_ranks), Ek = double(r.E) / double(r.k);
  f[0] = Ek / (Ta * Ta), f[1] = Ek / (Ts * Ts) / double(B), f[2] = Ek / (Tgl * Tgl);
}

// Token t's AuxGrad from the counts [moe_aux_rows(r, B), E] and the per-type scales
// (coefficient x aux_factors x the caller's aux_scale), in aux_factors' order.
template <class F>
MCPP_MOE_HD inline AuxGrad<F> aux_grad(const MoeRouteSpec& r, const F* counts, int64_t t,
                                       int64_t B, const F* scale) {
  AuxGrad<F> g;
  if (r.aux) g.row[0] = counts + moe_aux_row(r, B) * r.E, g.scale[0] = scale[0];
  if (r.seq_aux) g.row[1] = counts + (t % B) * r.E, g.scale[1] = scale[1];
  if (r.global_aux) g.row[2] = counts + moe_aux_global_row(r, B) * r.E, g.scale[2] = scale[2];
  return g;
}

// d(loss)/d(logits) of one token into dl [E] (=): dp [k] = d(loss)/d(prob) through the
// routing's Jacobian; with `own`, the aux gradient (ag, through the aux scores) and the
// z-loss gradient (zc * lse * softmax(l)). tmp [E] and s [E] are scratch.
template <class F>
MCPP_MOE_HD inline void route_token_backward(const MoeRouteSpec& r, const F* l, const int64_t* idx,
                                         const F* dprob, bool own, const AuxGrad<F>& ag, F zc,
                                         F* dl, F* s, F* tmp) {
  const int64_t E = r.E, k = r.k;
  const F sf = r.scaling > 0 ? F(r.scaling) : F(1);
  for (int64_t e = 0; e < E; ++e) dl[e] = 0;
  if (!r.sigmoid_like() && !r.pre_softmax) {  // p = softmax(l[idx])
    for (int64_t j = 0; j < k; ++j) tmp[j] = l[idx[j]];
    softmax(tmp, k, s);
    F dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += s[j] * (sf * dprob[j]);
    for (int64_t j = 0; j < k; ++j) dl[idx[j]] += s[j] * (sf * dprob[j] - dot);
  } else if (r.pre_softmax) {  // p = s[idx], s = softmax(l)
    softmax(l, E, s);
    F dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += s[idx[j]] * (sf * dprob[j]);
    for (int64_t e = 0; e < E; ++e) dl[e] -= s[e] * dot;
    for (int64_t j = 0; j < k; ++j) dl[idx[j]] += s[idx[j]] * (sf * dprob[j]);
  } else {  // p = a[idx] / (sum + eps), a = sigmoid(l) or sqrt(softplus(l))
    F sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      tmp[j] = score_(r, l[idx[j]]);
      sum += tmp[j], dot += sf * dprob[j] * tmp[j];
    }
    const F D = sum + F(1e-20);
    for (int64_t j = 0; j < k; ++j) {
      const F dpj = sf * dprob[j];
      const F draw = k > 1 ? dpj / D - dot / (D * D) : dpj;
      dl[idx[j]] += draw * dscore_(r, l[idx[j]], tmp[j]);
    }
  }
  if (!own) return;
  if (r.any_aux()) {  // dL/ds[e] = sum_i scale_i * row_i[e] (into s), through the aux scores
    for (int64_t e = 0; e < E; ++e) {
      F g = 0;
      for (int i = 0; i < 3; ++i)
        if (ag.row[i]) g += ag.scale[i] * ag.row[i][e];
      s[e] = g;
    }
    if (!r.sigmoid_like()) {  // tmp = softmax(l)
      softmax(l, E, tmp);
      F dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += tmp[e] * s[e];
      for (int64_t e = 0; e < E; ++e) dl[e] += tmp[e] * (s[e] - dot);
    } else {  // scores a / (sum a + eps), tmp = a
      F z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) tmp[e] = score_(r, l[e]), z += tmp[e];
      const F Z = z + F(1e-20);
      for (int64_t e = 0; e < E; ++e) dot += s[e] * tmp[e];
      for (int64_t e = 0; e < E; ++e)
        dl[e] += (s[e] / Z - dot / (Z * Z)) * dscore_(r, l[e], tmp[e]);
    }
  }
  if (r.z) {  // dL/dl = coeff * 2 lse softmax(l) / T (zc carries coeff * 2 / T)
    const F lse = softmax(l, E, s);
    for (int64_t e = 0; e < E; ++e) dl[e] += zc * lse * s[e];
  }
}

}  // namespace mcpp::ops::moe_math
