// Sliding-window attention (--window-size L,0, --window-attn-skip-freq) on CUDA against the
// CPU model (label gpu): loss, logits and every parameter gradient after one
// forward/backward of a Llama-style model whose first layer is windowed (L = 17 over 80
// tokens, several key tiles) and second full, alone and with packed documents
// (--reset-attention-mask: the two masks at once), f32 tight and bf16 loose; the window
// changes the GPU result (it reaches the kernels).
#include <algorithm>
#include <cmath>

#include "gpu_test_util.h"
#include "model/gpt_model.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace window_gpu_test {

constexpr int64_t kB = 2, kS = 80, kVocab = 120;

TransformerConfig cfg(Device dev, DType dt, int64_t window_left) {
  TransformerConfig c;
  c.num_layers = 2, c.kv_channels = 64, c.seq_length = kS, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = 0, c.attention_dropout = 0;
  c.seed = 5, c.init_method_std = 0.05, c.device = dev, c.dtype = dt;
  c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
  c.ffn_hidden_size = 256, c.swiglu = true;
  c.rope = true, c.rmsnorm = true, c.tie_embeddings = false, c.add_bias_linear = false;
  c.window_left = window_left, c.window_pattern = {1, 0};
  return c;
}

model::MicroBatch batch(uint64_t seed, bool docs) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({kB, kS}, DType::I64);
  mb.labels = Tensor::empty({kB, kS}, DType::I64);
  mb.loss_mask = Tensor::empty({kB, kS}, DType::F32);
  for (int64_t i = 0; i < kB * kS; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, uint64_t(i)) % kVocab);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, uint64_t(i)) % kVocab);
    mb.loss_mask.data<float>()[i] = i % 7 == 3 ? 0.f : 1.f;
  }
  if (docs) {  // documents of 23 + 11 b tokens
    mb.key_start = Tensor::empty({kB, kS}, DType::I64);
    for (int64_t b = 0; b < kB; ++b)
      for (int64_t s = 0; s < kS; ++s)
        mb.key_start.data<int64_t>()[b * kS + s] = s / (23 + 11 * b) * (23 + 11 * b);
  }
  return mb;
}

// Norm weights off 1 (CPU f32 parameters), then the GPU model takes them rounded and the
// CPU model the rounded values back: both hold the same numbers.
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

void compare_step(DType dt, bool docs, double tol_logits, double tol_grad) {
  MCPP_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (docs ? " with documents" : ""));
  GPTModel cm(cfg(Device::CPU, DType::F32, 17)), gm(cfg(Device::CUDA, dt, 17));
  same_params(cm, gm);
  const auto mb = batch(17, docs);
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
  if (dt != DType::F32) return;
  // The same GPU model without the window computes something else (by far more than the
  // tolerance): the window reached the kernels.
  GPTModel plain(cfg(Device::CUDA, dt, -1));
  ops::copy(gm.params().flat_params(), plain.params().flat_params(), GS());
  const double lp = plain.forward(mb, k);
  plain.backward(1e-2);
  EXPECT_GT(std::abs(lp - lg), 100 * tol_logits * std::abs(lc)) << "the window changed nothing";
}

TEST(GpuSlidingWindow, F32MatchesCpu) { compare_step(DType::F32, false, 1e-5, 1e-4); }
TEST(GpuSlidingWindow, F32WithDocumentsMatchesCpu) { compare_step(DType::F32, true, 1e-5, 1e-4); }
TEST(GpuSlidingWindow, Bf16CloseToCpu) { compare_step(DType::BF16, false, 3e-2, 8e-2); }
TEST(GpuSlidingWindow, Bf16WithDocumentsCloseToCpu) { compare_step(DType::BF16, true, 3e-2, 8e-2); }

}  // namespace window_gpu_test
