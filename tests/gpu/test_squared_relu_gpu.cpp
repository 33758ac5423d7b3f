// --squared-relu (and the exact GELU, the other activation that runs as an op after fc1's
// GEMM) on CUDA against the CPU model (label gpu): loss, logits and every parameter
// gradient after one forward/backward, f32 tight and bf16 loose, a GPT-style model (biases:
// fc1's bias in the GEMM, then squared_relu_forward), a Llama-style one and one whose second
// layer is MoE (routed experts through moe_act_scale_*, a shared expert); keeping the
// activation (--keep-mlp-activations) and recomputing fc1 (--recompute-modules mlp) give the
// same bits as recomputing the activation; greedy generation with the KV cache (the decode
// GEMM, then the activation) picks the tokens the full forward's logits pick.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_test_util.h"
#include "inference/generator.h"
#include "model/gpt_model.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace squared_relu_gpu_test {

constexpr int64_t kB = 2, kS = 80, kVocab = 120;

enum class Kind { Gpt, Llama, Moe };

TransformerConfig cfg(Kind kind, Device dev, DType dt,
                      ops::MlpActivation act = ops::MlpActivation::SquaredRelu) {
  TransformerConfig c;
  c.num_layers = 2, c.kv_channels = 64, c.seq_length = kS, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = 0, c.attention_dropout = 0;
  c.seed = 5, c.init_method_std = 0.05, c.device = dev, c.dtype = dt;
  c.squared_relu = act == ops::MlpActivation::SquaredRelu;
  c.gelu_erf = act == ops::MlpActivation::GeluErf;
  c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
  c.ffn_hidden_size = 512;
  if (kind != Kind::Gpt) {
    c.rope = true, c.rmsnorm = true, c.tie_embeddings = false, c.add_bias_linear = false;
  }
  if (kind == Kind::Moe) {
    c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 128;
    c.moe.layer_pattern = {0, 1}, c.moe.shared_ffn_hidden_size = 128;
  }
  return c;
}

model::MicroBatch batch(uint64_t seed) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({kB, kS}, DType::I64);
  mb.labels = Tensor::empty({kB, kS}, DType::I64);
  mb.loss_mask = Tensor::empty({kB, kS}, DType::F32);
  for (int64_t i = 0; i < kB * kS; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, uint64_t(i)) % kVocab);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, uint64_t(i)) % kVocab);
    mb.loss_mask.data<float>()[i] = i % 7 == 3 ? 0.f : 1.f;
  }
  return mb;
}

// Norm weights off 1 and biases off 0 (CPU f32 parameters), then the GPU model takes them
// rounded and the CPU model the rounded values back: both hold the same numbers.
void same_params(GPTModel& cm, GPTModel& gm) {
  auto& ps = cm.params();
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    if (ps.infos()[i].init == model::Init::Normal) continue;
    Tensor t = ps.param(i);
    for (int64_t e = 0; e < t.numel(); ++e)
      t.data<float>()[e] +=
          float(0.1 * Philox::normal(3, hash_name(ps.infos()[i].name), uint64_t(e)));
  }
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  ops::copy(gm.params().flat_params(), cm.params().flat_params(), GS());
}

void compare_step(Kind kind, DType dt, double tol_logits, double tol_grad,
                  ops::MlpActivation act = ops::MlpActivation::SquaredRelu) {
  MCPP_REQUIRE_GPU();
  GPTModel cm(cfg(kind, Device::CPU, DType::F32, act)), gm(cfg(kind, Device::CUDA, dt, act));
  same_params(cm, gm);
  const auto mb = batch(17);
  model::StepKeys k;
  k.iteration = 2;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  EXPECT_NEAR(lg, lc, tol_logits * std::abs(lc)) << "loss sum";
  EXPECT_LE(rel_err(to_cpu(gm.logits()), cm.logits()), tol_logits) << "logits";
  cm.backward(1e-2), gm.backward(1e-2);
  for (size_t i = 0; i < cm.params().infos().size(); ++i)
    EXPECT_LE(rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i)), tol_grad)
        << cm.params().infos()[i].name;
}

// Loss and flat gradients of one bf16 forward/backward with the given policy.
std::pair<double, Tensor> step(const TransformerConfig& c) {
  GPTModel m(c);
  m.params().zero_grads();
  model::StepKeys k;
  k.iteration = 1;
  const double loss = m.forward(batch(29), k);
  m.backward(1e-2);
  return {loss, to_cpu(m.params().flat_grads())};
}


TEST(GpuSquaredRelu, GptF32MatchesCpu) { compare_step(Kind::Gpt, DType::F32, 1e-5, 1e-4); }
TEST(GpuSquaredRelu, LlamaF32MatchesCpu) { compare_step(Kind::Llama, DType::F32, 1e-5, 1e-4); }
TEST(GpuSquaredRelu, MoeF32MatchesCpu) { compare_step(Kind::Moe, DType::F32, 1e-5, 1e-4); }
TEST(GpuSquaredRelu, GptBf16CloseToCpu) { compare_step(Kind::Gpt, DType::BF16, 3e-2, 8e-2); }
TEST(GpuSquaredRelu, MoeBf16CloseToCpu) { compare_step(Kind::Moe, DType::BF16, 3e-2, 8e-2); }
constexpr auto kErf = ops::MlpActivation::GeluErf;
TEST(GpuGeluErf, GptF32MatchesCpu) { compare_step(Kind::Gpt, DType::F32, 1e-5, 1e-4, kErf); }
TEST(GpuGeluErf, MoeF32MatchesCpu) { compare_step(Kind::Moe, DType::F32, 1e-5, 1e-4, kErf); }
TEST(GpuGeluErf, GptBf16CloseToCpu) { compare_step(Kind::Gpt, DType::BF16, 3e-2, 8e-2, kErf); }
TEST(GpuGeluErf, MoeBf16CloseToCpu) { compare_step(Kind::Moe, DType::BF16, 3e-2, 8e-2, kErf); }

TEST(GpuSquaredRelu, KeptAndRecomputedActivationsGiveTheSameBits) {
  MCPP_REQUIRE_GPU();
  for (Kind kind : {Kind::Gpt, Kind::Moe}) {
    const TransformerConfig base = cfg(kind, Device::CUDA, DType::BF16);
    const auto [loss, grads] = step(base);
    TransformerConfig keep = base;
    keep.keep_mlp_activations = 2;
    TransformerConfig rec = base;
    rec.recompute = TransformerConfig::Recompute::Selective, rec.recompute_mlp = true;
    for (const TransformerConfig* c : {&keep, &rec}) {
      const auto [l, g] = step(*c);
      EXPECT_EQ(l, loss);
      EXPECT_EQ(std::memcmp(g.raw(), grads.raw(), g.nbytes()), 0) << "gradients";
    }
  }
}

TEST(GpuSquaredRelu, GreedyGenerationFollowsTheFullForward) {
  MCPP_REQUIRE_GPU();
  for (Kind kind : {Kind::Gpt, Kind::Moe}) {
    const TransformerConfig c = cfg(kind, Device::CUDA, DType::F32);
    GPTModel m(c);
    inference::Generator gen(m.params(), c);
    const int64_t B = 2, P = 5, steps = 4;
    inference::KVCache cache(c, c.max_position_embeddings, B, Device::CUDA);
    std::vector<std::vector<int64_t>> seqs(B);
    Tensor tokens = Tensor::empty({B, P}, DType::I64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < P; ++s) {
        seqs[size_t(b)].push_back(int64_t(Philox::u32(8, uint64_t(b), uint64_t(s)) % kVocab));
        tokens.data<int64_t>()[b * P + s] = seqs[size_t(b)].back();
      }
    Tensor logits = to_cpu(gen.forward(tokens, cache));  // [B, Vp] f32
    for (int64_t st = 0; st < steps; ++st) {
      // The full forward of every sequence so far; its last position's logits.
      const int64_t S = int64_t(seqs[0].size());
      model::MicroBatch mb;
      mb.tokens = Tensor::empty({B, S}, DType::I64);
      mb.labels = Tensor::zeros({B, S}, DType::I64);
      mb.loss_mask = Tensor::zeros({B, S}, DType::F32);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s)
          mb.tokens.data<int64_t>()[b * S + s] = seqs[size_t(b)][size_t(s)];
      model::StepKeys k;
      k.training = false;
      m.forward(mb, k);
      const Tensor full = to_cpu(m.logits());  // [S*B, Vp]
      const int64_t V = logits.size(-1);
      Tensor next = Tensor::empty({B, 1}, DType::I64);
      for (int64_t b = 0; b < B; ++b) {
        const float* got = logits.data<float>() + b * V;
        const float* want = full.data<float>() + ((S - 1) * B + b) * V;
        double num = 0, den = 0;
        for (int64_t v = 0; v < V; ++v)
          num += double(got[v] - want[v]) * (got[v] - want[v]), den += double(want[v]) * want[v];
        EXPECT_LE(std::sqrt(num / den), 1e-5) << "step " << st << " row " << b;
        const int64_t id = int64_t(std::max_element(got, got + V) - got);
        seqs[size_t(b)].push_back(id);
        next.data<int64_t>()[b] = id;
      }
      logits = to_cpu(gen.forward(next, cache));
    }
  }
}

}  // namespace squared_relu_gpu_test
