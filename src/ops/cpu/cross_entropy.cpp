// Cross-entropy over a (possibly TP-split) vocabulary, on the CPU, in Megatron's
// vocab_parallel_cross_entropy steps. One float dtype per call (f32/f64), targets i32/i64.
//   logits, dlogits: [..., Vl] = T rows holding vocab columns [vocab_start, vocab_start+Vl)
//   row_max, sum_exp, target_logit, loss, dloss, targets: T elements (row t = s*B + b).
//   ce_row_max:        row_max = max_j logits                                 (=)
//   ce_sum_exp_target: sum_exp = sum_j exp(logits - row_max);
//                      target_logit = logits[target - vocab_start], 0 off-slice (=)
//   ce_stats:          the three above in one pass: per block of columns the block's max
//                      first, the running sum rescaled by exp(m_old - m_new) when the
//                      max grows, then the block's exponentials (the block is still in L2)
//   ce_rescale_sum_exp: sum_exp *= exp(local_max - global_max)                 (in place)
//   ce_loss:           loss = log(sum_exp) + row_max - target_logit           (=)
//   ce_backward:       dlogits = dloss (softmax - onehot(target))             (=, in place ok)
// Rows go to OpenMP threads. A [2048, 50304] f32 logits tensor is 412 MB: each step is
// one streaming pass, and backward may overwrite the logits so no second buffer exists.
#include <algorithm>
#include <cmath>
#include <utility>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

struct CeDims {
  int64_t T, V;
};

CeDims check_logits(const Check& c, const Tensor& logits, const char* name) {
  c.min_dim(logits, name, 1);
  const int64_t V = logits.size(-1);
  MCPP_CHECK(V > 0, "{}: {} has shape {}: the vocabulary slice is empty", c.op, name,
             shape_str(logits.shape()));
  return {logits.numel() / V, V};
}

// The checks of the ops that write the forward statistics (ce_sum_exp_target, ce_stats);
// the logits' dtype and dims.
std::pair<DType, CeDims> check_stats_args(const Check& c, const Tensor& logits,
                                          const Tensor& row_max, const Tensor& sum_exp,
                                          const Tensor& target_logit, const Tensor& targets) {
  const DType dt = c.floating(logits, "logits");
  c.dtype(row_max, "row_max", dt), c.dtype(sum_exp, "sum_exp", dt);
  c.dtype(target_logit, "target_logit", dt);
  c.index(targets, "targets");
  const CeDims d = check_logits(c, logits, "logits");
  c.rows(row_max, "row_max", d.T), c.rows(targets, "targets", d.T);
  c.rows(sum_exp, "sum_exp", d.T), c.rows(target_logit, "target_logit", d.T);
  return {dt, d};
}

// Columns summed in f32/f64 lanes before joining the row's f64 total: the lanes keep
// the vectorised speed, the f64 total keeps 50K-term sums accurate.
constexpr int64_t kSumBlock = 2048;
constexpr int kMaxLanes = 32;
// ce_stats reads this many columns for their max, then sums their exponentials while they
// are still in L2 (128 KB of f32). Blocks of kSumBlock (in L1) were 1.6x slower than two
// passes on one core: the hardware prefetcher restarts after every compute phase.
constexpr int64_t kStatsBlock = 16 * kSumBlock;

// max_j x[j], n >= 1.
template <class R>
R max_of(const R* x, int64_t n) {
  // kMaxLanes independent running maxima: GCC's `omp simd reduction(max)` turned out 3x
  // slower here (one dependent chain), this form becomes plain vmaxps.
  R acc[kMaxLanes];
  for (int l = 0; l < kMaxLanes; ++l) acc[l] = x[0];
  int64_t j = 0;
  for (; j + kMaxLanes <= n; j += kMaxLanes) {
#pragma omp simd
    for (int l = 0; l < kMaxLanes; ++l) acc[l] = std::max(acc[l], x[j + l]);
  }
  R m = x[0];
  for (; j < n; ++j) m = std::max(m, x[j]);
  for (int l = 0; l < kMaxLanes; ++l) m = std::max(m, acc[l]);
  return m;
}

// sum_j exp(x[j] - m) over one block of at most kSumBlock columns.
template <class R>
R block_sum_exp(const R* x, int64_t n, R m) {
  R part = 0;
#pragma omp simd reduction(+ : part)
  for (int64_t j = 0; j < n; ++j) part += exp_fast(x[j] - m);
  return part;
}

}  // namespace

void ce_row_max(const Tensor& logits, Tensor& row_max, Stream& s) {
  const Check c{"ce_row_max"};
  c.stream(s);
  const DType dt = c.floating(logits, "logits");
  c.dtype(row_max, "row_max", dt);
  const auto [T, V] = check_logits(c, logits, "logits");
  c.rows(row_max, "row_max", T);
  dispatch_float(dt, [&, T = T, V = V](auto tag) {
    using R = decltype(tag);
    const R* L = logits.data<R>();
    R* M = row_max.data<R>();
#pragma omp parallel for schedule(static) if (T * V > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) M[t] = max_of(L + t * V, V);
  });
}

void ce_sum_exp_target(const Tensor& logits, const Tensor& row_max, const Tensor& targets,
                       int64_t vocab_start, Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const Check c{"ce_sum_exp_target"};
  c.stream(s);
  const auto [dt, dims] = check_stats_args(c, logits, row_max, sum_exp, target_logit, targets);
  const auto [T, V] = dims;
  dispatch_float(dt, [&, T = T, V = V](auto tag) {
    using R = decltype(tag);
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const R *L = logits.data<R>(), *M = row_max.data<R>();
      const I* TG = targets.data<I>();
      R *SE = sum_exp.data<R>(), *TL = target_logit.data<R>();
#pragma omp parallel for schedule(static) if (T * V > kParallelGrain)
      for (int64_t t = 0; t < T; ++t) {
        const R* lr = L + t * V;
        const R m = M[t];
        double total = 0;
        for (int64_t j0 = 0; j0 < V; j0 += kSumBlock)
          total += double(block_sum_exp(lr + j0, std::min(kSumBlock, V - j0), m));
        SE[t] = R(total);
        const int64_t v = int64_t(TG[t]) - vocab_start;
        TL[t] = v >= 0 && v < V ? lr[v] : R(0);
      }
    });
  });
}

void ce_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, Tensor& row_max,
              Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const Check c{"ce_stats"};
  c.stream(s);
  const auto [dt, dims] = check_stats_args(c, logits, row_max, sum_exp, target_logit, targets);
  const auto [T, V] = dims;
  dispatch_float(dt, [&, T = T, V = V](auto tag) {
    using R = decltype(tag);
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const R* L = logits.data<R>();
      const I* TG = targets.data<I>();
      R *M = row_max.data<R>(), *SE = sum_exp.data<R>(), *TL = target_logit.data<R>();
#pragma omp parallel for schedule(static) if (T * V > kParallelGrain)
      for (int64_t t = 0; t < T; ++t) {
        const R* lr = L + t * V;
        R m = lr[0];   // running max
        double d = 0;  // running sum of exp(x - m)
        for (int64_t j0 = 0; j0 < V; j0 += kStatsBlock) {
          const int64_t n = std::min(kStatsBlock, V - j0);
          const R bm = max_of(lr + j0, n);
          if (bm > m) {
            d *= std::exp(double(m) - double(bm));
            m = bm;
          }
          for (int64_t j1 = j0; j1 < j0 + n; j1 += kSumBlock)
            d += double(block_sum_exp(lr + j1, std::min(kSumBlock, j0 + n - j1), m));
        }
        M[t] = m, SE[t] = R(d);
        const int64_t v = int64_t(TG[t]) - vocab_start;
        TL[t] = v >= 0 && v < V ? lr[v] : R(0);
      }
    });
  });
}

void ce_rescale_sum_exp(const Tensor& local_max, const Tensor& global_max, Tensor& sum_exp,
                        Stream& s) {
  const Check c{"ce_rescale_sum_exp"};
  c.stream(s);
  const DType dt = c.floating(sum_exp, "sum_exp");
  c.dtype(local_max, "local_max", dt), c.dtype(global_max, "global_max", dt);
  const int64_t T = sum_exp.numel();
  c.rows(local_max, "local_max", T), c.rows(global_max, "global_max", T);
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *LM = local_max.data<R>(), *GM = global_max.data<R>();
    R* SE = sum_exp.data<R>();
    for (int64_t t = 0; t < T; ++t) SE[t] *= R(std::exp(double(LM[t]) - double(GM[t])));
  });
}

void ce_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss,
             Stream& s) {
  const Check c{"ce_loss"};
  c.stream(s);
  const DType dt = c.floating(row_max, "row_max");
  c.dtype(sum_exp, "sum_exp", dt), c.dtype(target_logit, "target_logit", dt);
  c.dtype(loss, "loss", dt);
  const int64_t T = row_max.numel();
  c.rows(sum_exp, "sum_exp", T), c.rows(target_logit, "target_logit", T), c.rows(loss, "loss", T);
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *M = row_max.data<R>(), *SE = sum_exp.data<R>(), *TL = target_logit.data<R>();
    R* LO = loss.data<R>();
    for (int64_t t = 0; t < T; ++t) LO[t] = std::log(SE[t]) + M[t] - TL[t];
  });
}

void ce_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                 const Tensor& targets, int64_t vocab_start, const Tensor& dloss, Tensor& dlogits,
                 Stream& s) {
  const Check c{"ce_backward"};
  c.stream(s);
  const DType dt = c.floating(logits, "logits");
  c.dtype(row_max, "row_max", dt), c.dtype(sum_exp, "sum_exp", dt);
  c.dtype(dloss, "dloss", dt), c.dtype(dlogits, "dlogits", dt);
  c.index(targets, "targets");
  const auto [T, V] = check_logits(c, logits, "logits");
  c.shape(dlogits, "dlogits", logits.shape());
  c.rows(row_max, "row_max", T), c.rows(sum_exp, "sum_exp", T);
  c.rows(targets, "targets", T), c.rows(dloss, "dloss", T);
  dispatch_float(dt, [&, T = T, V = V](auto tag) {
    using R = decltype(tag);
    dispatch_index(targets.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const R *L = logits.data<R>(), *M = row_max.data<R>(), *SE = sum_exp.data<R>();
      const R* DL = dloss.data<R>();
      const I* TG = targets.data<I>();
      R* D = dlogits.data<R>();
#pragma omp parallel for schedule(static) if (T * V > kParallelGrain)
      for (int64_t t = 0; t < T; ++t) {
        const R* lr = L + t * V;
        R* dr = D + t * V;  // may be lr: each element is read before it is written
        const R m = M[t], sc = DL[t] / SE[t];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) dr[j] = exp_fast(lr[j] - m) * sc;
        const int64_t v = int64_t(TG[t]) - vocab_start;
        if (v >= 0 && v < V) dr[v] -= DL[t];
      }
    });
  });
}

}  // namespace mcpp::ops::cpu
