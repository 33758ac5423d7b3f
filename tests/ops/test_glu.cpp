// The gated units with Megatron's offset and clamp (glu_forward / glu_backward: quick-GEGLU,
// SwiGLU) and the MoE ops that take them (moe_act_scale_*) or the experts' fc2 bias
// (moe_bias_scale_*), on the CPU: forward values against an fp64 reference written here from
// Megatron's formulas, f64 gradients against central differences (inputs kept away from the
// clamp's bounds), torch.clamp's gradient at the bounds themselves, f32 against f64, and
// plain SwiGLU through glu_* bit for bit swiglu_*'s.
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "op_test_util.h"

namespace glu_test {

using namespace mcpp;
using namespace mcpp::test;
using ops::GluParams;
using ops::MlpAct;
using ops::MlpActivation;

// Megatron's glu() in fp64: x_glu.clamp(max=C), x_linear.clamp(-C, C), then
// act(x_glu) * (x_linear + offset); act = F.silu or quick_gelu (x * sigmoid(1.702 x)).
double reference(MlpAct a, double gate, double up) {
  const double C = a.glu.clamp, k = a.kind == MlpActivation::QuickGeglu ? 1.702 : 1.0;
  const double g = std::min(gate, C), u = std::min(std::max(up, -C), C);
  return g / (1 + std::exp(-k * g)) * (u + a.glu.offset);
}

MlpAct quick(double offset, double clamp) {
  GluParams p;
  p.offset = offset, p.clamp = clamp;
  return {MlpActivation::QuickGeglu, p};
}
MlpAct swiglu(double clamp) {
  GluParams p;
  p.clamp = clamp;
  return {MlpActivation::Swiglu, p};
}
const double kNone = std::numeric_limits<double>::infinity();

// The cases: quick-GEGLU plain, with gpt-oss's offset 1, with a clamp that cuts (inputs of
// scale 2), both; SwiGLU with a clamp (MoE) and with an offset (--no-bias-swiglu-fusion).
std::vector<MlpAct> cases() {
  GluParams off;
  off.offset = 0.5;
  return {quick(0, kNone), quick(1.0, kNone), quick(0, 0.9), quick(1.0, 0.9), swiglu(0.9),
          MlpAct(MlpActivation::Swiglu, off)};
}

std::string name(MlpAct a) {
  return fmt::format("{} offset {} clamp {}",
                     a.kind == MlpActivation::QuickGeglu ? "qgeglu" : "swiglu", a.glu.offset,
                     a.glu.clamp);
}

// Moves every element at least 0.05 away from the bounds +-C (central differences at
// h = 1e-6 then stay on one side of them).
void away_from_bounds(Tensor& x, double C) {
  if (!std::isfinite(C)) return;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& v = x.data<double>()[i];
    for (double b : {C, -C})
      if (std::abs(v - b) < 0.05) v = v < b ? b - 0.05 - (b - v) : b + 0.05 + (v - b);
  }
}

TEST(Glu, ForwardIsMegatronsFormula) {
  const int64_t T = 7, F = 9;
  for (MlpAct a : cases()) {
    SCOPED_TRACE(name(a));
    Tensor x = randn({T, 2 * F}, 1, 2.0);
    Tensor y = Tensor::empty({T, F}, DType::F64);
    cpu::glu_forward(x, a, y, S());
    int cut = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        const double g = x.data<double>()[t * 2 * F + f], u = x.data<double>()[t * 2 * F + F + f];
        EXPECT_NEAR(y.data<double>()[t * F + f], reference(a, g, u), 1e-14);
        cut += g > a.glu.clamp || std::abs(u) > a.glu.clamp;
      }
    if (a.glu.clamped()) EXPECT_GT(cut, 10);  // the clamp is exercised
    // f32 (the fast exp) within 1e-5 of f64.
    Tensor x32 = as(x, DType::F32), y32 = Tensor::empty({T, F}, DType::F32);
    cpu::glu_forward(x32, a, y32, S());
    EXPECT_LT(max_abs_diff(y32, y), 1e-5 * max_abs(y));
  }
  // Not the same function as SwiGLU (quick_gelu's slope), and the offset adds act(g) * offset.
  Tensor x = randn({3, 8}, 2), y0 = Tensor::empty({3, 4}, DType::F64), y1 = y0.clone();
  cpu::glu_forward(x, quick(0, kNone), y0, S());
  cpu::swiglu_forward(x, y1, S());
  EXPECT_GT(max_abs_diff(y0, y1), 1e-2);
  Tensor bad = Tensor::empty({3, 3}, DType::F64);
  EXPECT_THROW(cpu::glu_forward(x, quick(0, kNone), bad, S()), Error);
  EXPECT_THROW(cpu::glu_forward(x, MlpAct(MlpActivation::Gelu), y0, S()), Error);
}

TEST(Glu, BackwardIsTheForwardsDerivative) {
  const int64_t T = 4, F = 6;
  for (MlpAct a : cases()) {
    SCOPED_TRACE(name(a));
    Tensor x = randn({T, 2 * F}, 3, 2.0), r = randn({T, F}, 4);
    away_from_bounds(x, a.glu.clamp);
    Tensor y = Tensor::empty({T, F}, DType::F64), dx = Tensor::empty({T, 2 * F}, DType::F64);
    auto L = [&] {
      cpu::glu_forward(x, a, y, S());
      return dot(r, y);
    };
    cpu::glu_backward(r, x, a, dx, S());
    EXPECT_LT(rel_err(dx, numeric_grad(x, L)), kGradTol);
    // Outside the clamp the gradient is exactly 0 (gate above C, up outside [-C, C]).
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        const double g = x.data<double>()[t * 2 * F + f], u = x.data<double>()[t * 2 * F + F + f];
        if (g > a.glu.clamp) EXPECT_EQ(dx.data<double>()[t * 2 * F + f], 0.0);
        if (std::abs(u) > a.glu.clamp) EXPECT_EQ(dx.data<double>()[t * 2 * F + F + f], 0.0);
      }
    // f32 within 1e-5 of f64.
    Tensor dx32 = Tensor::empty({T, 2 * F}, DType::F32);
    cpu::glu_backward(as(r, DType::F32), as(x, DType::F32), a, dx32, S());
    EXPECT_LT(max_abs_diff(dx32, dx), 1e-5 * max_abs(dx));
  }
}

// torch.clamp's gradient passes at the bounds themselves (its mask is min <= x <= max):
// gate = C and up = +-C get the derivative of the unclamped function there.
TEST(Glu, ClampGradientPassesAtTheBounds) {
  const double C = 0.75;
  for (MlpAct a : {quick(1.0, C), swiglu(C)}) {
    SCOPED_TRACE(name(a));
    const double k = a.kind == MlpActivation::QuickGeglu ? 1.702 : 1.0;
    // Row 0: gate at C, up at -C; row 1: gate below, up at +C; row 2: beyond both.
    Tensor x = Tensor::from(std::vector<double>{C, -C, 0.3, C, 2 * C, -3 * C}, {3, 2});
    Tensor dy = Tensor::from(std::vector<double>{1.0, 1.0, 1.0}, {3, 1});
    Tensor dx = Tensor::empty({3, 2}, DType::F64);
    cpu::glu_backward(dy, x, a, dx, S());
    auto act = [&](double g) { return g / (1 + std::exp(-k * g)); };
    auto dact = [&](double g) {
      const double s = 1 / (1 + std::exp(-k * g));
      return s * (1 + k * g * (1 - s));
    };
    const double o = a.glu.offset;
    EXPECT_NEAR(dx.data<double>()[0], dact(C) * (-C + o), 1e-15);
    EXPECT_NEAR(dx.data<double>()[1], act(C), 1e-15);
    EXPECT_NEAR(dx.data<double>()[2], dact(0.3) * (C + o), 1e-15);
    EXPECT_NEAR(dx.data<double>()[3], act(0.3), 1e-15);
    EXPECT_EQ(dx.data<double>()[4], 0.0);
    EXPECT_EQ(dx.data<double>()[5], 0.0);
  }
}

// SwiGLU without offset or clamp through glu_* gives swiglu_*'s bits (the MoE experts take
// glu's rules for every gated unit), in f32 and f64.
TEST(Glu, PlainSwigluIsSwiglusBits) {
  const int64_t T = 33, F = 70;
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = randn({T, 2 * F}, 5, 3.0, dt), dy = randn({T, F}, 6, 1.0, dt);
    Tensor y = Tensor::empty({T, F}, dt), y2 = Tensor::empty({T, F}, dt);
    Tensor dx = Tensor::empty({T, 2 * F}, dt), dx2 = Tensor::empty({T, 2 * F}, dt);
    cpu::swiglu_forward(x, y, S());
    cpu::glu_forward(x, MlpActivation::Swiglu, y2, S());
    cpu::swiglu_backward(dy, x, dx, S());
    cpu::glu_backward(dy, x, MlpActivation::Swiglu, dx2, S());
    EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0) << dtype_name(dt);
    EXPECT_EQ(std::memcmp(dx.raw(), dx2.raw(), dx.nbytes()), 0) << dtype_name(dt);
  }
}

// The experts' fused op with quick-GEGLU, offset and clamp: the composition of glu_forward and
// moe_scale_rows bit for bit, and its backward against central differences (fc1 and p).
TEST(GluMoe, ActScaleIsTheCompositionAndItsDerivative) {
  const int64_t N = 5, F = 4;
  for (MlpAct a : cases()) {
    SCOPED_TRACE(name(a));
    for (DType dt : {DType::F32, DType::F64}) {
      Tensor fc1 = randn({N, 2 * F}, 7, 2.0, dt), p = randn({N}, 8, 1.0, dt);
      Tensor act = Tensor::empty({N, F}, dt), ref = Tensor::empty({N, F}, dt);
      cpu::glu_forward(fc1, a, act, S());
      cpu::moe_scale_rows(act, p, ref, S());
      Tensor ap = Tensor::empty({N, F}, dt);
      cpu::moe_act_scale_forward(fc1, p, a, ap, S());
      EXPECT_EQ(std::memcmp(ap.raw(), ref.raw(), ap.nbytes()), 0) << dtype_name(dt);
    }
    Tensor fc1 = randn({N, 2 * F}, 9, 2.0), p = randn({N}, 10), dap = randn({N, F}, 11);
    away_from_bounds(fc1, a.glu.clamp);
    auto loss = [&] {
      Tensor ap = Tensor::empty({N, F}, DType::F64);
      cpu::moe_act_scale_forward(fc1, p, a, ap, S());
      return dot(ap, dap);
    };
    Tensor dfc1 = Tensor::empty({N, 2 * F}, DType::F64), dp = Tensor::empty({N}, DType::F64);
    Tensor none;
    cpu::moe_act_scale_backward(dap, fc1, p, a, dfc1, dp, none, S());
    EXPECT_LT(rel_err(dfc1, numeric_grad(fc1, loss)), kGradTol);
    EXPECT_LT(rel_err(dp, numeric_grad(p, loss)), kGradTol);
  }
}

// y += p b and its backward: the values against the formula, both gradients against central
// differences, and += on db and dp.
TEST(GluMoe, BiasScale) {
  const int64_t N = 6, H = 5;
  Tensor b = randn({H}, 12), p = randn({N}, 13), y0 = randn({N, H}, 14), r = randn({N, H}, 15);
  Tensor y = y0.clone();
  cpu::moe_bias_scale_forward(b, p, y, S());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      EXPECT_NEAR(y.data<double>()[n * H + h],
                  y0.data<double>()[n * H + h] + p.data<double>()[n] * b.data<double>()[h], 1e-15);
  auto loss = [&] {
    Tensor t = y0.clone();
    cpu::moe_bias_scale_forward(b, p, t, S());
    return dot(t, r);
  };
  Tensor db0 = randn({H}, 16), dp0 = randn({N}, 17);
  Tensor db = db0.clone(), dp = dp0.clone();
  cpu::moe_bias_scale_backward(r, b, p, db, dp, S());
  Tensor gb = numeric_grad(b, loss), gp = numeric_grad(p, loss);
  EXPECT_LT(rel_err(db, plus(db0, gb)), kGradTol);
  EXPECT_LT(rel_err(dp, plus(dp0, gp)), kGradTol);
  Tensor bad = Tensor::empty({N}, DType::F64);
  EXPECT_THROW(cpu::moe_bias_scale_backward(r, b, p, bad, dp, S()), Error);
}

}  // namespace glu_test
