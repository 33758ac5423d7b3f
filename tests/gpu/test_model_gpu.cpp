// The whole model on CUDA against the CPU model: logits, loss and every parameter
// gradient after one forward/backward (f32 tight, bf16 loose), both families, and a few
// AdamW training steps (f32, bf16 with fp32 main params, fp16 with the loss scaler).
// Plus the two ops the device-generic model added (dot, transpose) against the CPU.
#include <cmath>
#include <cstring>

#include "gpu_test_util.h"
#include "model/gpt_model.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace model_gpu_test {

// Head dim 64 so that bf16/f16 runs take the tensor-core flash attention; S = 80 is not a
// multiple of its 64-row tiles.
constexpr int64_t kB = 2, kS = 80, kVocab = 120;

// qkv_bias: Llama with --add-qkv-bias (Qwen2's q/k/v biases, no other linear bias).
// qk_norm: --qk-layernorm (Llama: Qwen3's per-head q/k RMSNorm; GPT: LayerNorm with biases).
bool interleaved_rope = false;  // cfg's models use --rotary-interleaved (one test sets it)
int64_t mtp_depths = 0;         // cfg's Llama models get MTP layers (the MTP tests set it)
// cfg's models' --softmax-type (the attention-sink tests set it).
TransformerConfig::SoftmaxType softmax_type = TransformerConfig::SoftmaxType::Vanilla;

// mla: Llama with multi-latent attention (query/key heads 48 + 16 = 64 wide, so the
// tensor-core kernels take them; values 32 wide, padded; latent norms; YaRN).
TransformerConfig cfg(bool llama, Device dev, DType dt, double dropout, bool qkv_bias = false,
                      bool qk_norm = false, bool mla = false) {
  TransformerConfig c;
  c.num_layers = 2, c.kv_channels = 64, c.seq_length = kS, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = dropout, c.attention_dropout = dropout;
  c.seed = 5, c.init_method_std = 0.05, c.device = dev, c.dtype = dt;
  c.softmax_type = softmax_type;
  if (llama) {
    c.hidden_size = 256, c.num_attention_heads = 4, c.num_query_groups = 2;
    c.ffn_hidden_size = 320, c.rope = true, c.rmsnorm = true, c.swiglu = true;
    c.tie_embeddings = false, c.add_bias_linear = false, c.add_qkv_bias = qkv_bias;
    c.qk_layernorm = qk_norm, c.rotary_interleaved = interleaved_rope;
    c.mtp_num_layers = mtp_depths, c.mtp_loss_scaling_factor = 0.3;
    if (mla) {
      c.num_query_groups = c.num_attention_heads, c.qk_layernorm = true;
      c.mla.on = true, c.mla.q_lora_rank = 96, c.mla.kv_lora_rank = 64;
      c.mla.qk_head_dim = 48, c.mla.qk_pos_emb_head_dim = 16, c.mla.v_head_dim = 32;
      c.mla.rotary_scaling_factor = 40, c.mla.mscale = 1, c.mla.mscale_all_dim = 1;
      c.mla.original_max_positions = 64;
    }
  } else {
    c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
    // --qk-layernorm's LayerNorm form with RoPE, which gives the key norm's bias a gradient
    // (learned positions alone: every score of a row shifted alike, a zero true gradient).
    c.ffn_hidden_size = 512, c.qk_layernorm = qk_norm, c.rope = qk_norm;
  }
  return c;
}

model::MicroBatch batch(uint64_t seed) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({kB, kS}, DType::I64);
  mb.labels = Tensor::empty({kB, kS}, DType::I64);
  mb.loss_mask = Tensor::empty({kB, kS}, DType::F32);
  for (int64_t i = 0; i < kB * kS; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, i) % kVocab);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, i) % kVocab);
    mb.loss_mask.data<float>()[i] = i % 7 == 3 ? 0.f : 1.f;
  }
  return mb;
}

// Norm weights around 1 and non-zero biases, so that every gradient is non-trivial.
void perturb(model::ParamStore& ps) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    if (p.init == model::Init::Normal) continue;
    Tensor t = ps.param(i);
    for (int64_t e = 0; e < t.numel(); ++e)
      t.data<float>()[e] += float(0.1 * Philox::normal(3, hash_name(p.name), uint64_t(e)));
  }
}

// GPU params := CPU params (rounded to the GPU dtype), then CPU params := GPU params so
// both models hold exactly the same numbers.
void sync_params(GPTModel& cpu_m, GPTModel& gpu_m) {
  ops::copy(cpu_m.params().flat_params(), gpu_m.params().flat_params(), GS());
  ops::copy(gpu_m.params().flat_params(), cpu_m.params().flat_params(), GS());
}

double masked_tokens(const model::MicroBatch& mb) {
  double n = 0;
  for (int64_t i = 0; i < mb.loss_mask.numel(); ++i) n += mb.loss_mask.data<float>()[i];
  return n;
}

void compare_step(bool llama, DType dt, double dropout, double tol_logits, double tol_grad,
                  bool qkv_bias = false, bool qk_norm = false, bool mla = false) {
  MCPP_REQUIRE_GPU();
  GPTModel cm(cfg(llama, Device::CPU, DType::F32, dropout, qkv_bias, qk_norm, mla));
  GPTModel gm(cfg(llama, Device::CUDA, dt, dropout, qkv_bias, qk_norm, mla));
  // perturb() makes the zero-initialised QKV bias non-zero, so its add and gradient count
  // (and moves the q/k norm weights off 1).
  // (GPT models have every linear bias, Megatron's --add-bias-linear default.)
  EXPECT_EQ(gm.params().has("decoder.layers.0.self_attention.linear_qkv.bias"),
            qkv_bias || !llama);
  EXPECT_EQ(gm.params().has("decoder.layers.0.self_attention.q_layernorm.weight"),
            qk_norm || mla);
  EXPECT_EQ(gm.params().has("decoder.layers.0.self_attention.k_layernorm.bias"), qk_norm && !llama);
  perturb(cm.params());
  sync_params(cm, gm);
  auto mb = batch(17);
  model::StepKeys k;
  k.iteration = 2;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt") << " " << dtype_name(dt)
                                    << " dropout " << dropout << (qkv_bias ? " qkv bias" : "")
                                    << (qk_norm ? " qk norm" : ""));
  EXPECT_NEAR(lg, lc, tol_logits * std::abs(lc)) << "loss sum";
  EXPECT_LE(rel_err(to_cpu(gm.logits()), cm.logits()), tol_logits) << "logits";
  const double inv = 1.0 / masked_tokens(mb);
  cm.backward(inv), gm.backward(inv);
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < cm.params().infos().size(); ++i) {
    const double e = rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i));
    EXPECT_LE(e, tol_grad) << cm.params().infos()[i].name;
    if (e > worst) worst = e, worst_name = cm.params().infos()[i].name;
  }
  for (size_t k = 0; k < cm.mtp_stats().losses.size(); ++k) {  // the MTP depths' losses
    const double a = cm.mtp_stats().losses[k].back().value();
    const double b = gm.mtp_stats().losses[k].back().value();
    EXPECT_NEAR(b, a, tol_logits * std::abs(a)) << "mtp_" << k + 1 << " loss";
  }
  std::printf("[model %s %s p=%.1f] loss %.6f vs cpu %.6f, logits rel %.2e, worst grad rel %.2e "
              "(%s)\n",
              llama ? "llama" : "gpt", std::string(dtype_name(dt)).c_str(), dropout, lg, lc,
              rel_err(to_cpu(gm.logits()), cm.logits()), worst, worst_name.c_str());
}

// n AdamW steps on the same batch; returns the loss (per token) before each step.
std::vector<double> train(GPTModel& m, int n, optim::LossScaler* scaler) {
  optim::AdamW opt(m.params(), {});
  auto mb = batch(23);
  const double inv = 1.0 / masked_tokens(mb);
  std::vector<double> losses;
  for (int it = 0; it < n; ++it) {
    model::StepKeys k;
    k.iteration = it;
    m.params().zero_grads();
    losses.push_back(m.forward(mb, k) * inv);
    const double ls = scaler ? scaler->scale() : 1.0;
    m.backward(inv * ls);
    if (scaler) {
      const bool inf = opt.unscale_and_check(1.0 / ls);
      scaler->update(inf);
      if (inf) continue;  // skipped iteration: no step
    }
    const double norm = std::sqrt(opt.grad_sq_norm());
    opt.clip(1.0, norm);
    opt.step(3e-3, 0.1);
  }
  return losses;
}


// Multi-token prediction (two depths: rolled batches, eh_proj through the transposes, the
// shared output layer, d h_0 into the final norm) on the GPU against the CPU.
TEST(GpuModel, LlamaMtpF32MatchesCpu) {
  mtp_depths = 2;
  compare_step(true, DType::F32, 0.1, 1e-5, 1e-4);
  mtp_depths = 0;
}
TEST(GpuModel, LlamaMtpBf16CloseToCpu) {
  mtp_depths = 2;
  compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2);
  mtp_depths = 0;
}

TEST(GpuModel, GptF32MatchesCpu) { compare_step(false, DType::F32, 0.0, 1e-5, 1e-4); }
TEST(GpuModel, LlamaF32MatchesCpu) { compare_step(true, DType::F32, 0.0, 1e-5, 1e-4); }
TEST(GpuModel, GptF32WithDropoutMatchesCpu) { compare_step(false, DType::F32, 0.1, 1e-5, 1e-4); }
TEST(GpuModel, LlamaF32WithDropoutMatchesCpu) { compare_step(true, DType::F32, 0.1, 1e-5, 1e-4); }
TEST(GpuModel, GptBf16CloseToCpu) { compare_step(false, DType::BF16, 0.0, 3e-2, 8e-2); }
TEST(GpuModel, LlamaBf16CloseToCpu) { compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2); }
TEST(GpuModel, LlamaF16CloseToCpu) { compare_step(true, DType::F16, 0.0, 1e-2, 3e-2); }
// --add-qkv-bias with --disable-bias-linear (Qwen2's layout): the bias in the QKV GEMM's
// epilogue and its gradient, f32 with dropout and bf16.
TEST(GpuModel, LlamaQkvBiasF32MatchesCpu) { compare_step(true, DType::F32, 0.1, 1e-5, 1e-4, true); }
TEST(GpuModel, LlamaQkvBiasBf16CloseToCpu) {
  compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2, true);
}
// --qk-layernorm (Qwen3's layout): the per-head q/k RMSNorm kernels and their weight
// gradients, f32 with dropout and bf16.
TEST(GpuModel, LlamaQkNormF32MatchesCpu) {
  compare_step(true, DType::F32, 0.1, 1e-5, 1e-4, false, true);
}
TEST(GpuModel, LlamaQkNormBf16CloseToCpu) {
  compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2, false, true);
}
// --qk-layernorm with --normalization LayerNorm (a GPT model): the per-head q/k LayerNorm
// kernels and their weight and bias gradients, f32 with dropout and bf16.
TEST(GpuModel, GptQkLayerNormF32MatchesCpu) {
  compare_step(false, DType::F32, 0.1, 1e-5, 1e-4, false, true);
}
TEST(GpuModel, GptQkLayerNormBf16CloseToCpu) {
  compare_step(false, DType::BF16, 0.0, 3e-2, 8e-2, false, true);
}

// --softmax-type: the sinks joined after the flash / cuDNN attention (learnable: their
// gradient too; off-by-one: zero logits made on the device at the first forward), f32 with
// dropout and bf16.
struct SoftmaxTypeFor {
  explicit SoftmaxTypeFor(TransformerConfig::SoftmaxType t) { softmax_type = t; }
  ~SoftmaxTypeFor() { softmax_type = TransformerConfig::SoftmaxType::Vanilla; }
};
TEST(GpuModel, LlamaLearnableSinksF32MatchCpu) {
  SoftmaxTypeFor st(TransformerConfig::SoftmaxType::Learnable);
  compare_step(true, DType::F32, 0.1, 1e-5, 1e-4);
}
TEST(GpuModel, LlamaLearnableSinksBf16CloseToCpu) {
  SoftmaxTypeFor st(TransformerConfig::SoftmaxType::Learnable);
  compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2);
}
TEST(GpuModel, GptOffByOneSinksF32MatchCpu) {
  SoftmaxTypeFor st(TransformerConfig::SoftmaxType::OffByOne);
  compare_step(false, DType::F32, 0.1, 1e-5, 1e-4);
}

// --multi-latent-attention: the latent projections, the MLA packing kernels (YaRN) and the
// padded values through the tensor-core attention, f32 with dropout and bf16.
// --rotary-interleaved: the heads permuted before RoPE, the permutation undone on the
// gradient (f32 with dropout).
TEST(GpuModel, LlamaRotaryInterleavedF32MatchesCpu) {
  interleaved_rope = true;
  compare_step(true, DType::F32, 0.1, 1e-5, 1e-4, false, true);
  interleaved_rope = false;
}
TEST(GpuModel, LlamaMlaF32MatchesCpu) {
  compare_step(true, DType::F32, 0.1, 1e-5, 1e-4, false, false, true);
}
TEST(GpuModel, LlamaMlaBf16CloseToCpu) {
  compare_step(true, DType::BF16, 0.0, 3e-2, 8e-2, false, false, true);
}

// --recompute-modules layernorm and mlp on the GPU: the norms' outputs and the dense fc1's
// output re-run in backward into shared workspace buffers (fc1 by its own GELU / SwiGLU
// epilogue kernel) give the loss and every gradient bit for bit (bf16, dropout on and off,
// alone and with the attention core recomputed too).
TEST(GpuModel, RecomputedNormsGiveTheSameBits) {
  MCPP_REQUIRE_GPU();
  for (bool llama : {false, true})
    for (double dropout : {0.0, 0.1})
      for (int what : {0, 1, 2})  // 0 layernorm, 1 mlp, 2 both
      for (bool core : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (llama ? "llama" : "gpt") << " dropout " << dropout
                                          << " core_attn " << core << " modules " << what);
        TransformerConfig c = cfg(llama, Device::CUDA, DType::BF16, dropout);
        c.recompute = core ? TransformerConfig::Recompute::Selective
                           : TransformerConfig::Recompute::None;
        GPTModel ref(c);
        c.recompute = TransformerConfig::Recompute::Selective;
        c.recompute_core_attn = core, c.recompute_norms = what != 1, c.recompute_mlp = what != 0;
        GPTModel m(c);
        ops::copy(ref.params().flat_params(), m.params().flat_params(), GS());
        auto mb = batch(29);
        model::StepKeys k;
        k.iteration = 1;
        ref.params().zero_grads(), m.params().zero_grads();
        const double lr = ref.forward(mb, k), lm = m.forward(mb, k);
        EXPECT_EQ(lr, lm);
        ref.backward(1e-3), m.backward(1e-3);
        const Tensor gr = to_cpu(ref.params().flat_grads()), gm = to_cpu(m.params().flat_grads());
        ASSERT_EQ(gr.numel(), gm.numel());
        EXPECT_EQ(std::memcmp(gr.raw(), gm.raw(), size_t(gr.numel()) * sizeof(float)), 0);
        EXPECT_LT(m.activation_memory().per_slot_max, ref.activation_memory().per_slot_max);
      }
}

// --recompute-modules mla_up_proj on the GPU: the MLA layers rebuild their packed q/k/v from
// the kept latents in backward, the same bits as keeping them (bf16, dropout on and off, the
// core recomputed or kept), and hold less.
TEST(GpuModel, MlaUpProjRecomputeGivesTheSameBits) {
  MCPP_REQUIRE_GPU();
  for (double dropout : {0.0, 0.1})
    for (bool core : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "dropout " << dropout << " core_attn " << core);
      TransformerConfig c = cfg(true, Device::CUDA, DType::BF16, dropout, false, false, true);
      c.recompute = TransformerConfig::Recompute::Selective, c.recompute_core_attn = core;
      GPTModel ref(c);
      c.recompute_mla_up_proj = true;
      GPTModel m(c);
      ops::copy(ref.params().flat_params(), m.params().flat_params(), GS());
      auto mb = batch(31);
      model::StepKeys k;
      k.iteration = 1;
      ref.params().zero_grads(), m.params().zero_grads();
      EXPECT_EQ(ref.forward(mb, k), m.forward(mb, k));
      ref.backward(1e-3), m.backward(1e-3);
      const Tensor gr = to_cpu(ref.params().flat_grads()), gm = to_cpu(m.params().flat_grads());
      ASSERT_EQ(gr.numel(), gm.numel());
      EXPECT_EQ(std::memcmp(gr.raw(), gm.raw(), size_t(gr.numel()) * sizeof(float)), 0);
      EXPECT_LT(m.activation_memory().per_slot_max, ref.activation_memory().per_slot_max);
    }
}

TEST(GpuModel, TrainingStepsTrackCpu) {
  MCPP_REQUIRE_GPU();
  for (bool llama : {false, true}) {
    // No dropout: bf16/f16 then run the tensor-core attention (dropout is covered above).
    GPTModel cm(cfg(llama, Device::CPU, DType::F32, 0.0));
    auto ref = train(cm, 5, nullptr);
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      GPTModel gm(cfg(llama, Device::CUDA, dt, 0.0));
      optim::LossScalerConfig sc;
      sc.initial_scale = 1024;
      optim::LossScaler scaler(sc);
      auto got = train(gm, 5, dt == DType::F16 ? &scaler : nullptr);
      const double tol = dt == DType::F32 ? 1e-4 : 2e-2;
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], tol * ref[i])
            << (llama ? "llama " : "gpt ") << dtype_name(dt) << " step " << i;
      EXPECT_LT(got.back(), got.front()) << "training must reduce the loss";
      std::printf("[train %s %s] losses %.5f -> %.5f (cpu f32 %.5f -> %.5f)\n",
                  llama ? "llama" : "gpt", std::string(dtype_name(dt)).c_str(), got.front(),
                  got.back(), ref.front(),
                  ref.back());
    }
  }
}

TEST(GpuOps, DotAndTransposeMatchCpu) {
  MCPP_REQUIRE_GPU();
  Tensor x = rand_f32({37, 53}, 1), y = rand_f32({37 * 53}, 2);
  EXPECT_NEAR(gpu::dot(to_gpu(x, DType::F32), to_gpu(y, DType::F32), GS()), cpu::dot(x, y, CS()),
              1e-9);
  Tensor ids = Tensor::empty({5, 300}, DType::I64);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = i * 7919;
  Tensor want = Tensor::empty({300, 5}, DType::I64);
  cpu::transpose(ids, want, CS());
  Tensor gids = Tensor::empty({5, 300}, DType::I64, Device::CUDA);
  gpu::copy(ids, gids, GS());
  Tensor gt = Tensor::empty({300, 5}, DType::I64, Device::CUDA);
  gpu::transpose(gids, gt, GS());
  Tensor got = to_cpu(gt);
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_EQ(got.data<int64_t>()[i], want.data<int64_t>()[i]) << i;
  Tensor bt = Tensor::empty({53, 37}, DType::BF16, Device::CUDA), bx = to_gpu(x, DType::BF16);
  gpu::transpose(bx, bt, GS());
  Tensor xt = Tensor::empty({53, 37}, DType::F32);
  cpu::transpose(rounded(x, DType::BF16), xt, CS());
  EXPECT_EQ(rel_err(to_cpu(bt), xt), 0.0);
}

}  // namespace model_gpu_test
