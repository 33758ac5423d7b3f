// SGD with momentum and Lion on the GPU (ops/momentum_step.h): the kernels leave the CPU
// op's bits (every multiply and add rounded on its own on both sides) for each rule, on the
// vector path and the scalar one (unaligned views, tails), with and without the bf16 model
// parameters; the split kernel gives the whole fp32 kernel's main parameters; adaptive
// Muon's normalisation gives the CPU's bits; the
// optimizer on a CUDA bf16 model matches the same optimizer on the CPU's f32 model.
#include <string>
#include <tuple>

#include "gpu_test_util.h"
#include "model/params.h"
#include "ops/momentum_step.h"
#include "ops/split_main.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace momentum_step_gpu_test {

using Rule = ops::MomentumStepParams::Rule;


TEST(GpuMomentumStep, GivesTheCpuBits) {
  MCPP_REQUIRE_GPU();
  // (rule, momentum): SGD with a buffer, plain SGD (no buffer), Lion.
  for (auto [rule, momentum] : {std::tuple(Rule::Sgd, 0.9), std::tuple(Rule::Sgd, 0.0),
                                std::tuple(Rule::Lion, 0.0)})
    for (int64_t n : {int64_t(1) << 16, int64_t(100003), int64_t(5)})
      for (int64_t off : {int64_t(0), int64_t(1)})
        for (bool out : {false, true}) {
          const std::string what =
              fmt::format("rule {} momentum {} n {} offset {} out {}", int(rule), momentum, n,
                          off, out);
          const bool buffer = rule == Rule::Lion || momentum != 0;
          Tensor cp = rand_f32({n}, 1), cm = rand_f32({n}, 2, -0.1f, 0.1f), none;
          Tensor gp = gpu_at(cp, off), gm = gpu_at(cm, off);
          Tensor co = out ? Tensor::empty({n}, DType::BF16) : Tensor();
          Tensor go = out ? Tensor::empty({n + off}, DType::BF16, Device::CUDA).narrow(off, n)
                          : Tensor();
          for (int step = 1; step <= 3; ++step) {
            ops::MomentumStepParams mp;
            mp.rule = rule, mp.lr = 1e-2, mp.weight_decay = 0.1, mp.momentum = momentum;
            mp.first = step == 1, mp.beta1 = 0.9, mp.beta2 = 0.99, mp.grad_scale = 0.6;
            const Tensor g = rand_f32({n}, 10 + step);
            Tensor gg = gpu_at(g, off);
            cpu::momentum_step(cp, g, buffer ? cm : none, co, mp, CS());
            gpu::momentum_step(gp, gg, buffer ? gm : none, go, mp, GS());
          }
          EXPECT_TRUE(equal_bits(gp, cp)) << what;
          if (buffer) EXPECT_TRUE(equal_bits(gm, cm)) << what;
          if (out) EXPECT_TRUE(equal_bits(go, co)) << what;
          // The split form on the GPU: the whole kernel's fp32 values.
          Tensor sm = Tensor::empty({n}, DType::BF16), sl = Tensor::empty({n}, DType::U16);
          const Tensor start = rand_f32({n}, 1);
          cpu::split_main_params(start, sm, sl, CS());
          Tensor gsm = gpu_at(sm, off), gsl = gpu_at(sl, off);
          Tensor gsb = gpu_at(rand_f32({n}, 2, -0.1f, 0.1f), off);
          for (int step = 1; step <= 3; ++step) {
            ops::MomentumStepParams mp;
            mp.rule = rule, mp.lr = 1e-2, mp.weight_decay = 0.1, mp.momentum = momentum;
            mp.first = step == 1, mp.beta1 = 0.9, mp.beta2 = 0.99, mp.grad_scale = 0.6;
            Tensor gg = gpu_at(rand_f32({n}, 10 + step), off);
            gpu::momentum_step_split(gsm, gsl, gg, buffer ? gsb : none, mp, GS());
          }
          Tensor joined = Tensor::empty({n}, DType::F32, Device::CUDA);
          gpu::join_main_params(gsm, gsl, joined, GS());
          EXPECT_TRUE(equal_bits(joined, cp)) << what << " (split)";
          if (buffer) EXPECT_TRUE(equal_bits(gsb, cm)) << what << " (split)";
        }
}

// adamuon_normalize (--optimizer adaptive_muon): the CPU op's bits over three steps, on an
// odd size and an offset view.
TEST(GpuMomentumStep, AdamuonNormalizeGivesTheCpuBits) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(100003), int64_t(5)})
    for (int64_t off : {int64_t(0), int64_t(1)}) {
      Tensor cv = Tensor::zeros({n}, DType::F32);
      Tensor gv = gpu_at(cv, off);
      for (int step = 1; step <= 3; ++step) {
        Tensor cu = rand_f32({n}, 20 + step, -0.5f, 0.5f);
        Tensor gu = gpu_at(cu, off);
        cpu::adamuon_normalize(cu, cv, 0.95, 1e-8, 2.5, CS());
        gpu::adamuon_normalize(gu, gv, 0.95, 1e-8, 2.5, GS());
        EXPECT_TRUE(equal_bits(gu, cu)) << "n " << n << " offset " << off << " step " << step;
      }
      EXPECT_TRUE(equal_bits(gv, cv)) << "n " << n << " offset " << off;
    }
}

// The optimizer on a CUDA bf16 model (split main parameters) and on the CPU's f32 model
// from the same values: the same fp32 values and state after steps with clipping, decay
// on one group only, for both rules.
TEST(GpuMomentumStep, OptimizerOnACudaBf16ModelMatchesTheCpu) {
  MCPP_REQUIRE_GPU();
  auto make = optimizer_test_params;
  for (optim::UpdateRule rule : {optim::UpdateRule::Sgd, optim::UpdateRule::Lion}) {
    SCOPED_TRACE(optim::rule_name(rule));
    model::ParamStore g = make(DType::BF16, Device::CUDA), c = make(DType::F32, Device::CPU);
    optim::OptimizerConfig oc;
    oc.rule = rule;
    optim::AdamW go(g, oc), co(c, oc);
    ASSERT_TRUE(go.main_params_split());
    // The CPU model starts from the GPU model's values (its bf16 weights, lower halves 0).
    Tensor start = go.full_main_params();
    co.load_state(start, nullptr, nullptr);
    for (int step = 1; step <= 4; ++step) {
      const Tensor grad = rand_f32({g.total_numel()}, 60 + step);
      gpu::copy(grad, g.flat_grads(), GS());
      cpu::copy(grad, c.flat_grads(), CS());
      go.clip(1.0, 2.5), co.clip(1.0, 2.5);
      go.step(1e-2, 0.1), co.step(1e-2, 0.1);
    }
    EXPECT_TRUE(equal_bits(go.full_main_params(), c.flat_params()));
    EXPECT_TRUE(equal_bits(go.exp_avg(), co.exp_avg()));
  }
}

}  // namespace momentum_step_gpu_test
