// gemm against a naive loop in all four transpose cases; linear forward/backward
// against f64 finite differences, with += semantics and undefined dx/dw/db.
#include <cstring>

#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace gemm_test {

// C = alpha op(A) op(B) + beta C0, naive triple loop in f64.
Tensor naive_gemm(bool ta, bool tb, double alpha, const Tensor& A, const Tensor& B, double beta,
                  const Tensor& C0) {
  Tensor a = f64(A), b = f64(B), c = f64(C0).clone();
  const int64_t M = c.size(0), N = c.size(1), K = ta ? a.size(0) : a.size(1);
  auto at = [&](int64_t i, int64_t k) {
    return ta ? a.data<double>()[k * a.size(1) + i] : a.data<double>()[i * a.size(1) + k];
  };
  auto bt = [&](int64_t k, int64_t j) {
    return tb ? b.data<double>()[j * b.size(1) + k] : b.data<double>()[k * b.size(1) + j];
  };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += at(i, k) * bt(k, j);
      double& cij = c.data<double>()[i * N + j];
      cij = alpha * s + beta * cij;
    }
  return c;
}


TEST(Gemm, AllTransposesMatchNaiveLoop) {
  const int64_t M = 7, N = 5, K = 9;
  for (DType dt : {DType::F64, DType::F32})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, 1, 1.0, dt);
        Tensor B = randn(tb ? Shape{N, K} : Shape{K, N}, 2, 1.0, dt);
        Tensor C = randn({M, N}, 3, 1.0, dt);
        Tensor want = naive_gemm(ta, tb, 0.75, A, B, -0.5, C);
        cpu::gemm(ta, tb, 0.75, A, B, -0.5, C, S());
        EXPECT_LT(rel_err(C, want), dt == DType::F64 ? 1e-14 : 1e-6)
            << "ta=" << ta << " tb=" << tb << " " << dtype_name(dt);
      }
}

// 3-D operands: each matrix of the batch as the naive loop computes it, in every transpose
// case; mismatched batch sizes are refused.
TEST(Gemm, BatchesAreEachMatrixsProduct) {
  const int64_t n = 3, M = 4, N = 6, K = 5;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor A = randn(ta ? Shape{n, K, M} : Shape{n, M, K}, 1);
      Tensor B = randn(tb ? Shape{n, N, K} : Shape{n, K, N}, 2);
      Tensor C = randn({n, M, N}, 3), C0 = C.clone();
      cpu::gemm(ta, tb, 0.5, A, B, 2.0, C, S());
      for (int64_t i = 0; i < n; ++i) {
        auto mat = [&](const Tensor& t) { return t.narrow(i, 1).view({t.size(1), t.size(2)}); };
        Tensor want = naive_gemm(ta, tb, 0.5, mat(A), mat(B), 2.0, mat(C0));
        EXPECT_LT(rel_err(mat(C), want), 1e-14) << "matrix " << i << " ta=" << ta << " tb=" << tb;
      }
    }
  Tensor A = randn({2, 3, 4}, 1), B = randn({3, 4, 2}, 2), C = Tensor::zeros({2, 3, 2}, DType::F64);
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B, 0, C, S()), Error);
  Tensor B2 = randn({4, 2}, 2);
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B2, 0, C, S()), Error);  // 3-D with 2-D
}

// gemm_add: D = alpha op(A) op(B) + beta C, C untouched, bitwise copy-then-gemm; C and D
// one buffer is refused.
TEST(Gemm, GemmAddReadsCWritesD) {
  Tensor A = randn({2, 3, 4}, 1), B = randn({2, 5, 4}, 2), C = randn({2, 3, 5}, 3);
  const Tensor C0 = C.clone();
  Tensor D = Tensor::empty({2, 3, 5}, DType::F64), want = C.clone();
  cpu::gemm_add(false, true, 0.5, A, B, -2.0, C, D, S());
  cpu::gemm(false, true, 0.5, A, B, -2.0, want, S());
  EXPECT_EQ(max_abs_diff(D, want), 0.0);
  EXPECT_EQ(max_abs_diff(C, C0), 0.0);
  EXPECT_THROW(cpu::gemm_add(false, true, 0.5, A, B, -2.0, C, C, S()), Error);
  Tensor Dbad = Tensor::empty({2, 5, 3}, DType::F64);
  EXPECT_THROW(cpu::gemm_add(false, true, 0.5, A, B, -2.0, C, Dbad, S()), Error);
}

TEST(Gemm, BetaZeroIgnoresGarbageAndEmptyK) {
  Tensor A = randn({3, 4}, 1), B = randn({4, 2}, 2);
  Tensor C = Tensor::empty({3, 2}, DType::F64);
  cpu::fill(C, std::nan(""), S());
  cpu::gemm(false, false, 1.0, A, B, 0.0, C, S());
  EXPECT_LT(rel_err(C, naive_gemm(false, false, 1.0, A, B, 0.0, Tensor::zeros({3, 2}, DType::F64))),
            1e-14);
  Tensor A0 = Tensor::zeros({3, 0}, DType::F64), B0 = Tensor::zeros({0, 2}, DType::F64);
  Tensor C1 = randn({3, 2}, 5), C1want = C1.clone();
  cpu::scale(C1want, 2.0, S());
  cpu::gemm(false, false, 1.0, A0, B0, 2.0, C1, S());
  EXPECT_EQ(max_abs_diff(C1, C1want), 0.0);
}

TEST(Gemm, ShapeAndDtypeMismatchesThrow) {
  Tensor A = randn({3, 4}, 1), B = randn({5, 2}, 2), C = Tensor::zeros({3, 2}, DType::F64);
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B, 0, C, S()), Error);  // K 4 vs 5
  Tensor B2 = randn({4, 2}, 2), Cbad = Tensor::zeros({2, 3}, DType::F64);
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B2, 0, Cbad, S()), Error);
  Tensor B32 = randn({4, 2}, 2, 1.0, DType::F32);
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B32, 0, C, S()), Error);
  Stream cuda{Device::CUDA, nullptr};
  EXPECT_THROW(cpu::gemm(false, false, 1, A, B2, 0, C, cuda), Error);
  try {
    cpu::gemm(false, false, 1, A, B2, 0, Cbad, S());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: tensor 'C' has shape [2, 3], expected [3, 2]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  const int64_t S_ = 3, B = 2, in = 4, out = 5;
  Tensor x = randn({S_, B, in}, 10), w = randn({out, in}, 11), b = randn({out}, 12);
  Tensor r = randn({S_, B, out}, 13);  // L = <r, y>
  Tensor y = Tensor::empty({S_, B, out}, DType::F64);
  auto L = [&] {
    cpu::linear_forward(x, w, b, y, S());
    return dot(r, y);
  };
  Tensor dx0 = randn(x.shape(), 14), dw0 = randn(w.shape(), 15), db0 = randn(b.shape(), 16);
  Tensor dx = dx0.clone(), dw = dw0.clone(), db = db0.clone();
  cpu::linear_backward(r, x, w, dx, /*accumulate_dx=*/true, dw, db, S());
  Tensor gx = numeric_grad(x, L), gw = numeric_grad(w, L), gb = numeric_grad(b, L);
  EXPECT_LT(rel_err(dx, plus(dx0, gx)), kGradTol);
  EXPECT_LT(rel_err(dw, plus(dw0, gw)), kGradTol);
  EXPECT_LT(rel_err(db, plus(db0, gb)), kGradTol);
  // Without accumulation dx is overwritten; dw keeps accumulating.
  cpu::linear_backward(r, x, w, dx, false, dw, db, S());
  EXPECT_LT(rel_err(dx, gx), kGradTol);
  Tensor two_gw = gw.clone();
  cpu::scale(two_gw, 2.0, S());
  EXPECT_LT(rel_err(dw, plus(dw0, two_gw)), kGradTol);
}

TEST(Linear, UndefinedDxDbAndNoBiasAreSkipped) {
  Tensor x = randn({6, 4}, 1), w = randn({3, 4}, 2), r = randn({6, 3}, 3);
  Tensor y = Tensor::empty({6, 3}, DType::F64), none;
  cpu::linear_forward(x, w, none, y, S());
  EXPECT_LT(rel_err(y, naive_gemm(false, true, 1, x, w, 0, Tensor::zeros({6, 3}, DType::F64))),
            1e-14);
  Tensor dw = Tensor::zeros({3, 4}, DType::F64), dx, db;
  cpu::linear_backward(r, x, w, dx, false, dw, db, S());
  EXPECT_LT(rel_err(dw, naive_gemm(true, false, 1, r, x, 0, Tensor::zeros({3, 4}, DType::F64))),
            1e-14);
}

// The MLP backward runs fc2's input gradient and its weight gradient as two calls (the
// SwiGLU activation is recomputed between them): together they must give the one call's bits.
TEST(Linear, DxOnlyThenDwOnlyEqualsOneCall) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = randn({37, 24}, 1, 1.0, dt), w = randn({19, 24}, 2, 1.0, dt),
           r = randn({37, 19}, 3, 1.0, dt);
    Tensor dx = Tensor::empty({37, 24}, dt), dw = randn({19, 24}, 4, 1.0, dt),
           db = randn({19}, 5, 1.0, dt);
    Tensor dx2 = Tensor::empty({37, 24}, dt), dw2 = dw.clone(), db2 = db.clone(), none;
    cpu::linear_backward(r, x, w, dx, false, dw, db, S());
    cpu::linear_backward(r, x, w, dx2, false, none, none, S());
    cpu::linear_backward(r, x, w, none, false, dw2, db2, S());
    EXPECT_EQ(std::memcmp(dx.raw(), dx2.raw(), dx.nbytes()), 0) << dtype_name(dt);
    EXPECT_EQ(std::memcmp(dw.raw(), dw2.raw(), dw.nbytes()), 0) << dtype_name(dt);
    EXPECT_EQ(std::memcmp(db.raw(), db2.raw(), db.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(Linear, F32MatchesF64AndShapeErrors) {
  Tensor x = randn({64, 48}, 1), w = randn({40, 48}, 2), b = randn({40}, 3);
  Tensor r = randn({64, 40}, 4);
  Tensor y = Tensor::empty({64, 40}, DType::F64), dx = Tensor::empty({64, 48}, DType::F64);
  Tensor dw = Tensor::zeros({40, 48}, DType::F64), db = Tensor::zeros({40}, DType::F64);
  cpu::linear_forward(x, w, b, y, S());
  cpu::linear_backward(r, x, w, dx, false, dw, db, S());
  const DType F = DType::F32;
  Tensor x32 = as(x, F), w32 = as(w, F), b32 = as(b, F), r32 = as(r, F);
  Tensor y32 = Tensor::empty({64, 40}, F), dx32 = Tensor::empty({64, 48}, F);
  Tensor dw32 = Tensor::zeros({40, 48}, F), db32 = Tensor::zeros({40}, F);
  cpu::linear_forward(x32, w32, b32, y32, S());
  cpu::linear_backward(r32, x32, w32, dx32, false, dw32, db32, S());
  EXPECT_LT(rel_err(y32, y), 1e-5);
  EXPECT_LT(rel_err(dx32, dx), 1e-5);
  EXPECT_LT(rel_err(dw32, dw), 1e-5);
  EXPECT_LT(rel_err(db32, db), 1e-5);
  Tensor ybad = Tensor::empty({64, 41}, DType::F64), wbad = randn({40, 47}, 5);
  EXPECT_THROW(cpu::linear_forward(x, w, b, ybad, S()), Error);
  EXPECT_THROW(cpu::linear_forward(x, wbad, b, y, S()), Error);
  Tensor bbad = randn({41}, 6);
  EXPECT_THROW(cpu::linear_forward(x, w, bbad, y, S()), Error);
  Tensor dbbad = Tensor::zeros({39}, DType::F64);
  EXPECT_THROW(cpu::linear_backward(r, x, w, dx, false, dw, dbbad, S()), Error);
}

}  // namespace gemm_test
