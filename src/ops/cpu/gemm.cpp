// GEMM and linear layers on the CPU: OpenBLAS cblas_sgemm / cblas_dgemm, row-major.
//   gemm:            C[M,N] = alpha op(A) op(B) + beta C        (f32 or f64, all alike;
//                    3-D operands: a batch of such products, one after another)
//   linear_forward:  y[..., out] = x[..., in] @ w[out, in]^T (+ b[out])       (=)
//   linear_backward: dx[..., in] = dy @ w                 (= or += with accumulate_dx)
//                    dw[out, in] += dy^T @ x, db[out] += sum over rows of dy  (+=)
//                    (each of dx, dw, db skipped when undefined)
// Leading dimensions of x/y/dy/dx are flattened into T rows, so [S, B, H] activations
// need no reshaping by the caller.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

// C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C with leading dimensions from the
// stored (untransposed) shapes. M, N or K may be zero.
template <typename R>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, R alpha, const R* A, int64_t lda,
               const R* B, int64_t ldb, R beta, R* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS would be asked for lda = 0; the product is empty, only beta remains
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == R(0) ? R(0) : beta * C[i];
    return;
  }
  MCPP_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX,
             "gemm: dimensions M={} N={} K={} exceed OpenBLAS's 32-bit index", M, N, K);
  if (M == 1 && !ta) {
    // One row (a decode step): gemv streams op(B) once; sgemm would first pack all of it.
    // C[1,N] = a[1,K] op(B): op(B) = B^T ([N,K] stored) -> B a; else B stored [K,N] -> B^T a.
    const auto op = tb ? CblasNoTrans : CblasTrans;
    const int rows = tb ? int(N) : int(K), cols = tb ? int(K) : int(N);
    if constexpr (std::is_same_v<R, float>)
      cblas_sgemv(CblasRowMajor, op, rows, cols, alpha, B, int(ldb), A, 1, beta, C, 1);
    else
      cblas_dgemv(CblasRowMajor, op, rows, cols, alpha, B, int(ldb), A, 1, beta, C, 1);
    return;
  }
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<R, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb),
                beta, C, int(N));
  else
    cblas_dgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb),
                beta, C, int(N));
}

// Leading dims of `t` (all but the last) must equal those of `ref`.
void check_leading(const Check& c, const Tensor& t, const char* name, const Tensor& ref,
                   int64_t last) {
  Shape want = ref.shape();
  want.back() = last;
  c.shape(t, name, want);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& A, const Tensor& B, double beta,
          Tensor& C, Stream& s) {
  const Check c{"gemm"};
  c.stream(s);
  DType dt = c.floating(A, "A");
  c.dtype(B, "B", dt);
  c.dtype(C, "C", dt);
  const int d = A.dim();
  MCPP_CHECK((d == 2 || d == 3) && B.dim() == d && C.dim() == d,
             "gemm: A, B, C must all be 2-D (or 3-D: a batch), found A {}, B {}, C {}",
             shape_str(A.shape()), shape_str(B.shape()), shape_str(C.shape()));
  const int64_t batch = d == 3 ? A.size(0) : 1;
  MCPP_CHECK(d == 2 || (B.size(0) == batch && C.size(0) == batch),
             "gemm: batch sizes differ: A {}, B {}, C {}", shape_str(A.shape()),
             shape_str(B.shape()), shape_str(C.shape()));
  const int64_t a0 = A.size(-2), a1 = A.size(-1), b0 = B.size(-2), b1 = B.size(-1);
  const int64_t M = trans_a ? a1 : a0, K = trans_a ? a0 : a1;
  const int64_t Kb = trans_b ? b1 : b0, N = trans_b ? b0 : b1;
  MCPP_CHECK(K == Kb,
             "gemm: inner dimensions differ: op(A) is [{}, {}] (A {}{}), op(B) is "
             "[{}, {}] (B {}{})",
             M, K, shape_str(A.shape()), trans_a ? "^T" : "", Kb, N, shape_str(B.shape()),
             trans_b ? "^T" : "");
  c.shape(C, "C", d == 3 ? Shape{batch, M, N} : Shape{M, N});
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    for (int64_t i = 0; i < batch; ++i)  // each matrix as a 2-D call: the same bits
      blas_gemm<R>(trans_a, trans_b, M, N, K, R(alpha), A.data<R>() + i * a0 * a1, a1,
                   B.data<R>() + i * b0 * b1, b1, R(beta), C.data<R>() + i * M * N);
  });
}

void gemm_add(bool trans_a, bool trans_b, double alpha, const Tensor& A, const Tensor& B,
              double beta, const Tensor& C, Tensor& D, Stream& s) {
  const Check c{"gemm_add"};
  c.stream(s);
  c.shape(D, "D", C.shape());
  MCPP_CHECK(C.raw() != D.raw() || C.numel() == 0, "gemm_add: C and D are one buffer; use gemm");
  copy(C, D, s);
  gemm(trans_a, trans_b, alpha, A, B, beta, D, s);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, Stream& s) {
  const Check c{"linear_forward"};
  c.stream(s);
  DType dt = c.floating(x, "x");
  c.dtype(w, "w", dt);
  c.dtype(y, "y", dt);
  c.min_dim(x, "x", 1);
  MCPP_CHECK(w.dim() == 2 && w.size(1) == x.size(-1),
             "linear_forward: w has shape {}, expected [out, {}] (x is {})", shape_str(w.shape()),
             x.size(-1), shape_str(x.shape()));
  const int64_t out = w.size(0), in = w.size(1), T = x.numel() / std::max<int64_t>(in, 1);
  check_leading(c, y, "y", x, out);
  if (b.defined()) {
    c.dtype(b, "b", dt);
    c.shape(b, "b", {out});
  }
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    R* Y = y.data<R>();
    blas_gemm<R>(false, true, T, out, in, R(1), x.data<R>(), in, w.data<R>(), in, R(0), Y);
    if (!b.defined()) return;
    const R* bias = b.data<R>();
#pragma omp parallel for schedule(static) if (T * out > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      R* row = Y + t * out;
#pragma omp simd
      for (int64_t o = 0; o < out; ++o) row[o] += bias[o];
    }
  });
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx,
                     bool accumulate_dx, Tensor& dw, Tensor& db, Stream& s) {
  const Check c{"linear_backward"};
  c.stream(s);
  DType dt = c.floating(dy, "dy");
  c.dtype(x, "x", dt);
  c.dtype(w, "w", dt);
  c.min_dim(x, "x", 1);
  MCPP_CHECK(w.dim() == 2 && w.size(1) == x.size(-1),
             "linear_backward: w has shape {}, expected [out, {}] (x is {})", shape_str(w.shape()),
             x.size(-1), shape_str(x.shape()));
  const int64_t out = w.size(0), in = w.size(1), T = x.numel() / std::max<int64_t>(in, 1);
  check_leading(c, dy, "dy", x, out);
  if (dw.defined()) {
    c.dtype(dw, "dw", dt);
    c.shape(dw, "dw", w.shape());
  }
  if (dx.defined()) {
    c.dtype(dx, "dx", dt);
    c.shape(dx, "dx", x.shape());
  }
  if (db.defined()) {
    c.dtype(db, "db", dt);
    c.shape(db, "db", {out});
  }
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* DY = dy.data<R>();
    if (dx.defined())  // dx[T,in] = dy[T,out] @ w[out,in]
      blas_gemm<R>(false, false, T, in, out, R(1), DY, out, w.data<R>(), in,
                   R(accumulate_dx ? 1 : 0), dx.data<R>());
    if (dw.defined())  // dw[out,in] += dy^T[out,T] @ x[T,in]
      blas_gemm<R>(true, false, out, in, T, R(1), DY, out, x.data<R>(), in, R(1), dw.data<R>());
    if (!db.defined()) return;
    // Column sums of dy: threads own column blocks, so no reduction between threads is
    // needed; each column sums in double because T can be large.
    R* DB = db.data<R>();
    constexpr int64_t kBlock = 256;
    const int64_t nblocks = (out + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * out > kParallelGrain)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t o0 = blk * kBlock, n = std::min(kBlock, out - o0);
      double acc[kBlock] = {};
      for (int64_t t = 0; t < T; ++t) {
        const R* row = DY + t * out + o0;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) acc[j] += double(row[j]);
      }
      for (int64_t j = 0; j < n; ++j) DB[o0 + j] += R(acc[j]);
    }
  });
}

}  // namespace mcpp::ops::cpu

namespace mcpp::ops::cpu {

// The CPU backend has no GEMM epilogues: the linear op and the activation (or the
// residual add) in turn.
void linear_residual_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                             const Tensor& residual, Tensor& y, Stream& s) {
  MCPP_CHECK(residual.numel() == y.numel(), "linear_residual_forward: residual {} does not "
             "match y {}", shape_str(residual.shape()), shape_str(y.shape()));
  const Tensor r = residual.view(y.shape());
  if (residual.raw() == y.raw()) {
    Tensor tmp = Tensor::empty(y.shape(), y.dtype());
    linear_forward(x, w, b, tmp, s);
    add(r, tmp, y, s);
    return;
  }
  linear_forward(x, w, b, y, s);
  add(r, y, y, s);
}

void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre,
                         Tensor& y, Stream& s) {
  linear_forward(x, w, b, pre, s);
  gelu_forward(pre, y, s);
}

void linear_gelu_backward(const Tensor& dy, const Tensor& act, const Tensor& w,
                          const Tensor& pre, Tensor& dpre, Tensor& dw, Tensor& db, Stream& s) {
  linear_backward(dy, act, w, dpre, false, dw, db, s);
  gelu_backward(dpre, pre, dpre, s);  // elementwise: in place is safe
}

}  // namespace mcpp::ops::cpu
