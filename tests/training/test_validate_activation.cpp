// GELU's form, --quick-geglu, --glu-linear-offset, --activation-func-clamp-value and MoE linear
// biases at start-up: the values reach the model config, and every combination Megatron-LM refuses
// (TransformerConfig.__post_init__, core_transformer_config_from_args, TEGroupedMLP,
// SharedExpertMLP, the ETP-1 rule for MoE biases) is an error naming the flag with a HINT, as are
// the ones that would change nothing; FP8 training takes them all.
#include <cmath>
#include <limits>

#include "model/config.h"
#include "test_util.h"
#include "training/memory_plan.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace validate_activation_test {

using ops::MlpActivation;

std::vector<std::string> moe(std::initializer_list<std::string> more = {}) {
  return with(with(base_argv(), {"--num-experts", "4", "--moe-router-topk", "2"}), more);
}

TEST(ValidateActivation, QuickGegluReachesTheModel) {
  Args a = parse_and_validate(
      with(base_argv(),
           {"--quick-geglu", "--glu-linear-offset", "1.0", "--activation-func-clamp-value", "7"}));
  const model::TransformerConfig c = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(c.quick_geglu && c.gated_linear_unit());
  EXPECT_EQ(c.activation().kind, MlpActivation::QuickGeglu);
  EXPECT_EQ(c.activation().glu.offset, 1.0);
  EXPECT_EQ(c.activation().glu.clamp, 7.0);
  EXPECT_EQ(c.fc1_width_local(), 2 * c.ffn_hidden_size);
  // Plain: no offset, no clamp; Megatron's 4h (its 2/3 width is SwiGLU's only).
  Args p = parse_and_validate(with(base_argv(), {"--quick-geglu"}));
  const model::TransformerConfig q = model_config(p, Device::CPU, DType::F32);
  EXPECT_TRUE(q.activation().glu.plain());
  EXPECT_EQ(q.ffn_hidden_size, 4 * q.hidden_size);
  // Megatron takes any clamp for quick_gelu (its SwiGLU checks only): a negative one too.
  EXPECT_NO_THROW(parse_and_validate(
      with(base_argv(), {"--quick-geglu", "--activation-func-clamp-value", "-1"})));
}

// GELU's form as Megatron's MLP takes it: the bias_gelu fusion's tanh form with biases, torch's
// exact F.gelu without the fusion (--no-bias-gelu-fusion, or --disable-bias-linear, which
// switches the fusion off), --openai-gelu's tanh form either way; the other activations ignore
// both flags.
TEST(ValidateActivation, GeluFormFollowsTheBiasGeluFusion) {
  auto kind = [](std::initializer_list<std::string> more) {
    Args a = parse_and_validate(with(base_argv(), more));
    EXPECT_EQ(gelu_is_exact(a), model_config(a, Device::CPU, DType::F32).gelu_erf);
    return model_config(a, Device::CPU, DType::F32).activation().kind;
  };
  EXPECT_EQ(kind({}), MlpActivation::Gelu);
  EXPECT_EQ(kind({"--no-bias-gelu-fusion"}), MlpActivation::GeluErf);
  EXPECT_EQ(kind({"--disable-bias-linear"}), MlpActivation::GeluErf);
  EXPECT_EQ(kind({"--disable-bias-linear", "--openai-gelu"}), MlpActivation::Gelu);
  EXPECT_EQ(kind({"--no-bias-gelu-fusion", "--openai-gelu"}), MlpActivation::Gelu);
  EXPECT_EQ(kind({"--openai-gelu"}), MlpActivation::Gelu);
  EXPECT_EQ(kind({"--swiglu", "--no-bias-gelu-fusion"}), MlpActivation::Swiglu);
  EXPECT_EQ(kind({"--squared-relu", "--disable-bias-linear"}), MlpActivation::SquaredRelu);
  EXPECT_EQ(kind({"--quick-geglu", "--disable-bias-linear"}), MlpActivation::QuickGeglu);
}

TEST(ValidateActivation, OneActivation) {
  expect_error([] { parse_and_validate(with(base_argv(), {"--quick-geglu", "--swiglu"})); },
               {"--quick-geglu and --swiglu"});
  expect_error(
      [] { parse_and_validate(with(base_argv(), {"--quick-geglu", "--squared-relu"})); },
      {"--quick-geglu and --squared-relu"});
}

TEST(ValidateActivation, OffsetUnderTheBiasActivationFusion) {
  // SwiGLU: Megatron's bias_swiglu fusion refuses an offset; without it the GLU takes it.
  expect_error(
      [] { parse_and_validate(with(base_argv(), {"--swiglu", "--glu-linear-offset", "1"})); },
      {"--glu-linear-offset 1", "--no-bias-swiglu-fusion", "quick_gelu"});
  Args a = parse_and_validate(
      with(base_argv(), {"--swiglu", "--glu-linear-offset", "1", "--no-bias-swiglu-fusion"}));
  EXPECT_EQ(model_config(a, Device::CPU, DType::F32).activation().glu.offset, 1.0);
  // GELU with biases: the bias_gelu fusion refuses it; without the fusion (or without biases)
  // GELU is not gated and the offset would change nothing.
  expect_error([] { parse_and_validate(with(base_argv(), {"--glu-linear-offset", "1"})); },
               {"--glu-linear-offset 1", "--no-bias-gelu-fusion"});
  expect_error(
      [] {
        parse_and_validate(
            with(base_argv(), {"--glu-linear-offset", "1", "--disable-bias-linear"}));
      },
      {"--glu-linear-offset acts on a gated MLP only"});
  expect_error(
      [] {
        parse_and_validate(with(base_argv(), {"--squared-relu", "--glu-linear-offset", "1",
                                              "--no-bias-gelu-fusion"}));
      },
      {"--glu-linear-offset acts on a gated MLP only", "--squared-relu"});
  // (A non-finite value is the flag parser's error already.)
  expect_error(
      [] {
        parse_and_validate(with(base_argv(), {"--quick-geglu", "--glu-linear-offset", "inf"}));
      },
      {"--glu-linear-offset expects a finite number"});
}

TEST(ValidateActivation, Clamp) {
  auto clamp = [](const char* v, std::initializer_list<std::string> more) {
    return with(with(moe(), more), {"--activation-func-clamp-value", v});
  };
  // SwiGLU: MoE only, finite and positive, no offset.
  EXPECT_NO_THROW(parse_and_validate(clamp("7", {"--swiglu"})));
  expect_error(
      [] {
        parse_and_validate(
            with(base_argv(), {"--swiglu", "--activation-func-clamp-value", "7"}));
      },
      {"only supported with MoE"});
  for (const char* bad : {"0", "-2"})
    expect_error([&] { parse_and_validate(clamp(bad, {"--swiglu"})); },
                 {"for SwiGLU must be finite and greater than zero"});
  expect_error(
      [&] {
        parse_and_validate(clamp("7", {"--swiglu", "--glu-linear-offset", "1",
                                       "--no-bias-swiglu-fusion"}));
      },
      {"--glu-linear-offset 1 must be zero when --activation-func-clamp-value is set"});
  // No gated unit: nothing to clamp. NaN or inf: no bound (the flag parser's error).
  expect_error([&] { parse_and_validate(clamp("7", {})); },
               {"--activation-func-clamp-value acts on a gated MLP only"});
  for (const char* bad : {"nan", "inf"})
    expect_error([&] { parse_and_validate(clamp(bad, {"--quick-geglu"})); },
                 {"--activation-func-clamp-value expects a finite number"});
  // The model config's own check (checkpoint imports, tests build configs directly).
  model::TransformerConfig c;
  c.quick_geglu = true, c.activation_func_clamp_value = std::nan("");
  expect_error([&] { c.check_activation(); }, {"--activation-func-clamp-value is NaN"});
  c.activation_func_clamp_value = std::numeric_limits<double>::infinity(), c.swiglu = true;
  c.quick_geglu = false, c.moe.num_experts = 4;
  expect_error([&] { c.check_activation(); }, {"for SwiGLU must be finite"});
}

// As Megatron with Transformer Engine: the GEMMs in FP8, the activation between them in the
// model precision (docs/fp8.md).
TEST(ValidateActivation, Fp8TakesThem) {
  for (auto more : {std::vector<std::string>{"--quick-geglu"},
                    std::vector<std::string>{"--quick-geglu", "--glu-linear-offset", "1.0",
                                             "--activation-func-clamp-value", "7"},
                    std::vector<std::string>{"--squared-relu"},
                    std::vector<std::string>{"--swiglu", "--num-experts", "4",
                                             "--activation-func-clamp-value", "7"}}) {
    auto v = with(base_argv(), {"--fp8-format", "hybrid", "--bf16"});
    v.insert(v.end(), more.begin(), more.end());
    Args a;
    ASSERT_NO_THROW(a = parse_and_validate(v)) << more[0];
    const model::TransformerConfig c = model_config(a, Device::CPU, DType::BF16);
    EXPECT_TRUE(c.fp8.enabled()) << more[0];
    EXPECT_FALSE(c.activation().plain_swiglu() || c.activation().kind == MlpActivation::Gelu);
  }
}

TEST(ValidateActivation, MoeBiases) {
  // Megatron's default --add-bias-linear with experts: accepted (was refused).
  Args a = parse_and_validate(moe({"--quick-geglu"}));
  EXPECT_TRUE(model_config(a, Device::CPU, DType::F32).add_bias_linear);
  // ETP must be 1: at TP 2 it defaults to 2.
  const auto tp2 = moe({"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  expect_error([&] { parse_and_validate(tp2, 2); },
               {"--expert-tensor-parallel-size 2", "ETP 1 only"});
  EXPECT_NO_THROW(parse_and_validate(with(tp2, {"--expert-tensor-parallel-size", "1"}), 2));
  expect_error(
      [] { parse_and_validate(moe({"--moe-shared-expert-intermediate-size", "32"})); },
      {"SharedExpertMLP"});
  expect_error([] { parse_and_validate(moe({"--moe-grouped-gemm"})); },
               {"--moe-grouped-gemm with linear biases", "--no-bias-dropout-fusion"});
  EXPECT_NO_THROW(parse_and_validate(moe({"--moe-grouped-gemm", "--no-bias-dropout-fusion"})));
  expect_error([] { parse_and_validate(moe({"--init-method-xavier-uniform"})); },
               {"--init-method-xavier-uniform with MoE linear biases"});
  // Without biases none of these apply.
  EXPECT_NO_THROW(parse_and_validate(
      moe({"--disable-bias-linear", "--moe-shared-expert-intermediate-size", "32"})));
}

}  // namespace validate_activation_test
