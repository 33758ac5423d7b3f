// Vocab-parallel cross-entropy: loss against a naive log-softmax, gradient against
// central differences, the TP=2 split (two vocab halves combined with max/sum give the
// whole vocabulary's loss and gradient), in-place backward, f32 against f64.
#include <string>
#include <vector>

#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace cross_entropy_test {

struct CeOut {
  Tensor row_max, sum_exp, target_logit, loss;
};

// The serial (TP=1) pipeline of the four steps.
CeOut ce_whole(const Tensor& logits, const Tensor& targets) {
  const int64_t T = logits.size(0);
  const DType dt = logits.dtype();
  CeOut o{Tensor::empty({T}, dt), Tensor::empty({T}, dt), Tensor::empty({T}, dt),
          Tensor::empty({T}, dt)};
  cpu::ce_row_max(logits, o.row_max, S());
  cpu::ce_sum_exp_target(logits, o.row_max, targets, 0, o.sum_exp, o.target_logit, S());
  cpu::ce_loss(o.row_max, o.sum_exp, o.target_logit, o.loss, S());
  return o;
}

Tensor random_targets(int64_t T, int64_t V, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int64_t> v(static_cast<size_t>(T));
  for (auto& x : v) x = int64_t(gen() % uint64_t(V));
  return Tensor::from(v, {T});
}


TEST(CrossEntropy, LossMatchesNaiveAndGradientMatchesFiniteDifferences) {
  const int64_t T = 5, V = 7;
  Tensor logits = randn({T, V}, 1, 3.0), targets = random_targets(T, V, 2);
  Tensor dloss = randn({T}, 3);
  CeOut o = ce_whole(logits, targets);
  for (int64_t t = 0; t < T; ++t) {
    double se = 0;
    for (int64_t j = 0; j < V; ++j) se += std::exp(logits.data<double>()[t * V + j]);
    const double want = std::log(se) - logits.data<double>()[t * V + targets.data<int64_t>()[t]];
    EXPECT_NEAR(o.loss.data<double>()[t], want, 1e-13);
  }
  auto L = [&] { return dot(dloss, ce_whole(logits, targets).loss); };
  Tensor dlogits = Tensor::empty({T, V}, DType::F64);
  cpu::ce_backward(logits, o.row_max, o.sum_exp, targets, 0, dloss, dlogits, S());
  EXPECT_LT(rel_err(dlogits, numeric_grad(logits, L)), kGradTol);
  // In place over the logits, as the model does to save a [T, V] buffer.
  Tensor inplace = logits.clone();
  cpu::ce_backward(inplace, o.row_max, o.sum_exp, targets, 0, dloss, inplace, S());
  EXPECT_EQ(max_abs_diff(inplace, dlogits), 0.0);
}

TEST(CrossEntropy, TwoVocabHalvesMatchWholeVocabulary) {
  const int64_t T = 9, V = 12, Vh = V / 2;
  Tensor logits = randn({T, V}, 4, 2.0), dloss = randn({T}, 5);
  Tensor targets32 = Tensor::empty({T}, DType::I32);
  cpu::copy(random_targets(T, V, 6), targets32, S());
  CeOut whole = ce_whole(logits, targets32);
  Tensor dwhole = Tensor::empty({T, V}, DType::F64);
  cpu::ce_backward(logits, whole.row_max, whole.sum_exp, targets32, 0, dloss, dwhole, S());
  // Each "rank" holds columns [r*Vh, (r+1)*Vh).
  Tensor part[2], mx[2], se[2], tl[2];
  for (int r = 0; r < 2; ++r) {
    part[r] = Tensor::empty({T, Vh}, DType::F64);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < Vh; ++j)
        part[r].data<double>()[t * Vh + j] = logits.data<double>()[t * V + r * Vh + j];
    mx[r] = Tensor::empty({T}, DType::F64), se[r] = Tensor::empty({T}, DType::F64);
    tl[r] = Tensor::empty({T}, DType::F64);
    cpu::ce_row_max(part[r], mx[r], S());
  }
  Tensor gmax = Tensor::empty({T}, DType::F64);  // all-reduce MAX
  for (int64_t t = 0; t < T; ++t)
    gmax.data<double>()[t] = std::max(mx[0].data<double>()[t], mx[1].data<double>()[t]);
  for (int r = 0; r < 2; ++r)
    cpu::ce_sum_exp_target(part[r], gmax, targets32, r * Vh, se[r], tl[r], S());
  Tensor gse = plus(se[0], se[1]), gtl = plus(tl[0], tl[1]);  // all-reduce SUM
  Tensor loss = Tensor::empty({T}, DType::F64);
  cpu::ce_loss(gmax, gse, gtl, loss, S());
  EXPECT_LT(max_abs_diff(loss, whole.loss), 1e-13);
  for (int r = 0; r < 2; ++r) {
    Tensor d = Tensor::empty({T, Vh}, DType::F64);
    cpu::ce_backward(part[r], gmax, gse, targets32, r * Vh, dloss, d, S());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < Vh; ++j)
        ASSERT_NEAR(d.data<double>()[t * Vh + j], dwhole.data<double>()[t * V + r * Vh + j], 1e-15);
  }
}

TEST(CrossEntropy, F32MatchesF64OnWideVocabulary) {
  const int64_t T = 48, V = 5003;  // several summation blocks and a ragged tail
  Tensor logits = randn({T, V}, 7, 4.0), targets = random_targets(T, V, 8), dloss = randn({T}, 9);
  CeOut o = ce_whole(logits, targets);
  Tensor d = Tensor::empty({T, V}, DType::F64);
  cpu::ce_backward(logits, o.row_max, o.sum_exp, targets, 0, dloss, d, S());
  Tensor l32 = as(logits, DType::F32);
  CeOut o32 = ce_whole(l32, targets);
  cpu::ce_backward(l32, o32.row_max, o32.sum_exp, targets, 0, as(dloss, DType::F32), l32, S());
  EXPECT_LT(max_abs_diff(o32.loss, o.loss), 1e-5 * max_abs(o.loss));
  EXPECT_LT(max_abs_diff(l32, d), 1e-5 * max_abs(d));
}

TEST(CrossEntropy, ShapeErrors) {
  Tensor logits = randn({4, 6}, 1), targets = random_targets(4, 6, 2);
  Tensor m = Tensor::empty({4}, DType::F64), bad = Tensor::empty({5}, DType::F64);
  EXPECT_THROW(cpu::ce_row_max(logits, bad, S()), Error);
  cpu::ce_row_max(logits, m, S());
  Tensor se = Tensor::empty({4}, DType::F64), tl = Tensor::empty({4}, DType::F64);
  Tensor tbad = random_targets(3, 6, 2);
  EXPECT_THROW(cpu::ce_sum_exp_target(logits, m, tbad, 0, se, tl, S()), Error);
  Tensor ftargets = Tensor::empty({4}, DType::F64);
  EXPECT_THROW(cpu::ce_sum_exp_target(logits, m, ftargets, 0, se, tl, S()), Error);
  Tensor dbad = Tensor::empty({4, 5}, DType::F64);
  EXPECT_THROW(cpu::ce_backward(logits, m, se, targets, 0, m, dbad, S()), Error);
}

// ---- ce_stats: the forward statistics in one pass (online softmax) ---------------------


// fp64 statistics of one row of any float tensor: max, sum of exp(x - max), target logit.
struct RowRef {
  double max, sum_exp, target_logit;
};
RowRef row_ref(const Tensor& logits64, int64_t t, int64_t target, int64_t vocab_start) {
  const int64_t V = logits64.size(-1);
  const double* x = logits64.data<double>() + t * V;
  double m = x[0];
  for (int64_t j = 1; j < V; ++j) m = std::max(m, x[j]);
  double se = 0;
  for (int64_t j = 0; j < V; ++j) se += std::exp(x[j] - m);
  const int64_t v = target - vocab_start;
  return {m, se, v >= 0 && v < V ? x[v] : 0.0};
}

// Logits that test the recurrence: N(0, scale^2) (never exactly 0), plus rows whose max
// is in the last column, in the first, and rising across the whole row (the running max
// grows in every block of columns).
Tensor hard_logits(int64_t T, int64_t V, uint64_t seed, double scale) {
  Tensor x = randn({T, V}, seed, scale);
  double* p = x.data<double>();
  p[0 * V + V - 1] = max_abs(x) + 3.0;
  p[1 * V + 0] = max_abs(x) + 1.0;
  for (int64_t j = 0; j < V; ++j) p[2 * V + j] = scale * (double(j) / double(V) - 0.5);
  return x;
}

// Targets in and out of [vocab_start, vocab_start + V), the slice's edges included.
Tensor edge_targets(int64_t T, int64_t V, int64_t vocab_start, uint64_t seed, DType dt) {
  std::mt19937_64 gen(seed);
  std::vector<int64_t> v(static_cast<size_t>(T));
  const int64_t lo = std::max<int64_t>(0, vocab_start - 20), hi = vocab_start + V + 20;
  for (auto& x : v) x = lo + int64_t(gen() % uint64_t(hi - lo));
  v[0] = vocab_start + V - 1, v[1] = vocab_start, v[2] = vocab_start - 1, v[3] = vocab_start + V;
  Tensor t = Tensor::from(v, {T});
  return dt == DType::I64 ? t : as(t, dt);
}


TEST(CrossEntropy, OnePassStatsMatchFp64LogSumExp) {
  const int64_t T = 9, vs = 1000;
  // 7: shorter than the max's lanes; 2048: one summation block exactly; 5003: three, the
  // last ragged; 70001: three of ce_stats' blocks (32768 columns), so the running max and
  // its rescale are exercised (row 2 rises: its max grows in every block).
  for (int64_t V : {int64_t(7), int64_t(2048), int64_t(5003), int64_t(70001)})
    for (double scale : {1.0, 30.0})
      // bf16: values representable in bf16 (the CUDA model's logits), held in f32.
      for (const char* kind : {"f64", "f32", "bf16"}) {
        SCOPED_TRACE(::testing::Message() << "V=" << V << " scale=" << scale << " " << kind);
        const bool is64 = std::string(kind) == "f64";
        const DType dt = is64 ? DType::F64 : DType::F32;
        Tensor x = hard_logits(T, V, uint64_t(V) + 11, scale);
        x = as(x, std::string(kind) == "bf16" ? DType::BF16 : dt);
        Tensor logits = as(x, dt), ref = f64(logits);
        const DType it = V == 2048 ? DType::I32 : DType::I64;
        Tensor targets = edge_targets(T, V, vs, 12, it);
        Tensor tg64 = as(targets, DType::I64);
        Tensor mx = Tensor::empty({T}, dt), se = Tensor::empty({T}, dt),
               tl = Tensor::empty({T}, dt), loss = Tensor::empty({T}, dt);
        cpu::ce_stats(logits, targets, vs, mx, se, tl, S());
        cpu::ce_loss(mx, se, tl, loss, S());
        Tensor mx64 = f64(mx), se64 = f64(se), tl64 = f64(tl), loss64 = f64(loss);
        const double tol = is64 ? 1e-13 : 1e-5;
        for (int64_t t = 0; t < T; ++t) {
          const RowRef r = row_ref(ref, t, tg64.data<int64_t>()[t], vs);
          EXPECT_EQ(mx64.data<double>()[t], r.max) << "row " << t;  // a max is exact
          EXPECT_EQ(tl64.data<double>()[t], r.target_logit) << "row " << t;
          EXPECT_NEAR(se64.data<double>()[t], r.sum_exp, tol * r.sum_exp) << "row " << t;
          // log-sum-exp - target logit, on the scale of the row's logits.
          const double want = std::log(r.sum_exp) + r.max - r.target_logit;
          EXPECT_NEAR(loss64.data<double>()[t], want, tol * (1 + std::abs(r.max)) + 1e-14)
              << "row " << t;
        }
        // The two-pass ops give the same max and target bit for bit, the same sum closely.
        Tensor mx2 = Tensor::empty({T}, dt), se2 = Tensor::empty({T}, dt),
               tl2 = Tensor::empty({T}, dt);
        cpu::ce_row_max(logits, mx2, S());
        cpu::ce_sum_exp_target(logits, mx2, targets, vs, se2, tl2, S());
        EXPECT_EQ(max_abs_diff(mx, mx2), 0.0);
        EXPECT_EQ(max_abs_diff(tl, tl2), 0.0);
        EXPECT_LE(rel_err(se, se2), tol);
      }
}

// Three unequal vocab shards (TP = 3), one below the others: ce_stats per shard, the
// row max all-reduced (MAX), each shard's sum moved to it by ce_rescale_sum_exp, sums and
// target logits all-reduced (SUM): the whole vocabulary's statistics.
TEST(CrossEntropy, OnePassShardsCombineToWholeVocabulary) {
  const int64_t T = 6, V = 4500, cut[4] = {0, 2100, 2101, V};
  for (DType dt : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor whole64 = hard_logits(T, V, 21, 30.0);
    for (int64_t t = 3; t < T; ++t)  // rows where the first shard's max is not the row's
      for (int64_t j = 0; j < cut[1]; ++j) whole64.data<double>()[t * V + j] -= 10.0;
    Tensor whole = as(whole64, dt), ref = f64(whole);
    Tensor targets = edge_targets(T, V, 0, 22, DType::I64);
    targets.data<int64_t>()[4] = cut[1];  // the one-column shard's target
    Tensor part[3], mx[3], se[3], tl[3];
    Tensor gmax64 = Tensor::empty({T}, DType::F64);  // all-reduce MAX
    cpu::fill(gmax64, -INFINITY, S());
    for (int r = 0; r < 3; ++r) {
      const int64_t Vr = cut[r + 1] - cut[r];
      Tensor p64 = Tensor::empty({T, Vr}, DType::F64);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < Vr; ++j)
          p64.data<double>()[t * Vr + j] = ref.data<double>()[t * V + cut[r] + j];
      part[r] = as(p64, dt);
      mx[r] = Tensor::empty({T}, dt), se[r] = Tensor::empty({T}, dt);
      tl[r] = Tensor::empty({T}, dt);
      cpu::ce_stats(part[r], targets, cut[r], mx[r], se[r], tl[r], S());
      Tensor m = f64(mx[r]);
      for (int64_t t = 0; t < T; ++t)
        gmax64.data<double>()[t] = std::max(gmax64.data<double>()[t], m.data<double>()[t]);
    }
    Tensor gmax = as(gmax64, dt);  // exact: a max of dt values
    Tensor gse64 = Tensor::empty({T}, DType::F64), gtl64 = Tensor::empty({T}, DType::F64);
    cpu::fill(gse64, 0.0, S()), cpu::fill(gtl64, 0.0, S());
    for (int r = 0; r < 3; ++r) {  // all-reduce SUM
      cpu::ce_rescale_sum_exp(mx[r], gmax, se[r], S());
      gse64 = plus(gse64, se[r]), gtl64 = plus(gtl64, tl[r]);
    }
    const double tol = dt == DType::F64 ? 1e-13 : 1e-5;
    for (int64_t t = 0; t < T; ++t) {
      const RowRef r = row_ref(ref, t, targets.data<int64_t>()[t], 0);
      EXPECT_EQ(gmax64.data<double>()[t], r.max) << "row " << t;
      EXPECT_EQ(gtl64.data<double>()[t], r.target_logit) << "row " << t;
      EXPECT_NEAR(gse64.data<double>()[t], r.sum_exp, tol * r.sum_exp) << "row " << t;
    }
  }
}

TEST(CrossEntropy, OnePassShapeErrors) {
  Tensor logits = randn({4, 6}, 1), targets = random_targets(4, 6, 2);
  Tensor m = Tensor::empty({4}, DType::F64), se = Tensor::empty({4}, DType::F64),
         tl = Tensor::empty({4}, DType::F64), bad = Tensor::empty({5}, DType::F64);
  EXPECT_THROW(cpu::ce_stats(logits, targets, 0, bad, se, tl, S()), Error);
  EXPECT_THROW(cpu::ce_stats(logits, targets, 0, m, bad, tl, S()), Error);
  EXPECT_THROW(cpu::ce_stats(logits, targets, 0, m, se, bad, S()), Error);
  EXPECT_THROW(cpu::ce_stats(logits, random_targets(3, 6, 2), 0, m, se, tl, S()), Error);
  EXPECT_THROW(cpu::ce_stats(logits, Tensor::empty({4}, DType::F64), 0, m, se, tl, S()), Error);
  Tensor m32 = Tensor::empty({4}, DType::F32);
  EXPECT_THROW(cpu::ce_stats(logits, targets, 0, m32, se, tl, S()), Error);
  cpu::ce_stats(logits, targets, 0, m, se, tl, S());
  EXPECT_THROW(cpu::ce_rescale_sum_exp(m, bad, se, S()), Error);
  EXPECT_THROW(cpu::ce_rescale_sum_exp(m32, m, se, S()), Error);
}

}  // namespace cross_entropy_test
