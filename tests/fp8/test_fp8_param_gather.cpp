// --fp8-param-gather: Megatron's constraints and ours as start-up errors with a HINT; the
// accepted settings; the CPU cast of main parameters to E4M3 bytes (optim/fp8_param_gather.h)
// against the emulation's quantiser and the formats' bit-field definition. Its training
// behaviour is tested end to end under mpirun (tests/fp8/CMakeLists.txt, fp8.param_gather.*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../training/test_util.h"
#include "model/fp8/fp8_param.h"
#include "ops/fp8_grid.h"
#include "ops/ops.h"
#include "optim/fp8_param_gather.h"
#include "training/validate_fp8.h"

namespace fp8_param_gather_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(Fp8ParamGather, FlagsMegatronRejectsAreErrors) {
  auto bad = [](std::vector<std::string> extra, std::initializer_list<std::string> needles) {
    std::vector<std::string> argv = base_argv();
    argv.insert(argv.end(), extra.begin(), extra.end());
    expect_error([&] { parse_and_validate(argv); }, needles);
  };
  // Megatron: the distributed optimizer (or FSDP) only.
  bad({"--fp8-format", "hybrid", "--fp8-param-gather"},
      {"--fp8-param-gather", "add --use-distributed-optimizer"});
  // A flag that would change nothing: FP8 parameters without FP8.
  bad({"--use-distributed-optimizer", "--fp8-param-gather"},
      {"--fp8-param-gather acts on FP8 training only"});
  // Ours: the params norm reads the model's copy, current only in each rank's shard.
  bad({"--fp8-format", "hybrid", "--use-distributed-optimizer", "--fp8-param-gather",
       "--log-params-norm"},
      {"--log-params-norm with --fp8-param-gather"});
  // Ours: so does the weight-hash check across DP replicas.
  bad({"--fp8-format", "hybrid", "--use-distributed-optimizer", "--fp8-param-gather",
       "--check-weight-hash-across-dp-replicas-interval", "10"},
      {"--check-weight-hash-across-dp-replicas-interval with --fp8-param-gather",
       "HINT: drop --check-weight-hash-across-dp-replicas-interval, or drop --fp8-param-gather"});
  for (const char* recipe : {"delayed", "tensorwise"}) {
    Args a = parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", recipe,
                                                   "--use-distributed-optimizer",
                                                   "--fp8-param-gather"}));
    EXPECT_TRUE(a.fp8_param_gather) << recipe;
  }
  Args o = parse_and_validate(with(base_argv(), {"--fp8-format", "e4m3", "--use-distributed-optimizer",
                                                 "--fp8-param-gather", "--overlap-param-gather",
                                                 "--first-last-layers-bf16", "--num-layers", "4"}));
  EXPECT_TRUE(o.fp8_param_gather && o.overlap_param_gather);
}

// Every E4M3 code's value (positive and negative, subnormals, the saturation value) and
// the midpoints between neighbours (round to nearest even) cast to the code the format's
// definition says; the dequantised bytes equal ops::fp8_quantize of the same values.
TEST(Fp8ParamGather, CpuCastIsTheEmulationsQuantiser) {
  std::vector<float> v;
  for (int c = 0; c < 0x7F; ++c) {
    const float a = float(ops::fp8_decode(uint8_t(c), ops::Fp8Format::E4M3));
    v.push_back(a), v.push_back(-a);
    if (c + 1 < 0x7F) v.push_back(0.5f * (a + float(ops::fp8_decode(uint8_t(c + 1), ops::Fp8Format::E4M3))));
  }
  v.push_back(1e6f), v.push_back(-500.f), v.push_back(449.f);  // saturate to +-448
  const int64_t n = int64_t(v.size());
  for (float sc : {1.0f, 0.5f}) {
    Tensor x = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = v[size_t(i)] / sc;
    Tensor scale = Tensor::empty({1}, DType::F32);
    scale.data<float>()[0] = sc;
    Tensor q = Tensor::empty({n}, DType::FP8E4M3), amax = Tensor::zeros({1}, DType::F32);
    Tensor inv = Tensor::zeros({1}, DType::F32), deq = Tensor::empty({n}, DType::F32);
    Tensor emu = Tensor::empty({n}, DType::F32);
    optim::fp8_param_cast(x, scale, q, &amax, inv, Stream::cpu());
    EXPECT_EQ(amax.data<float>()[0], 1e6f / sc);
    EXPECT_EQ(inv.data<float>()[0], 1.0f / sc);
    const auto* qb = static_cast<const uint8_t*>(q.raw());
    for (int64_t i = 0; i < n; ++i) {
      const double want = ops::fp8_round(double(v[size_t(i)]), ops::Fp8Format::E4M3);
      EXPECT_EQ(ops::fp8_decode(qb[i], ops::Fp8Format::E4M3), want) << v[size_t(i)];
    }
    EXPECT_EQ(qb[0], 0x00);  // +0
    optim::fp8_param_dequantize(q, inv, deq);
    ops::fp8_quantize(x, ops::Fp8Format::E4M3, scale, emu, Stream::cpu());
    EXPECT_EQ(std::memcmp(deq.raw(), emu.raw(), size_t(n) * 4), 0) << "scale " << sc;
  }
}

// Which parameters are FP8 weights: the four linears of the layers in FP8, nothing else.
TEST(Fp8ParamGather, TheFp8LayersWeights) {
  model::TransformerConfig c;
  c.num_layers = 4;
  c.fp8.format = model::Fp8Config::Format::Hybrid;
  c.fp8.bf16_start = 1;
  auto info = [](const std::string& name, int layer) {
    model::ParamInfo p;
    p.name = name, p.layer = layer;
    return p;
  };
  EXPECT_TRUE(model::is_fp8_weight(c, info("decoder.layers.1.mlp.linear_fc1.weight", 1)));
  EXPECT_TRUE(model::is_fp8_weight(c, info("decoder.layers.3.self_attention.linear_qkv.weight", 3)));
  EXPECT_FALSE(model::is_fp8_weight(c, info("decoder.layers.0.mlp.linear_fc1.weight", 0)));  // bf16
  EXPECT_FALSE(model::is_fp8_weight(c, info("decoder.layers.1.mlp.linear_fc1.bias", 1)));
  EXPECT_FALSE(model::is_fp8_weight(c, info("decoder.layers.1.input_layernorm.weight", 1)));
  EXPECT_FALSE(model::is_fp8_weight(c, info("embedding.word_embeddings.weight", -1)));
  c.fp8.format = model::Fp8Config::Format::None;
  EXPECT_FALSE(model::is_fp8_weight(c, info("decoder.layers.1.mlp.linear_fc1.weight", 1)));
}

}  // namespace fp8_param_gather_test
