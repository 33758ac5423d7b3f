// The start-up memory plan counts --grad-reduce-in-bf16's bf16 staging copy: 2 bytes per
// parameter of the rank's buffer (plus 2 per parameter of the 1/DP shard with the
// distributed optimizer), as DataParallelGrads allocates it (staging_bytes(), checked
// against the same sizes by parallel_equiv.grad_buffer_np2); nothing at DP 1.
#include "test_util.h"
#include "training/memory_plan.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace {
StageMemory plan(std::vector<std::string> argv, int world) {
  Args a = parse_and_validate(argv, world);
  a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by,
                                          a.tensor_model_parallel_size);
  return plan_stage_memory(a, model_config(a, Device::CUDA, DType::BF16), 0);
}
}  // namespace

TEST(MemoryPlan, GradReduceInBf16Staging) {
  for (bool distopt : {false, true}) {
    auto argv = with(base_argv(), {"--bf16"});
    if (distopt) argv.push_back("--use-distributed-optimizer");
    const StageMemory fp32 = plan(argv, 2);
    const StageMemory bf16 = plan(with(argv, {"--grad-reduce-in-bf16"}), 2);
    const int64_t n = fp32.parameters;
    ASSERT_GT(n, 0);
    EXPECT_EQ(bf16.parameters, n);
    EXPECT_EQ(bf16.grads - fp32.grads, 2 * n + (distopt ? 2 * (n / 2) : 0)) << distopt;
    EXPECT_EQ(bf16.weights, fp32.weights);
    EXPECT_EQ(bf16.optimizer, fp32.optimizer);
    // DP 1: the flag has no effect, nothing is allocated.
    EXPECT_EQ(plan(with(argv, {"--grad-reduce-in-bf16"}), 1).grads, plan(argv, 1).grads);
  }
}
