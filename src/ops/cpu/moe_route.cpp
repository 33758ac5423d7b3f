// The MoE routing ops (catalogue.inc, ---- MoE routing) on the CPU: the reference of
// ops/cuda/moe_route.cu, with the per-token math shared (ops/moe_route_math.h). Tokens are
// independent, so the loops over them run in parallel; every sum over tokens runs in token
// order on one thread.
#include <algorithm>
#include <tuple>
#include <vector>

#include "ops/cpu/cpu_common.h"
#include "ops/moe_route_math.h"

namespace mcpp::ops::cpu {

namespace {

void check_spec(const MoeRouteSpec& r, const char* op) {
  MCPP_CHECK(r.E > 0 && r.E <= 1024 && r.k >= 1 && r.k <= r.E,
             "{}: {} experts, top-{} (1 <= k <= E <= 1024)", op, r.E, r.k);
  MCPP_CHECK(r.group_topk == 0 || (r.num_groups > 0 && r.E % r.num_groups == 0 &&
                                   r.k % r.group_topk == 0 && r.group_topk <= r.num_groups),
             "{}: group-limited routing of {} experts in {} groups, top-{} groups, top-{}", op,
             r.E, r.num_groups, r.group_topk, r.k);
}

}  // namespace

void moe_route_topk(const Tensor& logits, const Tensor& bias, const MoeRouteSpec& r,
                    Tensor& idx, Tensor& prob, Stream& s) {
  const Check c{"moe_route_topk"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, k = r.k, T = logits.numel() / E;
  c.numel(logits, "logits", T * E);
  c.dtype(idx, "idx", DType::I64);
  c.numel(idx, "idx", T * k);
  c.dtype(prob, "prob", dt);
  c.numel(prob, "prob", T * k);
  const float* b = nullptr;
  if (bias.defined()) {
    c.dtype(bias, "bias", DType::F32);
    c.numel(bias, "bias", E);
    b = bias.data<float>();
  }
  int64_t* ix = idx.data<int64_t>();
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    F* p = prob.data<F>();
#pragma omp parallel
    {
      std::vector<F> sel(static_cast<size_t>(E)), tmp(static_cast<size_t>(E + k));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t)
        moe_math::route_token(r, l + t * E, b, sel.data(), tmp.data(), ix + t * k, p + t * k);
    }
  });
}

void moe_route_index(const Tensor& idx, int64_t E, Tensor& counts, Tensor& src,
                     Tensor& row_slot, Tensor& slot_row, Tensor& offsets, Tensor& rows,
                     Stream& s) {
  const Check c{"moe_route_index"};
  c.stream(s);
  c.dtype(idx, "idx", DType::I64);
  const int64_t N = idx.numel(), T = offsets.numel() - 1, k = T > 0 ? N / T : 0;
  MCPP_CHECK(T > 0 && T * k == N, "moe_route_index: idx {} for offsets {}", idx.str(),
             offsets.str());
  for (auto [t, name, n] : {std::tuple{&counts, "counts", E}, {&src, "src", N},
                            {&row_slot, "row_slot", N}, {&slot_row, "slot_row", N},
                            {&offsets, "offsets", T + 1}, {&rows, "rows", N}}) {
    c.dtype(*t, name, DType::I64);
    c.numel(*t, name, n);
  }
  const int64_t* ix = idx.data<int64_t>();
  int64_t* cnt = counts.data<int64_t>();
  std::fill(cnt, cnt + E, 0);
  for (int64_t i = 0; i < N; ++i) {
    MCPP_CHECK(ix[i] >= 0 && ix[i] < E, "moe_route_index: expert {} of {}", ix[i], E);
    ++cnt[ix[i]];
  }
  std::vector<int64_t> fill(size_t(E), 0);
  for (int64_t e = 1; e < E; ++e) fill[size_t(e)] = fill[size_t(e - 1)] + cnt[e - 1];
  int64_t* sr = slot_row.data<int64_t>();
  for (int64_t i = 0; i < N; ++i) {  // token order inside each expert
    const int64_t n = fill[size_t(ix[i])]++;
    src.data<int64_t>()[n] = i / k, row_slot.data<int64_t>()[n] = i, sr[i] = n;
  }
  int64_t* off = offsets.data<int64_t>();
  int64_t* rw = rows.data<int64_t>();
  for (int64_t t = 0; t <= T; ++t) off[t] = t * k;
  for (int64_t t = 0; t < T; ++t) {
    std::copy(sr + t * k, sr + (t + 1) * k, rw + t * k);
    std::sort(rw + t * k, rw + (t + 1) * k);
  }
}

void moe_gather(const Tensor& x, const Tensor& index, Tensor& y, Stream& s) {
  const Check c{"moe_gather"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.dtype(index, "index", DType::I64);
  c.numel(y, "y", index.numel());
  const int64_t n = index.numel(), M = x.numel();
  const int64_t* ix = index.data<int64_t>();
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    for (int64_t i = 0; i < n; ++i) {
      MCPP_CHECK(ix[i] >= 0 && ix[i] < M, "moe_gather: index {} of {}", ix[i], M);
      y.data<F>()[i] = x.data<F>()[ix[i]];
    }
  });
}

void moe_route_stats(const Tensor& logits, const MoeRouteSpec& r, int64_t B, Tensor& aux_counts,
                     Tensor& losses, Stream& s) {
  const Check c{"moe_route_stats"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, k = r.k, T = logits.numel() / E, G = r.seq_aux ? B : 1;
  MCPP_CHECK(B >= 1 && T % B == 0, "moe_route_stats: {} tokens in {} sequences", T, B);
  c.dtype(aux_counts, "aux_counts", dt);
  c.numel(aux_counts, "aux_counts", G * E);
  c.dtype(losses, "losses", dt);
  c.numel(losses, "losses", 2);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    F* cnt = aux_counts.data<F>();
    std::fill(cnt, cnt + G * E, F(0));
    std::vector<F> colsum(size_t(G * E), F(0)), sc(static_cast<size_t>(E));
    std::vector<int64_t> top(static_cast<size_t>(k));
    F z = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = r.seq_aux ? t % B : 0;
      if (r.aux) {
        moe_math::aux_scores(r, l + t * E, sc.data());
        moe_math::topk(sc.data(), E, k, top.data());
        for (int64_t j = 0; j < k; ++j) cnt[g * E + top[size_t(j)]] += F(1);
        for (int64_t e = 0; e < E; ++e) colsum[size_t(g * E + e)] += sc[size_t(e)];
      }
      if (r.z) {
        const F lse = moe_math::softmax(l + t * E, E, sc.data());
        z += lse * lse;
      }
    }
    F L = 0;
    for (int64_t i = 0; i < G * E; ++i) L += cnt[i] * colsum[size_t(i)];
    const F Tg = F(T / G);
    losses.data<F>()[0] = r.aux ? F(E) / (F(k) * Tg * Tg) * L / F(G) : F(0);
    losses.data<F>()[1] = r.z ? z / F(T) : F(0);
  });
}

void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dprob,
                        const Tensor& aux_counts, const MoeRouteSpec& r, int64_t B,
                        double aux_scale, int64_t r0, int64_t r1, Tensor& dlogits, Stream& s) {
  const Check c{"moe_route_backward"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, k = r.k, T = logits.numel() / E, G = r.seq_aux ? B : 1;
  MCPP_CHECK(B >= 1 && T % B == 0, "moe_route_backward: {} tokens in {} sequences", T, B);
  c.dtype(idx, "idx", DType::I64);
  c.numel(idx, "idx", T * k);
  c.dtype(dprob, "dprob", dt);
  c.numel(dprob, "dprob", T * k);
  c.dtype(dlogits, "dlogits", dt);
  c.numel(dlogits, "dlogits", T * E);
  if (r.aux) {
    c.dtype(aux_counts, "aux_counts", dt);
    c.numel(aux_counts, "aux_counts", G * E);
  }
  const double Tg = double(T / G);
  const double ds = aux_scale * r.aux_coeff * double(E) / (double(k) * Tg * Tg) / double(G);
  const double zc = aux_scale * r.z_coeff * 2.0 / double(T);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    const F* cnt = r.aux ? aux_counts.data<F>() : nullptr;
#pragma omp parallel
    {
      std::vector<F> sc(static_cast<size_t>(E)), tmp(static_cast<size_t>(E + k));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t)
        moe_math::route_token_backward(r, l + t * E, idx.data<int64_t>() + t * k,
                                       dprob.data<F>() + t * k, t >= r0 && t < r1,
                                       cnt ? cnt + (r.seq_aux ? t % B : 0) * E : nullptr, F(ds),
                                       F(zc), dlogits.data<F>() + t * E, sc.data(), tmp.data());
    }
  });
}

}  // namespace mcpp::ops::cpu
