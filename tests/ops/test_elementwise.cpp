// fill, copy (dtype conversions on known bit patterns), add/axpy/scale, sum_squares,
// has_nonfinite, and AdamW against a scalar reference (and its bf16/f16 model-parameter
// output against a step followed by copy).
#include <cstring>
#include <limits>

#include "op_test_util.h"

namespace elementwise_test {

using namespace mcpp;
using namespace mcpp::test;

TEST(Copy, F32ToBf16AndF16KnownBits) {
  const std::vector<float> v = {1.0f,
                                -2.0f,
                                bits_float(0x3f808000u),
                                bits_float(0x3f818000u),
                                65504.0f,
                                std::ldexp(1.0f, -24),
                                std::numeric_limits<float>::infinity()};
  Tensor src = Tensor::from(v, {7});
  Tensor bf = Tensor::empty({7}, DType::BF16), hf = Tensor::empty({7}, DType::F16);
  cpu::copy(src, bf, S());
  cpu::copy(src, hf, S());
  const auto* b = static_cast<const uint16_t*>(bf.raw());
  const auto* h = static_cast<const uint16_t*>(hf.raw());
  const uint16_t want_bf[] = {0x3f80, 0xc000, 0x3f80, 0x3f82, 0x4780, 0x3380, 0x7f80};
  const uint16_t want_hf[] = {0x3c00, 0xc000, 0x3c04, 0x3c0c, 0x7bff, 0x0001, 0x7c00};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(b[i], want_bf[i]) << i;
    EXPECT_EQ(h[i], want_hf[i]) << i;
  }
  // Back to f32 and f64: exact.
  Tensor back = Tensor::empty({7}, DType::F32), back64 = Tensor::empty({7}, DType::F64);
  cpu::copy(bf, back, S());
  EXPECT_EQ(back.data<float>()[3], bits_float(0x3f820000u));
  cpu::copy(hf, back64, S());
  EXPECT_EQ(back64.data<double>()[4], 65504.0);
  EXPECT_EQ(back64.data<double>()[5], std::ldexp(1.0, -24));
  EXPECT_TRUE(std::isinf(back64.data<double>()[6]));
}

TEST(Copy, IntegerAndFloatConversions) {
  Tensor i64 = Tensor::from(std::vector<int64_t>{-3, 0, 7, int64_t(1) << 40}, {4});
  Tensor f = Tensor::empty({2, 2}, DType::F64), i32 = Tensor::empty({4}, DType::I32);
  cpu::copy(i64, f, S());  // same numel, different shape is fine
  EXPECT_EQ(f.data<double>()[3], std::ldexp(1.0, 40));
  Tensor small = Tensor::from(std::vector<double>{-3.7, 0.2, 7.9, 100}, {4});
  cpu::copy(small, i32, S());
  EXPECT_EQ(i32.data<int32_t>()[0], -3);  // truncation, as a C++ cast
  EXPECT_EQ(i32.data<int32_t>()[2], 7);
  Tensor bad = Tensor::empty({5}, DType::F32);
  EXPECT_THROW(cpu::copy(i64, bad, S()), Error);
  Tensor fp8 = Tensor::empty({4}, DType::FP8E4M3);
  EXPECT_THROW(cpu::copy(small, fp8, S()), Error);
  Tensor cuda_view = Tensor::wrap(f.raw(), {4}, DType::F64, Device::CUDA);
  EXPECT_THROW(cpu::copy(small, cuda_view, S()), Error);
}

TEST(Elementwise, FillAddAxpyScale) {
  Tensor a = randn({3, 50}, 1), b = randn({3, 50}, 2);
  Tensor out = Tensor::empty({3, 50}, DType::F64);
  cpu::add(a, b, out, S());
  EXPECT_EQ(out.data<double>()[17], a.data<double>()[17] + b.data<double>()[17]);
  Tensor a2 = a.clone();
  cpu::add(a2, b, a2, S());  // aliasing output
  EXPECT_EQ(max_abs_diff(a2, out), 0.0);
  cpu::axpy(-1.0, b, a2, S());
  EXPECT_LT(max_abs_diff(a2, a), 1e-15);
  cpu::scale(a2, 3.0, S());
  EXPECT_NEAR(a2.data<double>()[5], 3 * a.data<double>()[5], 1e-15);
  Tensor i = Tensor::empty({5}, DType::I64), h = Tensor::empty({5}, DType::BF16);
  cpu::fill(i, 42, S());
  cpu::fill(h, 1.0, S());
  EXPECT_EQ(i.data<int64_t>()[4], 42);
  EXPECT_EQ(static_cast<const uint16_t*>(h.raw())[2], 0x3f80);
  Tensor c = Tensor::empty({3, 49}, DType::F64);
  EXPECT_THROW(cpu::add(a, b, c, S()), Error);
  EXPECT_THROW(cpu::axpy(1.0, a, c, S()), Error);
  Tensor a32 = as(a, DType::F32);
  EXPECT_THROW(cpu::add(a, a32, out, S()), Error);
}

TEST(Elementwise, SumSquaresAndNonfinite) {
  Tensor x = randn({100000}, 3, 1.0, DType::F32);
  double want = 0;
  for (int64_t i = 0; i < x.numel(); ++i) want += double(x.data<float>()[i]) * x.data<float>()[i];
  EXPECT_NEAR(cpu::sum_squares(x, S()), want, 1e-9 * want);
  EXPECT_FALSE(cpu::has_nonfinite(x, S()));
  x.data<float>()[77777] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(cpu::has_nonfinite(x, S()));
  x.data<float>()[77777] = std::nanf("");
  EXPECT_TRUE(cpu::has_nonfinite(x, S()));
  Tensor d = randn({10}, 4);
  EXPECT_FALSE(cpu::has_nonfinite(d, S()));
  d.data<double>()[9] = -std::numeric_limits<double>::infinity();
  EXPECT_TRUE(cpu::has_nonfinite(d, S()));
}

// torch.optim.AdamW written out for one scalar, in f64.
TEST(AdamW, MatchesScalarReferenceOverSteps) {
  const int64_t n = 37;
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor p = randn({n}, 1, 1.0, dt), m = Tensor::zeros({n}, dt), v = Tensor::zeros({n}, dt);
    Tensor p0 = f64(p).clone();
    std::vector<double> rp(p0.data<double>(), p0.data<double>() + n), rm(n, 0), rv(n, 0);
    ops::AdamWParams hp;
    hp.lr = 1e-2, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.weight_decay = 0.1;
    for (int step = 1; step <= 5; ++step) {
      Tensor g = randn({n}, 100 + step, 1.0, dt);
      Tensor g64 = f64(g);
      hp.step = step;
      Tensor none;
      cpu::adamw_step(p, g, m, v, none, hp, S());
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g64.data<double>()[i];
        rp[i] *= 1 - hp.lr * hp.weight_decay;
        rm[i] = hp.beta1 * rm[i] + (1 - hp.beta1) * gi;
        rv[i] = hp.beta2 * rv[i] + (1 - hp.beta2) * gi * gi;
        const double mhat = rm[i] / (1 - std::pow(hp.beta1, step));
        const double vhat = rv[i] / (1 - std::pow(hp.beta2, step));
        rp[i] -= hp.lr * mhat / (std::sqrt(vhat) + hp.eps);
      }
    }
    Tensor want = Tensor::from(rp, {n}), wm = Tensor::from(rm, {n}), wv = Tensor::from(rv, {n});
    const double tol = dt == DType::F64 ? 1e-13 : 2e-6;
    EXPECT_LT(max_abs_diff(p, want), tol) << dtype_name(dt);
    EXPECT_LT(rel_err(m, wm), tol) << dtype_name(dt);
    EXPECT_LT(rel_err(v, wv), tol) << dtype_name(dt);
  }
  Tensor p = randn({4}, 1), g = randn({5}, 2), m = Tensor::zeros({4}, DType::F64), none;
  ops::AdamWParams hp;
  EXPECT_THROW(cpu::adamw_step(p, g, m, m, none, hp, S()), Error);
  hp.step = 0;
  Tensor g4 = randn({4}, 2);
  EXPECT_THROW(cpu::adamw_step(p, g4, m, m, none, hp, S()), Error);
}

static bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// grad_scale (gradient clipping folded into the step): bit for bit scale(grad) then the step.
TEST(AdamW, GradScaleEqualsScalingTheGradientsFirst) {
  const int64_t n = 101;
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor p = randn({n}, 3, 1.0, dt), m = Tensor::zeros({n}, dt), v = Tensor::zeros({n}, dt);
    Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone(), none;
    ops::AdamWParams hp;
    hp.lr = 1e-2, hp.weight_decay = 0.1;
    for (int step = 1; step <= 3; ++step) {
      hp.step = step;
      Tensor g = randn({n}, 200 + step, 1.0, dt), g2 = g.clone();
      hp.grad_scale = 0.3711 * step;
      cpu::adamw_step(p, g, m, v, none, hp, S());
      EXPECT_TRUE(same_bits(g, g2)) << "the gradient is read, not written";
      cpu::scale(g2, hp.grad_scale, S());
      ops::AdamWParams unscaled = hp;
      unscaled.grad_scale = 1.0;
      cpu::adamw_step(p2, g2, m2, v2, none, unscaled, S());
    }
    EXPECT_TRUE(same_bits(p, p2)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(m, m2)) << dtype_name(dt);
    EXPECT_TRUE(same_bits(v, v2)) << dtype_name(dt);
  }
}

// The mixed-precision step in one pass: adamw_step with a bf16/f16 model_param must leave
// p, m, v and the model params bit for bit as adamw_step followed by copy(p, model) does.
// The CPU backend takes grads in param's dtype (f32 here); the CUDA test covers bf16/f16
// grads. Sizes: below and above the OpenMP grain. Parameters span many binades (f16
// subnormals and values past the f16 range included) so that the rounding is exercised.
TEST(AdamW, ModelParamOutputEqualsStepThenCopy) {
  for (int64_t n : {int64_t(1003), int64_t(3 * (1 << 14) + 5)}) {  // the grain is 2^14
    Tensor p = randn({n}, 7, 1.0, DType::F32), m = randn({n}, 8, 0.1, DType::F32);
    Tensor v = randn({n}, 9, 0.01, DType::F32);
    float* P = p.data<float>();
    float* V = v.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      P[i] = std::ldexp(P[i], int(i % 41) - 26);  // 2^-26 .. 2^14 times N(0, 1)
      V[i] = V[i] * V[i];                         // second moments are >= 0
    }
    for (DType out_dt : {DType::BF16, DType::F16}) {
      Tensor p1 = p.clone(), m1 = m.clone(), v1 = v.clone(), none;
      Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
      Tensor want = Tensor::empty({n}, out_dt), got = Tensor::empty({n}, out_dt);
      ops::AdamWParams hp;
      hp.lr = 3e-3, hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.weight_decay = 0.1;
      for (int step = 1; step <= 3; ++step) {
        hp.step = step;
        Tensor g = randn({n}, 20 + step, 1.0, DType::F32);
        std::memset(got.raw(), 0xff, got.nbytes());  // NaN: an element left unwritten fails
        cpu::adamw_step(p1, g, m1, v1, none, hp, S());
        cpu::copy(p1, want, S());
        cpu::adamw_step(p2, g, m2, v2, got, hp, S());
        const std::string what = fmt::format("n {}, {}, step {}", n, dtype_name(out_dt), step);
        EXPECT_TRUE(same_bits(got, want)) << what;
        EXPECT_TRUE(same_bits(p2, p1)) << what;
        EXPECT_TRUE(same_bits(m2, m1)) << what;
        EXPECT_TRUE(same_bits(v2, v1)) << what;
      }
    }
  }
  // Argument checks: the output must be bf16/f16 of param's numel, param f32.
  ops::AdamWParams hp;
  Tensor p = randn({8}, 1, 1.0, DType::F32), g = randn({8}, 2, 1.0, DType::F32);
  Tensor m = Tensor::zeros({8}, DType::F32), v = Tensor::zeros({8}, DType::F32);
  Tensor f32_out = Tensor::empty({8}, DType::F32), short_out = Tensor::empty({7}, DType::BF16);
  EXPECT_THROW(cpu::adamw_step(p, g, m, v, f32_out, hp, S()), Error);
  EXPECT_THROW(cpu::adamw_step(p, g, m, v, short_out, hp, S()), Error);
  Tensor pd = randn({8}, 1), gd = randn({8}, 2), md = Tensor::zeros({8}, DType::F64);
  Tensor vd = Tensor::zeros({8}, DType::F64), bf_out = Tensor::empty({8}, DType::BF16);
  EXPECT_THROW(cpu::adamw_step(pd, gd, md, vd, bf_out, hp, S()), Error);
}

TEST(Dot, F32AndF64AccumulateInF64) {
  Tensor x = Tensor::from(std::vector<float>{1.5f, -2.f, 1e-8f, 3.f}, {2, 2});
  Tensor y = Tensor::from(std::vector<float>{2.f, 0.5f, 1.f, 0.f}, {4});
  EXPECT_DOUBLE_EQ(cpu::dot(x, y, S()), 3.0 - 1.0 + double(1e-8f));
  Tensor xd = Tensor::from(std::vector<double>{1, 2, 3}, {3});
  EXPECT_DOUBLE_EQ(cpu::dot(xd, xd, S()), 14.0);
  EXPECT_THROW(cpu::dot(x, xd, S()), Error);
}

TEST(Transpose, IdsAndFloats) {
  Tensor ids = Tensor::from(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, {2, 3});  // [B=2, S=3]
  Tensor out = Tensor::empty({3, 2}, DType::I64);
  cpu::transpose(ids, out, S());
  const std::vector<int64_t> want = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.data<int64_t>()[i], want[i]) << i;
  Tensor f = Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor ft = Tensor::empty({2, 3}, DType::F32);
  cpu::transpose(f, ft, S());
  const std::vector<float> wf = {1, 3, 5, 2, 4, 6};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ft.data<float>()[i], wf[i]) << i;
  Tensor bad = Tensor::empty({2, 3}, DType::I64);
  EXPECT_THROW(cpu::transpose(ids, bad, S()), Error);
}

}  // namespace elementwise_test
