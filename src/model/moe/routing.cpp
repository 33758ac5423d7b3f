#include "model/moe/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/error.h"

namespace mcpp::model::moe {
namespace {

using Balance = TransformerConfig::Moe::Balance;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The k largest of v[0..n) (ties: lower index first), in descending order.
void topk(const double* v, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(order.begin(), order.begin() + k, out);
}

void softmax(const double* l, int64_t n, double* s, double* lse_out = nullptr) {
  double mx = kNegInf;
  for (int64_t e = 0; e < n; ++e) mx = std::max(mx, l[e]);
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += (s[e] = std::exp(l[e] - mx));
  for (int64_t e = 0; e < n; ++e) s[e] /= sum;
  if (lse_out) *lse_out = mx + std::log(sum);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The sigmoid-like score functions and their derivative da/dl given a = score(l).
// sqrt(softplus): softplus in its overflow-free form; its derivative sigmoid(l) / (2 a)
// tends to 0 where a underflows to 0.
double score(const TransformerConfig::Moe& m, double x) {
  if (m.score == TransformerConfig::Moe::Score::Sigmoid) return sigmoid(x);
  return std::sqrt(std::log1p(std::exp(-std::abs(x))) + std::max(x, 0.0));
}
double dscore(const TransformerConfig::Moe& m, double x, double a) {
  if (m.score == TransformerConfig::Moe::Score::Sigmoid) return a * (1.0 - a);
  return a > 0 ? sigmoid(x) / (2.0 * a) : 0.0;
}

// Megatron's group_limited_topk: mask every expert outside the best group_topk groups.
void group_limit(const TransformerConfig::Moe& m, int64_t E, double* sel) {
  const int64_t G = m.num_groups, per = E / G, kg = m.topk / m.group_topk;
  std::vector<double> gscore(static_cast<size_t>(G));
  std::vector<int32_t> top(static_cast<size_t>(kg));
  for (int64_t g = 0; g < G; ++g) {
    topk(sel + g * per, per, kg, top.data());
    double s = 0;
    for (int32_t i : top) s += sel[g * per + i];
    gscore[size_t(g)] = s;
  }
  std::vector<int32_t> keep(static_cast<size_t>(m.group_topk));
  topk(gscore.data(), G, m.group_topk, keep.data());
  std::vector<uint8_t> on(static_cast<size_t>(G), 0);
  for (int32_t g : keep) on[size_t(g)] = 1;
  for (int64_t e = 0; e < E; ++e)
    if (!on[size_t(e / per)]) sel[e] = kNegInf;
}

// The aux losses' scores: the full softmax, or the sigmoid-like scores normalised over E.
void aux_score(const TransformerConfig::Moe& m, const double* l, int64_t E, double* s) {
  if (!m.sigmoid_like()) return softmax(l, E, s);
  double z = 0;
  for (int64_t e = 0; e < E; ++e) z += (s[e] = score(m, l[e]));
  for (int64_t e = 0; e < E; ++e) s[e] /= z + 1e-20;
}

// One aux loss's terms: L = coeff E / (k Tg^2) / G * sum_t sum_e c[t % G, e] s[t, e] with its
// counts c [G, E] (token t in group t % G) and Tg tokens per group.
struct AuxTerm {
  Balance type;
  const std::vector<double>* c;
  int64_t G;
  double Tg, coeff;
};
std::vector<AuxTerm> aux_terms(const TransformerConfig::Moe& m, const Routing& r, int64_t B) {
  std::vector<AuxTerm> v;
  const double T = double(r.T);
  if (!r.aux_counts.empty())
    v.push_back(
        {Balance::AuxLoss, &r.aux_counts, 1, T * double(r.cp), m.coeff(Balance::AuxLoss)});
  if (!r.seq_counts.empty())
    v.push_back({Balance::SeqAuxLoss, &r.seq_counts, B, T / double(B) * double(r.cp),
                 m.coeff(Balance::SeqAuxLoss)});
  if (!r.global_counts.empty())
    v.push_back({Balance::GlobalAuxLoss, &r.global_counts, 1, T * double(r.global_ranks),
                 m.coeff(Balance::GlobalAuxLoss)});
  return v;
}
double term_scale(const AuxTerm& a, int64_t E, int64_t k) {
  return a.coeff * double(E) / (double(k) * a.Tg * a.Tg) / double(a.G);
}

}  // namespace

std::vector<double> sinkhorn(const double* logits, int64_t T, int64_t E, double tol) {
  std::vector<double> cost(static_cast<size_t>(T * E)), d0(static_cast<size_t>(T), 1.0),
      d1(static_cast<size_t>(E), 1.0), d1_old(static_cast<size_t>(E), 1.0);
  for (int64_t i = 0; i < T * E; ++i) cost[size_t(i)] = std::exp(logits[i]);
  constexpr double eps = 1e-8;
  double error = 1e9;
  int rounds = 0;
  while (error > tol) {
    MCPP_CHECK(++rounds <= 100000,
               "sinkhorn routing did not converge in 100000 rounds ({} tokens, {} experts; "
               "non-finite router logits?)",
               T, E);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[size_t(e)] * cost[size_t(t * E + e)];
      d0[size_t(t)] = (1.0 / double(T)) * 1.0 / (s + eps);
    }
    std::fill(d1.begin(), d1.end(), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) d1[size_t(e)] += d0[size_t(t)] * cost[size_t(t * E + e)];
    error = 0;
    for (int64_t e = 0; e < E; ++e) {
      d1[size_t(e)] = (1.0 / double(E)) * 1.0 / (d1[size_t(e)] + eps);
      error += std::abs(d1_old[size_t(e)] - d1[size_t(e)]);
    }
    error /= double(E);
    d1_old = d1;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      cost[size_t(t * E + e)] *= d1[size_t(e)] * d0[size_t(t)];
  return cost;
}

Routing route(const TransformerConfig::Moe& m, const double* logits, int64_t T, int64_t B,
              const double* bias, int64_t blocks, const AuxLossGroup& cp, bool training) {
  const int64_t E = m.num_experts, k = m.topk;
  MCPP_CHECK(blocks >= 1 && T % blocks == 0, "route: {} tokens in {} blocks", T, blocks);
  Routing r;
  r.T = T, r.E = E, r.k = k, r.cp = cp.ranks;
  r.idx.resize(size_t(T * k)), r.prob.resize(size_t(T * k)), r.kept.assign(size_t(T * k), 1);
  r.topk_raw.resize(size_t(T * k));
  const bool sink = m.sinkhorn();
  const bool keep_scores = m.pre_softmax || m.sigmoid_like() || sink;
  if (keep_scores) r.scores.resize(size_t(T * E));
  // Sinkhorn's choice in training: each block's normalised exp(logits).
  std::vector<double> sink_sel;
  if (sink && training) {
    const int64_t Tb = T / blocks;
    sink_sel.resize(size_t(T * E));
    for (int64_t b = 0; b < blocks; ++b) {
      const std::vector<double> n = sinkhorn(logits + b * Tb * E, Tb, E);
      std::copy(n.begin(), n.end(), sink_sel.begin() + b * Tb * E);
    }
  }
  std::vector<double> sel(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const double* l = logits + t * E;
    double* s = keep_scores ? r.scores.data() + t * E : nullptr;
    if (sink) {  // a = sigmoid (top-1) or softmax of the logits; chosen by sinkhorn or a
      if (k == 1)
        for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]);
      else
        softmax(l, E, s);
      const double* by = training ? sink_sel.data() + t * E : s;
      std::copy(by, by + E, sel.begin());
      int32_t* idx = r.idx.data() + t * k;
      topk(sel.data(), E, k, idx);
      for (int64_t j = 0; j < k; ++j)
        r.prob[size_t(t * k + j)] = r.topk_raw[size_t(t * k + j)] = s[idx[j]];
      continue;
    }
    if (m.sigmoid_like()) {
      for (int64_t e = 0; e < E; ++e) s[e] = score(m, l[e]);
      for (int64_t e = 0; e < E; ++e) sel[size_t(e)] = s[e] + (bias ? bias[e] : 0.0);
    } else if (m.pre_softmax) {
      softmax(l, E, s);
      std::copy(s, s + E, sel.begin());
    } else {
      std::copy(l, l + E, sel.begin());
    }
    if (m.group_topk > 0) group_limit(m, E, sel.data());
    int32_t* idx = r.idx.data() + t * k;
    topk(sel.data(), E, k, idx);
    double* p = r.prob.data() + t * k;
    double* raw = r.topk_raw.data() + t * k;
    if (!m.sigmoid_like() && !m.pre_softmax) {  // softmax over the k selected logits
      for (int64_t j = 0; j < k; ++j) raw[j] = l[idx[j]];
      softmax(raw, k, p);
    } else if (m.pre_softmax) {
      for (int64_t j = 0; j < k; ++j) p[j] = raw[j] = s[idx[j]];
    } else {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += (raw[j] = s[idx[j]]);
      for (int64_t j = 0; j < k; ++j) p[j] = k > 1 ? raw[j] / (sum + 1e-20) : raw[j];
    }
    if (m.topk_scaling_factor > 0)
      for (int64_t j = 0; j < k; ++j) p[j] *= m.topk_scaling_factor;
  }

  // Capacity, per block (Megatron applies it to each rank's tokens), then the dispatch rows.
  std::vector<std::vector<std::pair<int64_t, int32_t>>> rows(static_cast<size_t>(E));  // (token, slot)
  const int64_t Tb = T / blocks;
  std::vector<int64_t> pad_rows(static_cast<size_t>(E), 0);  // rows added by pad_multiple
  if (m.capacity_factor > 0)
    r.capacity = std::min<int64_t>(
        Tb, int64_t(std::ceil(double(Tb * k) / double(E) * m.capacity_factor)));
  // Padding: up to n more rows of block b for an expert whose rows are c, the block's
  // earliest tokens not routed there, at probability 0 (slot -1); returns how many.
  auto pad_with_earliest = [&](std::vector<std::pair<int64_t, int32_t>>& c, int64_t b,
                               int64_t n) {
    if (n <= 0) return int64_t(0);
    std::vector<uint8_t> has(static_cast<size_t>(Tb), 0);
    for (const auto& x : c) has[size_t(x.first - b * Tb)] = 1;
    int64_t added = 0;
    for (int64_t t = b * Tb; t < (b + 1) * Tb && added < n; ++t)
      if (!has[size_t(t - b * Tb)]) c.push_back({t, -1}), ++added;
    return added;
  };
  for (int64_t b = 0; b < blocks; ++b) {
    std::vector<std::vector<std::pair<int64_t, int32_t>>> cand(static_cast<size_t>(E));
    for (int64_t t = b * Tb; t < (b + 1) * Tb; ++t)
      for (int64_t j = 0; j < k; ++j) cand[size_t(r.idx[size_t(t * k + j)])].push_back({t, int32_t(j)});
    for (int64_t e = 0; e < E; ++e) {
      auto& c = cand[size_t(e)];
      if (r.capacity > 0) {
        if (!m.drop_by_position)  // the highest probabilities (ties: earlier token)
          std::stable_sort(c.begin(), c.end(), [&](const auto& x, const auto& y) {
            return r.prob[size_t(x.first * k + x.second)] > r.prob[size_t(y.first * k + y.second)];
          });
        for (size_t i = size_t(r.capacity); i < c.size(); ++i) {
          r.kept[size_t(c[i].first * k + c[i].second)] = 0;
          r.prob[size_t(c[i].first * k + c[i].second)] = 0;
        }
        if (c.size() > size_t(r.capacity)) c.resize(size_t(r.capacity));
        if (m.pad_to_capacity)  // fill to the capacity
          pad_with_earliest(c, b, r.capacity - int64_t(c.size()));
        std::sort(c.begin(), c.end());  // token order inside the expert
      }
      if (m.pad_multiple > 1) {  // Megatron's pad_routing_map: to a multiple of pad_multiple
        const int64_t need = (m.pad_multiple - int64_t(c.size()) % m.pad_multiple) % m.pad_multiple;
        pad_rows[size_t(e)] += pad_with_earliest(c, b, need);
        std::sort(c.begin(), c.end());
      }
      rows[size_t(e)].insert(rows[size_t(e)].end(), c.begin(), c.end());
    }
  }
  r.counts.assign(size_t(E), 0);
  std::vector<int64_t> per_token(static_cast<size_t>(T + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    r.counts[size_t(e)] = int64_t(rows[size_t(e)].size());
    for (const auto& [t, j] : rows[size_t(e)]) {
      r.row_token.push_back(t), r.row_slot.push_back(j);
      ++per_token[size_t(t + 1)];
    }
  }
  // The expert-bias counts are the router's (before the FP8 padding, as in Megatron).
  r.tokens_per_expert.assign(r.counts.begin(), r.counts.end());
  for (int64_t e = 0; e < E; ++e) r.tokens_per_expert[size_t(e)] -= double(pad_rows[size_t(e)]);
  std::partial_sum(per_token.begin(), per_token.end(), per_token.begin());
  r.tok_offsets = per_token;
  r.tok_rows.assign(r.row_token.size(), 0);
  std::vector<int64_t> fill(per_token.begin(), per_token.end() - 1);
  for (size_t n = 0; n < r.row_token.size(); ++n)
    r.tok_rows[size_t(fill[size_t(r.row_token[n])]++)] = int64_t(n);

  // Aux losses over all T tokens (of the CP group's: T x CP; global_aux_loss's: T x DP x CP),
  // from one top-k of the aux scores per token, counted for every type.
  const double c_aux = m.coeff(Balance::AuxLoss), c_seq = m.coeff(Balance::SeqAuxLoss);
  const double c_glob = training ? m.coeff(Balance::GlobalAuxLoss) : 0.0;
  if (c_aux > 0 || c_seq > 0 || c_glob > 0) {
    r.aux_scores.resize(size_t(T * E));
    std::vector<double> all(static_cast<size_t>(E), 0.0), seq;
    if (c_seq > 0) seq.assign(size_t(B * E), 0.0);
    std::vector<int32_t> top(static_cast<size_t>(k));
    for (int64_t t = 0; t < T; ++t) {
      double* s = r.aux_scores.data() + t * E;
      aux_score(m, logits + t * E, E, s);
      topk(s, E, k, top.data());
      for (int32_t e : top) {
        all[size_t(e)] += 1;
        if (c_seq > 0) seq[size_t((t % B) * E + e)] += 1;
      }
    }
    if (c_glob > 0) {
      r.global_counts = all;
      r.global_ranks = cp.global_ranks;
      if (cp.global) cp.global(r.global_counts);
    }
    if (c_aux > 0) r.aux_counts = std::move(all);
    if (c_seq > 0) r.seq_counts = std::move(seq);
    if (cp.sum) {  // one sum over the CP group of aux_loss's and seq_aux_loss's counts
      std::vector<double> both = r.aux_counts;
      both.insert(both.end(), r.seq_counts.begin(), r.seq_counts.end());
      if (!both.empty()) {
        cp.sum(both);
        std::copy(both.begin(), both.begin() + int64_t(r.aux_counts.size()), r.aux_counts.begin());
        std::copy(both.begin() + int64_t(r.aux_counts.size()), both.end(), r.seq_counts.begin());
      }
    }
    for (const AuxTerm& a : aux_terms(m, r, B)) {
      double L = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e)
          L += (*a.c)[size_t((t % a.G) * E + e)] * r.aux_scores[size_t(t * E + e)];
      const double v = term_scale(a, E, k) * L;
      if (a.type == Balance::AuxLoss) r.aux_loss = v;
      if (a.type == Balance::SeqAuxLoss) r.seq_aux_loss = v;
      if (a.type == Balance::GlobalAuxLoss) r.global_aux_loss = v;
    }
  }
  if (m.z_loss_coeff > 0) {
    r.lse.resize(size_t(T));
    std::vector<double> tmp(static_cast<size_t>(E));
    double z = 0;
    for (int64_t t = 0; t < T; ++t) {
      softmax(logits + t * E, E, tmp.data(), &r.lse[size_t(t)]);
      z += r.lse[size_t(t)] * r.lse[size_t(t)];
    }
    r.z_loss = m.z_loss_coeff * z / double(T * r.cp);
  }
  return r;
}

void route_backward(const TransformerConfig::Moe& m, const Routing& r, const double* logits,
                    const double* dprob, double aux_scale, int64_t r0, int64_t r1, int64_t B,
                    double* dlogits) {
  const int64_t T = r.T, E = r.E, k = r.k;
  std::fill(dlogits, dlogits + T * E, 0.0);
  const double sf = m.topk_scaling_factor > 0 ? m.topk_scaling_factor : 1.0;
  // Sinkhorn's p = a[idx] differentiates as pre-softmax's (a = softmax, k > 1) or as
  // sigmoid top-1's (a = sigmoid); its choice has no gradient.
  const bool sink = m.sinkhorn();
  const bool pre = m.pre_softmax || (sink && k > 1), sig = m.sigmoid_like() || (sink && k == 1);
  // Sinkhorn's top-1 weight is the sigmoid whatever the score function.
  TransformerConfig::Moe ms = m;
  if (sink) ms.score = TransformerConfig::Moe::Score::Sigmoid;
  std::vector<double> dp(static_cast<size_t>(k)), tmp(static_cast<size_t>(E)),
      ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* idx = r.idx.data() + t * k;
    const double* raw = r.topk_raw.data() + t * k;
    double* dl = dlogits + t * E;
    for (int64_t j = 0; j < k; ++j)
      dp[size_t(j)] = r.kept[size_t(t * k + j)] ? sf * dprob[t * k + j] : 0.0;
    if (!sig && !pre) {  // p = softmax(l[idx])
      softmax(raw, k, tmp.data());
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += tmp[size_t(j)] * dp[size_t(j)];
      for (int64_t j = 0; j < k; ++j) dl[idx[j]] += tmp[size_t(j)] * (dp[size_t(j)] - dot);
    } else if (pre) {  // p = s[idx], s = softmax(l)
      const double* s = r.scores.data() + t * E;
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += s[idx[j]] * dp[size_t(j)];
      for (int64_t e = 0; e < E; ++e) dl[e] -= s[e] * dot;
      for (int64_t j = 0; j < k; ++j) dl[idx[j]] += s[idx[j]] * dp[size_t(j)];
    } else {  // p = s[idx] / (sum + eps), s = sigmoid(l) or sqrt(softplus(l))
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) sum += raw[j], dot += dp[size_t(j)] * raw[j];
      const double D = sum + 1e-20;
      for (int64_t j = 0; j < k; ++j) {
        const double draw = k > 1 ? dp[size_t(j)] / D - dot / (D * D) : dp[size_t(j)];
        dl[idx[j]] += draw * dscore(ms, logits[t * E + idx[j]], raw[j]);
      }
    }
  }
  // Aux losses: dL/ds[t,e] = sum over the types of coeff E/(k Tg^2) / G c[t % G, e], through
  // the aux score function.
  const std::vector<AuxTerm> terms = aux_terms(m, r, B);
  if (!terms.empty()) {
    for (int64_t t = r0; t < r1; ++t) {
      const double* s = r.aux_scores.data() + t * E;
      std::fill(ds.begin(), ds.end(), 0.0);
      for (const AuxTerm& a : terms) {
        const double c = aux_scale * term_scale(a, E, k);
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += c * (*a.c)[size_t((t % a.G) * E + e)];
      }
      double* dl = dlogits + t * E;
      if (!m.sigmoid_like()) {
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += s[e] * ds[size_t(e)];
        for (int64_t e = 0; e < E; ++e) dl[e] += s[e] * (ds[size_t(e)] - dot);
      } else {  // s = a / (sum a + eps), a = sigmoid(l) or sqrt(softplus(l))
        const double* l = logits + t * E;
        double z = 0, dot = 0;
        for (int64_t e = 0; e < E; ++e) tmp[size_t(e)] = score(m, l[e]), z += tmp[size_t(e)];
        const double Z = z + 1e-20;
        for (int64_t e = 0; e < E; ++e) dot += ds[size_t(e)] * tmp[size_t(e)];
        for (int64_t e = 0; e < E; ++e)
          dl[e] += (ds[size_t(e)] / Z - dot / (Z * Z)) * dscore(m, l[e], tmp[size_t(e)]);
      }
    }
  }
  if (!r.lse.empty()) {  // dL/dl = coeff * 2 lse softmax(l) / T
    for (int64_t t = r0; t < r1; ++t) {
      softmax(logits + t * E, E, tmp.data());
      const double c = aux_scale * m.z_loss_coeff * 2.0 * r.lse[size_t(t)] / double(T * r.cp);
      for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] += c * tmp[size_t(e)];
    }
  }
}

}  // namespace mcpp::model::moe
