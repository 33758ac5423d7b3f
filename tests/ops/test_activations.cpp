// GELU (tanh form and exact), SwiGLU and squared ReLU: f64 gradients against central differences,
// forward values against the formulas, f32 (fast exp/tanh) against f64, the fused backward
// (swiglu_backward_recompute) against the two ops bit for bit.
#include <cstring>

#include "op_test_util.h"
#include "ops/cpu/cpu_common.h"

namespace activations_test {

using namespace mcpp;
using namespace mcpp::test;

TEST(Gelu, ForwardFormulaAndGradient) {
  Tensor x = randn({4, 6}, 1, 2.0), r = randn({4, 6}, 2);
  Tensor y = Tensor::empty({4, 6}, DType::F64);
  auto L = [&] {
    cpu::gelu_forward(x, y, S());
    return dot(r, y);
  };
  L();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y.data<double>()[i], want, 1e-15);
  }
  Tensor dx = Tensor::empty({4, 6}, DType::F64);
  cpu::gelu_backward(r, x, dx, S());
  EXPECT_LT(rel_err(dx, numeric_grad(x, L)), kGradTol);
}

// The exact GELU x Phi(x): values at points where Phi is tabulated (independent of libm's
// erf), the tanh form's distance from it there, the gradient against central differences,
// f32 against f64, and the activation dispatch (ops::mlp_activation_*) choosing it.
TEST(GeluErf, TabulatedValuesAndGradient) {
  // x and Phi(x) (the standard normal CDF, to 16 digits)
  const double pts[][2] = {{-2.0, 0.022750131948179195},
                           {-1.0, 0.15865525393145707},
                           {0.0, 0.5},
                           {0.5, 0.6914624612740131},
                           {1.0, 0.8413447460685429},
                           {2.0, 0.9772498680518208},
                           {3.0, 0.9986501019683699}};
  const int64_t n = std::size(pts);
  Tensor xt = Tensor::empty({n}, DType::F64), yt = Tensor::empty({n}, DType::F64);
  Tensor yh = Tensor::empty({n}, DType::F64);
  for (int64_t i = 0; i < n; ++i) xt.data<double>()[i] = pts[i][0];
  cpu::gelu_erf_forward(xt, yt, S());
  cpu::gelu_forward(xt, yh, S());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(yt.data<double>()[i], pts[i][0] * pts[i][1], 1e-15) << "x = " << pts[i][0];
    if (pts[i][0] == 1.0)  // the tanh form is 0.841192 there: not the same function
      EXPECT_NEAR(yt.data<double>()[i] - yh.data<double>()[i], 1.5276e-4, 1e-7);
  }

  Tensor x = randn({4, 6}, 1, 2.0), r = randn({4, 6}, 2);
  Tensor y = Tensor::empty({4, 6}, DType::F64);
  auto L = [&] {
    cpu::gelu_erf_forward(x, y, S());
    return dot(r, y);
  };
  L();
  Tensor dx = Tensor::empty({4, 6}, DType::F64);
  cpu::gelu_erf_backward(r, x, dx, S());
  EXPECT_LT(rel_err(dx, numeric_grad(x, L)), kGradTol);

  // f32 against f64 on a tensor large enough for the threaded loop
  Tensor xb = randn({129, 203}, 3, 3.0), dyb = randn({129, 203}, 4);
  Tensor x32 = as(xb, DType::F32), dy32 = as(dyb, DType::F32);
  Tensor g = Tensor::empty(xb.shape(), DType::F64), g32 = Tensor::empty(xb.shape(), DType::F32);
  cpu::gelu_erf_forward(xb, g, S());
  cpu::gelu_erf_forward(x32, g32, S());
  EXPECT_LT(max_abs_diff(g32, g), 1e-6 * max_abs(g));
  cpu::gelu_erf_backward(dyb, xb, g, S());
  cpu::gelu_erf_backward(dy32, x32, g32, S());
  EXPECT_LT(max_abs_diff(g32, g), 1e-6 * max_abs(g));

  // the dispatch: MlpActivation::GeluErf is this op, Gelu the tanh form
  Tensor a = Tensor::empty(xb.shape(), DType::F64), b = Tensor::empty(xb.shape(), DType::F64);
  ops::mlp_activation_forward(ops::MlpActivation::GeluErf, xb, a, Stream::cpu());
  cpu::gelu_erf_forward(xb, b, S());
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  ops::mlp_activation_forward(ops::MlpActivation::Gelu, xb, a, Stream::cpu());
  EXPECT_GT(max_abs_diff(a, b), 1e-4);
  ops::mlp_activation_backward(ops::MlpActivation::GeluErf, dyb, xb, a, Stream::cpu());
  cpu::gelu_erf_backward(dyb, xb, b, S());
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  Tensor bad = Tensor::empty({4, 5}, DType::F64);
  EXPECT_THROW(cpu::gelu_erf_forward(x, bad, S()), Error);
}

TEST(SwiGLU, ForwardFormulaAndGradient) {
  const int64_t T = 3, F = 5;
  Tensor x = randn({T, 2 * F}, 1, 2.0), r = randn({T, F}, 2);
  Tensor y = Tensor::empty({T, F}, DType::F64);
  auto L = [&] {
    cpu::swiglu_forward(x, y, S());
    return dot(r, y);
  };
  L();
  const double g = x.data<double>()[1], u = x.data<double>()[F + 1];
  EXPECT_NEAR(y.data<double>()[1], g / (1 + std::exp(-g)) * u, 1e-15);
  Tensor dx = Tensor::empty({T, 2 * F}, DType::F64);
  cpu::swiglu_backward(r, x, dx, S());
  EXPECT_LT(rel_err(dx, numeric_grad(x, L)), kGradTol);
  Tensor odd = randn({T, 7}, 3), ybad = Tensor::empty({T, 4}, DType::F64);
  EXPECT_THROW(cpu::swiglu_forward(odd, y, S()), Error);
  EXPECT_THROW(cpu::swiglu_forward(x, ybad, S()), Error);
}

// relu(x)^2: the formula exactly (f32 and f64), the gradient against central differences in
// f64 (inputs kept 0.05 away from the kink at 0, so that x +- h stays on one side), and the
// derivative 0 at x = 0 and below.
TEST(SquaredRelu, ForwardFormulaAndGradient) {
  Tensor x = randn({5, 7}, 1, 2.0), r = randn({5, 7}, 2);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& v = x.data<double>()[i];
    if (std::abs(v) < 0.05) v = v < 0 ? -0.05 - v : 0.05 + v;
  }
  Tensor y = Tensor::empty({5, 7}, DType::F64);
  auto L = [&] {
    cpu::squared_relu_forward(x, y, S());
    return dot(r, y);
  };
  L();
  int positive = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    EXPECT_EQ(y.data<double>()[i], v > 0 ? v * v : 0.0) << "x = " << v;
    positive += v > 0;
  }
  EXPECT_GT(positive, 5);
  EXPECT_LT(positive, x.numel() - 5);
  Tensor dx = Tensor::empty({5, 7}, DType::F64);
  cpu::squared_relu_backward(r, x, dx, S());
  EXPECT_LT(rel_err(dx, numeric_grad(x, L)), kGradTol);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    EXPECT_EQ(dx.data<double>()[i], v > 0 ? r.data<double>()[i] * 2 * v : 0.0);
  }

  // f32, every branch: positive, negative, +0, -0; the threaded loop on a large tensor.
  Tensor x32 = as(randn({129, 203}, 3, 3.0), DType::F32), dy32 = as(randn({129, 203}, 4),
                                                                       DType::F32);
  x32.data<float>()[0] = 0.f, x32.data<float>()[1] = -0.f;
  Tensor y32 = Tensor::empty(x32.shape(), DType::F32);
  Tensor dx32 = Tensor::empty(x32.shape(), DType::F32);
  cpu::squared_relu_forward(x32, y32, S());
  cpu::squared_relu_backward(dy32, x32, dx32, S());
  for (int64_t i = 0; i < x32.numel(); ++i) {
    const float v = x32.data<float>()[i], rv = v > 0.f ? v : 0.f;
    EXPECT_EQ(y32.data<float>()[i], rv * rv);
    EXPECT_EQ(dx32.data<float>()[i], dy32.data<float>()[i] * (2.f * rv));
  }
  EXPECT_EQ(dx32.data<float>()[0], 0.f);
  EXPECT_EQ(dx32.data<float>()[1], 0.f);

  Tensor ybad = Tensor::empty({5, 6}, DType::F64), y32bad = Tensor::empty({5, 7}, DType::F32);
  EXPECT_THROW(cpu::squared_relu_forward(x, ybad, S()), Error);
  EXPECT_THROW(cpu::squared_relu_forward(x, y32bad, S()), Error);
  EXPECT_THROW(cpu::squared_relu_backward(r, x, ybad, S()), Error);
}

// The fused MLP-backward op against the two ops it replaces, bit for bit: the model's
// results must not change with it. Sizes: odd rows and columns (simd tails), one element,
// and one large enough for the threaded loop.
TEST(SwiGLU, BackwardRecomputeEqualsTheTwoOps) {
  struct Size {
    int64_t T, F;
  };
  for (DType dt : {DType::F32, DType::F64})
    for (Size sz : {Size{1, 1}, Size{7, 13}, Size{3, 37}, Size{129, 203}}) {
      const int64_t T = sz.T, F = sz.F;
      Tensor x = randn({T, 2 * F}, 1, 4.0, dt), dy = randn({T, F}, 2, 1.0, dt);
      Tensor y = Tensor::empty({T, F}, dt), dx = Tensor::empty({T, 2 * F}, dt);
      cpu::swiglu_forward(x, y, S());
      cpu::swiglu_backward(dy, x, dx, S());
      Tensor y2 = Tensor::empty({T, F}, dt), dx2 = Tensor::empty({T, 2 * F}, dt);
      cpu::swiglu_backward_recompute(dy, x, dx2, y2, S());
      EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0)
          << dtype_name(dt) << " T=" << T << " F=" << F;
      EXPECT_EQ(std::memcmp(dx.raw(), dx2.raw(), dx.nbytes()), 0)
          << dtype_name(dt) << " T=" << T << " F=" << F;
    }
  Tensor x = randn({3, 10}, 3), dy = randn({3, 5}, 4), dx = Tensor::empty({3, 10}, DType::F64);
  Tensor ybad = Tensor::empty({3, 4}, DType::F64), y32 = Tensor::empty({3, 5}, DType::F32);
  EXPECT_THROW(cpu::swiglu_backward_recompute(dy, x, dx, ybad, S()), Error);
  EXPECT_THROW(cpu::swiglu_backward_recompute(dy, x, dx, y32, S()), Error);
}

TEST(Activations, F32MatchesF64) {
  const int64_t T = 257, F = 192;  // multi-threaded, with a tail after the simd width
  const DType D = DType::F64, F32 = DType::F32;
  Tensor x = randn({T, 2 * F}, 1, 4.0), dy = randn({T, F}, 2), dyg = randn({T, 2 * F}, 3);
  Tensor x32 = as(x, F32), dy32 = as(dy, F32), dyg32 = as(dyg, F32);
  Tensor y = Tensor::empty({T, F}, D), dx = Tensor::empty({T, 2 * F}, D);
  Tensor y32 = Tensor::empty({T, F}, F32), dx32 = Tensor::empty({T, 2 * F}, F32);
  cpu::swiglu_forward(x, y, S());
  cpu::swiglu_forward(x32, y32, S());
  cpu::swiglu_backward(dy, x, dx, S());
  cpu::swiglu_backward(dy32, x32, dx32, S());
  EXPECT_LT(max_abs_diff(y32, y), 1e-5 * max_abs(y));
  EXPECT_LT(max_abs_diff(dx32, dx), 1e-5 * max_abs(dx));
  Tensor g = Tensor::empty({T, 2 * F}, D), g32 = Tensor::empty({T, 2 * F}, F32);
  cpu::gelu_forward(x, g, S());
  cpu::gelu_forward(x32, g32, S());
  EXPECT_LT(max_abs_diff(g32, g), 1e-5 * max_abs(g));
  cpu::gelu_backward(dyg, x, g, S());
  cpu::gelu_backward(dyg32, x32, g32, S());
  EXPECT_LT(max_abs_diff(g32, g), 1e-5 * max_abs(g));
}

// The f32 exp must stay accurate over the whole range softmax uses, and keep NaN.
TEST(Activations, FastExpAccuracy) {
  double worst = 0;
  for (float v = -87.0f; v < 88.0f; v += 0.0137f) {
    const double want = std::exp(double(v));
    worst = std::max(worst, std::abs(double(cpu::exp_fast(v)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_TRUE(std::isnan(cpu::exp_fast(std::nanf(""))));
  EXPECT_EQ(cpu::exp_fast(0.0f), 1.0f);
}

}  // namespace activations_test
