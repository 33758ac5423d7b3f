// The MoE routing ops (catalogue.inc, ---- MoE routing) on the CPU: the reference of
// ops/cuda/moe_route.cu, with the per-token math shared (ops/moe_route_math.h). Tokens are
// independent, so the loops over them run in parallel; every sum over tokens runs in token
// order on one thread.
#include <algorithm>
#include <tuple>
#include <utility>
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
             "{}: group-limited routing of {} experts in {} groups, top-{} groups, top-{}", op, r.E,
             r.num_groups, r.group_topk, r.k);
}

}  // namespace

void moe_route_topk(const Tensor& logits, const Tensor& bias, const MoeRouteSpec& r, Tensor& idx,
                    Tensor& prob, Stream& s) {
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

namespace {

// The dropless index: a counting sort of the (token, slot) pairs by expert.
void index_dropless(const int64_t* ix, int64_t T, int64_t k, int64_t E, int64_t* cnt, int64_t* src,
                    int64_t* rs, int64_t* sr, int64_t* off, int64_t* rw) {
  const int64_t N = T * k;
  std::fill(cnt, cnt + E, 0);
  for (int64_t i = 0; i < N; ++i) ++cnt[ix[i]];
  std::vector<int64_t> fill(size_t(E), 0);
  for (int64_t e = 1; e < E; ++e) fill[size_t(e)] = fill[size_t(e - 1)] + cnt[e - 1];
  for (int64_t i = 0; i < N; ++i) {  // token order inside each expert
    const int64_t n = fill[size_t(ix[i])]++;
    src[n] = i / k, rs[n] = i, sr[i] = n;
  }
  for (int64_t t = 0; t <= T; ++t) off[t] = t * k;
  for (int64_t t = 0; t < T; ++t) {
    std::copy(sr + t * k, sr + (t + 1) * k, rw + t * k);
    std::sort(rw + t * k, rw + (t + 1) * k);
  }
}

}  // namespace

// With capacity or padding, the steps of the CUDA kernels, on a dense [E, T] table of each
// (expert, token)'s slot j (or -1): drop each (expert, block)'s pairs past the capacity (in
// token order, or by descending prob with a stable sort: ties to the earlier token), count
// the kept pairs and the padding rows of each (expert, block), place the blocks' rows by a
// scan over (expert, block), then each token's row from its kept / not-kept rank in its
// block (moe_math::row_in_block); last the CSR, each token's rows by expert (so ascending).
void moe_route_index(const Tensor& idx, Tensor& prob, const MoeRouteSpec& r, int64_t blocks,
                     Tensor& counts, Tensor& bias_counts, Tensor& src, Tensor& row_slot,
                     Tensor& slot_row, Tensor& offsets, Tensor& rows, Stream& s) {
  const Check c{"moe_route_index"};
  c.stream(s);
  c.dtype(idx, "idx", DType::I64);
  const int64_t E = r.E, N0 = idx.numel(), T = offsets.numel() - 1, k = T > 0 ? N0 / T : 0;
  MCPP_CHECK(T > 0 && T * k == N0 && k >= 1 && k <= E && E <= 1024,
             "moe_route_index: idx {} for offsets {} and {} experts", idx.str(), offsets.str(), E);
  MCPP_CHECK(blocks >= 1 && T % blocks == 0, "moe_route_index: {} tokens in {} blocks", T, blocks);
  const int64_t Nmax = moe_route_max_rows(r, T, blocks);
  for (auto [t, name, n] : {std::tuple{&counts, "counts", E},
                            {&bias_counts, "bias_counts", E},
                            {&slot_row, "slot_row", N0},
                            {&offsets, "offsets", T + 1}}) {
    c.dtype(*t, name, DType::I64);
    c.numel(*t, name, n);
  }
  for (auto [t, name] : {std::pair{&src, "src"}, {&row_slot, "row_slot"}, {&rows, "rows"}}) {
    c.dtype(*t, name, DType::I64);
    MCPP_CHECK(t->numel() >= Nmax,
               "moe_route_index: {} {} holds fewer than the {} rows it may "
               "need",
               name, t->str(), Nmax);
  }
  const int64_t* ix = idx.data<int64_t>();
  for (int64_t i = 0; i < N0; ++i)
    MCPP_CHECK(ix[i] >= 0 && ix[i] < E, "moe_route_index: expert {} of {}", ix[i], E);
  int64_t* cnt = counts.data<int64_t>();
  int64_t* bc = bias_counts.data<int64_t>();
  int64_t *sp = src.data<int64_t>(), *rs = row_slot.data<int64_t>();
  int64_t *sr = slot_row.data<int64_t>(), *off = offsets.data<int64_t>();
  int64_t* rw = rows.data<int64_t>();
  if (!r.shapes_rows()) {
    index_dropless(ix, T, k, E, cnt, sp, rs, sr, off, rw);
    std::copy(cnt, cnt + E, bc);
    return;
  }
  const int64_t Tb = T / blocks, cap = r.drops() ? moe_capacity(r, Tb) : 0;
  if (r.drops()) {
    c.floating(prob, "prob");
    c.numel(prob, "prob", N0);
  }
  std::vector<int32_t> dense(static_cast<size_t>(E * T), -1);  // [E, T]: slot j, or -1
  for (int64_t i = 0; i < N0; ++i) {
    int32_t& d = dense[size_t(ix[i] * T + i / k)];
    MCPP_CHECK(d < 0, "moe_route_index: token {} picks expert {} twice", i / k, ix[i]);
    d = int32_t(i % k);
  }
  const int64_t S = E * blocks;  // segments (e, b), expert-major
  if (r.drops()) {               // keep the first cap pairs of each segment in policy order
    dispatch_float(prob.dtype(), [&](auto tag) {
      using F = decltype(tag);
      F* p = prob.data<F>();
      std::vector<int64_t> cand;
      for (int64_t g = 0; g < S; ++g) {
        const int64_t e = g / blocks, t0 = g % blocks * Tb;
        cand.clear();
        for (int64_t t = t0; t < t0 + Tb; ++t)
          if (dense[size_t(e * T + t)] >= 0) cand.push_back(t);
        if (!r.drop_by_position)  // descending weight; equal weights keep token order
          std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) {
            return p[a * k + dense[size_t(e * T + a)]] > p[b * k + dense[size_t(e * T + b)]];
          });
        for (size_t q = size_t(cap); q < cand.size(); ++q) {
          int32_t& d = dense[size_t(e * T + cand[q])];
          p[cand[q] * k + d] = F(0);  // a dropped pair's weight
          d = -1;
        }
      }
    });
  }
  // Rows per segment (kept + padding) and where each segment's rows start.
  std::vector<int64_t> seg_pad(static_cast<size_t>(S)), seg_row0(static_cast<size_t>(S));
  std::fill(cnt, cnt + E, 0), std::fill(bc, bc + E, 0);
  int64_t N = 0;
  for (int64_t g = 0; g < S; ++g) {
    const int64_t e = g / blocks, t0 = g % blocks * Tb;
    int64_t kept = 0, bias = 0;
    for (int64_t t = t0; t < t0 + Tb; ++t) kept += dense[size_t(e * T + t)] >= 0;
    seg_pad[size_t(g)] = moe_math::pad_rows(r, kept, cap, Tb, &bias);
    seg_row0[size_t(g)] = N;
    N += kept + seg_pad[size_t(g)];
    cnt[e] += kept + seg_pad[size_t(g)], bc[e] += bias;
  }
  MCPP_CHECK(N <= Nmax, "moe_route_index: {} rows above the bound {}", N, Nmax);
  // Each member (kept, or one of the first seg_pad not-kept tokens) gets its row; dense then
  // holds the row (or -1) for the CSR.
  std::fill(sr, sr + N0, int64_t(-1));
  for (int64_t g = 0; g < S; ++g) {
    const int64_t e = g / blocks, t0 = g % blocks * Tb, pad = seg_pad[size_t(g)];
    int64_t kb = 0;
    for (int64_t t = t0; t < t0 + Tb; ++t) {
      int32_t& d = dense[size_t(e * T + t)];
      const int64_t nk = (t - t0) - kb;
      const int64_t n = seg_row0[size_t(g)] + moe_math::row_in_block(kb, nk, pad);
      if (d >= 0) {
        sp[n] = t, rs[n] = t * k + d, sr[t * k + d] = n, d = int32_t(n), ++kb;
      } else if (nk < pad) {
        sp[n] = t, rs[n] = -1, d = int32_t(n);
      }
    }
  }
  off[0] = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t m = off[t];
    for (int64_t e = 0; e < E; ++e)
      if (dense[size_t(e * T + t)] >= 0) rw[m++] = dense[size_t(e * T + t)];
    off[t + 1] = m;
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
      MCPP_CHECK(ix[i] < M, "moe_gather: index {} of {}", ix[i], M);
      y.data<F>()[i] = ix[i] >= 0 ? x.data<F>()[ix[i]] : F(0);
    }
  });
}

void moe_route_counts(const Tensor& logits, const MoeRouteSpec& r, int64_t B, Tensor& aux_counts,
                      Stream& s) {
  const Check c{"moe_route_counts"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, k = r.k, T = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T % B == 0, "moe_route_counts: {} tokens in {} sequences", T, B);
  c.dtype(aux_counts, "aux_counts", dt);
  c.numel(aux_counts, "aux_counts", R * E);
  const int64_t ra = moe_aux_row(r, B), rg = moe_aux_global_row(r, B);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    F* cnt = aux_counts.data<F>();
    std::fill(cnt, cnt + R * E, F(0));
    std::vector<F> sc(static_cast<size_t>(E));
    std::vector<int64_t> top(static_cast<size_t>(k));
    for (int64_t t = 0; t < T; ++t) {
      moe_math::aux_scores(r, l + t * E, sc.data());
      moe_math::topk(sc.data(), E, k, top.data());
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = top[size_t(j)];
        if (r.seq_aux) cnt[(t % B) * E + e] += F(1);
        if (r.aux) cnt[ra * E + e] += F(1);
        if (r.global_aux) cnt[rg * E + e] += F(1);
      }
    }
  });
}

void moe_route_stats(const Tensor& logits, const Tensor& aux_counts, const MoeRouteSpec& r,
                     int64_t B, Tensor& losses, Stream& s) {
  const Check c{"moe_route_stats"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, T = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T % B == 0 && r.cp >= 1 && r.global_ranks >= 1,
             "moe_route_stats: {} tokens in {} sequences, CP {}, DP x CP {}", T, B, r.cp,
             r.global_ranks);
  if (r.any_aux()) {
    c.dtype(aux_counts, "aux_counts", dt);
    c.numel(aux_counts, "aux_counts", R * E);
  }
  c.dtype(losses, "losses", dt);
  c.numel(losses, "losses", 4);
  const int64_t ra = moe_aux_row(r, B), rg = moe_aux_global_row(r, B);
  double f[3];
  moe_math::aux_factors(r, T, B, f);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    // The score sums per sequence (seq_aux_loss) and over all tokens (aux / global).
    std::vector<F> col_seq(static_cast<size_t>(B * E), F(0)), col(static_cast<size_t>(E), F(0));
    std::vector<F> sc(static_cast<size_t>(E));
    F z = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (r.any_aux()) {
        moe_math::aux_scores(r, l + t * E, sc.data());
        for (int64_t e = 0; e < E; ++e) {
          if (r.seq_aux) col_seq[size_t((t % B) * E + e)] += sc[size_t(e)];
          col[size_t(e)] += sc[size_t(e)];
        }
      }
      if (r.z) {
        const F lse = moe_math::softmax(l + t * E, E, sc.data());
        z += lse * lse;
      }
    }
    const F* cnt = r.any_aux() ? aux_counts.data<F>() : nullptr;
    F La = 0, Ls = 0, Lg = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (r.aux) La += cnt[ra * E + e] * col[size_t(e)];
      if (r.global_aux) Lg += cnt[rg * E + e] * col[size_t(e)];
    }
    if (r.seq_aux)
      for (int64_t i = 0; i < B * E; ++i) Ls += cnt[i] * col_seq[size_t(i)];
    F* out = losses.data<F>();
    out[0] = r.aux ? F(f[0]) * La : F(0);
    out[1] = r.seq_aux ? F(f[1]) * Ls : F(0);
    out[2] = r.global_aux ? F(f[2]) * Lg : F(0);
    out[3] = r.z ? z / F(T * r.cp) : F(0);
  });
}

void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dprob,
                        const Tensor& aux_counts, const MoeRouteSpec& r, int64_t B,
                        double aux_scale, int64_t r0, int64_t r1, Tensor& dlogits, Stream& s) {
  const Check c{"moe_route_backward"};
  c.stream(s);
  check_spec(r, c.op);
  const DType dt = c.floating(logits, "logits");
  const int64_t E = r.E, k = r.k, T = logits.numel() / E, R = moe_aux_rows(r, B);
  MCPP_CHECK(B >= 1 && T % B == 0, "moe_route_backward: {} tokens in {} sequences", T, B);
  c.dtype(idx, "idx", DType::I64);
  c.numel(idx, "idx", T * k);
  c.dtype(dprob, "dprob", dt);
  c.numel(dprob, "dprob", T * k);
  c.dtype(dlogits, "dlogits", dt);
  c.numel(dlogits, "dlogits", T * E);
  if (r.any_aux()) {
    c.dtype(aux_counts, "aux_counts", dt);
    c.numel(aux_counts, "aux_counts", R * E);
  }
  MCPP_CHECK(r.cp >= 1 && r.global_ranks >= 1, "moe_route_backward: CP {}, DP x CP {}", r.cp,
             r.global_ranks);
  double f[3];
  moe_math::aux_factors(r, T, B, f);
  const double ds[3] = {aux_scale * r.aux_coeff * f[0], aux_scale * r.seq_aux_coeff * f[1],
                        aux_scale * r.global_aux_coeff * f[2]};
  const double zc = aux_scale * r.z_coeff * 2.0 / double(T * r.cp);
  dispatch_float(dt, [&](auto tag) {
    using F = decltype(tag);
    const F* l = logits.data<F>();
    const F* cnt = r.any_aux() ? aux_counts.data<F>() : nullptr;
    const F scale[3] = {F(ds[0]), F(ds[1]), F(ds[2])};
#pragma omp parallel
    {
      std::vector<F> sc(static_cast<size_t>(E)), tmp(static_cast<size_t>(E + k));
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        const moe_math::AuxGrad<F> ag =
            cnt ? moe_math::aux_grad(r, cnt, t, B, scale) : moe_math::AuxGrad<F>{};
        moe_math::route_token_backward(r, l + t * E, idx.data<int64_t>() + t * k,
                                       dprob.data<F>() + t * k, t >= r0 && t < r1, ag, F(zc),
                                       dlogits.data<F>() + t * E, sc.data(), tmp.data());
      }
    }
  });
}

}  // namespace mcpp::ops::cpu
