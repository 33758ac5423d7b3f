// fp32 main parameters held as (bf16 model parameter, lower 16 bits) on the GPU
// (ops/split_main.h): the split and join kernels give the CPU op's bits; adamw_step_split
// leaves bit for bit the main parameters and moments the GPU's adamw_step leaves on whole
// fp32 values, on the vector path and the scalar one (unaligned views, tails), with f32 and
// bf16 gradients; AdamW on a CUDA bf16 model with split and whole main parameters agrees;
// bf16 Adam moments (--use-precision-aware-optimizer) give the CPU op's bits.
#include <cstdlib>
#include <string>
#include <utility>

#include "gpu_test_util.h"
#include "model/params.h"
#include "ops/split_main.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace split_main_gpu_test {

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

// A host tensor as a host tensor of dtype dt (rounded to nearest even, or widened).
Tensor in_dtype(const Tensor& f, DType dt) {
  if (f.dtype() == dt) return f;
  Tensor t = Tensor::empty(f.shape(), dt);
  cpu::copy(f, t, CS());
  return t;
}


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

// bf16 moments (m, v or both) on whole fp32 main parameters with the bf16 model output and
// on split ones, vector and scalar paths: after every step the parameters (and the model
// output) are bit for bit those of the GPU's f32-moment step from the same moments, and
// each bf16 moment is that step's f32 moment rounded to nearest even (as on the CPU,
// Bf16Moments.*; the CPU's and the GPU's AdamW arithmetic differ in their last bits).
TEST(GpuBf16Moments, StepIsTheF32StepWithItsMomentsRounded) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(1) << 16, int64_t(100003), int64_t(5)})
    for (int64_t off : {int64_t(0), int64_t(1)})
      for (bool split : {false, true})
        for (auto [m16, v16] :
             {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
          const std::string what = fmt::format("n {}, offset {}, split {}, bf16 m {} v {}", n,
                                               off, split, m16, v16);
          const Tensor x = many_binades(n, 31);
          // bf16-valued f32 moments for the reference; the same values as bf16 where asked.
          auto bf16_valued = [](const Tensor& t) {
            return in_dtype(in_dtype(t, DType::BF16), DType::F32);
          };
          const Tensor hm = bf16_valued(rand_f32({n}, 32, -0.1f, 0.1f));
          const Tensor hv = bf16_valued(rand_f32({n}, 33, 0.f, 0.01f));
          Tensor rm = gpu_at(hm, off), rv = gpu_at(hv, off);
          Tensor gm = gpu_at(m16 ? in_dtype(hm, DType::BF16) : hm, off);
          Tensor gv = gpu_at(v16 ? in_dtype(hv, DType::BF16) : hv, off);
          Tensor rp = gpu_at(x, off), gp = gpu_at(x, off), none;
          Tensor ro = gpu_nan({n}, DType::BF16), go = gpu_nan({n}, DType::BF16), rl, gl;
          if (split) {
            Tensor co = Tensor::empty({n}, DType::BF16), cl = Tensor::empty({n}, DType::U16);
            cpu::split_main_params(x, co, cl, CS());
            ro = gpu_at(co, off), go = gpu_at(co, off), rl = gpu_at(cl, off), gl = gpu_at(cl, off);
          }
          ops::AdamWParams ap;
          ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1;
          ap.grad_scale = 0.5;
          for (int step = 1; step <= 3; ++step) {
            ap.step = step;
            Tensor gg = gpu_at(rand_f32({n}, 250 + step), off);
            if (split) {
              gpu::adamw_step_split(ro, rl, gg, rm, rv, ap, GS());
              gpu::adamw_step_split(go, gl, gg, gm, gv, ap, GS());
            } else {
              gpu::adamw_step(rp, gg, rm, rv, ro, ap, GS());
              gpu::adamw_step(gp, gg, gm, gv, go, ap, GS());
            }
            const Tensor want_m = in_dtype(host_copy_bits(rm), m16 ? DType::BF16 : DType::F32);
            const Tensor want_v = in_dtype(host_copy_bits(rv), v16 ? DType::BF16 : DType::F32);
            ASSERT_TRUE(equal_bits(gm, want_m)) << what << ", step " << step;
            ASSERT_TRUE(equal_bits(gv, want_v)) << what << ", step " << step;
            ASSERT_TRUE(equal_bits(go, ro)) << what << ", step " << step;
            if (split)
              ASSERT_TRUE(equal_bits(gl, rl)) << what << ", step " << step;
            else
              ASSERT_TRUE(equal_bits(gp, rp)) << what << ", step " << step;
            // The reference continues from the moments the bf16 run kept.
            if (m16) gpu::copy(gm, rm, GS());
            if (v16) gpu::copy(gv, rv, GS());
          }
        }
}

// The optimizer on a CUDA bf16 model with bf16 moments: 4 bytes an element less state, and
// each step the f32-moment optimizer's step with its moments rounded.
TEST(GpuBf16Moments, OptimizerOnACudaModelIsTheF32MomentOneRounded) {
  MCPP_REQUIRE_GPU();
  model::ParamStore a = optimizer_test_params(DType::BF16, Device::CUDA);
  model::ParamStore b = optimizer_test_params(DType::BF16, Device::CUDA);
  optim::OptimizerConfig c;
  c.exp_avg_dtype = c.exp_avg_sq_dtype = DType::BF16;
  optim::AdamW half(a, c), full(b, {});
  EXPECT_EQ(full.state_bytes() - half.state_bytes(), 4 * a.total_numel());
  for (int step = 1; step <= 4; ++step) {
    const Tensor g = rand_f32({a.total_numel()}, 80 + step);
    gpu::copy(g, a.flat_grads(), GS());
    gpu::copy(g, b.flat_grads(), GS());
    half.clip(1.0, 2.5), full.clip(1.0, 2.5);
    half.step(1e-2, 0.1), full.step(1e-2, 0.1);
    ASSERT_TRUE(equal_bits(half.exp_avg(), in_dtype(host_copy_bits(full.exp_avg()), DType::BF16)));
    ASSERT_TRUE(
        equal_bits(half.exp_avg_sq(), in_dtype(host_copy_bits(full.exp_avg_sq()), DType::BF16)));
    ASSERT_TRUE(equal_bits(half.full_main_params(), full.full_main_params())) << step;
    ASSERT_TRUE(equal_bits(a.flat_params(), b.flat_params())) << step;
    gpu::copy(half.exp_avg(), full.exp_avg(), GS());
    gpu::copy(half.exp_avg_sq(), full.exp_avg_sq(), GS());
  }
}

}  // namespace split_main_gpu_test
