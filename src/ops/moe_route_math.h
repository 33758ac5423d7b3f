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

#include "ops/moe_route.h"

#ifdef __CUDACC__
#define MCPP_MOE_HD __host__ __device__
#else
#define MCPP_MOE_HD
#endif

namespace mcpp::ops::moe_math {

MCPP_MOE_HD inline float exp_(float x) { return expf(x); }
MCPP_MOE_HD inline double exp_(double x) { return exp(x); }
MCPP_MOE_HD inline float log_(float x) { return logf(x); }
MCPP_MOE_HD inline double log_(double x) { return log(x); }
template <class F> MCPP_MOE_HD inline F sigmoid_(F x) { return F(1) / (F(1) + exp_(-x)); }
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
  if (r.sigmoid) {
    for (int64_t e = 0; e < E; ++e) sel[e] = sigmoid_(l[e]) + (bias ? F(bias[e]) : F(0));
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
  if (!r.sigmoid && !r.pre_softmax) {  // softmax over the k selected logits
    for (int64_t j = 0; j < k; ++j) tmp[j] = l[idx[j]];
    softmax(tmp, k, p);
  } else if (r.pre_softmax) {  // the full softmax's values (sel was it before the masking)
    softmax(l, E, sel);
    for (int64_t j = 0; j < k; ++j) p[j] = sel[idx[j]];
  } else {
    F sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (tmp[j] = sigmoid_(l[idx[j]]));
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

// The aux loss's scores of one token: the full softmax, or sigmoid normalised over E.
template <class F>
MCPP_MOE_HD inline void aux_scores(const MoeRouteSpec& r, const F* l, F* s) {
  if (!r.sigmoid) {
    softmax(l, r.E, s);
    return;
  }
  F z = 0;
  for (int64_t e = 0; e < r.E; ++e) z += (s[e] = sigmoid_(l[e]));
  for (int64_t e = 0; e < r.E; ++e) s[e] /= z + F(1e-20);
}

// d(loss)/d(logits) of one token into dl [E] (=): dp [k] = d(loss)/d(prob) through the
// routing's Jacobian; with `own`, the aux gradient (ds_scale * counts[e], through the aux
// scores) and the z-loss gradient (zc * lse * softmax(l)). tmp [E] and s [E] are scratch.
template <class F>
MCPP_MOE_HD inline void route_token_backward(const MoeRouteSpec& r, const F* l, const int64_t* idx,
                                         const F* dprob, bool own, const F* counts, F ds_scale,
                                         F zc, F* dl, F* s, F* tmp) {
  const int64_t E = r.E, k = r.k;
  const F sf = r.scaling > 0 ? F(r.scaling) : F(1);
  for (int64_t e = 0; e < E; ++e) dl[e] = 0;
  if (!r.sigmoid && !r.pre_softmax) {  // p = softmax(l[idx])
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
  } else {  // p = a[idx] / (sum + eps), a = sigmoid(l)
    F sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      tmp[j] = sigmoid_(l[idx[j]]);
      sum += tmp[j], dot += sf * dprob[j] * tmp[j];
    }
    const F D = sum + F(1e-20);
    for (int64_t j = 0; j < k; ++j) {
      const F dpj = sf * dprob[j];
      const F draw = k > 1 ? dpj / D - dot / (D * D) : dpj;
      dl[idx[j]] += draw * tmp[j] * (F(1) - tmp[j]);
    }
  }
  if (!own) return;
  if (r.aux) {  // dL/ds[e] = ds_scale * c_e, through the aux scores
    if (!r.sigmoid) {
      softmax(l, E, s);
      F dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += s[e] * (ds_scale * counts[e]);
      for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (ds_scale * counts[e] - dot);
    } else {  // s = a / (sum a + eps)
      F z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) tmp[e] = sigmoid_(l[e]), z += tmp[e];
      const F Z = z + F(1e-20);
      for (int64_t e = 0; e < E; ++e) dot += ds_scale * counts[e] * tmp[e];
      for (int64_t e = 0; e < E; ++e)
        dl[e] += (ds_scale * counts[e] / Z - dot / (Z * Z)) * tmp[e] * (F(1) - tmp[e]);
    }
  }
  if (r.z) {  // dL/dl = coeff * 2 lse softmax(l) / T (zc carries coeff * 2 / T)
    const F lse = softmax(l, E, s);
    for (int64_t e = 0; e < E; ++e) dl[e] += zc * lse * s[e];
  }
}

}  // namespace mcpp::ops::moe_math
