// validate_cp.cpp's checks through validate_args, in one process: what CP accepts (the
// per-layer expansion of --cp-comm-type) and each error's flag and HINT.
#include <gtest/gtest.h>

#include "base/error.h"
#include "training/arguments.h"

namespace validate_cp_test {

using mcpp::training::Args;

std::vector<std::string> argv(std::vector<std::string> extra) {
  std::vector<std::string> v = {"--num-layers", "2", "--hidden-size", "32",
                                "--num-attention-heads", "4", "--seq-length", "16",
                                "--max-position-embeddings", "16", "--micro-batch-size", "1",
                                "--lr", "1e-3", "--train-iters", "1", "--mock-data",
                                "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

Args validated(const std::vector<std::string>& extra, int world) {
  Args a = mcpp::training::parse_args(argv(extra));
  mcpp::training::validate_args(a, world);
  return a;
}

void expect_error(const std::vector<std::string>& extra, int world, const std::string& what,
                  const std::string& hint) {
  try {
    validated(extra, world);
    ADD_FAILURE() << "no error for " << what;
  } catch (const mcpp::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find(hint), std::string::npos) << msg;
  }
}

TEST(ValidateCp, AcceptsAndExpandsCommTypes) {
  Args a = validated({"--context-parallel-size", "2"}, 4);
  EXPECT_EQ(a.data_parallel_size, 2);
  EXPECT_EQ(a.cp_comm_type, (std::vector<std::string>{"p2p", "p2p"}));
  a = validated({"--context-parallel-size", "2", "--cp-comm-type", "a2a", "all_gather"}, 2);
  EXPECT_EQ(a.cp_comm_type, (std::vector<std::string>{"a2a", "all_gather"}));
  a = validated({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "p2p",
                 "--hierarchical-context-parallel-sizes", "2", "2"},
                4);
  EXPECT_EQ(a.cp_comm_type, (std::vector<std::string>{"a2a+p2p", "p2p"}));
  EXPECT_EQ(a.hierarchical_context_parallel_sizes, (std::vector<int64_t>{2, 2}));
  // Megatron accepts the sizes without an a2a+p2p layer (its groups are then unused).
  EXPECT_NO_THROW(validated({"--context-parallel-size", "4",
                             "--hierarchical-context-parallel-sizes", "2", "1", "2"},
                            4));
}

TEST(ValidateCp, Errors) {
  expect_error({"--context-parallel-size", "4", "--seq-length", "12"}, 4,
               "--context-parallel-size 4 splits --seq-length 12 into 8 equal chunks",
               "multiple of 2 x --context-parallel-size = 8");
  expect_error({"--context-parallel-size", "2", "--tensor-model-parallel-size", "4",
                "--sequence-parallel", "--seq-length", "12", "--make-vocab-size-divisible-by",
                "32"},
               8, "--sequence-parallel splits each context-parallel rank's 6 tokens",
               "multiple of --context-parallel-size x --tensor-model-parallel-size = 8");
  expect_error({"--context-parallel-size", "4", "--cp-comm-type", "a2a", "--group-query-attention",
                "--num-query-groups", "2"},
               4, "--cp-comm-type a2a needs", "use --cp-comm-type p2p");
  // a2a+p2p: the sizes are needed, must multiply to CP, come in two levels, and the
  // all-to-all level must divide a TP rank's heads and query groups.
  expect_error({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"}, 4,
               "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes",
               "A x P = --context-parallel-size 4");
  expect_error({"--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2",
                "4"},
               4, "--hierarchical-context-parallel-sizes 2 4 multiply to 8, not "
               "--context-parallel-size 4",
               "product is --context-parallel-size 4");
  expect_error({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                "--hierarchical-context-parallel-sizes", "2", "1", "2"},
               4, "takes two levels of --hierarchical-context-parallel-sizes, not 3",
               "the all-to-all groups' and the ring's");
  expect_error({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                "--hierarchical-context-parallel-sizes", "0", "4"},
               4, "a size below 1", "positive sizes");
  expect_error({"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                "--hierarchical-context-parallel-sizes", "4", "1", "--group-query-attention",
                "--num-query-groups", "2"},
               4, "--cp-comm-type a2a+p2p needs --num-attention-heads 4 and --num-query-groups 2",
               "dividing the heads and query groups");
}

// Document masking on the GPU: both flags, alone or together.
TEST(ValidateCp, DocumentFlagsOnCuda) {
  for (auto flags : std::vector<std::vector<std::string>>{
           {"--reset-position-ids"}, {"--reset-position-ids", "--reset-attention-mask"}}) {
    flags.insert(flags.end(), {"--device", "cuda"});
    const Args a = validated(flags, 1);
    EXPECT_TRUE(a.reset_position_ids);
  }
}

// CP on the GPU: every comm type, with hidden dropout and the document mask.
TEST(ValidateCp, CpOnCuda) {
  for (const char* t : {"p2p", "all_gather", "a2a"}) {
    const Args a = validated({"--context-parallel-size", "2", "--device", "cuda", "--hidden-dropout",
                              "0.1", "--attention-dropout", "0.1", "--reset-attention-mask",
                              "--reset-position-ids", "--cp-comm-type", t},
                             2);
    EXPECT_EQ(a.context_parallel_size, 2);
    EXPECT_TRUE(a.reset_attention_mask);
  }
}

// The document mask has GPU kernels (ops/cuda/attention_block.cu): accepted on --device cuda.
TEST(ValidateCp, AttentionMaskOnCuda) {
  const Args a = validated({"--reset-attention-mask", "--device", "cuda"}, 1);
  EXPECT_TRUE(a.reset_attention_mask);
  EXPECT_FALSE(a.reset_position_ids);
}

}  // namespace validate_cp_test
