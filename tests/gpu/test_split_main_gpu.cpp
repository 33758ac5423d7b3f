// fp32 main parameters held as (bf16 model parameter, lower 16 bits) on the GPU
// (ops/split_main.h): the split and join kernels give the CPU op's bits; adamw_step_split
// leaves bit for bit the main parameters and moments the GPU's adamw_step leaves on whole
// fp32 values, on the vector path and the scalar one (unaligned views, tails), with f32 and
// bf16 gradients; AdamW on a CUDA bf16 model with split and whole main parameters agrees.
#include <cstdlib>
#include <string>

#include "gpu_test_util.h"
#include "model/params.h"
#include "ops/split_main.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace {

Tensor host_copy_bits(const Tensor& g) {
  Tensor h = Tensor::empty(g.shape(), g.dtype());
  gpu::copy(g, h, GS());
  return h;
}

// Values over many binades, with a share of exact ties (lower half 0x8000).
Tensor many_binades(int64_t n, uint64_t seed) {
  Tensor x = rand_f32({n}, seed);
  float* X = x.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    X[i] = std::ldexp(X[i], int(i % 31) - 16);
    if (i % 97 == 0) X[i] = bits_float((float_bits(X[i]) & 0xFFFF0000u) | 0x8000u);
  }
  return x;
}

}  // namespace

TEST(GpuSplitMain, SplitAndJoinGiveTheCpuBits) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(1) << 16, int64_t(100003), int64_t(5)}) {
    const Tensor x = many_binades(n, 3);
    Tensor cm = Tensor::empty({n}, DType::BF16), cl = Tensor::empty({n}, DType::U16);
    cpu::split_main_params(x, cm, cl, CS());
    Tensor gx = gpu_at(x, 0), gm = Tensor::empty({n}, DType::BF16, Device::CUDA);
    Tensor gl = Tensor::empty({n}, DType::U16, Device::CUDA);
    gpu::split_main_params(gx, gm, gl, GS());
    EXPECT_TRUE(equal_bits(gm, cm)) << n;
    EXPECT_TRUE(equal_bits(gl, cl)) << n;
    Tensor back = gpu_nan({n}, DType::F32);
    gpu::join_main_params(gm, gl, back, GS());
    EXPECT_TRUE(equal_bits(back, x)) << n;
    gpu::clear_main_lo(gl, GS());
    Tensor zeros = Tensor::empty({n}, DType::U16);
    std::memset(zeros.raw(), 0, zeros.nbytes());
    EXPECT_TRUE(equal_bits(gl, zeros)) << n;
  }
}

TEST(GpuSplitMain, StepIsAdamWStepOnTheJoinedValuesBitwise) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(1) << 16, int64_t(100003), int64_t(5)})
    for (DType gdt : {DType::F32, DType::BF16})
      for (int64_t off : {int64_t(0), int64_t(1)}) {
        const std::string what = fmt::format("n {}, grads {}, offset {}", n, dtype_name(gdt), off);
        const Tensor x = many_binades(n, 21), m = rand_f32({n}, 22, -0.1f, 0.1f),
                     v = rand_f32({n}, 23, 0.f, 0.01f);
        // Whole fp32 main parameters (the reference) and split ones, on the GPU.
        Tensor wp = gpu_at(x, 0), wm = gpu_at(m, 0), wv = gpu_at(v, 0), none;
        Tensor cm = Tensor::empty({n}, DType::BF16), cl = Tensor::empty({n}, DType::U16);
        cpu::split_main_params(x, cm, cl, CS());
        Tensor sp = gpu_at(cm, off), sl = gpu_at(cl, off), sm = gpu_at(m, off),
               sv = gpu_at(v, off);
        ops::AdamWParams ap;
        ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1, ap.grad_scale = 0.5;
        for (int step = 1; step <= 3; ++step) {
          ap.step = step;
          const Tensor g = rand_in({n}, 150 + step, gdt);
          Tensor gw = to_gpu(g, gdt);
          Tensor gs = Tensor::empty({n + off}, gdt, Device::CUDA).narrow(off, n);
          gpu::copy(g, gs, GS());
          gpu::adamw_step(wp, gw, wm, wv, none, ap, GS());
          gpu::adamw_step_split(sp, sl, gs, sm, sv, ap, GS());
        }
        Tensor joined = gpu_nan({n}, DType::F32);
        gpu::join_main_params(sp, sl, joined, GS());
        EXPECT_TRUE(equal_bits(joined, wp)) << what;
        EXPECT_TRUE(equal_bits(sm, wm)) << what;
        EXPECT_TRUE(equal_bits(sv, wv)) << what;
        // The model parameters: the step's fp32 values rounded half away from zero.
        Tensor hp = host_copy_bits(wp), want = Tensor::empty({n}, DType::BF16), nolo;
        cpu::split_main_params(hp, want, nolo, CS());
        EXPECT_TRUE(equal_bits(sp, want)) << what;
      }
}

TEST(GpuSplitMain, AdamWOnACudaModelSplitAndWholeAgree) {
  MCPP_REQUIRE_GPU();
  auto make = [] { return optimizer_test_params(DType::BF16, Device::CUDA); };
  model::ParamStore a = make(), b = make();
  ASSERT_EQ(std::getenv("MCPP_FP32_MAIN_PARAMS"), nullptr);
  optim::AdamW split(a, {});
  setenv("MCPP_FP32_MAIN_PARAMS", "1", 1);
  optim::AdamW whole(b, {});
  unsetenv("MCPP_FP32_MAIN_PARAMS");
  ASSERT_TRUE(split.main_params_split());
  EXPECT_EQ(whole.state_bytes() - split.state_bytes(), 2 * a.total_numel());
  for (int step = 1; step <= 4; ++step) {
    const Tensor g = rand_f32({a.total_numel()}, 60 + step);
    gpu::copy(g, a.flat_grads(), GS());
    gpu::copy(g, b.flat_grads(), GS());
    split.clip(1.0, 2.5), whole.clip(1.0, 2.5);
    split.step(1e-2, 0.1), whole.step(1e-2, 0.1);
  }
  const Tensor sm = split.full_main_params(), wm = whole.full_main_params();
  EXPECT_EQ(sm.device(), Device::CPU);  // joined onto the host a chunk at a time
  EXPECT_TRUE(equal_bits(sm, wm));
  EXPECT_TRUE(equal_bits(split.exp_avg(), whole.exp_avg()));
  EXPECT_DOUBLE_EQ(split.main_sum_squares(0, a.total_numel()),
                   whole.main_sum_squares(0, a.total_numel()));
  // Loading a checkpoint's host values: exact.
  const Tensor values = rand_f32({a.total_numel()}, 7);
  split.set_params(values);
  EXPECT_TRUE(equal_bits(split.full_main_params(), values));
}
