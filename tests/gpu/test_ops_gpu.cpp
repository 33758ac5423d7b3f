// Every CUDA op against the CPU op on random data (see gpu_test_util.h), for f32 and
// bf16 activations (f16 where it is cheap), forward and backward.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "ops/rope_math.h"

namespace mcpp::test {
namespace ops_gpu_test {

class GpuOp : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& i) {
  return std::string(dtype_name(i.param));
}

// ---- device, allocator, copies ------------------------------------------------------

TEST(GpuDevice, AllocatorTracksPeakAndReuses) {
  MCPP_REQUIRE_GPU();
  gpu::synchronize(GS());
  gpu::reset_peak_memory();
  auto before = gpu::memory_stats();
  {
    Tensor a = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
    auto mid = gpu::memory_stats();
    EXPECT_GE(mid.in_use, before.in_use + (4u << 20));
    EXPECT_GE(mid.peak, mid.in_use);
  }
  auto after = gpu::memory_stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_GE(after.peak, before.in_use + (4u << 20));
}

TEST(GpuDevice, CopyCastsMatchHostRounding) {
  MCPP_REQUIRE_GPU();
  Tensor x = rand_f32({1000}, 1, -100.f, 100.f);
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor g = to_gpu(x, dt);
    Tensor raw = Tensor::empty({1000}, dt);
    gpu::copy(g, raw, GS());  // device -> host, same dtype
    Tensor back = to_cpu(g);  // device cast to f32 -> host
    const uint16_t* r = static_cast<const uint16_t*>(raw.raw());
    const float* xs = static_cast<const float*>(x.raw());
    const float* bs = static_cast<const float*>(back.raw());
    for (int i = 0; i < 1000; ++i) {
      uint16_t want = dt == DType::BF16 ? float_to_bf16(xs[i]) : float_to_f16(xs[i]);
      ASSERT_EQ(r[i], want) << i;
      float wf = dt == DType::BF16 ? bf16_to_float(want) : f16_to_float(want);
      ASSERT_EQ(bs[i], wf) << i;
    }
  }
  // Integers and device-to-device.
  std::vector<int64_t> ids = {0, 5, -3, 1 << 20};
  Tensor ci = Tensor::from(ids, {4});
  Tensor gi = Tensor::empty({4}, DType::I32, Device::CUDA);
  gpu::copy(ci, gi, GS());
  Tensor gi2 = Tensor::empty({4}, DType::I32, Device::CUDA);
  gpu::copy(gi, gi2, GS());
  Tensor back = to_cpu(gi2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<int32_t*>(back.raw())[i], ids[i]);
}

TEST_P(GpuOp, ElementwiseAddAxpyScaleFill) {
  const int64_t n = 100003;  // odd: exercises the vector tails
  Tensor a = rand_in({n}, 2, dt()), b = rand_in({n}, 3, dt());
  Tensor ga = to_gpu(a, dt()), gb = to_gpu(b, dt()), go = gpu_nan({n}, dt());
  gpu::add(ga, gb, go, GS());
  Tensor co = Tensor::empty({n}, DType::F32);
  cpu::add(a, b, co, CS());
  EXPECT_CLOSE(go, co, dt());

  // axpy into an f32 accumulator from an activation-dtype x (mixed dtypes).
  Tensor y = rand_f32({n}, 4);
  Tensor gy = to_gpu(y, DType::F32);
  gpu::axpy(0.37, ga, gy, GS());
  cpu::axpy(0.37, a, y, CS());
  EXPECT_CLOSE(gy, y, DType::F32);

  gpu::scale(ga, -1.5, GS());
  cpu::scale(a, -1.5, CS());
  EXPECT_CLOSE(ga, a, dt());

  gpu::fill(gb, 0.25, GS());
  Tensor cb = to_cpu(gb);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<float*>(cb.raw())[i], 0.25f);
}

// sum_squares_each (the gradient norm's ranges, one wait): each result the bits of
// sum_squares on that tensor alone, empty and bf16 tensors among them.
TEST(GpuOpF32, SumSquaresEachGivesTheBitsOfOneByOne) {
  MCPP_REQUIRE_GPU();
  const Tensor g = to_gpu(rand_f32({3 << 20}, 6), DType::F32);
  const Tensor b = to_gpu(rand_f32({70001}, 7), DType::BF16);
  const std::vector<Tensor> xs = {g.narrow(0, 1 << 20), g.narrow(1 << 20, 0), b,
                                  g.narrow(5, (2 << 20) + 3), g.narrow(0, 1)};
  const std::vector<double> each = gpu::sum_squares_each(xs, GS());
  ASSERT_EQ(each.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_EQ(each[i], gpu::sum_squares(xs[i], GS())) << i;  // the same bits
  EXPECT_EQ(each[1], 0.0);
  EXPECT_GT(each[3], each[0]);
  EXPECT_TRUE(gpu::sum_squares_each({}, GS()).empty());
}

TEST(GpuOpF32, SumSquaresAndNonfinite) {
  MCPP_REQUIRE_GPU();
  Tensor x = rand_f32({1 << 20}, 5);
  Tensor g = to_gpu(x, DType::F32);
  double want = cpu::sum_squares(x, CS());
  double got = gpu::sum_squares(g, GS());
  EXPECT_NEAR(got, want, 1e-9 * want);
  EXPECT_EQ(gpu::sum_squares(g, GS()), got);  // bitwise reproducible
  EXPECT_FALSE(gpu::has_nonfinite(g, GS()));
  static_cast<float*>(x.raw())[12345] = INFINITY;
  EXPECT_TRUE(gpu::has_nonfinite(to_gpu(x, DType::F32), GS()));
  static_cast<float*>(x.raw())[12345] = std::nanf("");
  EXPECT_TRUE(gpu::has_nonfinite(to_gpu(x, DType::BF16), GS()));
}

// ---- GEMM and linear ----------------------------------------------------------------

TEST_P(GpuOp, GemmAllTransposes) {
  const int64_t M = 67, N = 130, K = 95;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor A = rand_in(ta ? Shape{K, M} : Shape{M, K}, 10 + ta, dt());
      Tensor B = rand_in(tb ? Shape{N, K} : Shape{K, N}, 20 + tb, dt());
      Tensor C = rand_in({M, N}, 30, dt());
      Tensor gC = to_gpu(C, dt());
      gpu::gemm(ta, tb, 0.5, to_gpu(A, dt()), to_gpu(B, dt()), 0.25, gC, GS());
      cpu::gemm(ta, tb, 0.5, A, B, 0.25, C, CS());
      EXPECT_CLOSE(gC, C, dt()) << "ta=" << ta << " tb=" << tb;
      // f32 output from low-precision inputs (the parameter-gradient case).
      Tensor C32 = rand_f32({M, N}, 31);
      Tensor gC32 = to_gpu(C32, DType::F32);
      gpu::gemm(ta, tb, 1.0, to_gpu(A, dt()), to_gpu(B, dt()), 1.0, gC32, GS());
      cpu::gemm(ta, tb, 1.0, A, B, 1.0, C32, CS());
      EXPECT_CLOSE(gC32, C32, DType::F32 == dt() ? DType::F32 : DType::F16);
    }
}

TEST_P(GpuOp, LinearForwardBackward) {
  const int64_t S = 13, B = 3, in = 96, out = 72;
  Tensor x = rand_in({S, B, in}, 40, dt()), w = rand_in({out, in}, 41, dt(), -0.2f, 0.2f);
  for (DType bias_dt : {dt(), DType::F32}) {
    Tensor b = rand_in({out}, 42, dt());
    Tensor gy = gpu_nan({S, B, out}, dt());
    gpu::linear_forward(to_gpu(x, dt()), to_gpu(w, dt()), to_gpu(b, bias_dt), gy, GS());
    Tensor y = Tensor::empty({S, B, out}, DType::F32);
    cpu::linear_forward(x, w, b, y, CS());
    EXPECT_CLOSE(gy, y, dt()) << "bias " << dtype_name(bias_dt);
  }
  Tensor dy = rand_in({S, B, out}, 43, dt());
  for (bool acc : {false, true}) {
    Tensor dx = rand_in({S, B, in}, 44, dt()), dw = rand_f32({out, in}, 45),
           db = rand_f32({out}, 46);
    Tensor gdx = acc ? to_gpu(dx, dt()) : gpu_nan({S, B, in}, dt());
    Tensor gdw = to_gpu(dw, DType::F32), gdb = to_gpu(db, DType::F32);
    gpu::linear_backward(to_gpu(dy, dt()), to_gpu(x, dt()), to_gpu(w, dt()), gdx, acc, gdw, gdb,
                         GS());
    cpu::linear_backward(dy, x, w, dx, acc, dw, db, CS());
    EXPECT_CLOSE(gdx, dx, dt());
    EXPECT_CLOSE(gdw, dw, DType::F32 == dt() ? DType::F32 : DType::F16);
    EXPECT_CLOSE(gdb, db, DType::F32 == dt() ? DType::F32 : DType::F16);
  }
}

// ---- norms and activations ----------------------------------------------------------

TEST_P(GpuOp, LayerNormForwardBackward) {
  const int64_t T = 77, H = 160;
  Tensor x = rand_in({T, H}, 50, dt(), -2.f, 3.f), w = rand_in({H}, 51, dt()),
         b = rand_in({H}, 52, dt());
  Tensor y = Tensor::empty({T, H}, DType::F32), mean = Tensor::empty({T}, DType::F32),
         rstd = Tensor::empty({T}, DType::F32);
  cpu::layernorm_forward(x, w, b, 1e-5, y, mean, rstd, CS());
  Tensor gx = to_gpu(x, dt()), gw = to_gpu(w, DType::F32), gb = to_gpu(b, dt());
  Tensor gy = gpu_nan({T, H}, dt()), gm = gpu_nan({T}, DType::F32), gr = gpu_nan({T}, DType::F32);
  gpu::layernorm_forward(gx, gw, gb, 1e-5, gy, gm, gr, GS());
  EXPECT_CLOSE(gy, y, dt());
  EXPECT_CLOSE(gm, mean, DType::F32);
  EXPECT_CLOSE(gr, rstd, DType::F32);

  Tensor dy = rand_in({T, H}, 53, dt());
  Tensor dx = rand_in({T, H}, 54, dt()), dw = rand_f32({H}, 55), db = rand_f32({H}, 56);
  Tensor gdx = to_gpu(dx, dt()), gdw = to_gpu(dw, DType::F32), gdb = to_gpu(db, DType::F32);
  // Backward from the CPU's statistics so that both sides use the same mean/rstd.
  gpu::layernorm_backward(to_gpu(dy, dt()), gx, gw, to_gpu(mean, DType::F32),
                          to_gpu(rstd, DType::F32), gdx, true, gdw, gdb, GS());
  cpu::layernorm_backward(dy, x, w, mean, rstd, dx, true, dw, db, CS());
  EXPECT_CLOSE(gdx, dx, dt());
  EXPECT_CLOSE(gdw, dw, dt() == DType::F32 ? DType::F32 : DType::F16);
  EXPECT_CLOSE(gdb, db, dt() == DType::F32 ? DType::F32 : DType::F16);
}

TEST_P(GpuOp, RMSNormForwardBackward) {
  const int64_t T = 45, H = 1000;
  Tensor x = rand_in({T, H}, 60, dt(), -2.f, 3.f), w = rand_in({H}, 61, dt());
  Tensor y = Tensor::empty({T, H}, DType::F32), rstd = Tensor::empty({T}, DType::F32);
  cpu::rmsnorm_forward(x, w, 1e-6, y, rstd, CS());
  Tensor gx = to_gpu(x, dt()), gw = to_gpu(w, dt());
  Tensor gy = gpu_nan({T, H}, dt()), gr = gpu_nan({T}, DType::F32);
  gpu::rmsnorm_forward(gx, gw, 1e-6, gy, gr, GS());
  EXPECT_CLOSE(gy, y, dt());
  EXPECT_CLOSE(gr, rstd, DType::F32);
  Tensor dy = rand_in({T, H}, 62, dt());
  Tensor dx = Tensor::empty({T, H}, DType::F32), dw = rand_f32({H}, 63);
  Tensor gdx = gpu_nan({T, H}, dt()), gdw = to_gpu(dw, DType::F32);
  gpu::rmsnorm_backward(to_gpu(dy, dt()), gx, gw, to_gpu(rstd, DType::F32), gdx, false, gdw, GS());
  cpu::rmsnorm_backward(dy, x, w, rstd, dx, false, dw, CS());
  EXPECT_CLOSE(gdx, dx, dt());
  EXPECT_CLOSE(gdw, dw, dt() == DType::F32 ? DType::F32 : DType::F16);
}

// --qk-layernorm's per-head RMSNorm against the CPU op: HD 64 and 128, r = 1 and r = 4 (GQA),
// with and without 1p, weights in the activation dtype or f32. Forward out of place and in
// place (value heads passed through); backward in place, dwq and dwk accumulated in f32.
TEST_P(GpuOp, QkNormForwardBackward) {
  const int64_t T = 37, NG = 2;
  const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;  // for f32 gradients
  for (int64_t HD : {64, 128})
    for (int64_t r : {1, 4})
      for (bool one_plus : {false, true}) {
        const int64_t W = NG * (r + 2) * HD;
        const uint64_t seed = 300 + uint64_t(HD + 10 * r + one_plus);
        const std::string what = "HD=" + std::to_string(HD) + " r=" + std::to_string(r) +
                                 (one_plus ? " 1p" : "");
        Tensor x = rand_in({T, W}, seed, dt(), -2.f, 3.f), wq = rand_in({HD}, seed + 1, dt()),
               wk = rand_in({HD}, seed + 2, dt());
        Tensor y = Tensor::empty({T, W}, DType::F32);
        cpu::qk_norm_forward(x, wq, wk, r, 1e-6, one_plus, y, CS());
        const DType wt = one_plus ? DType::F32 : dt();
        Tensor gx = to_gpu(x, dt()), gwq = to_gpu(wq, wt), gwk = to_gpu(wk, wt);
        Tensor gy = gpu_nan({T, W}, dt());
        gpu::qk_norm_forward(gx, gwq, gwk, r, 1e-6, one_plus, gy, GS());
        EXPECT_CLOSE(gy, y, dt()) << what;
        Tensor gi = to_gpu(x, dt());
        gpu::qk_norm_forward(gi, gwq, gwk, r, 1e-6, one_plus, gi, GS());
        EXPECT_CLOSE(gi, y, dt()) << what << " in place";

        Tensor dx = rand_in({T, W}, seed + 3, dt());  // dL/dy in, dL/dx out
        Tensor dwq = rand_f32({HD}, seed + 4), dwk = rand_f32({HD}, seed + 5);
        Tensor gdx = to_gpu(dx, dt()), gdwq = to_gpu(dwq, DType::F32),
               gdwk = to_gpu(dwk, DType::F32);
        gpu::qk_norm_backward(gx, gwq, gwk, r, 1e-6, one_plus, gdx, gdwq, gdwk, GS());
        cpu::qk_norm_backward(x, wq, wk, r, 1e-6, one_plus, dx, dwq, dwk, CS());
        EXPECT_CLOSE(gdx, dx, dt()) << what;
        EXPECT_CLOSE(gdwq, dwq, gt) << what;
        EXPECT_CLOSE(gdwk, dwk, gt) << what;
      }
}

// dwq and dwk from per-block partial sums added in a fixed order: two runs give the same bits
// (rows spread over every block of the grid many times).
TEST_P(GpuOp, QkNormBackwardBitwiseReproducible) {
  const int64_t T = 4096, NG = 2, r = 4, HD = 128, W = NG * (r + 2) * HD;
  Tensor x = rand_in({T, W}, 400, dt(), -2.f, 3.f), wq = rand_in({HD}, 401, dt()),
         wk = rand_in({HD}, 402, dt()), dy = rand_in({T, W}, 403, dt());
  Tensor gx = to_gpu(x, dt()), gwq = to_gpu(wq, dt()), gwk = to_gpu(wk, dt());
  Tensor dq[2], dk[2];
  for (int run = 0; run < 2; ++run) {
    Tensor gdx = to_gpu(dy, dt());
    Tensor gdwq = to_gpu(Tensor::zeros({HD}, DType::F32), DType::F32);
    Tensor gdwk = to_gpu(Tensor::zeros({HD}, DType::F32), DType::F32);
    gpu::qk_norm_backward(gx, gwq, gwk, r, 1e-6, false, gdx, gdwq, gdwk, GS());
    dq[run] = to_cpu(gdwq), dk[run] = to_cpu(gdwk);
  }
  EXPECT_EQ(std::memcmp(dq[0].raw(), dq[1].raw(), HD * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(dk[0].raw(), dk[1].raw(), HD * sizeof(float)), 0);
  Tensor dwq = Tensor::zeros({HD}, DType::F32), dwk = Tensor::zeros({HD}, DType::F32);
  cpu::qk_norm_backward(x, wq, wk, r, 1e-6, false, dy, dwq, dwk, CS());
  const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;
  EXPECT_LE(rel_err(dq[0], dwq), tol(gt));
  EXPECT_LE(rel_err(dk[0], dwk), tol(gt));
}

// --qk-layernorm with --normalization LayerNorm against the CPU op: HD 40 (lanes past the
// head masked out of the mean and variance), 64 and 128; r = 1 and r = 4 (GQA); with and
// without 1p; weights and biases in the activation dtype or f32. Forward out of place and in
// place; backward in place, dwq, dbq, dwk, dbk accumulated in f32.
TEST_P(GpuOp, QkLayerNormForwardBackward) {
  const int64_t T = 37, NG = 2;
  const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;  // for f32 gradients
  for (int64_t HD : {40, 64, 128})
    for (int64_t r : {1, 4})
      for (bool one_plus : {false, true}) {
        const int64_t W = NG * (r + 2) * HD;
        const uint64_t seed = 500 + uint64_t(HD + 10 * r + one_plus);
        const std::string what =
            "HD=" + std::to_string(HD) + " r=" + std::to_string(r) + (one_plus ? " 1p" : "");
        Tensor x = rand_in({T, W}, seed, dt(), -2.f, 3.f), wq = rand_in({HD}, seed + 1, dt()),
               wk = rand_in({HD}, seed + 2, dt()), bq = rand_in({HD}, seed + 6, dt()),
               bk = rand_in({HD}, seed + 7, dt());
        Tensor y = Tensor::empty({T, W}, DType::F32);
        cpu::qk_layernorm_forward(x, wq, bq, wk, bk, r, 1e-5, one_plus, y, CS());
        const DType wt = one_plus ? DType::F32 : dt();
        Tensor gx = to_gpu(x, dt()), gwq = to_gpu(wq, wt), gwk = to_gpu(wk, wt);
        Tensor gbq = to_gpu(bq, wt), gbk = to_gpu(bk, wt);
        Tensor gy = gpu_nan({T, W}, dt());
        gpu::qk_layernorm_forward(gx, gwq, gbq, gwk, gbk, r, 1e-5, one_plus, gy, GS());
        EXPECT_CLOSE(gy, y, dt()) << what;
        Tensor gi = to_gpu(x, dt());
        gpu::qk_layernorm_forward(gi, gwq, gbq, gwk, gbk, r, 1e-5, one_plus, gi, GS());
        EXPECT_CLOSE(gi, y, dt()) << what << " in place";

        Tensor dx = rand_in({T, W}, seed + 3, dt());  // dL/dy in, dL/dx out
        Tensor dwq = rand_f32({HD}, seed + 4), dwk = rand_f32({HD}, seed + 5);
        Tensor dbq = rand_f32({HD}, seed + 8), dbk = rand_f32({HD}, seed + 9);
        Tensor gdx = to_gpu(dx, dt()), gdwq = to_gpu(dwq, DType::F32),
               gdwk = to_gpu(dwk, DType::F32), gdbq = to_gpu(dbq, DType::F32),
               gdbk = to_gpu(dbk, DType::F32);
        gpu::qk_layernorm_backward(gx, gwq, gwk, r, 1e-5, one_plus, gdx, gdwq, gdbq, gdwk, gdbk,
                                   GS());
        cpu::qk_layernorm_backward(x, wq, wk, r, 1e-5, one_plus, dx, dwq, dbq, dwk, dbk, CS());
        EXPECT_CLOSE(gdx, dx, dt()) << what;
        EXPECT_CLOSE(gdwq, dwq, gt) << what;
        EXPECT_CLOSE(gdwk, dwk, gt) << what;
        EXPECT_CLOSE(gdbq, dbq, gt) << what;
        EXPECT_CLOSE(gdbk, dbk, gt) << what;
      }
}

// The LayerNorm form's four parameter gradients from per-block partial sums added in a fixed
// order: two runs give the same bits.
TEST_P(GpuOp, QkLayerNormBackwardBitwiseReproducible) {
  const int64_t T = 4096, NG = 2, r = 4, HD = 128, W = NG * (r + 2) * HD;
  Tensor x = rand_in({T, W}, 600, dt(), -2.f, 3.f), wq = rand_in({HD}, 601, dt()),
         wk = rand_in({HD}, 602, dt()), dy = rand_in({T, W}, 603, dt());
  Tensor gx = to_gpu(x, dt()), gwq = to_gpu(wq, dt()), gwk = to_gpu(wk, dt());
  Tensor got[2][4];  // dwq, dbq, dwk, dbk
  for (int run = 0; run < 2; ++run) {
    Tensor gdx = to_gpu(dy, dt()), g[4];
    for (auto& t : g) t = to_gpu(Tensor::zeros({HD}, DType::F32), DType::F32);
    gpu::qk_layernorm_backward(gx, gwq, gwk, r, 1e-5, false, gdx, g[0], g[1], g[2], g[3], GS());
    for (int p = 0; p < 4; ++p) got[run][p] = to_cpu(g[p]);
  }
  Tensor want[4];
  for (auto& t : want) t = Tensor::zeros({HD}, DType::F32);
  cpu::qk_layernorm_backward(x, wq, wk, r, 1e-5, false, dy, want[0], want[1], want[2], want[3],
                             CS());
  const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(std::memcmp(got[0][p].raw(), got[1][p].raw(), HD * sizeof(float)), 0) << p;
    EXPECT_LE(rel_err(got[0][p], want[p]), tol(gt)) << p;
  }
}

// The shapes of the 16-byte-vector kernels: one warp a row (H = 768), then 2 to 16 warps a row
// (H = 2048 to 12288; the largest stream in f32), row counts that leave the last row group of
// a block partly empty, dx written and accumulated.
TEST_P(GpuOp, NormVectorisedShapes) {
  using Shape2 = std::pair<int64_t, int64_t>;
  for (auto [T, H] : {Shape2{300, 768}, Shape2{64, 2048}, Shape2{67, 2048}, Shape2{19, 4096},
                      Shape2{9, 8192}, Shape2{5, 12288}}) {
    const uint64_t seed = 100 + uint64_t(T + H);
    Tensor x = rand_in({T, H}, seed, dt(), -2.f, 3.f), w = rand_in({H}, seed + 1, dt()),
           b = rand_in({H}, seed + 2, dt()), dy = rand_in({T, H}, seed + 3, dt());
    Tensor gx = to_gpu(x, dt()), gdy = to_gpu(dy, dt());
    const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;  // for f32 gradients
    for (bool rms : {false, true})
      for (bool acc : {false, true}) {
        std::string what = std::string(rms ? "rmsnorm" : "layernorm") + " T=" + std::to_string(T) +
                           " H=" + std::to_string(H) + (acc ? " accumulate" : "");
        Tensor y = Tensor::empty({T, H}, DType::F32), mean = Tensor::empty({T}, DType::F32),
               rstd = Tensor::empty({T}, DType::F32);
        // LayerNorm with an f32 weight and an activation-dtype bias; RMSNorm with an
        // activation-dtype weight.
        Tensor gw = to_gpu(w, rms ? dt() : DType::F32), gb = to_gpu(b, dt());
        Tensor gy = gpu_nan({T, H}, dt()), gm = gpu_nan({T}, DType::F32),
               gr = gpu_nan({T}, DType::F32);
        if (rms) {
          cpu::rmsnorm_forward(x, w, 1e-6, y, rstd, CS());
          gpu::rmsnorm_forward(gx, gw, 1e-6, gy, gr, GS());
        } else {
          cpu::layernorm_forward(x, w, b, 1e-5, y, mean, rstd, CS());
          gpu::layernorm_forward(gx, gw, gb, 1e-5, gy, gm, gr, GS());
          EXPECT_CLOSE(gm, mean, DType::F32) << what;
        }
        EXPECT_CLOSE(gy, y, dt()) << what;
        EXPECT_CLOSE(gr, rstd, DType::F32) << what;

        Tensor dx = acc ? rand_in({T, H}, seed + 4, dt()) : Tensor::empty({T, H}, DType::F32);
        Tensor dw = rand_f32({H}, seed + 5), db = rand_f32({H}, seed + 6);
        Tensor gdx = acc ? to_gpu(dx, dt()) : gpu_nan({T, H}, dt());
        Tensor gdw = to_gpu(dw, DType::F32), gdb = to_gpu(db, DType::F32);
        Tensor grs = to_gpu(rstd, DType::F32);
        if (rms) {
          gpu::rmsnorm_backward(gdy, gx, gw, grs, gdx, acc, gdw, GS());
          cpu::rmsnorm_backward(dy, x, w, rstd, dx, acc, dw, CS());
        } else {
          gpu::layernorm_backward(gdy, gx, gw, to_gpu(mean, DType::F32), grs, gdx, acc, gdw, gdb,
                                  GS());
          cpu::layernorm_backward(dy, x, w, mean, rstd, dx, acc, dw, db, CS());
          EXPECT_CLOSE(gdb, db, gt) << what;
        }
        EXPECT_CLOSE(gdx, dx, dt()) << what;
        EXPECT_CLOSE(gdw, dw, gt) << what;
      }
  }
}

// dw/db come from per-block partial sums added in a fixed order: two runs give the same bits
// (rows spread over every block of the grid several times; a vectorised and a streaming H).
TEST_P(GpuOp, NormBackwardBitwiseReproducible) {
  using Shape2 = std::pair<int64_t, int64_t>;
  for (auto [T, H] : {Shape2{20000, 768}, Shape2{3001, 77}}) {
    Tensor x = rand_in({T, H}, 80, dt(), -2.f, 3.f), w = rand_in({H}, 81, dt()),
           b = rand_in({H}, 82, dt()), dy = rand_in({T, H}, 83, dt());
    Tensor y = Tensor::empty({T, H}, DType::F32), mean = Tensor::empty({T}, DType::F32),
           rstd = Tensor::empty({T}, DType::F32);
    cpu::layernorm_forward(x, w, b, 1e-5, y, mean, rstd, CS());
    Tensor gx = to_gpu(x, dt()), gdy = to_gpu(dy, dt()), gw = to_gpu(w, dt());
    Tensor gm = to_gpu(mean, DType::F32), gr = to_gpu(rstd, DType::F32);
    Tensor gdx = gpu_nan({T, H}, dt());
    Tensor dws[2], dbs[2];
    for (int run = 0; run < 2; ++run) {
      Tensor gdw = to_gpu(Tensor::zeros({H}, DType::F32), DType::F32);
      Tensor gdb = to_gpu(Tensor::zeros({H}, DType::F32), DType::F32);
      gpu::layernorm_backward(gdy, gx, gw, gm, gr, gdx, false, gdw, gdb, GS());
      dws[run] = to_cpu(gdw), dbs[run] = to_cpu(gdb);
    }
    EXPECT_EQ(std::memcmp(dws[0].raw(), dws[1].raw(), H * sizeof(float)), 0) << "H=" << H;
    EXPECT_EQ(std::memcmp(dbs[0].raw(), dbs[1].raw(), H * sizeof(float)), 0) << "H=" << H;
    Tensor dx = Tensor::empty({T, H}, DType::F32), dw = Tensor::zeros({H}, DType::F32),
           db = Tensor::zeros({H}, DType::F32);
    cpu::layernorm_backward(dy, x, w, mean, rstd, dx, false, dw, db, CS());
    const DType gt = dt() == DType::F32 ? DType::F32 : DType::F16;
    EXPECT_LE(rel_err(dws[0], dw), tol(gt)) << "H=" << H;
    EXPECT_LE(rel_err(dbs[0], db), tol(gt)) << "H=" << H;
    EXPECT_CLOSE(gdx, dx, dt()) << "H=" << H;

    // RMSNorm, dw only and no dx.
    Tensor none, rs = Tensor::empty({T}, DType::F32);
    cpu::rmsnorm_forward(x, w, 1e-6, y, rs, CS());
    Tensor grs = to_gpu(rs, DType::F32);
    for (int run = 0; run < 2; ++run) {
      Tensor gdw = to_gpu(Tensor::zeros({H}, DType::F32), DType::F32);
      gpu::rmsnorm_backward(gdy, gx, gw, grs, none, false, gdw, GS());
      dws[run] = to_cpu(gdw);
    }
    EXPECT_EQ(std::memcmp(dws[0].raw(), dws[1].raw(), H * sizeof(float)), 0) << "rms H=" << H;
    dw = Tensor::zeros({H}, DType::F32);
    cpu::rmsnorm_backward(dy, x, w, rs, dx, false, dw, CS());
    EXPECT_LE(rel_err(dws[0], dw), tol(gt)) << "rms H=" << H;
  }
}

TEST_P(GpuOp, GeluSwiGLU) {
  const int64_t T = 33, F = 200;
  Tensor x = rand_in({T, 2 * F}, 70, dt(), -4.f, 4.f), dy = rand_in({T, 2 * F}, 71, dt());
  Tensor y = Tensor::empty({T, 2 * F}, DType::F32), dx = Tensor::empty({T, 2 * F}, DType::F32);
  Tensor gx = to_gpu(x, dt()), gy = gpu_nan({T, 2 * F}, dt()), gdx = gpu_nan({T, 2 * F}, dt());
  cpu::gelu_forward(x, y, CS());
  gpu::gelu_forward(gx, gy, GS());
  EXPECT_CLOSE(gy, y, dt());
  cpu::gelu_backward(dy, x, dx, CS());
  gpu::gelu_backward(to_gpu(dy, dt()), gx, gdx, GS());
  EXPECT_CLOSE(gdx, dx, dt());
  // The exact GELU: the vector kernel on the whole tensor, the scalar one on a view that
  // starts one element in (not 16-byte aligned); neither is the tanh form's result.
  cpu::gelu_erf_forward(x, y, CS());
  gpu::gelu_erf_forward(gx, gy, GS());
  EXPECT_CLOSE(gy, y, dt());
  Tensor th = Tensor::empty({T, 2 * F}, DType::F32);
  cpu::gelu_forward(x, th, CS());
  EXPECT_GT(rel_err(th, y), 1e-6);
  cpu::gelu_erf_backward(dy, x, dx, CS());
  gpu::gelu_erf_backward(to_gpu(dy, dt()), gx, gdx, GS());
  EXPECT_CLOSE(gdx, dx, dt());
  {
    const int64_t n = T * 2 * F - 1;
    Tensor gxo = gx.view({-1}).narrow(1, n), gyo = gpu_nan({n}, dt());
    Tensor xo = x.view({-1}).narrow(1, n).clone(), yo = Tensor::empty({n}, DType::F32);
    cpu::gelu_erf_forward(xo, yo, CS());
    gpu::gelu_erf_forward(gxo, gyo, GS());
    EXPECT_CLOSE(gyo, yo, dt());
  }

  Tensor sy = Tensor::empty({T, F}, DType::F32), gsy = gpu_nan({T, F}, dt());
  cpu::swiglu_forward(x, sy, CS());
  gpu::swiglu_forward(gx, gsy, GS());
  EXPECT_CLOSE(gsy, sy, dt());
  Tensor sdy = rand_in({T, F}, 72, dt());
  Tensor sdx = Tensor::empty({T, 2 * F}, DType::F32), gsdx = gpu_nan({T, 2 * F}, dt());
  cpu::swiglu_backward(sdy, x, sdx, CS());
  gpu::swiglu_backward(to_gpu(sdy, dt()), gx, gsdx, GS());
  EXPECT_CLOSE(gsdx, sdx, dt());
}

// ---- dropout: the same mask as the CPU, bit for bit -------------------------------

// d2 = 300 takes the kernel's aligned path (one Philox block per 4 elements), 301 the
// per-element path; the partition at offset 100 is aligned for 300, not for 301.
class GpuDropout : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
};

TEST_P(GpuDropout, SameMaskAsCpuWholeAndPartitioned) {
  const int64_t d0 = 9, d1 = 4, d2 = GetParam(), w2 = d2 == 300 ? 152 : 150;
  const ops::DropoutKey key{1234, 99};
  Tensor x = rand_f32({d0, d1, d2}, 80, 0.5f, 1.5f);  // never zero: zero <=> dropped
  for (double p : {0.1, 0.5, 0.9}) {
    auto g = ops::GlobalIndex3::whole(d0, d1, d2);
    Tensor y = Tensor::empty({d0, d1, d2}, DType::F32);
    cpu::dropout_add_forward(x, Tensor(), p, key, g, y, CS());
    Tensor gy = gpu_nan({d0, d1, d2}, DType::F32);
    gpu::dropout_add_forward(to_gpu(x, DType::F32), Tensor(), p, key, g, gy, GS());
    Tensor cy = to_cpu(gy);
    ASSERT_EQ(std::memcmp(cy.raw(), y.raw(), y.nbytes()), 0) << "p=" << p;

    // A block of the global tensor (as under SP/TP/DP) draws the same mask.
    ops::GlobalIndex3 part{{3, 1, 100}, {d0, d1, d2}};
    Tensor xb = Tensor::empty({4, 2, w2}, DType::F32);
    for (int64_t i0 = 0; i0 < 4; ++i0)
      for (int64_t i1 = 0; i1 < 2; ++i1)
        for (int64_t i2 = 0; i2 < w2; ++i2)
          static_cast<float*>(xb.raw())[(i0 * 2 + i1) * w2 + i2] =
              static_cast<float*>(x.raw())[((i0 + 3) * d1 + i1 + 1) * d2 + i2 + 100];
    Tensor gyb = gpu_nan({4, 2, w2}, DType::F32);
    gpu::dropout_add_forward(to_gpu(xb, DType::F32), Tensor(), p, key, part, gyb, GS());
    Tensor cyb = to_cpu(gyb);
    for (int64_t i0 = 0; i0 < 4; ++i0)
      for (int64_t i1 = 0; i1 < 2; ++i1)
        for (int64_t i2 = 0; i2 < w2; ++i2)
          ASSERT_EQ(static_cast<float*>(cyb.raw())[(i0 * 2 + i1) * w2 + i2],
                    static_cast<float*>(y.raw())[((i0 + 3) * d1 + i1 + 1) * d2 + i2 + 100]);

    // A context-parallel rank's two chunks (global rows 1-2 and 6-7: split0 2, jump0 3),
    // forward and backward, draw the whole tensor's mask on those rows.
    ops::GlobalIndex3 two = g;
    two.offset[0] = 1, two.split0 = 2, two.jump0 = 3;
    const int64_t rows[4] = {1, 2, 6, 7}, R = d1 * d2;
    Tensor xc = Tensor::empty({4, d1, d2}, DType::F32);
    for (int64_t i = 0; i < 4; ++i)
      std::memcpy(static_cast<float*>(xc.raw()) + i * R, static_cast<float*>(x.raw()) + rows[i] * R,
                  size_t(R) * sizeof(float));
    Tensor gyc = gpu_nan({4, d1, d2}, DType::F32), gdc = gpu_nan({4, d1, d2}, DType::F32);
    gpu::dropout_add_forward(to_gpu(xc, DType::F32), Tensor(), p, key, two, gyc, GS());
    gpu::dropout_backward(to_gpu(xc, DType::F32), p, key, two, gdc, GS());
    Tensor cyc = to_cpu(gyc), cdc = to_cpu(gdc), dwhole = Tensor::empty({d0, d1, d2}, DType::F32);
    cpu::dropout_backward(x, p, key, g, dwhole, CS());
    for (int64_t i = 0; i < 4; ++i) {
      ASSERT_EQ(std::memcmp(static_cast<float*>(cyc.raw()) + i * R,
                            static_cast<float*>(y.raw()) + rows[i] * R, size_t(R) * sizeof(float)),
                0)
          << "chunk row " << i << " p=" << p;
      ASSERT_EQ(std::memcmp(static_cast<float*>(cdc.raw()) + i * R,
                            static_cast<float*>(dwhole.raw()) + rows[i] * R, size_t(R) * sizeof(float)),
                0)
          << "backward, chunk row " << i << " p=" << p;
    }

    // Backward and the residual form.
    Tensor dx = Tensor::empty({d0, d1, d2}, DType::F32), gdx = gpu_nan({d0, d1, d2}, DType::F32);
    cpu::dropout_backward(x, p, key, g, dx, CS());
    gpu::dropout_backward(to_gpu(x, DType::F32), p, key, g, gdx, GS());
    Tensor cdx = to_cpu(gdx);
    ASSERT_EQ(std::memcmp(cdx.raw(), dx.raw(), dx.nbytes()), 0);
    Tensor res = rand_f32({d0, d1, d2}, 81);
    Tensor out = Tensor::empty({d0, d1, d2}, DType::F32);
    cpu::dropout_add_forward(x, res, p, key, g, out, CS());
    for (DType dt : {DType::F32, DType::BF16}) {
      Tensor gres = to_gpu(rounded(res, dt), dt);
      gpu::dropout_add_forward(to_gpu(rounded(x, dt), dt), gres, p, key, g, gres, GS());
      Tensor want = Tensor::empty({d0, d1, d2}, DType::F32);
      cpu::dropout_add_forward(rounded(x, dt), rounded(res, dt), p, key, g, want, CS());
      EXPECT_CLOSE(gres, want, dt);
    }
  }
}

// ---- embeddings and cross-entropy ---------------------------------------------------

TEST_P(GpuOp, EmbeddingsForwardBackward) {
  const int64_t B = 3, S = 40, H = 48, Vl = 50, vs = 20;
  std::vector<int32_t> ids(B * S);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t(Philox::u32(5, 5, i) % 90);  // some outside [20, 70), many repeats
  Tensor cid = Tensor::from(ids, {B, S});
  Tensor gid = Tensor::empty({B, S}, DType::I32, Device::CUDA);
  gpu::copy(cid, gid, GS());
  Tensor table = rand_in({Vl, H}, 90, dt());
  Tensor y = Tensor::empty({S, B, H}, DType::F32), gy = gpu_nan({S, B, H}, dt());
  cpu::embedding_forward(cid, table, vs, y, CS());
  gpu::embedding_forward(gid, to_gpu(table, dt()), vs, gy, GS());
  EXPECT_CLOSE(gy, y, dt());

  Tensor pos = rand_in({S + 5, H}, 91, dt());
  cpu::position_embedding_forward(pos, 3, y, CS());
  gpu::position_embedding_forward(to_gpu(pos, dt()), 3, gy, GS());
  EXPECT_CLOSE(gy, y, dt());

  Tensor dy = rand_in({S, B, H}, 92, dt());
  Tensor dt_ = rand_f32({Vl, H}, 93), dpos = rand_f32({S + 5, H}, 94);
  Tensor gdt = to_gpu(dt_, DType::F32), gdpos = to_gpu(dpos, DType::F32), gdy = to_gpu(dy, dt());
  cpu::embedding_backward(dy, cid, vs, dt_, CS());
  gpu::embedding_backward(gdy, gid, vs, gdt, GS());
  EXPECT_CLOSE(gdt, dt_, DType::F32);
  // Deterministic: the same inputs give the same bits.
  Tensor z1 = gpu_nan({Vl, H}, DType::F32), z2 = gpu_nan({Vl, H}, DType::F32);
  gpu::fill(z1, 0.0, GS());
  gpu::fill(z2, 0.0, GS());
  gpu::embedding_backward(gdy, gid, vs, z1, GS());
  gpu::embedding_backward(gdy, gid, vs, z2, GS());
  Tensor c1 = to_cpu(z1), c2 = to_cpu(z2);
  EXPECT_EQ(std::memcmp(c1.raw(), c2.raw(), c1.nbytes()), 0);
  cpu::position_embedding_backward(dy, 3, dpos, CS());
  gpu::position_embedding_backward(gdy, 3, gdpos, GS());
  EXPECT_CLOSE(gdpos, dpos, DType::F32);
}

// Row lengths: 1000 and 12008 take the 16-byte vector kernels (12008 long enough for their
// unrolled loop), 1003 the element-wise ones.
TEST_P(GpuOp, CrossEntropyVocabSlice) {
  for (int64_t Vl : {int64_t(1000), int64_t(1003), int64_t(12008)}) {
    SCOPED_TRACE(::testing::Message() << "Vl=" << Vl);
    const int64_t T = 37, vs = 500;
    Tensor logits = rand_in({T, Vl}, 100, dt(), -5.f, 5.f);
    std::vector<int64_t> tg(T);
    for (int64_t i = 0; i < T; ++i) tg[i] = int64_t(Philox::u32(6, 6, uint64_t(i)) % 2000);
    Tensor ct = Tensor::from(tg, {T});
    Tensor gt = Tensor::empty({T}, DType::I64, Device::CUDA);
    gpu::copy(ct, gt, GS());
    Tensor gl = to_gpu(logits, dt());
    auto f32 = [&] { return Tensor::empty({T}, DType::F32); };
    auto g32 = [&] { return gpu_nan({T}, DType::F32); };
    Tensor mx = f32(), se = f32(), tl = f32(), loss = f32();
    Tensor gmx = g32(), gse = g32(), gtl = g32(), gloss = g32();
    cpu::ce_row_max(logits, mx, CS());
    gpu::ce_row_max(gl, gmx, GS());
    EXPECT_CLOSE(gmx, mx, DType::F32);
    cpu::ce_sum_exp_target(logits, mx, ct, vs, se, tl, CS());
    gpu::ce_sum_exp_target(gl, gmx, gt, vs, gse, gtl, GS());
    EXPECT_CLOSE(gse, se, DType::F32);
    EXPECT_CLOSE(gtl, tl, DType::F32);
    cpu::ce_loss(mx, se, tl, loss, CS());
    gpu::ce_loss(gmx, gse, gtl, gloss, GS());
    EXPECT_CLOSE(gloss, loss, DType::F32);
    Tensor dloss = rand_f32({T}, 101);
    Tensor dl = Tensor::empty({T, Vl}, DType::F32);
    cpu::ce_backward(logits, mx, se, ct, vs, dloss, dl, CS());
    gpu::ce_backward(gl, gmx, gse, gt, vs, to_gpu(dloss, DType::F32), gl, GS());  // in place
    EXPECT_CLOSE(gl, dl, dt());
  }
}

// ce_stats (one pass, online softmax) against the CPU op. Row lengths: 1000 and 12008 take
// the vector kernel (12008 long enough for its four-load loop), 1003 the element-wise one.
// Logits in [-30, 30], row 0's max in its last column, row 1 rising (its running max grows
// in every group of values); targets inside and outside [vs, vs + Vl), i32 and i64.
TEST_P(GpuOp, CrossEntropyOnePassStats) {
  for (int64_t Vl : {int64_t(1000), int64_t(1003), int64_t(12008)}) {
    SCOPED_TRACE(::testing::Message() << "Vl=" << Vl);
    const int64_t T = 37, vs = 500;
    Tensor logits = rand_f32({T, Vl}, 102, -30.f, 30.f);
    float* p = static_cast<float*>(logits.raw());
    p[Vl - 1] = 40.f;
    for (int64_t j = 0; j < Vl; ++j) p[Vl + j] = -30.f + 60.f * float(j) / float(Vl);
    logits = rounded(logits, dt());
    std::vector<int64_t> tg(T);
    for (int64_t i = 0; i < T; ++i) tg[i] = int64_t(Philox::u32(7, 7, uint64_t(i)) % 2000);
    tg[0] = vs + Vl - 1, tg[1] = vs, tg[2] = vs - 1, tg[3] = vs + Vl;
    const DType it = Vl == 1003 ? DType::I32 : DType::I64;
    Tensor ct = Tensor::empty({T}, it);
    cpu::copy(Tensor::from(tg, {T}), ct, CS());
    Tensor gt = Tensor::empty({T}, it, Device::CUDA);
    gpu::copy(ct, gt, GS());
    Tensor gl = to_gpu(logits, dt());
    auto f32 = [&] { return Tensor::empty({T}, DType::F32); };
    auto g32 = [&] { return gpu_nan({T}, DType::F32); };
    Tensor mx = f32(), se = f32(), tl = f32();
    Tensor gmx = g32(), gse = g32(), gtl = g32();
    cpu::ce_stats(logits, ct, vs, mx, se, tl, CS());
    gpu::ce_stats(gl, gt, vs, gmx, gse, gtl, GS());
    Tensor cmx = to_cpu(gmx), ctl = to_cpu(gtl), cse = to_cpu(gse);
    EXPECT_EQ(std::memcmp(cmx.raw(), mx.raw(), mx.nbytes()), 0) << "row max (exact)";
    EXPECT_EQ(std::memcmp(ctl.raw(), tl.raw(), tl.nbytes()), 0) << "target logit (exact)";
    EXPECT_CLOSE(gse, se, DType::F32);
    // The two-pass kernels agree.
    Tensor gmx2 = g32(), gse2 = g32(), gtl2 = g32();
    gpu::ce_row_max(gl, gmx2, GS());
    gpu::ce_sum_exp_target(gl, gmx2, gt, vs, gse2, gtl2, GS());
    EXPECT_CLOSE(gse, to_cpu(gse2), DType::F32);
    // Deterministic: a second call gives the same bits.
    Tensor gmx3 = g32(), gse3 = g32(), gtl3 = g32();
    gpu::ce_stats(gl, gt, vs, gmx3, gse3, gtl3, GS());
    Tensor c3[3] = {to_cpu(gmx3), to_cpu(gse3), to_cpu(gtl3)};
    EXPECT_EQ(std::memcmp(c3[0].raw(), cmx.raw(), cmx.nbytes()), 0);
    EXPECT_EQ(std::memcmp(c3[1].raw(), cse.raw(), cse.nbytes()), 0);
    EXPECT_EQ(std::memcmp(c3[2].raw(), ctl.raw(), ctl.nbytes()), 0);
  }
}

// Two vocab shards (TP = 2) through ce_stats, the MAX of the row maxima, ce_rescale_sum_exp
// and the SUM: the whole vocabulary's loss. The second shard sits 8 below the first in
// half the rows, so the rescale factors are far from 1.
TEST_P(GpuOp, CrossEntropyOnePassShardsCombine) {
  const int64_t T = 37, V = 1000, cut[3] = {0, 504, V};
  Tensor whole = rand_f32({T, V}, 103, -30.f, 30.f);
  float* w = static_cast<float*>(whole.raw());
  for (int64_t t = 0; t < T; t += 2)
    for (int64_t j = cut[1]; j < V; ++j) w[t * V + j] -= 8.f;
  whole = rounded(whole, dt());  // a new buffer for bf16/f16
  const float* wr = static_cast<const float*>(whole.raw());
  std::vector<int64_t> tg(T);
  for (int64_t i = 0; i < T; ++i) tg[i] = int64_t(Philox::u32(8, 8, uint64_t(i)) % uint64_t(V));
  Tensor ct = Tensor::from(tg, {T});
  Tensor gt = Tensor::empty({T}, DType::I64, Device::CUDA);
  gpu::copy(ct, gt, GS());
  Tensor mx = Tensor::empty({T}, DType::F32), se = Tensor::empty({T}, DType::F32),
         tl = Tensor::empty({T}, DType::F32), loss = Tensor::empty({T}, DType::F32);
  cpu::ce_stats(whole, ct, 0, mx, se, tl, CS());
  cpu::ce_loss(mx, se, tl, loss, CS());

  Tensor gmx[2], gse[2], gtl[2], lmx[2];
  std::vector<float> gmax(size_t(T), -INFINITY);
  for (int r = 0; r < 2; ++r) {
    const int64_t Vr = cut[r + 1] - cut[r];
    Tensor part = Tensor::empty({T, Vr}, DType::F32);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(static_cast<float*>(part.raw()) + t * Vr, wr + t * V + cut[r],
                  size_t(Vr) * sizeof(float));
    gmx[r] = gpu_nan({T}, DType::F32), gse[r] = gpu_nan({T}, DType::F32);
    gtl[r] = gpu_nan({T}, DType::F32);
    gpu::ce_stats(to_gpu(part, dt()), gt, cut[r], gmx[r], gse[r], gtl[r], GS());
    lmx[r] = to_cpu(gmx[r]);
    for (int64_t t = 0; t < T; ++t)
      gmax[size_t(t)] = std::max(gmax[size_t(t)], static_cast<const float*>(lmx[r].raw())[t]);
  }
  Tensor cgmax = Tensor::from(gmax, {T}), ggmax = to_gpu(cgmax, DType::F32);
  std::vector<double> sum(size_t(T), 0.0), tsum(size_t(T), 0.0);
  for (int r = 0; r < 2; ++r) {
    Tensor want = to_cpu(gse[r]);  // the CPU rescale of the same numbers
    cpu::ce_rescale_sum_exp(lmx[r], cgmax, want, CS());
    gpu::ce_rescale_sum_exp(gmx[r], ggmax, gse[r], GS());
    EXPECT_CLOSE(gse[r], want, DType::F32);
    Tensor s = to_cpu(gse[r]), l = to_cpu(gtl[r]);
    for (int64_t t = 0; t < T; ++t) {
      sum[size_t(t)] += static_cast<const float*>(s.raw())[t];
      tsum[size_t(t)] += static_cast<const float*>(l.raw())[t];
    }
  }
  Tensor got = Tensor::empty({T}, DType::F32);
  for (int64_t t = 0; t < T; ++t)
    static_cast<float*>(got.raw())[t] =
        float(std::log(sum[size_t(t)]) + gmax[size_t(t)] - tsum[size_t(t)]);
  EXPECT_LE(rel_err(got, loss), tol(DType::F32));
}

// ---- attention and RoPE -------------------------------------------------------------

struct AttnCase {
  int64_t S, B, NH, NG, HD;
  double p;
};

void run_attention(DType dt, const AttnCase& c) {
  ops::AttentionDims d;
  d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
  const double scale = 1.0 / std::sqrt(double(c.HD));
  const ops::DropoutKey key{7, 8};
  Tensor qkv = rand_in({c.S, c.B, d.qkv_width()}, 110, dt, -2.f, 2.f);
  Tensor out = Tensor::empty({c.S, c.B, c.NH * c.HD}, DType::F32);
  Tensor lse = Tensor::empty({c.B, c.NH, c.S}, DType::F32);
  cpu::attention_forward(qkv, d, scale, c.p, key, out, lse, CS());
  Tensor gqkv = to_gpu(qkv, dt);
  Tensor gout = gpu_nan(out.shape(), dt), glse = gpu_nan(lse.shape(), DType::F32);
  gpu::attention_forward(gqkv, d, scale, c.p, key, gout, glse, GS());
  SCOPED_TRACE(::testing::Message() << "S=" << c.S << " B=" << c.B << " NH=" << c.NH
                                    << " NG=" << c.NG << " HD=" << c.HD << " p=" << c.p
                                    << " dtype=" << dtype_name(dt));
  EXPECT_CLOSE(gout, out, dt);
  EXPECT_CLOSE(glse, lse, DType::F32);

  // Backward from the same saved tensors on both sides (the CPU's out, rounded to dt).
  Tensor dout = rand_in(out.shape(), 111, dt);
  Tensor out_r = rounded(out, dt);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
  cpu::attention_backward(dout, qkv, out_r, lse, d, scale, c.p, key, dqkv, CS());
  Tensor gdqkv = gpu_nan(qkv.shape(), dt);
  gpu::attention_backward(to_gpu(dout, dt), gqkv, to_gpu(out_r, dt), to_gpu(lse, DType::F32), d,
                          scale, c.p, key, gdqkv, GS());
  EXPECT_CLOSE(gdqkv, dqkv, dt);
}

TEST_P(GpuOp, AttentionCausalGQA) {
  for (AttnCase c : {AttnCase{100, 2, 4, 4, 64, 0.0}, AttnCase{130, 2, 6, 2, 64, 0.0},
                     AttnCase{64, 1, 4, 1, 128, 0.0}, AttnCase{77, 2, 4, 2, 32, 0.0}})
    run_attention(dt(), c);
}

TEST(GpuAttention, DropoutSameMaskAsCpu) {
  MCPP_REQUIRE_GPU();
  run_attention(DType::F32, AttnCase{90, 2, 4, 2, 64, 0.2});
}

// Generation's attention through a KV cache: prefill, decode steps and a chunk, each
// against the CPU op (which tests/inference checks against a naive reference).
TEST_P(GpuOp, AttentionKVCacheChunks) {
  for (AttnCase c : {AttnCase{40, 2, 4, 4, 64, 0}, AttnCase{37, 2, 6, 2, 128, 0},
                     AttnCase{20, 1, 4, 1, 80, 0}}) {
    ops::AttentionDims d;
    d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
    const double scale = 1.0 / std::sqrt(double(c.HD));
    Tensor qkv = rand_in({c.S, c.B, d.qkv_width()}, 130, dt(), -2.f, 2.f);
    Tensor gqkv = to_gpu(qkv, dt());
    const Shape cache{c.B, c.S + 3, c.NG, c.HD};
    Tensor kc = Tensor::empty(cache, DType::F32), vc = Tensor::empty(cache, DType::F32);
    Tensor gkc = gpu_nan(cache, dt()), gvc = gpu_nan(cache, dt());
    Tensor out = Tensor::empty({c.S, c.B, c.NH * c.HD}, DType::F32);
    Tensor gout = gpu_nan(out.shape(), dt());
    const int64_t prefill = c.S - 7;
    int64_t p0 = 0;
    for (int64_t n : {prefill, int64_t(1), int64_t(1), int64_t(5)}) {
      d.S = n;
      Tensor o = out.narrow(p0, n), go = gout.narrow(p0, n);
      Tensor pos = Tensor::empty({c.B}, DType::I64);
      for (int64_t b = 0; b < c.B; ++b) pos.data<int64_t>()[b] = p0;
      Tensor gpos = to_gpu(pos, DType::I64);
      cpu::attention_kv_cache_forward(qkv.narrow(p0, n), d, pos, scale, kc, vc, o, CS());
      gpu::attention_kv_cache_forward(gqkv.narrow(p0, n), d, gpos, scale, gkc, gvc, go, GS());
      p0 += n;
    }
    SCOPED_TRACE(::testing::Message() << "S=" << c.S << " NH=" << c.NH << " NG=" << c.NG
                                      << " HD=" << c.HD << " dtype=" << dtype_name(dt()));
    EXPECT_CLOSE(gout, out, dt());
    for (int64_t b = 0; b < c.B; ++b) {  // each slot's rows [0, S)
      const Shape slot{c.S + 3, c.NG, c.HD};
      auto rows = [&](const Tensor& t) { return t.narrow(b, 1).view(slot).narrow(0, c.S); };
      EXPECT_CLOSE(rows(gkc), rows(kc), dt());
      EXPECT_CLOSE(rows(gvc), rows(vc), dt());
    }
  }
}

TEST_P(GpuOp, RopeForwardBackward) {
  ops::AttentionDims d;
  d.S = 50, d.B = 2, d.NH = 6, d.NG = 2, d.HD = 64;
  Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 120, dt());
  for (int64_t rot : {int64_t(64), int64_t(32)}) {
    Tensor out = Tensor::empty(qkv.shape(), DType::F32);
    cpu::rope_forward(qkv, d, rot, 10000.0, 1000, out, CS());
    Tensor gout = gpu_nan(qkv.shape(), dt());
    gpu::rope_forward(to_gpu(qkv, dt()), d, rot, 10000.0, 1000, gout, GS());
    EXPECT_CLOSE(gout, out, dt());
    Tensor din = Tensor::empty(qkv.shape(), DType::F32);
    cpu::rope_backward(qkv, d, rot, 10000.0, 1000, din, CS());
    Tensor gin = to_gpu(qkv, dt());
    gpu::rope_backward(gin, d, rot, 10000.0, 1000, gin, GS());  // in place
    EXPECT_CLOSE(gin, din, dt());
  }
}

// Llama 3.x RoPE scaling on every CUDA path that forms RoPE angles -- rope_forward /
// rope_backward (the training table), rope_positions, rope_decode, rope_attention_decode
// (the fused group kernel with and without its angle table, and the rotate-and-append
// kernel of head shapes without a group instance) -- against the CPU ops. Each case first
// checks that the CPU's scaled rotation is far from the plain one, so a path that dropped
// the scaling fails. The decode cases run plain RoPE of the same rot_dim first: the angle
// table cached for it must not be reused for the scaled frequencies.
TEST_P(GpuOp, RopeScalingMatchesCpu) {
  // Llama-3.2-1B's scaling for the training ops at positions past its original context; for
  // the decode ops (caches of 300 rows) a 256-token original context, so that positions
  // below 300 cross all three regions of the 32 rotary pairs. Each also with linear position
  // interpolation (RopeFreqs::interpolation: --rotary-seq-len-interpolation-factor, Hugging
  // Face's "linear"), on top of the scaling and alone, with an integer and a fractional factor.
  ops::RopeFreqs llama(500000.0), small(10000.0);
  llama.scaled = small.scaled = true;
  llama.factor = 32, llama.original_max_positions = 8192;
  small.factor = 8, small.original_max_positions = 256;
  auto interpolated = [](ops::RopeFreqs f, double n) {
    f.interpolation = n;
    return f;
  };
  // YaRN (--position-embedding-type yarn): its frequencies, cos and sin times its factor.
  auto yarn = [](double base, double factor, int64_t original) {
    ops::RopeFreqs f(base);
    f.yarn = true, f.factor = factor, f.original_max_positions = original;
    f.mscale = ops::yarn_concentration(factor, 1, 0);
    return f;
  };
  auto far = [&](const Tensor& a, const Tensor& b) { EXPECT_GT(rel_err(a, b), 0.1); };
  for (const ops::RopeFreqs& ft : {llama, interpolated(llama, 4),
                                   interpolated(ops::RopeFreqs(500000.0), 2.5),
                                   yarn(1e6, 4, 2048)}) {
    SCOPED_TRACE(::testing::Message() << "training ops, scaled " << ft.scaled << " interpolation "
                                      << ft.interpolation << " yarn " << ft.yarn);
    ops::AttentionDims d;
    d.S = 50, d.B = 2, d.NH = 6, d.NG = 2, d.HD = 64;
    const Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 121, dt());
    for (int64_t rot : {int64_t(64), int64_t(32)}) {
      SCOPED_TRACE(::testing::Message() << "rot " << rot);
      Tensor out = Tensor::empty(qkv.shape(), DType::F32), plain = out.clone();
      cpu::rope_forward(qkv, d, rot, ft, 20000, out, CS());
      cpu::rope_forward(qkv, d, rot, 500000.0, 20000, plain, CS());
      far(out, plain);
      if (ft.interpolation != 1) {  // and not the same frequencies uninterpolated
        cpu::rope_forward(qkv, d, rot, interpolated(ft, 1), 20000, plain, CS());
        far(out, plain);
      }
      Tensor gout = gpu_nan(qkv.shape(), dt());
      gpu::rope_forward(to_gpu(qkv, dt()), d, rot, ft, 20000, gout, GS());
      EXPECT_CLOSE(gout, out, dt());
      Tensor din = Tensor::empty(qkv.shape(), DType::F32);
      cpu::rope_backward(qkv, d, rot, ft, 20000, din, CS());
      Tensor gin = to_gpu(qkv, dt());
      gpu::rope_backward(gin, d, rot, ft, 20000, gin, GS());
      EXPECT_CLOSE(gin, din, dt());
      Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
      for (int64_t k = 0; k < d.S * d.B; ++k) pos.data<int64_t>()[k] = (k * 977) % 30000;
      const Tensor gpos = to_gpu(pos, DType::I64);
      for (bool inverse : {false, true}) {
        Tensor ref = Tensor::empty(qkv.shape(), DType::F32);
        cpu::rope_positions(qkv, d, rot, ft, pos, inverse, ref, CS());
        Tensor g = gpu_nan(qkv.shape(), dt());
        gpu::rope_positions(to_gpu(qkv, dt()), d, rot, ft, gpos, inverse, g, GS());
        EXPECT_CLOSE(g, ref, dt()) << (inverse ? "rope_positions inverse" : "rope_positions");
      }
    }
  }
  // Decode: (NH, NG, HD, rot) with a group kernel instance (G 4, HD 64), whole and partial
  // rotary dims, and without one (G 3, HD 80); the fused kernel with its table and without.
  for (auto [NH, NG, HD, rot] : {std::tuple{32, 8, 64, 64}, {32, 8, 64, 32}, {6, 2, 80, 80}})
    for (const char* table : {"1", "0"}) {
      SCOPED_TRACE(::testing::Message() << "NH=" << NH << " NG=" << NG << " HD=" << HD
                                        << " rot=" << rot << " MCPP_DECODE_ROPE_TABLE=" << table);
      ASSERT_EQ(setenv("MCPP_DECODE_ROPE_TABLE", table, 1), 0);
      ops::AttentionDims d;
      d.S = 1, d.B = 4, d.NH = NH, d.NG = NG, d.HD = HD;
      const int64_t Tmax = 300;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      const Tensor kc = rand_in(cache, 122, dt(), -2.f, 2.f), vc = rand_in(cache, 123, dt());
      const Tensor qkv = rand_in({1, d.B, d.qkv_width()}, 124, dt(), -2.f, 2.f);
      Tensor pos = Tensor::empty({d.B}, DType::I64);
      const int64_t p[] = {3, 120, 250, Tmax - 1};
      for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
      const Tensor gpos = to_gpu(pos, DType::I64);
      const double scale = 1.0 / std::sqrt(double(HD));
      for (const ops::RopeFreqs& f : {ops::RopeFreqs(10000.0), small, interpolated(small, 4),
                                      interpolated(ops::RopeFreqs(10000.0), 2.5),
                                      yarn(10000.0, 8, 64)}) {
        SCOPED_TRACE(::testing::Message() << "scaled " << f.scaled << " interpolation "
                                          << f.interpolation << " yarn " << f.yarn);
        Tensor rq = Tensor::empty(qkv.shape(), DType::F32);
        cpu::rope_decode(qkv, d, rot, f, pos, rq, CS());
        if (f.scaled || f.interpolation != 1 || f.yarn) {
          Tensor plain = rq.clone();
          cpu::rope_decode(qkv, d, rot, 10000.0, pos, plain, CS());
          far(rq, plain);
        }
        Tensor grq = gpu_nan(qkv.shape(), dt());
        gpu::rope_decode(to_gpu(qkv, dt()), d, rot, f, gpos, grq, GS());
        EXPECT_CLOSE(grq, rq, dt()) << "rope_decode";
        Tensor q2 = qkv.clone(), kc2 = kc.clone(), vc2 = vc.clone();
        Tensor out = Tensor::empty({1, d.B, d.NH * d.HD}, DType::F32);
        cpu::rope_attention_decode(q2, d, rot, f, pos, scale, kc2, vc2, out, CS());
        Tensor gq = to_gpu(qkv, dt()), gk = to_gpu(kc, dt()), gv = to_gpu(vc, dt());
        Tensor gout = gpu_nan(out.shape(), dt());
        gpu::rope_attention_decode(gq, d, rot, f, gpos, scale, gk, gv, gout, GS());
        EXPECT_CLOSE(gout, out, dt()) << "rope_attention_decode";
        EXPECT_CLOSE(gk, kc2, dt()) << "k_cache";
        EXPECT_CLOSE(gv, vc2, dt()) << "v_cache";
      }
    }
  unsetenv("MCPP_DECODE_ROPE_TABLE");
}

// ---- optimizer ----------------------------------------------------------------------

TEST(GpuAdamW, MatchesCpu) {
  MCPP_REQUIRE_GPU();
  const int64_t n = 10007;
  Tensor p = rand_f32({n}, 130), g = rand_f32({n}, 131), m = rand_f32({n}, 132, -0.1f, 0.1f),
         v = rand_f32({n}, 133, 0.f, 0.01f);
  Tensor gp = to_gpu(p, DType::F32), gg = to_gpu(g, DType::F32), gm = to_gpu(m, DType::F32),
         gv = to_gpu(v, DType::F32);
  ops::AdamWParams ap;
  ap.lr = 1e-3, ap.weight_decay = 0.1, ap.step = 3;
  Tensor none;
  for (int i = 0; i < 3; ++i) {
    cpu::adamw_step(p, g, m, v, none, ap, CS());
    gpu::adamw_step(gp, gg, gm, gv, none, ap, GS());
    ap.step++;
  }
  EXPECT_CLOSE(gp, p, DType::F32);
  EXPECT_CLOSE(gm, m, DType::F32);
  EXPECT_CLOSE(gv, v, DType::F32);
}

// A CUDA tensor's bytes on the host, in its own dtype.
Tensor host_bits(const Tensor& g) {
  Tensor h = Tensor::empty(g.shape(), g.dtype());
  gpu::copy(g, h, GS());
  return h;
}
bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = host_bits(a), y = host_bits(b);
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}
// c's values in a new CUDA tensor of dtype dt that starts `offset` elements into its
// allocation (offset 1: not 16-byte aligned, so the kernels take their scalar paths).
Tensor to_gpu_at(const Tensor& c, DType dt, int64_t offset) {
  Tensor g = Tensor::empty({c.numel() + offset}, dt, Device::CUDA).narrow(offset, c.numel());
  gpu::copy(c, g, GS());
  return g;
}

// The mixed-precision step in one pass: adamw_step with a bf16/f16 model_param, for f32,
// bf16 and f16 grads. Bit for bit (1) adamw_step without it followed by copy, and (2) the
// same step on unaligned views (offset 1: the scalar path), which is the kernel as it was
// before the vector path; close to the CPU op, whose formula is arranged differently.
// Sizes: whole packs, a tail of n % 8 = 3 (n % 4 = 3), and a run smaller than one pack.
TEST(GpuAdamW, FusedModelParamsBitwise) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(1) << 16, int64_t(100003), int64_t(5)}) {
    Tensor p = rand_f32({n}, 140), m = rand_f32({n}, 141, -0.1f, 0.1f),
           v = rand_f32({n}, 142, 0.f, 0.01f);
    float* P = static_cast<float*>(p.raw());
    for (int64_t i = 0; i < n; ++i) P[i] = std::ldexp(P[i], int(i % 31) - 16);  // many binades
    for (DType gdt : {DType::F32, DType::BF16, DType::F16})
      for (DType odt : {DType::BF16, DType::F16}) {
        const std::string what =
            fmt::format("n {}, grads {}, model params {}", n, dtype_name(gdt), dtype_name(odt));
        // Fused (aligned: the vector path), unfused + copy, fused on unaligned views.
        Tensor fp = to_gpu(p, DType::F32), fm = to_gpu(m, DType::F32), fv = to_gpu(v, DType::F32);
        Tensor up = to_gpu(p, DType::F32), um = to_gpu(m, DType::F32), uv = to_gpu(v, DType::F32);
        Tensor sp = to_gpu_at(p, DType::F32, 1), sm = to_gpu_at(m, DType::F32, 1),
               sv = to_gpu_at(v, DType::F32, 1);
        Tensor fo = gpu_nan({n}, odt), uo = gpu_nan({n}, odt),
               so = gpu_nan({n + 1}, odt).narrow(1, n);
        Tensor cp = p.clone(), cm = m.clone(), cv = v.clone(), co = Tensor::empty({n}, odt);
        Tensor none;
        ops::AdamWParams ap;
        ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1;
        for (int step = 1; step <= 3; ++step) {
          ap.step = step;
          Tensor g = rand_in({n}, 150 + step, gdt);  // representable in gdt: the CPU sees it too
          Tensor gg = to_gpu(g, gdt), sg = to_gpu_at(g, gdt, 1);
          gpu::adamw_step(fp, gg, fm, fv, fo, ap, GS());
          gpu::adamw_step(up, gg, um, uv, none, ap, GS());
          gpu::copy(up, uo, GS());
          gpu::adamw_step(sp, sg, sm, sv, so, ap, GS());
          cpu::adamw_step(cp, g, cm, cv, co, ap, CS());
        }
        EXPECT_TRUE(same_bits(fo, uo)) << what << ": fused vs adamw_step + copy";
        EXPECT_TRUE(same_bits(fp, up)) << what;
        EXPECT_TRUE(same_bits(fm, um)) << what;
        EXPECT_TRUE(same_bits(fv, uv)) << what;
        EXPECT_TRUE(same_bits(fo, so)) << what << ": vector vs scalar path";
        EXPECT_TRUE(same_bits(fp, sp)) << what;
        EXPECT_TRUE(same_bits(fm, sm)) << what;
        EXPECT_TRUE(same_bits(fv, sv)) << what;
        EXPECT_CLOSE(fp, cp, DType::F32) << what;
        EXPECT_CLOSE(fm, cm, DType::F32) << what;
        EXPECT_CLOSE(fv, cv, DType::F32) << what;
        Tensor co32 = Tensor::empty({n}, DType::F32);
        cpu::copy(co, co32, CS());
        EXPECT_CLOSE(fo, co32, odt) << what;
      }
  }
}

// grad_scale (clipping folded into the step): bit for bit scale(grad) then the step, on
// both the vector and the scalar path, for f32, bf16 and f16 gradients.
TEST(GpuAdamW, GradScaleEqualsScalingTheGradientsFirst) {
  MCPP_REQUIRE_GPU();
  for (int64_t n : {int64_t(1) << 16, int64_t(100003)})
    for (DType gdt : {DType::F32, DType::BF16, DType::F16}) {
      const std::string what = fmt::format("n {}, grads {}", n, dtype_name(gdt));
      Tensor p = rand_f32({n}, 160), m = rand_f32({n}, 161, -0.1f, 0.1f),
             v = rand_f32({n}, 162, 0.f, 0.01f);
      Tensor fp = to_gpu(p, DType::F32), fm = to_gpu(m, DType::F32), fv = to_gpu(v, DType::F32);
      Tensor up = to_gpu(p, DType::F32), um = to_gpu(m, DType::F32), uv = to_gpu(v, DType::F32);
      Tensor sp = to_gpu_at(p, DType::F32, 1), sm = to_gpu_at(m, DType::F32, 1),
             sv = to_gpu_at(v, DType::F32, 1);
      Tensor fo = gpu_nan({n}, DType::BF16), uo = gpu_nan({n}, DType::BF16),
             so = gpu_nan({n + 1}, DType::BF16).narrow(1, n);
      ops::AdamWParams ap;
      ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1;
      for (int step = 1; step <= 3; ++step) {
        ap.step = step, ap.grad_scale = 0.2917 * step;
        Tensor g = rand_in({n}, 170 + step, gdt);
        Tensor gg = to_gpu(g, gdt), sg = to_gpu_at(g, gdt, 1), ug = to_gpu(g, gdt);
        gpu::adamw_step(fp, gg, fm, fv, fo, ap, GS());
        gpu::adamw_step(sp, sg, sm, sv, so, ap, GS());
        gpu::scale(ug, ap.grad_scale, GS());
        ops::AdamWParams unscaled = ap;
        unscaled.grad_scale = 1.0;
        gpu::adamw_step(up, ug, um, uv, uo, unscaled, GS());
        EXPECT_TRUE(same_bits(gg, to_gpu(g, gdt)))
            << what << ": the gradient is read, not written";
      }
      EXPECT_TRUE(same_bits(fp, up)) << what << ": grad_scale vs scale + step";
      EXPECT_TRUE(same_bits(fm, um)) << what;
      EXPECT_TRUE(same_bits(fv, uv)) << what;
      EXPECT_TRUE(same_bits(fo, uo)) << what;
      EXPECT_TRUE(same_bits(fp, sp)) << what << ": vector vs scalar path";
      EXPECT_TRUE(same_bits(fo, so)) << what;
    }
}

INSTANTIATE_TEST_SUITE_P(Widths, GpuDropout, ::testing::Values(int64_t(301), int64_t(300)));

// The GPU tensor gy (f32 or bf16) holds the f64 values `want` rounded: within 1e-6 relative
// in f32 (the device's double math may differ in the last place), a bf16 step in bf16.
void expect_rounded_from(const Tensor& gy, const Tensor& want) {
  Tensor got = Tensor::empty(want.shape(), DType::F64);
  ops::copy(to_cpu(gy), got, CS());
  const double tol = gy.dtype() == DType::F32 ? 1e-6 : 1.0 / 128;
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(got.data<double>()[i], want.data<double>()[i],
                tol * std::max(1.0, std::fabs(want.data<double>()[i])))
        << dtype_name(gy.dtype()) << " element " << i;
}

// uniform_scale (the routers' input jitter) on a CP rank's block, f32 and bf16, against the
// CPU's f64 product rounded (bf16: within a step of the bf16 input's rounding).
TEST(GpuUniformScale, BlocksMatchTheCpu) {
  MCPP_REQUIRE_GPU();
  const ops::DropoutKey key{99, 5};
  const int64_t d0 = 8, d1 = 3, d2 = 40;
  ops::GlobalIndex3 part{{2, 0, 0}, {d0, d1, d2}};
  part.split0 = 2, part.jump0 = 2;  // rows 2-3, 6-7
  Tensor x = rand_f32({4, d1, d2}, 81, -2.0f, 2.0f);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor xd = Tensor::empty({4, d1, d2}, DType::F64);
    ops::copy(to_cpu(to_gpu(x, dt)), xd, CS());  // the input as the device holds it
    Tensor want = Tensor::empty({4, d1, d2}, DType::F64);
    cpu::uniform_scale(xd, 0.8, 1.2, key, part, want, CS());
    Tensor gy = gpu_nan({4, d1, d2}, dt);
    gpu::uniform_scale(to_gpu(x, dt), 0.8, 1.2, key, part, gy, GS());
    expect_rounded_from(gy, want);
  }
}

// random_normal (the routers' random logits): a CP rank's block of the global tensor, in f32
// and bf16, against the CPU's f64 values rounded (the device's double log and cos may differ
// from the host's in the last place: 1e-6 relative in f32, one bf16 step in bf16).
TEST(GpuRandomNormal, BlocksMatchTheCpu) {
  MCPP_REQUIRE_GPU();
  const ops::DropoutKey key{1234, 77};
  const int64_t d0 = 8, d1 = 3, d2 = 40;
  ops::GlobalIndex3 part{{2, 1, 0}, {d0, d1, d2}};
  part.split0 = 2, part.jump0 = 2;  // rows 2-3, 6-7
  Tensor want = Tensor::empty({4, 2, d2}, DType::F64);
  cpu::random_normal(key, part, want, CS());
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor gy = gpu_nan({4, 2, d2}, dt);
    gpu::random_normal(key, part, gy, GS());
    expect_rounded_from(gy, want);
  }
}
INSTANTIATE_TEST_SUITE_P(Dtypes, GpuOp, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_param_name);

}  // namespace ops_gpu_test
}  // namespace mcpp::test
