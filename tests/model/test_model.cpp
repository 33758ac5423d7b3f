// Whole-model checks: f64 finite differences of the loss against backward() for
// both families (dropout on: its masks are deterministic), dropout invariance to
// the micro-batch split, and parallel-invariant initialisation across TP layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "base/philox.h"
#include "model/gpt_model.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;
using model::test::tiny;

namespace model_test {

model::MicroBatch batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  return model::test::random_batch(B, S, V, seed);
}

void fd_check(const TransformerConfig& cfg) {
  model::test::expect_model_finite_differences(cfg, 13);
}
void fd_check(bool llama, int layers, double dropout) { fd_check(tiny(llama, layers, dropout)); }


TEST(ModelGrad, GptOneLayerFiniteDifferences) { fd_check(false, 1, 0.0); }
TEST(ModelGrad, GptFiniteDifferencesWithDropout) { fd_check(false, 2, 0.2); }
TEST(ModelGrad, LlamaOneLayerFiniteDifferences) { fd_check(true, 1, 0.0); }
TEST(ModelGrad, LlamaFiniteDifferencesWithDropout) { fd_check(true, 2, 0.2); }

// Multi-latent attention: every latent projection, the latent norms, the shared position key
// (YaRN, concentration factor != 1) and the padded values, against finite differences; with
// and without a query latent and attention dropout.
TransformerConfig tiny_mla(bool q_latent, double dropout) {
  TransformerConfig c = tiny(true, 2, dropout);
  c.num_query_groups = c.num_attention_heads;
  c.mla.on = true, c.mla.q_lora_rank = q_latent ? 6 : 0, c.mla.kv_lora_rank = 5;
  c.mla.qk_head_dim = 2, c.mla.qk_pos_emb_head_dim = 4, c.mla.v_head_dim = 3;
  c.mla.yarn = q_latent, c.mla.rotary_scaling_factor = 40, c.mla.mscale = 0.9;
  c.mla.mscale_all_dim = 0.7, c.mla.original_max_positions = 16;
  c.kv_channels = c.mla.q_head_dim();
  c.qk_layernorm = q_latent;
  return c;
}
// --rotary-interleaved (with the q/k norms before the permutation): the permuted heads and
// the inverse permutation of their gradient.
TEST(ModelGrad, RotaryInterleavedFiniteDifferences) {
  TransformerConfig c = tiny(true, 2, 0.2);
  c.rotary_interleaved = true, c.qk_layernorm = true;
  fd_check(c);
}
// --qk-layernorm with --normalization LayerNorm (a GPT model): per-head q/k LayerNorms with
// a weight and a bias each (HD = 4, so centring and scaling both matter), named and ordered as
// Megatron's q_layernorm / k_layernorm modules (weights ones, biases zeros, no decay; perturbed
// before the check), against finite differences with dropout, with and without 1p. RoPE: it
// gives the key norm's bias a gradient (without it the bias shifts every score of a row alike).
TEST(ModelGrad, GptQkLayerNormFiniteDifferences) {
  TransformerConfig c = tiny(false, 2, 0.2);
  c.qk_layernorm = true, c.kv_channels = 4, c.rope = true;
  {
    GPTModel m(c);
    std::vector<std::string> names;
    for (const auto& p : m.params().infos()) names.push_back(p.name);
    const std::string a = "decoder.layers.1.self_attention.";
    const std::vector<std::string> want = {a + "q_layernorm.weight", a + "q_layernorm.bias",
                                           a + "k_layernorm.weight", a + "k_layernorm.bias"};
    const auto at = std::find(names.begin(), names.end(), want[0]);
    ASSERT_LE(at + 4, names.end());
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(at[ptrdiff_t(i)], want[i]);
      const auto& info = m.params().info(want[i]);
      EXPECT_EQ(info.global_shape, (Shape{4}));
      EXPECT_EQ(info.init, i % 2 ? model::Init::Zeros : model::Init::Ones);
      EXPECT_FALSE(info.weight_decay);
    }
  }
  fd_check(c);
  c.zero_centered_gamma = true;
  fd_check(c);
}
// --position-embedding-type yarn: YaRN's frequencies across the ramp (original context 4
// below the sequence) and its concentration factor in the rotation and its adjoint.
TEST(ModelGrad, YarnFiniteDifferencesWithDropout) {
  TransformerConfig c = tiny(true, 2, 0.2);
  c.yarn.on = true, c.yarn.factor = 4, c.yarn.original_max_positions = 4;
  c.yarn.beta_fast = 4, c.yarn.mscale = 0.8;
  fd_check(c);
}
// --position-embedding-type none: no position table (one parameter fewer than learned
// positions), no rotation; the gradient of what remains.
TEST(ModelGrad, NoPositionsFiniteDifferences) {
  TransformerConfig c = tiny(false, 2, 0.2);
  c.no_positions = true;
  GPTModel m(c), learned(tiny(false, 2, 0.2));
  EXPECT_FALSE(m.params().has("embedding.position_embeddings.weight"));
  EXPECT_TRUE(learned.params().has("embedding.position_embeddings.weight"));
  fd_check(c);
}
TEST(ModelGrad, MlaFiniteDifferences) { fd_check(tiny_mla(true, 0.0)); }
TEST(ModelGrad, MlaWithoutQueryLatentFiniteDifferencesWithDropout) {
  fd_check(tiny_mla(false, 0.2));
}

// --recompute-modules mla_up_proj: the MLA layers keep their latents and the key's position
// part, not the packed q/k/v, and rebuild them in backward: the loss and every gradient bit
// for bit as when q/k/v are kept (with and without a query latent, dropout on, with the core
// recomputed or kept), each layer keeping T x (qkv width - Dr) elements fewer.
TEST(ModelGrad, MlaUpProjRecomputeGivesTheBitsOfKeepingIt) {
  for (bool q_latent : {true, false})
    for (bool core : {true, false}) {
      SCOPED_TRACE(fmt::format("query latent {}, core_attn {}", q_latent, core));
      TransformerConfig keep = tiny_mla(q_latent, 0.2);
      keep.recompute = TransformerConfig::Recompute::Selective, keep.recompute_core_attn = core;
      TransformerConfig rc = keep;
      rc.recompute_mla_up_proj = true;
      GPTModel a(keep), b(rc);
      model::test::perturb_norms(a.params());
      model::test::perturb_norms(b.params());
      const auto mb = model::test::random_batch(2, keep.seq_length, 13, 5);
      model::StepKeys k;
      k.iteration = 2;
      a.params().zero_grads(), b.params().zero_grads();
      const double la = a.forward(mb, k), lb = b.forward(mb, k);
      a.backward(1.0), b.backward(1.0);
      EXPECT_EQ(la, lb);
      const Tensor ga = a.params().flat_grads(), gb = b.params().flat_grads();
      ASSERT_EQ(ga.nbytes(), gb.nbytes());
      EXPECT_EQ(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()), 0);
      double norm = 0;
      for (int64_t i = 0; i < gb.numel(); ++i) norm += std::abs(gb.data<double>()[i]);
      EXPECT_GT(norm, 0.0);
      const int64_t T = 2 * keep.seq_length, elem = int64_t(dtype_size(keep.dtype));
      const int64_t fewer = keep.num_layers * T *
                            (keep.qkv_width_local() - keep.mla.qk_pos_emb_head_dim) * elem;
      EXPECT_EQ(a.saved_bytes_per_microbatch(0, 2, keep.seq_length) -
                    b.saved_bytes_per_microbatch(0, 2, keep.seq_length),
                fewer);
    }
}

// --add-qkv-bias with --disable-bias-linear (Qwen2): linear_qkv [QKVW] gets a bias, zero at
// init as Megatron's, and no other linear does; its gradient against finite differences.
TEST(ModelGrad, QkvBiasAloneFiniteDifferences) {
  auto cfg = tiny(true, 2, 0.2);
  cfg.add_qkv_bias = true;
  {
    GPTModel m(cfg);
    std::vector<std::string> biases;
    for (const auto& p : m.params().infos())
      if (p.name.ends_with(".bias")) biases.push_back(p.name);
    ASSERT_EQ(biases.size(), 2u);  // one per layer
    EXPECT_EQ(biases[0], "decoder.layers.0.self_attention.linear_qkv.bias");
    const auto& info = m.params().info(biases[1]);
    EXPECT_EQ(info.global_shape, (Shape{cfg.qkv_width()}));
    EXPECT_EQ(info.init, model::Init::Zeros);
    EXPECT_FALSE(info.weight_decay);
    Tensor b = m.params().param(biases[1]);
    for (int64_t e = 0; e < b.numel(); ++e) ASSERT_EQ(b.data<double>()[e], 0.0);
  }
  fd_check(cfg);
  cfg.add_bias_linear = true;  // implied: the same parameters as plain biases
  GPTModel a(cfg);
  cfg.add_qkv_bias = false;
  GPTModel b(cfg);
  EXPECT_EQ(a.params().infos().size(), b.params().infos().size());
}

// The same global batch, as one micro-batch of 4 or two of 2: same token losses
// and same accumulated gradients (dropout masks keyed by the global sample index).
TEST(ModelInvariance, MicroBatchSplitWithDropout) {
  for (bool llama : {false, true}) {
    auto cfg = tiny(llama, 2, 0.3);
    GPTModel a(cfg), b(cfg);
    auto mb = batch(4, cfg.seq_length, 13, 5);
    model::StepKeys k;
    k.iteration = 7, k.global_batch = 4;
    a.params().zero_grads();
    double la = a.forward(mb, k);
    a.backward(0.1);
    b.params().zero_grads();
    double lb = 0;
    for (int64_t half = 0; half < 2; ++half) {
      model::MicroBatch part{mb.tokens.narrow(2 * half, 2), mb.labels.narrow(2 * half, 2),
                             mb.loss_mask.narrow(2 * half, 2)};
      k.sample_offset = 2 * half;
      lb += b.forward(part, k);
      b.backward(0.1);
    }
    EXPECT_NEAR(la, lb, 1e-10 * std::abs(la));
    const Tensor &ga = a.params().flat_grads(), &gb = b.params().flat_grads();
    double err = 0, mag = 0;
    for (int64_t i = 0; i < ga.numel(); ++i) {
      err = std::max(err, std::abs(ga.data<double>()[i] - gb.data<double>()[i]));
      mag = std::max(mag, std::abs(ga.data<double>()[i]));
    }
    EXPECT_LT(err, 1e-10 * mag) << (llama ? "llama" : "gpt");
    // Dropout really is on: a different iteration gives a different loss.
    k.iteration = 8, k.sample_offset = 0;
    EXPECT_NE(a.forward(mb, k), la);
  }
}

// Each TP rank's shard is exactly the slice of the TP=1 parameter (SwiGLU's
// [gate | up] per rank included).
TEST(ModelInit, ParallelInvariantAcrossTensorParallelRanks) {
  for (bool llama : {false, true}) {
    auto c1 = tiny(llama, 1, 0.0);
    GPTModel full(c1);
    for (int r = 0; r < 2; ++r) {
      auto c2 = c1;
      c2.tp_size = 2, c2.tp_rank = r;
      GPTModel part(c2);
      for (size_t i = 0; i < part.params().infos().size(); ++i) {
        const auto& p = part.params().infos()[i];
        Tensor w = part.params().param(i), W = full.params().param(p.name);
        const int64_t rows = p.local_shape[0], cols = p.local_shape.size() > 1 ? p.local_shape[1] : 1;
        for (int64_t rr = 0; rr < rows; ++rr)
          for (int64_t cc = 0; cc < cols; ++cc) {
            int64_t gi = part.params().global_index(p, rr, cc);
            ASSERT_EQ(w.data<double>()[rr * cols + cc], W.data<double>()[gi])
                << p.name << " rank " << r;
          }
      }
    }
  }
}

// --init-method-xavier-uniform: every weight drawn from init_method (embeddings, output
// layer, linears) is uniform in [-b, b), b = sqrt(6 / (fan_in + fan_out)) of its global
// shape: within the bound, reaching near it, with a uniform's variance b^2 / 3; biases and
// norms keep their zeros and ones; the TP 2 shards are the TP 1 values (global index).
TEST(ModelInit, XavierUniform) {
  for (bool llama : {false, true}) {
    auto c = tiny(llama, 1, 0.0);
    c.init_method_xavier_uniform = true;
    GPTModel m(c);
    int weights = 0;
    for (size_t i = 0; i < m.params().infos().size(); ++i) {
      const auto& p = m.params().infos()[i];
      const Tensor w = m.params().param(i);
      const double* x = w.data<double>();
      if (p.init != model::Init::XavierUniform) {
        for (int64_t k = 0; k < w.numel(); ++k)
          ASSERT_EQ(x[k], p.init == model::Init::Ones ? 1.0 : 0.0) << p.name;
        continue;
      }
      ++weights;
      ASSERT_EQ(p.global_shape.size(), 2u) << p.name;
      const double b = std::sqrt(6.0 / double(p.global_shape[0] + p.global_shape[1]));
      double mx = 0, sq = 0, sum = 0;
      for (int64_t k = 0; k < w.numel(); ++k) {
        ASSERT_LT(std::abs(x[k]), b) << p.name;
        mx = std::max(mx, std::abs(x[k])), sq += x[k] * x[k], sum += x[k];
      }
      const double n = double(w.numel());
      EXPECT_GT(mx, 0.9 * b) << p.name;
      EXPECT_NEAR(sq / n, b * b / 3, 0.25 * b * b / 3 + 4 * b * b / std::sqrt(n)) << p.name;
      EXPECT_LT(std::abs(sum / n), 4 * b / std::sqrt(3 * n)) << p.name;
    }
    EXPECT_GE(weights, 5);  // embeddings, qkv, proj, fc1, fc2 at least
    auto c2 = c;
    c2.tp_size = 2, c2.tp_rank = 1;
    GPTModel part(c2);
    for (size_t i = 0; i < part.params().infos().size(); ++i) {
      const auto& p = part.params().infos()[i];
      Tensor w = part.params().param(i), W = m.params().param(p.name);
      const int64_t rows = p.local_shape[0], cols = p.numel() / rows;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t cc = 0; cc < cols; ++cc)
          ASSERT_EQ(w.data<double>()[r * cols + cc],
                    W.data<double>()[part.params().global_index(p, r, cc)])
              << p.name;
    }
  }
}

// --embedding-init-method-std: the word and (GPT) position embeddings are drawn with their
// own std, every other weight as before, bit for bit; under --init-method-xavier-uniform a
// std other than --init-method-std keeps the embeddings normal, as in Megatron.
TEST(ModelInit, EmbeddingInitMethodStd) {
  auto is_embedding = [](const std::string& n) { return n.rfind("embedding.", 0) == 0; };
  auto sample_std = [](const Tensor& w) {
    double sq = 0;
    for (int64_t k = 0; k < w.numel(); ++k) sq += w.data<double>()[k] * w.data<double>()[k];
    return std::sqrt(sq / double(w.numel()));
  };
  for (bool llama : {false, true}) {
    auto c = tiny(llama, 1, 0.0);
    GPTModel base(c);
    c.embedding_init_method_std = 0.5;
    GPTModel m(c);
    int embeddings = 0;
    for (size_t i = 0; i < m.params().infos().size(); ++i) {
      const std::string& n = m.params().infos()[i].name;
      const Tensor w = m.params().param(i), w0 = base.params().param(n);
      if (!is_embedding(n)) {
        for (int64_t k = 0; k < w.numel(); ++k)
          ASSERT_EQ(w.data<double>()[k], w0.data<double>()[k]) << n;
        continue;
      }
      ++embeddings;
      EXPECT_NEAR(sample_std(w), 0.5, 0.5 * 4 / std::sqrt(double(w.numel()))) << n;
      EXPECT_NEAR(sample_std(w0), c.init_method_std,
                  c.init_method_std * 4 / std::sqrt(double(w0.numel())))
          << n;
    }
    EXPECT_EQ(embeddings, llama ? 1 : 2);
    c.init_method_xavier_uniform = true;
    GPTModel x(c);
    for (const auto& p : x.params().infos())
      if (is_embedding(p.name)) EXPECT_EQ(p.init, model::Init::Normal) << p.name;
    c.embedding_init_method_std = c.init_method_std;  // the same std: xavier, as Megatron
    GPTModel same(c);
    for (const auto& p : same.params().infos())
      if (is_embedding(p.name)) EXPECT_EQ(p.init, model::Init::XavierUniform) << p.name;
  }
}

TEST(ModelConfig, RejectsBadShapes) {
  auto c = tiny(true, 1, 0.0);
  c.num_query_groups = 3;
  EXPECT_THROW(GPTModel{c}, Error);
  c = tiny(false, 1, 0.0);
  c.seq_length = 9;  // > max_position_embeddings 8 with learned positions
  EXPECT_THROW(GPTModel{c}, Error);
}

}  // namespace model_test
