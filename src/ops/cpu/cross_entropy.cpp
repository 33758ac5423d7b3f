// Cross-entropy over a (possibly TP-split) vocabulary, on the CPU, in Megatron's
// vocab_parallel_cross_entropy steps. One float dtype per call (f32/f64), targets i32/i64.
//   logits, dlogits: [..., Vl] = T rows holding vocab columns [vocab_start, vocab_start+Vl)
//   row_max, sum_exp, target_logit, loss, dloss, targets: T elements (row t = s*B + b).
//   ce_row_max:        row_max = max_j logits                                 (=)
//   ce_sum_exp_target: sum_exp = sum_j exp(logits - row_max);
//                      target_logit = logits[target - vocab_start], 0 off-slice (=)
//   ce_loss:           loss = log(sum_exp) + row_max - target_logit           (=)
//   ce_backward:       dlogits = dloss (softmax - onehot(target))             (=, in place ok)
// Rows go to OpenMP threads. A [2048, 50304] f32 logits tensor is 412 MB: each step is
// one streaming pass, and backward may overwrite the logits so no second buffer exists.
#include <algorithm>
#include <cmath>

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

// Columns summed in f32/f64 lanes before joining the row's f64 total: the lanes keep
// the vectorised speed, the f64 total keeps 50K-term sums accurate.
constexpr int64_t kSumBlock = 2048;
constexpr int kMaxLanes = 32;

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
    for (int64_t t = 0; t < T; ++t) {
      const R* lr = L + t * V;
      // kMaxLanes independent running maxima: GCC's `omp simd reduction(max)` turned
      // out 3x slower here (one dependent chain), this form becomes plain vmaxps.
      R acc[kMaxLanes];
      for (int l = 0; l < kMaxLanes; ++l) acc[l] = lr[0];
      int64_t j = 0;
      for (; j + kMaxLanes <= V; j += kMaxLanes) {
#pragma omp simd
        for (int l = 0; l < kMaxLanes; ++l) acc[l] = std::max(acc[l], lr[j + l]);
      }
      R m = lr[0];
      for (; j < V; ++j) m = std::max(m, lr[j]);
      for (int l = 0; l < kMaxLanes; ++l) m = std::max(m, acc[l]);
      M[t] = m;
    }
  });
}

void ce_sum_exp_target(const Tensor& logits, const Tensor& row_max, const Tensor& targets,
                       int64_t vocab_start, Tensor& sum_exp, Tensor& target_logit, Stream& s) {
  const Check c{"ce_sum_exp_target"};
  c.stream(s);
  const DType dt = c.floating(logits, "logits");
  c.dtype(row_max, "row_max", dt), c.dtype(sum_exp, "sum_exp", dt);
  c.dtype(target_logit, "target_logit", dt);
  c.index(targets, "targets");
  const auto [T, V] = check_logits(c, logits, "logits");
  c.rows(row_max, "row_max", T), c.rows(targets, "targets", T);
  c.rows(sum_exp, "sum_exp", T), c.rows(target_logit, "target_logit", T);
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
        for (int64_t j0 = 0; j0 < V; j0 += kSumBlock) {
          const int64_t j1 = std::min(V, j0 + kSumBlock);
          R part = 0;
#pragma omp simd reduction(+ : part)
          for (int64_t j = j0; j < j1; ++j) part += exp_fast(lr[j] - m);
          total += double(part);
        }
        SE[t] = R(total);
        const int64_t v = int64_t(TG[t]) - vocab_start;
        TL[t] = v >= 0 && v < V ? lr[v] : R(0);
      }
    });
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
