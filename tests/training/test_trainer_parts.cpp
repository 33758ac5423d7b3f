// The pieces the trainer is assembled from, each against an independent reference:
//   * the Optimizer interface's gradient side (AdamW): the squared norm over a parameter
//     filter against an fp64 sum over the filtered parameters' elements; clipping;
//   * which parameters count in the global grad norm (ParamInfo, never names);
//   * the micro-batch assembly against Megatron's pretraining sampler, written out.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "data/micro_batches.h"
#include "model/params.h"
#include "ops/ops.h"
#include "optim/grads.h"
#include "optim/optimizer.h"

namespace mcpp {
namespace trainer_parts_test {

model::ParamStore small_store() {
  model::ParamStore ps;
  const int64_t sizes[] = {5, 37, 16, 3};
  for (int k = 0; k < 4; ++k) {
    model::ParamInfo p;
    p.name = "p" + std::to_string(k);
    p.global_shape = p.local_shape = {sizes[k]};
    p.init_std = 0.1;
    ps.add(p);
  }
  ps.allocate(DType::F32, 0, 1);
  ps.initialize(7);
  float* g = ps.flat_grads().data<float>();
  for (const auto& p : ps.infos())
    for (int64_t i = 0; i < p.numel(); ++i) g[p.offset + i] = float(0.01 * (p.offset + i) - 0.3);
  return ps;
}

TEST(TrainerParts, GradSqNormOverAFilterIsTheSumOverThoseParameters) {
  model::ParamStore ps = small_store();
  optim::AdamW opt(ps, {});
  const optim::ParamFilter even = [](size_t i) { return i % 2 == 0; };
  double want_all = 0, want_even = 0;
  const float* g = ps.flat_grads().data<float>();
  for (size_t k = 0; k < ps.infos().size(); ++k)
    for (int64_t i = 0; i < ps.infos()[k].numel(); ++i) {
      const double x = g[ps.infos()[k].offset + i];
      want_all += x * x;
      if (k % 2 == 0) want_even += x * x;
    }
  EXPECT_NEAR(opt.grad_sq_norm(), want_all, 1e-12 * want_all);
  EXPECT_NEAR(opt.grad_sq_norm(&even), want_even, 1e-12 * want_even);
  const optim::ParamFilter all = [](size_t) { return true; };
  EXPECT_NEAR(opt.grad_sq_norm(&all), want_all, 1e-12 * want_all);
  // AdamW's state is laid out like the parameters: one segment per parameter.
  ASSERT_EQ(opt.segments().size(), ps.infos().size());
  for (size_t k = 0; k < ps.infos().size(); ++k) {
    EXPECT_EQ(opt.segments()[k].param, k);
    EXPECT_EQ(opt.segments()[k].flat, ps.infos()[k].offset);
    EXPECT_EQ(opt.segments()[k].shard, ps.infos()[k].offset);
    EXPECT_EQ(opt.segments()[k].len, ps.infos()[k].numel());
  }
  EXPECT_FALSE(opt.state_sharded());
}

TEST(TrainerParts, ClipScalesByMaxNormOverNorm) {
  model::ParamStore ps = small_store();
  optim::AdamW opt(ps, {});
  const double norm = std::sqrt(opt.grad_sq_norm());
  const double before = opt.grad_sq_norm();
  opt.clip(0.5 * norm, norm);  // halves every gradient (up to the 1e-6 of Megatron's formula)
  EXPECT_DOUBLE_EQ(opt.pending_grad_scale(), 0.5 * norm / (norm + 1e-6));
  EXPECT_EQ(opt.grad_sq_norm(), before) << "the factor is applied in the step's pass";
  opt.clip(10 * norm, norm);  // a norm under the limit is left alone
  EXPECT_EQ(opt.pending_grad_scale(), 1.0);
  opt.clip(0.0, norm);  // clipping off
  EXPECT_EQ(opt.pending_grad_scale(), 1.0);
}

// A clipped step equals, bit for bit, the step on gradients scaled beforehand (what clip
// did before the factor moved into the step), and the factor applies to one step only.
TEST(TrainerParts, ClippedStepEqualsTheStepOnScaledGradients) {
  model::ParamStore a = small_store(), b = small_store();
  optim::AdamW oa(a, {}), ob(b, {});
  const double norm = std::sqrt(oa.grad_sq_norm());
  const double coeff = 0.3 * norm / (norm + 1e-6);
  for (int step = 0; step < 3; ++step) {
    oa.clip(0.3 * norm, norm);
    ob.scale_grads(coeff);
    oa.step(1e-2, 0.1), ob.step(1e-2, 0.1);
    EXPECT_EQ(oa.pending_grad_scale(), 1.0);
    const Tensor &pa = a.flat_params(), &pb = b.flat_params();
    ASSERT_EQ(pa.nbytes(), pb.nbytes());
    EXPECT_EQ(std::memcmp(pa.raw(), pb.raw(), pa.nbytes()), 0) << "step " << step;
    // b's gradients back to a's (unscaled: clip left a's alone) for the next step.
    std::memcpy(b.flat_grads().raw(), a.flat_grads().raw(), a.flat_grads().nbytes());
  }
}

TEST(TrainerParts, WhichParametersCountInTheGradNorm) {
  model::ParamInfo norm_w;  // duplicated across TP
  norm_w.split = model::TpSplit::None;
  model::ParamInfo qkv;  // split across TP
  qkv.split = model::TpSplit::Rows;
  model::ParamInfo tied_copy;  // the last stage's copy of the tied word embedding
  tied_copy.split = model::TpSplit::Rows;
  tied_copy.pipeline_duplicate = true;
  EXPECT_TRUE(optim::counts_in_grad_norm(norm_w, 0));
  EXPECT_FALSE(optim::counts_in_grad_norm(norm_w, 1));
  EXPECT_TRUE(optim::counts_in_grad_norm(qkv, 0));
  EXPECT_TRUE(optim::counts_in_grad_norm(qkv, 1));
  EXPECT_FALSE(optim::counts_in_grad_norm(tied_copy, 0));
  EXPECT_FALSE(optim::counts_in_grad_norm(tied_copy, 1));
}

// Sample i's tokens are all i (and its labels i + 1000; loss mask 1 on odd samples only).
class IndexSource : public data::GPTSampleSource {
 public:
  IndexSource(int64_t n, int64_t S) : n_(n), S_(S) {}
  int64_t size() const override { return n_; }
  void get(int64_t index, data::GPTSample& out) const override {
    out.tokens.assign(size_t(S_), index);
    out.labels.assign(size_t(S_), index + 1000);
    out.loss_mask.assign(size_t(S_), index % 2 ? 1.0f : 0.0f);
  }
  void get_text(int64_t, std::vector<int64_t>&) const override {}
  std::string describe() const override { return "index source"; }

 private:
  int64_t n_, S_;
};

TEST(TrainerParts, MicroBatchesFollowMegatronsPretrainingSampler) {
  const int64_t mbs = 2, S = 3, dp = 2, M = 3, gbs = mbs * dp * M, n = 50;
  const IndexSource ds(n, S);
  data::GPTSample scratch;
  const int64_t consumed = 44;  // the batch wraps around the dataset's end
  std::multiset<int64_t> seen;
  double tokens = 0;
  for (int64_t r = 0; r < dp; ++r) {
    const data::BatchShape shape{mbs, S, M, dp, r};
    const data::LocalBatch b = data::load_local_batch(ds, shape, consumed, scratch);
    ASSERT_EQ(int64_t(b.micro_batches.size()), M);
    double mine = 0;
    for (int64_t j = 0; j < M; ++j) {
      // Megatron: chunk j of the global batch holds MBS x DP samples; rank r takes its r-th
      // MBS of them.
      EXPECT_EQ(b.sample_offsets[j], j * mbs * dp + r * mbs);
      const auto& mb = b.micro_batches[j];
      for (int64_t i = 0; i < mbs; ++i) {
        const int64_t want = (consumed + j * mbs * dp + r * mbs + i) % n;
        seen.insert(want);
        for (int64_t s = 0; s < S; ++s) {
          EXPECT_EQ(mb.tokens.data<int64_t>()[i * S + s], want);
          EXPECT_EQ(mb.labels.data<int64_t>()[i * S + s], want + 1000);
          mine += mb.loss_mask.data<float>()[i * S + s];
        }
      }
    }
    EXPECT_EQ(b.loss_tokens, mine);
    tokens += b.loss_tokens;
  }
  // Together the DP ranks read the global batch [consumed, consumed + GBS), each sample once.
  std::multiset<int64_t> want;
  double want_tokens = 0;
  for (int64_t k = 0; k < gbs; ++k) {
    want.insert((consumed + k) % n);
    want_tokens += ((consumed + k) % n) % 2 ? S : 0;
  }
  EXPECT_EQ(seen, want);
  EXPECT_EQ(tokens, want_tokens);
}

}  // namespace trainer_parts_test
}  // namespace mcpp
