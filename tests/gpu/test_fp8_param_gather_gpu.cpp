// --fp8-param-gather on CUDA (one GPU, DP 1; docs/fp8.md "FP8 parameters"):
//   1. the optimizer's cast of fp32 main parameters to E4M3 bytes (fp8_param_cast: the
//      cast kernel) against the CPU emulation byte for byte -- the CPU cast's bytes, and
//      their values times scale_inv against ops::cpu::fp8_quantize (the emulated GEMM
//      operand) -- with saturation, subnormals, zeros, each row shape the cast takes, and
//      the recorded amax and scale_inv;
//   2. a bf16 model (GELU and SwiGLU, delayed and tensorwise) with the distributed
//      optimizer at DP 1: before any step the main parameters are the bf16 weights
//      exactly, so its first forward and backward reading the gathered FP8 weights (fprop
//      row-wise, dgrad the transposed copy) equal, bit for bit, the same model casting its
//      own bf16 weights: the loss, every gradient, the amax histories; after a step every
//      FP8 weight holds the CPU emulation's bytes of the new main parameters at the
//      weight's scale, its transpose, and 1/scale.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/local/local_communicator.h"
#include "gpu_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/fp8/fp8_param.h"
#include "model/gpt_model.h"
#include "optim/distributed_optimizer.h"
#include "optim/fp8_param_gather.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace fp8_param_gather_gpu_test {

Tensor host(const Tensor& g) {  // raw copy (FP8 bytes stay bytes)
  Tensor c = Tensor::empty(g.shape(), g.dtype());
  gpu::copy(g, c, GS());
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The values the cast must handle: random magnitudes over the E4M3 range at this scale,
// saturating ones, subnormal ones and exact zeros.
Tensor main_values(int64_t n, uint64_t seed, float scale) {
  Tensor x = rand_f32({n}, seed, -1.f, 1.f);
  float* p = x.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float u = Philox::uniform(seed, 9, uint64_t(i));
    if (u < 0.05f)
      p[i] = 0.f;
    else if (u < 0.15f)
      p[i] *= 600.f / scale;  // beyond 448: saturates
    else if (u < 0.3f)
      p[i] *= 0.01f / scale;  // E4M3 subnormals (below 2^-6)
    else
      p[i] *= 300.f / scale;
  }
  // at least one of each kind, whatever the draws (37 elements may draw none)
  p[0] = 600.f / scale, p[n - 1] = -0.005f / scale;
  return x;
}

TransformerConfig cfg(bool llama, bool tensorwise) {
  TransformerConfig c;
  c.num_layers = 3, c.kv_channels = 64, c.seq_length = 80, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = 0, c.attention_dropout = 0;
  c.seed = 11, c.init_method_std = 0.05, c.device = Device::CUDA, c.dtype = DType::BF16;
  if (llama) {
    c.hidden_size = 256, c.num_attention_heads = 4, c.num_query_groups = 2;
    c.ffn_hidden_size = 320, c.rope = true, c.rmsnorm = true, c.swiglu = true;
    c.tie_embeddings = false, c.add_bias_linear = false;
  } else {
    c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
    c.ffn_hidden_size = 512;
  }
  c.fp8.format = model::Fp8Config::Format::Hybrid;
  c.fp8.recipe = tensorwise ? model::Fp8Config::Recipe::Tensorwise : model::Fp8Config::Recipe::Delayed;
  c.fp8.amax_history_len = tensorwise ? 1 : 4;
  return c;
}

model::MicroBatch batch() {
  constexpr int64_t B = 2, S = 80;
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(3, 1, uint64_t(i)) % 120);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(3, 2, uint64_t(i)) % 120);
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  return mb;
}

struct DistOpt {  // DP 1: a group of one, one bucket, the distributed optimizer
  comm::LocalCommunicator dp{"dp", 0, std::chrono::seconds(30)};
  std::unique_ptr<parallel::DataParallelGrads> grads;
  std::unique_ptr<optim::DistributedAdamW> opt;
  explicit DistOpt(GPTModel& m) {
    auto& P = m.params();
    std::vector<parallel::ParamSpan> spans;
    for (size_t i = 0; i < P.infos().size(); ++i) {
      const auto& p = P.infos()[i];
      const int64_t next = i + 1 < P.infos().size() ? P.infos()[i + 1].offset : P.total_numel();
      spans.push_back({p.offset, next - p.offset, p.layer, false});
    }
    grads = std::make_unique<parallel::DataParallelGrads>(P.flat_grads(), std::move(spans), dp,
                                                          P.total_numel(), false, true);
    opt = std::make_unique<optim::DistributedAdamW>(P, optim::OptimizerConfig{}, *grads);
    opt->enable_fp8_param_gather(m.config(), nullptr);
    opt->refresh_fp8_params();
  }
};

std::vector<Tensor> grads_of(GPTModel& m) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < m.params().infos().size(); ++i) g.push_back(to_cpu(m.params().grad(i)));
  return g;
}


TEST(Fp8ParamGatherGpu, CastMatchesTheCpuEmulation) {
  MCPP_REQUIRE_GPU();
  // lengths: rows of 1024, of 128, of 16, and single elements (the kernel's row shapes)
  for (int64_t n : {int64_t(8192), int64_t(4224), int64_t(1008), int64_t(37)}) {
    for (float sc : {1.0f, 37.5f, 0.0625f}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " scale " << sc);
      const Tensor x = main_values(n, uint64_t(n) + uint64_t(sc * 16), sc);
      Tensor scale = Tensor::empty({1}, DType::F32);
      scale.data<float>()[0] = sc;
      Tensor q = Tensor::empty({n}, DType::FP8E4M3), amax = Tensor::zeros({1}, DType::F32);
      Tensor inv = Tensor::zeros({1}, DType::F32);
      optim::fp8_param_cast(x, scale, q, &amax, inv, CS());
      Tensor gx = to_gpu(x, DType::F32), gs = to_gpu(scale, DType::F32);
      Tensor gq = Tensor::empty({n}, DType::FP8E4M3, Device::CUDA);
      Tensor ga = to_gpu(Tensor::zeros({1}, DType::F32), DType::F32);
      Tensor gi = to_gpu(Tensor::zeros({1}, DType::F32), DType::F32);
      optim::fp8_param_cast(gx, gs, gq, &ga, gi, GS());
      EXPECT_TRUE(same_bytes(host(gq), q)) << "FP8 bytes";
      EXPECT_TRUE(same_bytes(host(ga), amax)) << "amax";
      EXPECT_TRUE(same_bytes(host(gi), inv)) << "scale_inv";
      // the bytes' values are the emulated operand Q(x)
      Tensor deq = Tensor::empty({n}, DType::F32), emu = Tensor::empty({n}, DType::F32);
      optim::fp8_param_dequantize(host(gq), host(gi), deq);
      cpu::fp8_quantize(x, ops::Fp8Format::E4M3, scale, emu, CS());
      EXPECT_TRUE(same_bytes(deq, emu)) << "dequantised bytes against fp8_quantize";
      int sat = 0, sub = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(emu.data<float>()[i]) * sc;
        sat += a == 448.f, sub += a > 0 && a < 0.015625f;
      }
      EXPECT_GT(sat, 0);
      EXPECT_GT(sub, 0);
    }
  }
}

TEST(Fp8ParamGatherGpu, ModelReadsTheGatheredWeights) {
  MCPP_REQUIRE_GPU();
  for (bool llama : {false, true})
    for (bool tensorwise : {false, true}) {
      SCOPED_TRACE(testing::Message() << (llama ? "SwiGLU" : "GELU")
                                      << (tensorwise ? " tensorwise" : " delayed"));
      const TransformerConfig c = cfg(llama, tensorwise);
      const auto mb = batch();
      const double norm = 1.0 / double(mb.tokens.numel());
      model::StepKeys k;
      // the same model casting its own bf16 weights
      GPTModel ref(c);
      ref.params().zero_grads();
      const double ref_loss = ref.forward(mb, k) * norm;
      ref.backward(norm);
      const std::vector<Tensor> ref_g = grads_of(ref);
      // with the optimizer's FP8 weights
      GPTModel m(c);
      DistOpt d(m);
      int fp8_weights = 0;
      for (const auto& p : m.params().infos())
        fp8_weights += model::find_fp8_param_weight(&m.params(), p.name) != nullptr;
      EXPECT_EQ(fp8_weights, 4 * c.num_layers);
      m.params().zero_grads();
      const double loss = m.forward(mb, k) * norm;
      m.backward(norm);
      EXPECT_EQ(loss, ref_loss);
      const std::vector<Tensor> g = grads_of(m);
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_TRUE(same_bytes(g[i], ref_g[i])) << m.params().infos()[i].name;
      for (size_t i = 0; i < m.params().buffer_infos().size(); ++i)
        EXPECT_TRUE(same_bytes(host(m.params().buffer(i)), host(ref.params().buffer(i))))
            << m.params().buffer_infos()[i].name;
      // a step: the FP8 weights are the emulation's cast of the new main parameters
      model::fp8_update_scales(c, m.params(), GS());
      d.grads->finish(GS());
      d.opt->step(3e-3, 0.1);
      const Tensor main = host(d.opt->full_main_params());
      int checked = 0;
      for (size_t i = 0; i < m.params().infos().size(); ++i) {
        const auto& p = m.params().infos()[i];
        const model::Fp8ParamWeight* w = model::find_fp8_param_weight(&m.params(), p.name);
        if (!w) continue;
        Tensor scale = Tensor::empty({1}, DType::F32);
        if (tensorwise) {  // fp8_max / amax of the whole weight
          Tensor a = Tensor::zeros({1}, DType::F32);
          cpu::fp8_amax(main.narrow(p.offset, p.numel()), a, CS());
          scale.data<float>()[0] = float(448.0 / double(a.data<float>()[0]));
        } else {
          const std::string pre = p.name.substr(0, p.name.size() - 7);
          scale.data<float>()[0] = host(m.params().buffer(model::fp8_scale_name(pre))).data<float>()[1];
        }
        Tensor q = Tensor::empty(p.local_shape, DType::FP8E4M3), inv = Tensor::zeros({1}, DType::F32);
        optim::fp8_param_cast(main.narrow(p.offset, p.numel()), scale, q, nullptr, inv, CS());
        EXPECT_TRUE(same_bytes(host(w->q), q)) << p.name;
        EXPECT_TRUE(same_bytes(host(w->scale_inv), inv)) << p.name;
        Tensor qt = Tensor::empty({p.local_shape[1], p.local_shape[0]}, DType::FP8E4M3);
        cpu::transpose(q, qt, CS());
        EXPECT_TRUE(same_bytes(host(w->qt), qt)) << p.name << " (transpose)";
        ++checked;
      }
      EXPECT_EQ(checked, 4 * c.num_layers);
      m.params().zero_grads();
      const double loss2 = m.forward(mb, k) * norm;
      EXPECT_LT(loss2, loss) << "the step must reduce the loss on its batch";
      std::printf("[fp8 param gather %s %s] loss %.6f (= own casts) -> %.6f after a step\n",
                  llama ? "swiglu" : "gelu", tensorwise ? "tensorwise" : "delayed", loss, loss2);
    }
}

}  // namespace fp8_param_gather_gpu_test
