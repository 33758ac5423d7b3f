// Vocab-parallel cross-entropy: loss against a naive log-softmax, gradient against
// central differences, the TP=2 split (two vocab halves combined with max/sum give the
// whole vocabulary's loss and gradient), in-place backward, f32 against f64.
#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace {

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

}  // namespace

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
