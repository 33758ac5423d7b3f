// How cuDNN's deterministic attention backward is chunked under its workspace cap
// (ops/types.h's attention_bwd_chunking, shared by the CUDA op and the memory plan):
// whole sequences while one fits, else whole key/value groups of one sequence; and what
// the memory plan counts for the Llama-style 1B at long sequences (bench/gpu/long_seq.sh's
// model), where one sequence's dP (32 heads x S^2 x 2 bytes: 64 GiB at 32K) would exceed
// the GPU. The GPU side (the chunked calls are bit for bit the unchunked one) is
// test_cp_gpu_chunks.cpp.
#include <gtest/gtest.h>

#include "ops/types.h"
#include "training/arguments.h"
#include "training/memory_plan.h"

namespace bwd_chunking_test {

using namespace mcpp;
constexpr int64_t MiB = int64_t(1) << 20, GiB = int64_t(1) << 30;

TEST(AttentionBwdChunking, SequencesThenGroups) {
  // GPT-2 124M at micro-batch 64 (12 heads, S 1024: 24 MiB a sequence) under 8 GiB: one call.
  auto c = ops::attention_bwd_chunking(64, 12, 12, 1024, 8192 * MiB);
  EXPECT_EQ(c.seqs, 64);
  EXPECT_EQ(c.groups, 12);
  // Under 600 MiB: the largest divisor of 64 whose sequences fit (16 x 24 MiB = 384 MiB).
  c = ops::attention_bwd_chunking(64, 12, 12, 1024, 600 * MiB);
  EXPECT_EQ(c.seqs, 16);
  EXPECT_EQ(c.groups, 12);
  // The Llama-style 1B at 32K (32 heads, 8 groups of 4): 64 GiB a sequence, 8 GiB a group.
  c = ops::attention_bwd_chunking(1, 32, 8, 32768, 8192 * MiB);
  EXPECT_EQ(c.seqs, 1);
  EXPECT_EQ(c.groups, 1);
  c = ops::attention_bwd_chunking(2, 32, 8, 32768, 20 * GiB);  // 2 of the 8 groups a call
  EXPECT_EQ(c.seqs, 1);
  EXPECT_EQ(c.groups, 2);
  c = ops::attention_bwd_chunking(1, 32, 8, 32768, 48 * GiB);  // 4 (the divisor under 6)
  EXPECT_EQ(c.groups, 4);
  c = ops::attention_bwd_chunking(1, 32, 8, 32768, 0);  // at least one group
  EXPECT_EQ(c.groups, 1);
  // MHA: each head its own group; 6 heads under a cap of 4 heads' dP run 3 at a time.
  c = ops::attention_bwd_chunking(3, 6, 6, 4096, 4 * ops::attention_bwd_per_seq_bytes(1, 4096));
  EXPECT_EQ(c.seqs, 1);
  EXPECT_EQ(c.groups, 3);
  // One call's workspace: dP of its heads, plus the f32 group sum under GQA only.
  EXPECT_EQ(ops::cudnn_attention_bwd_call_workspace_bytes(1, 4, 1, 32768, 64),
            8 * GiB + 32 * MiB);
  EXPECT_EQ(ops::cudnn_attention_bwd_call_workspace_bytes(1, 4, 4, 32768, 64), 8 * GiB);
  EXPECT_EQ(ops::cudnn_attention_bwd_workspace_bytes(1, 32, 8, 32768, 64, 8192 * MiB),
            8 * GiB + 32 * MiB);
  // Where one sequence fits, the figure is the sequence chunk's, as before.
  EXPECT_EQ(ops::cudnn_attention_bwd_workspace_bytes(16, 32, 8, 2048, 64, 8192 * MiB),
            4096 * MiB + 256 * MiB);
}

// `megatron plan`'s workspace line for long_seq.sh's model on the GPU: one group of 4 heads
// per cuDNN call at 32K (8 GiB of dP + 32 MiB), not the whole sequence's 64 GiB.
TEST(AttentionBwdChunking, MemoryPlanAtLongSequences) {
  auto plan = [](int64_t S) {
    std::vector<std::string> v = {
        "--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "32",
        "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "8192",
        "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
        "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--vocab-size",
        "32000", "--tokenizer-type", "NullTokenizer", "--mock-data", "--micro-batch-size", "1",
        "--global-batch-size", "1", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--lr", "1e-4", "--train-iters", "4", "--bf16", "--seq-length", std::to_string(S),
        "--max-position-embeddings", std::to_string(S)};
    training::Args a = training::parse_args(v);
    training::validate_args(a, 1);
    a.padded_vocab_size = training::padded_vocab_size(*a.vocab_size,
                                                      a.make_vocab_size_divisible_by, 1);
    return training::plan_stage_memory(a, training::model_config(a, Device::CUDA, DType::BF16),
                                       0);
  };
  EXPECT_EQ(plan(32768).attention_workspace, 8 * GiB + 32 * MiB);
  EXPECT_EQ(plan(16384).attention_workspace, 8 * GiB + 64 * MiB);  // 4 groups of 2 GiB
  EXPECT_EQ(plan(8192).attention_workspace, 4 * GiB + 64 * MiB);   // the whole sequence
  const training::StageMemory m = plan(32768);
  std::printf("[plan] Llama-style 1B, S 32768, one sequence: total %.2f GiB (workspace %.2f "
              "GiB, activations %.2f GiB)\n",
              double(m.total()) / GiB, double(m.attention_workspace) / GiB,
              double(m.activations()) / GiB);
}

}  // namespace bwd_chunking_test
