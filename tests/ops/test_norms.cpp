// LayerNorm and RMSNorm: f64 gradients against central differences (with += into
// dx, dw, db), f32 against f64, and shape errors.
#include "op_test_util.h"

namespace norms_test {

using namespace mcpp;
using namespace mcpp::test;

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  const int64_t T = 5, H = 7;
  Tensor x = randn({T, H}, 1, 2.0), w = randn({H}, 2), b = randn({H}, 3);
  Tensor r = randn({T, H}, 4);
  Tensor y = Tensor::empty({T, H}, DType::F64), mean = Tensor::empty({T}, DType::F64);
  Tensor rstd = Tensor::empty({T}, DType::F64);
  const double eps = 1e-5;
  auto L = [&] {
    cpu::layernorm_forward(x, w, b, eps, y, mean, rstd, S());
    return dot(r, y);
  };
  L();
  Tensor dx0 = randn({T, H}, 5), dw0 = randn({H}, 6), db0 = randn({H}, 7);
  Tensor dx = dx0.clone(), dw = dw0.clone(), db = db0.clone();
  cpu::layernorm_backward(r, x, w, mean, rstd, dx, true, dw, db, S());
  Tensor gx = numeric_grad(x, L), gw = numeric_grad(w, L), gb = numeric_grad(b, L);
  EXPECT_LT(rel_err(dx, plus(dx0, gx)), kGradTol);
  EXPECT_LT(rel_err(dw, plus(dw0, gw)), kGradTol);
  EXPECT_LT(rel_err(db, plus(db0, gb)), kGradTol);
  cpu::layernorm_backward(r, x, w, mean, rstd, dx, false, dw, db, S());
  EXPECT_LT(rel_err(dx, gx), kGradTol);
  // Saved statistics are the row mean and 1/sqrt(var + eps).
  double m = 0, v = 0;
  for (int64_t h = 0; h < H; ++h) m += x.data<double>()[h];
  m /= H;
  for (int64_t h = 0; h < H; ++h) v += std::pow(x.data<double>()[h] - m, 2);
  EXPECT_NEAR(mean.data<double>()[0], m, 1e-14);
  EXPECT_NEAR(rstd.data<double>()[0], 1 / std::sqrt(v / H + eps), 1e-12);
}

TEST(RMSNorm, GradientsMatchFiniteDifferences) {
  const int64_t H = 9;
  Tensor x = randn({2, 3, H}, 1, 1.5), w = randn({H}, 2), r = randn({2, 3, H}, 3);
  Tensor y = Tensor::empty(x.shape(), DType::F64), rstd = Tensor::empty({2, 3}, DType::F64);
  auto L = [&] {
    cpu::rmsnorm_forward(x, w, 1e-6, y, rstd, S());
    return dot(r, y);
  };
  L();
  Tensor dx0 = randn(x.shape(), 5), dw0 = randn({H}, 6);
  Tensor dx = dx0.clone(), dw = dw0.clone();
  cpu::rmsnorm_backward(r, x, w, rstd, dx, true, dw, S());
  Tensor gx = numeric_grad(x, L), gw = numeric_grad(w, L);
  EXPECT_LT(rel_err(dx, plus(dx0, gx)), kGradTol);
  EXPECT_LT(rel_err(dw, plus(dw0, gw)), kGradTol);
  cpu::rmsnorm_backward(r, x, w, rstd, dx, false, dw, S());
  EXPECT_LT(rel_err(dx, gx), kGradTol);
}

// --qk-layernorm's per-head RMSNorm: T = 3 rows of NG = 2 groups of r = 2 query heads, a key
// head and a value head, HD = 5. Gradients (+= into dwq, dwk) against central differences,
// with and without 1p; value heads pass through both ways; y may alias x.
TEST(QkNorm, GradientsMatchFiniteDifferences) {
  const int64_t T = 3, NG = 2, r = 2, HD = 5, W = NG * (r + 2) * HD;
  for (bool one_plus : {false, true}) {
    Tensor x = randn({T, W}, 11, 1.5), wq = randn({HD}, 12), wk = randn({HD}, 13);
    Tensor rr = randn({T, W}, 14), y = Tensor::empty({T, W}, DType::F64);
    auto L = [&] {
      cpu::qk_norm_forward(x, wq, wk, r, 1e-6, one_plus, y, S());
      return dot(rr, y);
    };
    L();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < NG; ++g)
        for (int64_t d = 0; d < HD; ++d) {  // the value head: y = x
          const int64_t i = t * W + (g * (r + 2) + r + 1) * HD + d;
          EXPECT_EQ(y.data<double>()[i], x.data<double>()[i]);
        }
    Tensor in_place = x.clone();
    cpu::qk_norm_forward(in_place, wq, wk, r, 1e-6, one_plus, in_place, S());
    EXPECT_EQ(max_abs_diff(in_place, y), 0.0);
    Tensor dwq0 = randn({HD}, 15), dwk0 = randn({HD}, 16);
    Tensor dx = rr.clone(), dwq = dwq0.clone(), dwk = dwk0.clone();
    cpu::qk_norm_backward(x, wq, wk, r, 1e-6, one_plus, dx, dwq, dwk, S());
    Tensor gx = numeric_grad(x, L), gq = numeric_grad(wq, L), gk = numeric_grad(wk, L);
    EXPECT_LT(rel_err(dx, gx), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dwq, plus(dwq0, gq)), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dwk, plus(dwk0, gk)), kGradTol) << one_plus;
  }
}

// --qk-layernorm with --normalization LayerNorm: the same layout, LayerNorm with a bias per
// head. Forward against a direct f64 computation (value heads passed through, in place the
// same bits); gradients (+= into dwq, dbq, dwk, dbk) against central differences, with and
// without 1p (gamma = 1 + w).
TEST(QkLayerNorm, MatchesDirectComputationAndFiniteDifferences) {
  const int64_t T = 3, NG = 2, r = 2, HD = 5, W = NG * (r + 2) * HD;
  const double eps = 1e-5;
  for (bool one_plus : {false, true}) {
    // An offset on x: the mean subtraction matters.
    Tensor x = randn({T, W}, 21, 1.5), wq = randn({HD}, 22), wk = randn({HD}, 23);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] += 0.7;
    Tensor bq = randn({HD}, 24), bk = randn({HD}, 25);
    Tensor rr = randn({T, W}, 26), y = Tensor::empty({T, W}, DType::F64);
    auto L = [&] {
      cpu::qk_layernorm_forward(x, wq, bq, wk, bk, r, eps, one_plus, y, S());
      return dot(rr, y);
    };
    L();
    const double one = one_plus ? 1.0 : 0.0;
    for (int64_t row = 0; row < T * NG * (r + 2); ++row) {
      const int64_t j = row % (r + 2);
      const double* xr = x.data<double>() + row * HD;
      const double* yr = y.data<double>() + row * HD;
      if (j == r + 1) {  // the value head: y = x
        for (int64_t d = 0; d < HD; ++d) EXPECT_EQ(yr[d], xr[d]);
        continue;
      }
      const double* w = (j < r ? wq : wk).data<double>();
      const double* b = (j < r ? bq : bk).data<double>();
      double m = 0, v = 0;
      for (int64_t d = 0; d < HD; ++d) m += xr[d] / double(HD);
      for (int64_t d = 0; d < HD; ++d) v += (xr[d] - m) * (xr[d] - m) / double(HD);
      for (int64_t d = 0; d < HD; ++d)
        EXPECT_NEAR(yr[d], (xr[d] - m) / std::sqrt(v + eps) * (w[d] + one) + b[d], 1e-12)
            << "row " << row << " d " << d << " 1p " << one_plus;
    }
    Tensor in_place = x.clone();
    cpu::qk_layernorm_forward(in_place, wq, bq, wk, bk, r, eps, one_plus, in_place, S());
    EXPECT_EQ(max_abs_diff(in_place, y), 0.0);
    Tensor dwq0 = randn({HD}, 27), dwk0 = randn({HD}, 28);
    Tensor dbq0 = randn({HD}, 29), dbk0 = randn({HD}, 30);
    Tensor dx = rr.clone(), dwq = dwq0.clone(), dwk = dwk0.clone();
    Tensor dbq = dbq0.clone(), dbk = dbk0.clone();
    cpu::qk_layernorm_backward(x, wq, wk, r, eps, one_plus, dx, dwq, dbq, dwk, dbk, S());
    Tensor gx = numeric_grad(x, L), gwq = numeric_grad(wq, L), gwk = numeric_grad(wk, L);
    Tensor gbq = numeric_grad(bq, L), gbk = numeric_grad(bk, L);
    EXPECT_LT(rel_err(dx, gx), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dwq, plus(dwq0, gwq)), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dwk, plus(dwk0, gwk)), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dbq, plus(dbq0, gbq)), kGradTol) << one_plus;
    EXPECT_LT(rel_err(dbk, plus(dbk0, gbk)), kGradTol) << one_plus;
  }
  // A bias of the wrong length is an error naming it.
  Tensor x = randn({1, W}, 31), w = randn({HD}, 32), bad = randn({HD + 1}, 33);
  Tensor y = Tensor::empty({1, W}, DType::F64);
  try {
    cpu::qk_layernorm_forward(x, w, bad, w, w, r, eps, false, y, S());
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'bq'"), std::string::npos) << e.what();
  }
}

// Large enough to run multi-threaded; f32 results within loose tolerance of f64.
TEST(Norms, F32MatchesF64) {
  const int64_t T = 300, H = 256;
  const DType F = DType::F32, D = DType::F64;
  Tensor x = randn({T, H}, 1, 3.0), w = randn({H}, 2), b = randn({H}, 3), dy = randn({T, H}, 4);
  Tensor x32 = as(x, F), w32 = as(w, F), b32 = as(b, F), dy32 = as(dy, F);
  // LayerNorm
  Tensor y = Tensor::empty({T, H}, D), mu = Tensor::empty({T}, D), rs = Tensor::empty({T}, D);
  Tensor dx = Tensor::empty({T, H}, D), dw = Tensor::zeros({H}, D), db = Tensor::zeros({H}, D);
  cpu::layernorm_forward(x, w, b, 1e-5, y, mu, rs, S());
  cpu::layernorm_backward(dy, x, w, mu, rs, dx, false, dw, db, S());
  Tensor y32 = Tensor::empty({T, H}, F), mu32 = Tensor::empty({T}, F), rs32 = Tensor::empty({T}, F);
  Tensor dx32 = Tensor::empty({T, H}, F), dw32 = Tensor::zeros({H}, F),
         db32 = Tensor::zeros({H}, F);
  cpu::layernorm_forward(x32, w32, b32, 1e-5, y32, mu32, rs32, S());
  cpu::layernorm_backward(dy32, x32, w32, mu32, rs32, dx32, false, dw32, db32, S());
  EXPECT_LT(rel_err(y32, y), 1e-5);
  EXPECT_LT(rel_err(rs32, rs), 1e-5);
  EXPECT_LT(rel_err(dx32, dx), 1e-5);
  EXPECT_LT(rel_err(dw32, dw), 1e-5);
  EXPECT_LT(rel_err(db32, db), 1e-5);
  // RMSNorm
  Tensor dw2 = Tensor::zeros({H}, D), dw2_32 = Tensor::zeros({H}, F);
  cpu::rmsnorm_forward(x, w, 1e-5, y, rs, S());
  cpu::rmsnorm_backward(dy, x, w, rs, dx, false, dw2, S());
  cpu::rmsnorm_forward(x32, w32, 1e-5, y32, rs32, S());
  cpu::rmsnorm_backward(dy32, x32, w32, rs32, dx32, false, dw2_32, S());
  EXPECT_LT(rel_err(y32, y), 1e-5);
  EXPECT_LT(rel_err(dx32, dx), 1e-5);
  EXPECT_LT(rel_err(dw2_32, dw2), 1e-5);
}

TEST(Norms, ShapeErrorsNameTheTensor) {
  Tensor x = randn({4, 8}, 1), w = randn({8}, 2), b = randn({8}, 3);
  Tensor y = Tensor::empty({4, 8}, DType::F64), mu = Tensor::empty({4}, DType::F64);
  Tensor rs = Tensor::empty({4}, DType::F64), wbad = randn({7}, 4), rsbad = randn({5}, 5);
  EXPECT_THROW(cpu::layernorm_forward(x, wbad, b, 1e-5, y, mu, rs, S()), Error);
  EXPECT_THROW(cpu::layernorm_forward(x, w, b, 1e-5, y, mu, rsbad, S()), Error);
  EXPECT_THROW(cpu::rmsnorm_forward(x, w, 1e-5, y, rsbad, S()), Error);
  Tensor y32 = Tensor::empty({4, 8}, DType::F32);
  EXPECT_THROW(cpu::rmsnorm_forward(x, w, 1e-5, y32, rs, S()), Error);
  try {
    cpu::rmsnorm_forward(x, wbad, 1e-5, y, rs, S());
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm_forward: tensor 'w' has shape [7], expected [8]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace norms_test
