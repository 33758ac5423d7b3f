// FP8 training steps of a whole model on CUDA (hybrid, delayed scaling, bf16): a layer
// that keeps its MLP activation keeps fc2's FP8 wgrad operand (the column-wise copy,
// written in the forward: Fp8Linear::keeps_input_t) instead of the bf16 activation. The
// backward must read exactly the bytes its own cast would have written, so the run that
// keeps every layer's activation and the run that keeps none (each layer recasts in the
// backward) give bitwise the same losses, parameter gradients, amax histories and
// scales, step after step; and the kept tensors are FP8 at half the bf16 size. GELU and
// SwiGLU MLPs (the copy written by their fused casts), squared ReLU and quick-GEGLU with
// an offset and a clamp (the activation op, then fc2's input cast both ways at once), with
// and without biases.
#include <cstring>

#include "gpu_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace fp8_model_gpu_test {

constexpr int64_t kB = 2, kS = 80, kVocab = 120;  // T = 160: a multiple of 16

// The MLP's activation; SwiGLU and quick-GEGLU in the Llama shape, the others in GPT's.
enum class Act { Gelu, Swiglu, SquaredRelu, QuickGeglu };
const Act kActs[] = {Act::Gelu, Act::Swiglu, Act::SquaredRelu, Act::QuickGeglu};
const char* act_name(Act a) {
  const char* const names[] = {"gelu", "swiglu", "squared_relu", "quick_geglu"};
  return names[int(a)];
}

TransformerConfig cfg(Act act, int64_t keep) {
  const bool llama = act == Act::Swiglu || act == Act::QuickGeglu;
  TransformerConfig c;
  c.num_layers = 3, c.kv_channels = 64, c.seq_length = kS, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = 0, c.attention_dropout = 0;
  c.seed = 5, c.init_method_std = 0.05, c.device = Device::CUDA, c.dtype = DType::BF16;
  if (llama) {
    c.hidden_size = 256, c.num_attention_heads = 4, c.num_query_groups = 2;
    c.ffn_hidden_size = 320, c.rope = true, c.rmsnorm = true, c.swiglu = act == Act::Swiglu;
    c.tie_embeddings = false, c.add_bias_linear = false;
    if (act == Act::QuickGeglu)  // gpt-oss's MLP
      c.quick_geglu = true, c.glu_linear_offset = 1.0, c.activation_func_clamp_value = 7.0;
  } else {
    c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
    c.ffn_hidden_size = 512, c.squared_relu = act == Act::SquaredRelu;
  }
  c.keep_mlp_activations = keep;
  c.fp8.format = model::Fp8Config::Format::Hybrid;
  c.fp8.recipe = model::Fp8Config::Recipe::Delayed;
  c.fp8.amax_history_len = 4;
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
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  return mb;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<Tensor> grads;    // every parameter gradient after the last backward (host)
  std::vector<Tensor> buffers;  // the FP8 histories and scales at the end (host)
};

TrainRun train(Act act, int64_t keep) {
  GPTModel m(cfg(act, keep));
  optim::AdamW opt(m.params(), {});
  TrainRun r;
  const auto mb = batch(40);  // one batch: the loss must fall step after step
  for (int it = 0; it < 3; ++it) {
    model::StepKeys k;
    k.iteration = it;
    m.params().zero_grads();
    r.losses.push_back(m.forward(mb, k) / double(kB * kS));
    m.backward(1.0 / double(kB * kS));
    if (it == 2)
      for (size_t i = 0; i < m.params().infos().size(); ++i)
        r.grads.push_back(to_cpu(m.params().grad(i)));
    model::fp8_update_scales(m.config(), m.params(), GS());
    opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
    opt.step(3e-3, 0.1);
  }
  for (size_t i = 0; i < m.params().buffer_infos().size(); ++i)
    r.buffers.push_back(to_cpu(m.params().buffer(i)));
  return r;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}


TEST(Fp8ModelGpu, KeptFp8ActivationEqualsRecastInBackward) {
  MCPP_REQUIRE_GPU();
  for (Act act : kActs) {
    SCOPED_TRACE(act_name(act));
    const TrainRun none = train(act, 0), all = train(act, 3);
    ASSERT_EQ(none.losses.size(), all.losses.size());
    for (size_t i = 0; i < none.losses.size(); ++i)
      EXPECT_EQ(none.losses[i], all.losses[i]) << "step " << i;
    EXPECT_LT(all.losses.back(), all.losses.front()) << "training must reduce the loss";
    ASSERT_EQ(none.grads.size(), all.grads.size());
    size_t nonzero = 0;
    for (size_t i = 0; i < none.grads.size(); ++i) {
      EXPECT_TRUE(same_bytes(none.grads[i], all.grads[i])) << "gradient " << i;
      nonzero += rel_err(all.grads[i], Tensor::zeros(all.grads[i].shape(), DType::F32)) > 0;
    }
    EXPECT_EQ(nonzero, all.grads.size()) << "every gradient non-zero";
    ASSERT_EQ(none.buffers.size(), all.buffers.size());
    ASSERT_GT(all.buffers.size(), 0u) << "delayed scaling registers its state";
    for (size_t i = 0; i < none.buffers.size(); ++i)
      EXPECT_TRUE(same_bytes(none.buffers[i], all.buffers[i])) << "FP8 buffer " << i;
    std::printf("[fp8 keep %s] losses %.6f %.6f %.6f, bitwise equal kept / recast\n", act_name(act),
                all.losses[0], all.losses[1], all.losses[2]);
  }
}

// The kept activation is the FP8 column-wise copy [F, T] (1 byte an element), not bf16.
TEST(Fp8ModelGpu, KeptActivationIsTheFp8Copy) {
  MCPP_REQUIRE_GPU();
  for (Act act : kActs) {
    const TransformerConfig c = cfg(act, 3);
    const model::Dims d = model::make_dims(c, kS, kB);
    GPTModel m(c);
    const model::Fp8Linear lin(&m.params(), "decoder.layers.1.mlp.linear_fc2.weight");
    EXPECT_TRUE(lin.keeps_input_t(c, d, c.ffn_hidden_size)) << act_name(act);
    TransformerConfig off = c;
    off.fp8.wgrad = false;  // bf16 wgrad reads the bf16 activation
    EXPECT_FALSE(lin.keeps_input_t(off, d, c.ffn_hidden_size));
    TransformerConfig cur = c;
    cur.fp8.recipe = model::Fp8Config::Recipe::Tensorwise;  // the scale changes per tensor
    EXPECT_FALSE(lin.keeps_input_t(cur, d, c.ffn_hidden_size));
  }
}

// Multi-token prediction in FP8 on the GPU: one depth after the SwiGLU model. A training pass
// records all three amaxes of the depth's eh_proj and of its layer's linears (their CUDA FP8
// GEMMs ran, with their own state), and the LM and the depth's losses are within 2% of the
// CPU's f32 emulation of the same FP8 model (the GPU's operands are bf16 before their cast).
TEST(Fp8ModelGpu, MtpDepthRunsInFp8CloseToTheEmulation) {
  MCPP_REQUIRE_GPU();
  TransformerConfig g = cfg(Act::Swiglu, 0);
  g.mtp_num_layers = 1;
  TransformerConfig c = g;
  c.device = Device::CPU, c.dtype = DType::F32;
  GPTModel gm(g), cm(c);
  const auto mb = batch(41);
  model::StepKeys k;
  const double n = double(kB * kS);
  gm.params().zero_grads();
  const double lg = gm.forward(mb, k) / n, lc = cm.forward(mb, k) / n;
  gm.backward(1.0 / n);
  const double dg = gm.mtp_stats().losses[0].back().value(),
               dc = cm.mtp_stats().losses[0].back().value();
  EXPECT_NEAR(lg, lc, 2e-2 * lc);
  EXPECT_NEAR(dg, dc, 2e-2 * std::abs(dc));
  for (const char* l : {"eh_proj", "mtp_model_layer.self_attention.linear_qkv",
                        "mtp_model_layer.self_attention.linear_proj",
                        "mtp_model_layer.mlp.linear_fc1", "mtp_model_layer.mlp.linear_fc2"}) {
    const std::string h_name = std::string("mtp.layers.0.") + l + ".fp8_amax_history";
    const Tensor h = to_cpu(gm.params().buffer(h_name));
    for (int j = 0; j < 3; ++j) EXPECT_GT(h.data<float>()[j], 0.f) << l << " operand " << j;
  }
  std::printf("[fp8 mtp] GPU lm %.6f depth %.6f, CPU emulation lm %.6f depth %.6f\n", lg, dg, lc,
              dc);
}

// Multi-latent attention in FP8 on the GPU (the Llama shape with DeepSeek-V3's MLA layout:
// query and key/value latents with their norms, q/k head 48 + 16, values 32; every FP8 GEMM
// dimension a multiple of 16): a training pass records all three amaxes of each of the
// five projections (their CUDA FP8 GEMMs ran, linear_kv_down_proj's over its whole weight,
// split after it), and the loss is within 2% of the CPU's f32 emulation of the same model.
TEST(Fp8ModelGpu, MlaRunsInFp8CloseToTheEmulation) {
  MCPP_REQUIRE_GPU();
  TransformerConfig g = cfg(Act::Swiglu, 0);
  g.num_query_groups = g.num_attention_heads;
  g.mla.on = true, g.mla.q_lora_rank = 64, g.mla.kv_lora_rank = 48;
  g.mla.qk_head_dim = 48, g.mla.qk_pos_emb_head_dim = 16, g.mla.v_head_dim = 32;
  g.kv_channels = g.mla.q_head_dim(), g.qk_layernorm = true;
  TransformerConfig c = g;
  c.device = Device::CPU, c.dtype = DType::F32;
  GPTModel gm(g), cm(c);
  const auto mb = batch(43);
  model::StepKeys k;
  const double n = double(kB * kS);
  gm.params().zero_grads();
  const double lg = gm.forward(mb, k) / n, lc = cm.forward(mb, k) / n;
  gm.backward(1.0 / n);
  EXPECT_NEAR(lg, lc, 2e-2 * lc);
  for (const char* l : {"linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj",
                        "linear_kv_up_proj", "linear_proj"}) {
    const std::string h_name = std::string("decoder.layers.1.self_attention.") + l +
                               ".fp8_amax_history";
    const Tensor h = to_cpu(gm.params().buffer(h_name));
    for (int j = 0; j < 3; ++j) EXPECT_GT(h.data<float>()[j], 0.f) << l << " operand " << j;
  }
  std::printf("[fp8 mla] GPU loss %.6f, CPU emulation %.6f\n", lg, lc);
}

}  // namespace fp8_model_gpu_test
