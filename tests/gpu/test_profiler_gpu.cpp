// --profile on the GPU (training/profiler.h): the op profiler is on exactly inside Megatron's
// window (the iterations after profile_step_start completed ones, up to profile_step_end),
// only on the ranks of --profile-ranks, and the window's end collects (clears) what it
// recorded. The printed table itself is the op profiler's (GpuProfiler.CountsDispatchedOps).
#include "gpu_test_util.h"
#include "training/profiler.h"

namespace mcpp::test {
namespace profiler_gpu_test {

training::Args profile_args() {
  training::Args a;
  a.profile = true;
  a.profile_step_start = 1, a.profile_step_end = 3, a.profile_ranks = {0};
  a.train_iters = 5;
  return a;
}

TEST(GpuProfileFlag, OpProfilingIsOnInsideTheWindowOnly) {
  MCPP_REQUIRE_GPU();
  const training::Args a = profile_args();
  training::StepProfiler p(a, Device::CUDA, /*rank=*/0, /*world_size=*/1);
  Tensor y = to_gpu(rand_f32({64, 64}, 5), DType::BF16);
  std::vector<bool> on;
  for (int64_t completed = 0; completed < a.train_iters; ++completed) {
    p.before_step(completed);
    on.push_back(gpu::op_profiling());
    ops::scale(y, 1.0, GS());
    p.after_step(completed + 1);
  }
  // Iterations 2 and 3 (1-based) profiled, as Megatron's defaults 10, 12 profile 11 and 12.
  EXPECT_EQ(on, (std::vector<bool>{false, true, true, false, false}));
  EXPECT_FALSE(gpu::op_profiling());
  EXPECT_FALSE(p.active());
  EXPECT_TRUE(gpu::op_profile_collect().empty());  // the window's end collected its ops
}

TEST(GpuProfileFlag, OtherRanksDoNotProfile) {
  MCPP_REQUIRE_GPU();
  const training::Args a = profile_args();
  training::StepProfiler p(a, Device::CUDA, /*rank=*/1, /*world_size=*/2);
  p.before_step(1);
  EXPECT_FALSE(gpu::op_profiling());
  EXPECT_FALSE(p.active());
  p.after_step(2);
}

}  // namespace profiler_gpu_test
}  // namespace mcpp::test
