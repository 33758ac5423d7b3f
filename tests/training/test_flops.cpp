// num_floating_point_operations against megatron.md §5.1/§5.2 numbers and closed forms.
#include "test_util.h"
#include "training/flops.h"

namespace flops_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(Flops, Gpt2_124M_Reproduces5p230e13) {
  // 12 layers, hidden 768, 12 heads, ffn 3072, B = 64, s = 1024, V = 50304 (padded 50257).
  Args a = parse_and_validate({"--num-layers",
                               "12",
                               "--hidden-size",
                               "768",
                               "--num-attention-heads",
                               "12",
                               "--seq-length",
                               "1024",
                               "--max-position-embeddings",
                               "1024",
                               "--micro-batch-size",
                               "8",
                               "--global-batch-size",
                               "64",
                               "--lr",
                               "6e-4",
                               "--train-iters",
                               "30",
                               "--mock-data",
                               "--tokenizer-type",
                               "NullTokenizer",
                               "--vocab-size",
                               "50257"});
  EXPECT_THROW(num_floating_point_operations(a, 64), Error);  // padded vocab not set yet
  a.padded_vocab_size = padded_vocab_size(50257, a.make_vocab_size_divisible_by, 1);
  ASSERT_EQ(*a.padded_vocab_size, 50304);
  const double f = num_floating_point_operations(a, a.global_batch_size);
  EXPECT_NEAR(f / 1e13, 5.230, 0.0005);
  EXPECT_DOUBLE_EQ(f, 52299816763392.0);  // exact: every term is an integer below 2^53
  // Dense, no GQA, F = 4h: 72·B·s·L·h²·(1 + s/(12h) + V/(12·L·h)) (causal s² term).
  const double B = 64, s = 1024, L = 12, h = 768, V = 50304;
  EXPECT_NEAR(f, 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h)), 1.0);
  // The log line's TFLOP/s/GPU: flops / (t · 1e12 · world).
  EXPECT_NEAR(throughput_tflops_per_gpu(f, 1.0045, 1), 52.07, 0.01);
}

TEST(Flops, GqaAndSwigluClosedForm) {
  // L=2, h=64, nh=8, ng=2, kv=8, F=176, V=128, s=16, B=2; by hand (fb·fma = 6):
  //   attn_lin = 6·(64·(64 + 16 + 16) + 64·64) = 61440, attn_core = 6·64 = 384,
  //   T = 32, Q2 = 512;  T·(6·64·176·3·2 + 2·61440 + 6·64·128) + 512·384·2 = 18874368.
  FlopsShape m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 8;
  m.num_query_groups = 2;
  m.kv_channels = 8;
  m.ffn_hidden_size = 176;
  m.padded_vocab_size = 128;
  m.seq_length = 16;
  m.swiglu = true;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 18874368.0);
  // Without GQA (ng = nh) and without SwiGLU the same shape costs more / less accordingly.
  m.num_query_groups = 8;
  const double mha = num_floating_point_operations(m, 2);
  EXPECT_DOUBLE_EQ(mha - 18874368.0, 32.0 * 2 * 6 * 64 * (2 * 64 - 2 * 16));
  m.swiglu = false;
  EXPECT_DOUBLE_EQ(mha - num_floating_point_operations(m, 2), 32.0 * 6 * 64 * 176 * 2);
}

// Multi-token prediction (Megatron's terms): D more layers (MoE ones when the last layer
// is), their norms and eh_proj 6·D·(3h + 2h²) per token, D more logits GEMMs.
TEST(Flops, MultiTokenPredictionTerms) {
  FlopsShape m;  // GqaAndSwigluClosedForm's shape: 18874368 FLOPs without MTP
  m.num_layers = 2, m.hidden_size = 64, m.num_attention_heads = 8, m.num_query_groups = 2;
  m.kv_channels = 8, m.ffn_hidden_size = 176, m.padded_vocab_size = 128, m.seq_length = 16;
  m.swiglu = true, m.mtp_num_layers = 1;
  // One more dense layer 32·(6·64·176·3 + 61440) + 512·384, the logits 32·6·64·128, the
  // MTP terms 32·6·(3·64 + 2·64·64).
  const double layer = 32.0 * (6 * 64 * 176 * 3 + 61440) + 512.0 * 384;
  const double mtp = 32.0 * 6 * 64 * 128 + 32.0 * 6 * (3 * 64 + 2 * 64 * 64);
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 18874368.0 + layer + mtp);
  // A MoE model whose last layer is MoE: the MTP layer runs k experts of width 32 (top-2).
  m.num_moe_layers = 2, m.moe_ffn_hidden_size = 32, m.moe_topk = 2, m.last_layer_moe = true;
  const double with_mtp = num_floating_point_operations(m, 2);
  m.mtp_num_layers = 0;
  const double moe_layer = 32.0 * (6 * 64 * 64 * 3 + 61440) + 512.0 * 384;
  EXPECT_DOUBLE_EQ(with_mtp - num_floating_point_operations(m, 2), moe_layer + mtp);
  // from_args reads --mtp-num-layers and whether the last layer is MoE.
  Args a = parse_and_validate(with(base_argv(), {"--position-embedding-type", "rope",
                                          "--mtp-num-layers", "2", "--num-experts", "4",
                                          "--disable-bias-linear", "--moe-layer-freq",
                                          "([1]+[0]*1)"}));
  a.padded_vocab_size = 128;
  EXPECT_EQ(FlopsShape::from_args(a).mtp_num_layers, 2);
  EXPECT_FALSE(FlopsShape::from_args(a).last_layer_moe);
}

TEST(Flops, FromArgsUsesDerivedShape) {
  Args a = parse_and_validate(
      with(base_argv(), {"--swiglu", "--group-query-attention", "--num-query-groups", "2"}));
  a.padded_vocab_size = 128;
  FlopsShape m = FlopsShape::from_args(a);
  EXPECT_EQ(m.ffn_hidden_size, 128);  // int(64·8/3/64)·64 = 128 for h = 64
  EXPECT_EQ(m.num_query_groups, 2);
  EXPECT_EQ(m.kv_channels, 16);
  EXPECT_GT(num_floating_point_operations(a, 8), 0.0);
}

TEST(Flops, MultiLatentAttentionClosedForm) {
  // Megatron's MLA terms, L=1, h=64, nh=4, rq=32, rkv=16, Dn=16, Dr=8, Dv=12, F=128 (GELU),
  // V=128, s=16, B=2; by hand (fb·fma = 6):
  //   q = 32·(64 + 4·24 + 1) = 5152, kv = 16·(64 + 4·(16 + 12) + 1) = 2832, rope k = 64·8,
  //   o = 4·12·64: attn_lin = 6·11568 = 69408; attn_core = 6·(4·24/2 + 4·12/2) = 432;
  //   T = 32, Q2 = 512: 32·(6·64·2·128 + 69408 + 6·64·128) + 512·432 = 7160832.
  FlopsShape m;
  m.num_layers = 1, m.hidden_size = 64, m.num_attention_heads = 4, m.num_query_groups = 4;
  m.kv_channels = 16, m.ffn_hidden_size = 128, m.padded_vocab_size = 128, m.seq_length = 16;
  m.mla = true, m.q_lora_rank = 32, m.kv_lora_rank = 16, m.qk_head_dim = 16;
  m.qk_pos_emb_head_dim = 8, m.v_head_dim = 12;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 7160832.0);
  // Without a query latent the query term is h·nh·Dq: 64·4·24 = 6144 instead of 5152.
  m.q_lora_rank = 0;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(m, 2), 7160832.0 + 32.0 * 6 * (6144 - 5152));
  // from_args reads the MLA flags.
  Args a = parse_and_validate({"--num-layers", "1", "--hidden-size", "64",
                               "--num-attention-heads", "4", "--ffn-hidden-size", "128",
                               "--seq-length", "16", "--max-position-embeddings", "16",
                               "--micro-batch-size", "2", "--lr", "1e-3", "--train-iters", "1",
                               "--mock-data", "--tokenizer-type", "NullTokenizer",
                               "--vocab-size", "100", "--multi-latent-attention",
                               "--q-lora-rank", "32", "--kv-lora-rank", "16", "--qk-head-dim",
                               "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "12"});
  a.padded_vocab_size = 128;
  EXPECT_DOUBLE_EQ(num_floating_point_operations(a, 2), 7160832.0);
}

}  // namespace flops_test
