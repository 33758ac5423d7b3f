// The loss normalisation (training/forward_backward.h loss_scales) on one process: the
// gradient scale of each micro-batch under Megatron's default (the mean of per-micro-batch
// masked means) and under --calculate-per-token-loss (the global batch's token mean),
// worked by hand; a micro-batch whose tokens are all masked gets 0, never NaN. The CP
// split of the counts is covered end to end under mpirun (cp.masked.*).
#include <gtest/gtest.h>

#include <cmath>

#include "comm/world.h"
#include "training/forward_backward.h"

namespace loss_scales_test {

using namespace mcpp;

model::MicroBatch batch_with_mask(std::vector<float> mask) {
  const int64_t S = int64_t(mask.size());
  model::MicroBatch mb;
  mb.tokens = Tensor::zeros({1, S}, DType::I64);
  mb.labels = Tensor::zeros({1, S}, DType::I64);
  mb.loss_mask = Tensor::from(mask, {1, S});
  return mb;
}

struct World {
  std::unique_ptr<comm::World> world;
  std::unique_ptr<parallel::ParallelState> ps;
  World() {
    comm::InitOptions io;
    io.backend = comm::Backend::Local;
    world = comm::init(io);
    ps = std::make_unique<parallel::ParallelState>(*world, parallel::ParallelSizes{});
  }
  ~World() { ps.reset(); }
};

TEST(LossScales, MegatronDefaultIsTheMeanOfMicroBatchMeans) {
  World w;
  data::LocalBatch b;
  b.micro_batches = {batch_with_mask({1, 1, 1, 0}), batch_with_mask({0, 1, 0, 0}),
                     batch_with_mask({0, 0, 0, 0})};
  b.loss_tokens = 4;
  const auto r = training::loss_scales(b, *w.ps, false, 1.0);
  ASSERT_EQ(r.grad_scale.size(), 3u);
  EXPECT_DOUBLE_EQ(r.tokens, 4.0);
  EXPECT_DOUBLE_EQ(r.grad_scale[0], 1.0 / (3 * 3));  // 3 tokens, 3 micro-batches, DP 1
  EXPECT_DOUBLE_EQ(r.grad_scale[1], 1.0 / (1 * 3));
  EXPECT_EQ(r.grad_scale[2], 0.0);  // no token: contributes nothing, no NaN
  const auto s = training::loss_scales(b, *w.ps, false, 1024.0);  // fp16 loss scale
  EXPECT_DOUBLE_EQ(s.grad_scale[0], 1024.0 / 9);
}

TEST(LossScales, PerTokenLossDividesByTheGlobalTokenCount) {
  World w;
  data::LocalBatch b;
  b.micro_batches = {batch_with_mask({1, 1, 1, 0}), batch_with_mask({0, 1, 0, 0})};
  b.loss_tokens = 4;
  const auto r = training::loss_scales(b, *w.ps, true, 1.0);
  ASSERT_EQ(r.grad_scale.size(), 2u);
  EXPECT_DOUBLE_EQ(r.grad_scale[0], 0.25);
  EXPECT_DOUBLE_EQ(r.grad_scale[1], 0.25);
  b.loss_tokens = 0;  // a batch with no token at all
  b.micro_batches = {batch_with_mask({0, 0})};
  EXPECT_EQ(training::loss_scales(b, *w.ps, true, 1.0).grad_scale[0], 0.0);
}

// With equal token counts the two normalisations agree exactly (the common case, which
// keeps runs without masked tokens bit for bit what they were).
TEST(LossScales, EqualCountsGiveTheSameScaleBothWays) {
  World w;
  data::LocalBatch b;
  b.micro_batches = {batch_with_mask({1, 1, 1}), batch_with_mask({1, 1, 1})};
  b.loss_tokens = 6;
  const auto a = training::loss_scales(b, *w.ps, false, 1.0);
  const auto p = training::loss_scales(b, *w.ps, true, 1.0);
  EXPECT_EQ(a.grad_scale, p.grad_scale);
}

}  // namespace loss_scales_test
