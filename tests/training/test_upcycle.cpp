// --moe-use-upcycling (training/upcycle.h): a dense checkpoint written here, upcycled, and
// the MoE checkpoint read back and checked tensor by tensor against the dense one with
// Megatron-LM's rules written out again (granules of fc1's gate and up rows and of fc2's
// columns, the weight scale, the router's repeated rows); and the errors that name what
// does not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "comm/local/local_communicator.h"
#include "model/gpt_model.h"
#include "model/module.h"
#include "test_util.h"
#include "training/memory_plan.h"
#include "training/upcycle.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace upcycle_test {

std::string fresh_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("mcpp_upcycle_" + name);
  std::filesystem::remove_all(d);
  return d.string();
}

std::vector<std::string> llama_argv() {
  return with(base_argv(), {"--swiglu", "--disable-bias-linear", "--ffn-hidden-size", "64",
                            "--position-embedding-type", "rope", "--normalization", "RMSNorm"});
}

model::TransformerConfig config_of(Args a) {
  a.padded_vocab_size = 128;  // the trainer's, from the tokenizer
  return model_config(a, Device::CPU, DType::F32);
}

// A dense checkpoint of llama_argv()'s model (seed 5, so that it differs from the MoE
// model's own initialisation) at iteration 4.
std::string write_dense(const std::string& name) {
  const std::string dir = fresh_dir(name);
  model::TransformerConfig c = config_of(parse_and_validate(llama_argv()));
  c.seed = 5;
  model::GPTModel m(c);
  checkpoint::TrainingState st;
  st.iteration = 4;
  checkpoint::save_checkpoint(dir, m, nullptr, st);
  return dir;
}

Tensor param(const checkpoint::ModelWeights& w, const std::string& name) {
  return w.params.param(name);
}


// The upcycled model `m` (granularity 1: every expert the dense MLP, the top-k weights
// summing to 1) computes the dense model: its logits on 2 x 16 tokens (drawn with `mult`)
// within f32 rounding of the dense model's, which a missing or misplaced tensor would move
// by far more.
void expect_logits_of_dense(model::GPTModel& dense, checkpoint::ModelWeights& m, int64_t mult) {
  model::GPTModel moe(m.config);
  ops::copy(m.params.flat_params(), moe.params().flat_params(),
            ops::default_stream(Device::CPU));
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({2, 16}, DType::I64);
  mb.labels = Tensor::zeros({2, 16}, DType::I64);
  mb.loss_mask = Tensor::zeros({2, 16}, DType::F32);
  for (int64_t i = 0; i < 32; ++i) mb.tokens.data<int64_t>()[i] = (i * mult + 11) % 100;
  model::StepKeys k;
  k.training = false;
  dense.forward(mb, k);
  moe.forward(mb, k);
  const Tensor& x = dense.logits();
  const Tensor& y = moe.logits();
  ASSERT_EQ(x.numel(), y.numel());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    worst = std::max(worst, double(std::abs(x.data<float>()[i] - y.data<float>()[i])));
    scale = std::max(scale, double(std::abs(x.data<float>()[i])));
  }
  EXPECT_LE(worst, 1e-5 * scale) << "largest logit " << scale;
}

// Granularity 2, 4 experts of FFN 32 from a dense FFN of 64, SwiGLU, post-softmax router:
// activation scale g = 2, each weight x 2^(1/3).
TEST(Upcycle, ExpertsAreScaledGranulesOfTheDenseMlp) {
  const std::string dense_dir = write_dense("dense_g2"), moe_dir = fresh_dir("moe_g2");
  const Args a = parse_and_validate(
      with(llama_argv(), {"--num-experts", "4", "--moe-ffn-hidden-size", "32",
                          "--moe-use-upcycling", "--moe-upcycling-granularity", "2", "--load",
                          dense_dir, "--save", moe_dir}));
  const model::TransformerConfig mc = config_of(a);
  comm::LocalCommunicator world("world", 0, std::chrono::seconds(5));
  upcycle_dense_checkpoint(a, mc, world);
  const auto d = checkpoint::load_model_weights(dense_dir, std::nullopt);
  const auto m = checkpoint::load_model_weights(moe_dir, std::nullopt);
  EXPECT_EQ(m.state.iteration, 1);
  EXPECT_EQ(m.config.moe.num_experts, 4);
  // The MoE model's own initialisation (its router before the rows are repeated).
  model::TransformerConfig whole = mc;
  model::GPTModel init(whole);
  const float s = float(std::cbrt(2.0));
  for (int layer = 0; layer < 2; ++layer) {
    auto name = [&](const std::string& n) { return model::layer_param_name(layer, n); };
    // Shared tensors: the dense values.
    for (const char* n : {"self_attention.linear_qkv.weight", "self_attention.linear_proj.weight",
                          "input_layernorm.weight", "pre_mlp_layernorm.weight"}) {
      const Tensor x = param(d, name(n)), y = param(m, name(n));
      ASSERT_EQ(x.numel(), y.numel()) << n;
      for (int64_t i = 0; i < x.numel(); ++i)
        ASSERT_EQ(x.data<float>()[i], y.data<float>()[i]) << n << " " << i;
    }
    const Tensor w1 = param(d, name("mlp.linear_fc1.weight"));  // [128, 64]: gate; up
    const Tensor w2 = param(d, name("mlp.linear_fc2.weight"));  // [64, 64]
    const int64_t H = 64;
    for (int e = 0; e < 4; ++e) {
      const int j = e % 2;
      const Tensor e1 = param(m, name("mlp.experts.linear_fc1.weight" + std::to_string(e)));
      const Tensor e2 = param(m, name("mlp.experts.linear_fc2.weight" + std::to_string(e)));
      ASSERT_EQ(e1.numel(), 64 * H);
      for (int64_t r = 0; r < 64; ++r) {  // rows 0-31 gate, 32-63 up
        const int64_t src = r < 32 ? j * 32 + r : 64 + j * 32 + (r - 32);
        for (int64_t c = 0; c < H; ++c)
          ASSERT_EQ(e1.data<float>()[r * H + c], w1.data<float>()[src * H + c] * s)
              << "layer " << layer << " expert " << e << " fc1 row " << r;
      }
      for (int64_t r = 0; r < H; ++r)
        for (int64_t c = 0; c < 32; ++c)
          ASSERT_EQ(e2.data<float>()[r * 32 + c], w2.data<float>()[r * 64 + j * 32 + c] * s)
              << "layer " << layer << " expert " << e << " fc2 (" << r << ", " << c << ")";
    }
    // The router: rows 0, 0, 1, 1 of its initialisation.
    const Tensor r = param(m, name("mlp.router.weight"));
    const Tensor r0 = init.params().param(name("mlp.router.weight"));
    for (int e = 0; e < 4; ++e)
      for (int64_t c = 0; c < H; ++c)
        ASSERT_EQ(r.data<float>()[e * H + c], r0.data<float>()[(e / 2) * H + c]) << e;
  }
}

// Linear biases (the dense model without --disable-bias-linear; gpt-oss-style MoE layers):
// at granularity 2 each expert's fc1 bias is the scaled granule of the dense one (gate and
// up halves), its fc2 bias the dense fc2 bias; at granularity 1 the upcycled model computes
// the dense model (the top-2 weights sum to 1), its logits within f32 rounding of the
// dense model's -- which a missing bias would move by far more.
TEST(Upcycle, LinearBiasesAreCopiedAsMegatronsSequentialMlp) {
  auto biased = [](std::vector<std::string> v) {
    v.erase(std::find(v.begin(), v.end(), "--disable-bias-linear"));
    return v;
  };
  const std::string dense_dir = fresh_dir("dense_bias");
  model::TransformerConfig dc = config_of(parse_and_validate(biased(llama_argv())));
  dc.seed = 5;
  model::GPTModel dense(dc);
  for (size_t i = 0; i < dense.params().infos().size(); ++i)  // biases away from zero
    if (dense.params().infos()[i].name.ends_with(".bias")) {
      Tensor b = dense.params().param(i);
      for (int64_t e = 0; e < b.numel(); ++e) b.data<float>()[e] = 0.05f * float(e % 7) - 0.1f;
    }
  checkpoint::TrainingState st;
  st.iteration = 4;
  checkpoint::save_checkpoint(dense_dir, dense, nullptr, st);
  comm::LocalCommunicator world("world", 0, std::chrono::seconds(5));
  const auto d = checkpoint::load_model_weights(dense_dir, std::nullopt);
  for (int g : {2, 1}) {
    SCOPED_TRACE(::testing::Message() << "granularity " << g);
    const std::string moe_dir = fresh_dir("moe_bias" + std::to_string(g));
    const Args a = parse_and_validate(biased(with(
        llama_argv(), {"--num-experts", "4", "--moe-ffn-hidden-size", std::to_string(64 / g),
                       "--moe-use-upcycling", "--moe-upcycling-granularity", std::to_string(g),
                       "--load", dense_dir, "--save", moe_dir})));
    upcycle_dense_checkpoint(a, config_of(a), world);
    auto m = checkpoint::load_model_weights(moe_dir, std::nullopt);
    const int64_t I = 64 / g, H = 64;
    const float s = float(std::cbrt(double(g)));
    for (int layer = 0; layer < 2; ++layer) {
      auto name = [&](const std::string& n) { return model::layer_param_name(layer, n); };
      const Tensor b1 = param(d, name("mlp.linear_fc1.bias"));
      const Tensor b2 = param(d, name("mlp.linear_fc2.bias"));
      for (int e = 0; e < 4; ++e) {
        const int j = e % g;
        const Tensor c1 = param(m, name("mlp.experts.linear_fc1.bias" + std::to_string(e)));
        const Tensor c2 = param(m, name("mlp.experts.linear_fc2.bias" + std::to_string(e)));
        ASSERT_EQ(c1.numel(), 2 * I);
        for (int64_t r = 0; r < 2 * I; ++r) {
          const int64_t src = r < I ? j * I + r : 64 + j * I + (r - I);
          ASSERT_EQ(c1.data<float>()[r], b1.data<float>()[src] * s) << "expert " << e << " " << r;
        }
        for (int64_t r = 0; r < H; ++r) ASSERT_EQ(c2.data<float>()[r], b2.data<float>()[r]);
      }
    }
    if (g != 1) continue;
    expect_logits_of_dense(dense, m, 37);  // the upcycled model computes the dense one
  }
}

// gpt-oss's MLP (quick-GEGLU with offset 1 and clamp 7, linear biases) upcycled at
// granularity 1: every expert is the dense MLP, so the MoE model's logits are the dense
// model's; at granularity 2 a start-up error (Megatron's split would cut across the gate and
// up halves).
TEST(Upcycle, QuickGegluWithOffsetAndClampAtGranularityOne) {
  auto geglu = [](std::vector<std::string> v) {
    v.erase(std::find(v.begin(), v.end(), "--disable-bias-linear"));
    v.erase(std::find(v.begin(), v.end(), "--swiglu"));
    for (const char* f : {"--quick-geglu", "--glu-linear-offset", "1.0",
                          "--activation-func-clamp-value", "7.0"})
      v.push_back(f);
    return v;
  };
  const std::string dense_dir = fresh_dir("dense_geglu"), moe_dir = fresh_dir("moe_geglu");
  model::TransformerConfig dc = config_of(parse_and_validate(geglu(llama_argv())));
  dc.seed = 5;
  model::GPTModel dense(dc);
  checkpoint::TrainingState st;
  st.iteration = 4;
  checkpoint::save_checkpoint(dense_dir, dense, nullptr, st);
  const Args a = parse_and_validate(geglu(with(
      llama_argv(), {"--num-experts", "4", "--moe-use-upcycling", "--load", dense_dir, "--save",
                     moe_dir})));
  comm::LocalCommunicator world("world", 0, std::chrono::seconds(5));
  upcycle_dense_checkpoint(a, config_of(a), world);
  auto m = checkpoint::load_model_weights(moe_dir, std::nullopt);
  expect_logits_of_dense(dense, m, 41);
  expect_error(
      [&] {
        parse_and_validate(geglu(with(
            llama_argv(), {"--num-experts", "4", "--moe-ffn-hidden-size", "32",
                           "--moe-use-upcycling", "--moe-upcycling-granularity", "2", "--load",
                           dense_dir, "--save", fresh_dir("moe_geglu2")})));
      },
      {"--quick-geglu at --moe-upcycling-granularity 2", "HINT"});
}

TEST(Upcycle, RefusesWhatDoesNotFit) {
  const std::string dense_dir = write_dense("dense_err");
  comm::LocalCommunicator world("world", 0, std::chrono::seconds(5));
  auto upcycle = [&](std::initializer_list<std::string> extra) {
    auto v = with(llama_argv(), {"--num-experts", "4", "--load", dense_dir, "--save",
                                 fresh_dir("moe_err"), "--moe-use-upcycling"});
    v.insert(v.end(), extra.begin(), extra.end());
    const Args b = parse_and_validate(v);
    upcycle_dense_checkpoint(b, config_of(b), world);
  };
  // Experts of FFN 32 at granularity 1 from a dense FFN of 64: the hint names 2.
  expect_error([&] { upcycle({"--moe-ffn-hidden-size", "32"}); },
               {"FFN width 64 is not the experts' 32 x --moe-upcycling-granularity 1",
                "give --moe-upcycling-granularity 2"});
  // Another hidden size: the tensor is named.
  expect_error([&] { upcycle({"--hidden-size", "32"}); },
               {"--moe-use-upcycling:", "in the dense checkpoint"});
  // Validation: granularity must divide the experts; --save is required.
  expect_error(
      [&] {
        parse_and_validate(with(llama_argv(), {"--num-experts", "3", "--moe-use-upcycling",
                                               "--moe-upcycling-granularity", "2", "--load",
                                               dense_dir, "--save", "/tmp/x"}));
      },
      {"--num-experts 3 is not a multiple of --moe-upcycling-granularity 2"});
  expect_error(
      [&] {
        parse_and_validate(with(
            llama_argv(), {"--num-experts", "4", "--moe-use-upcycling", "--load", dense_dir}));
      },
      {"writes the MoE model to --save"});
  expect_error([&] { parse_and_validate(with(llama_argv(), {"--moe-use-upcycling"})); },
               {"--moe-use-upcycling applies to mixture-of-experts models only"});
}

}  // namespace upcycle_test
