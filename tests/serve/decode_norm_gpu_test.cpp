// rmsnorm_linear_decode (label gpu): the RMSNorm folded into the decode GEMM's kernel against
// its composition on the GPU, rmsnorm_forward then linear_decode / linear_swiglu_decode, bit
// for bit -- at every register-row shape of the norm kernel the fold replicates (1 to 8 warps
// a row, 1 to 4 vectors a lane), with and without a bias, bf16 and f16; one row folded, 3
// and 8 through the composition -- and the shapes it does not take (9 rows, f32, an f32
// norm weight) running the composition; the tensor-core decode GEMM's persistent grid
// against a block per tile, bit for bit; the norm's few-row launch against its blocks of
// several rows, bit for bit.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "ops/cuda/gemv.h"

namespace mcpp::test {
namespace decode_norm_gpu_test {

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = to_cpu(a), y = to_cpu(b);
  return x.numel() == y.numel() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

TEST(GpuDecode, RmsnormFoldedIntoTheGemmIsTheComposition) {
  MCPP_REQUIRE_GPU();
  const double eps = 1e-5;
  // K: the norm kernel's shapes for bf16 rows (nvec = K / 8): (1,1) (1,2) (2,3) (2,4) (4,3)
  // (4,4) (8,3) (8,4); f16 the same.
  const int64_t Ks[] = {64, 512, 1536, 2048, 3072, 4096, 6144, 8192};
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t K : Ks)
      for (int64_t rows : {1, 3, 8})
        for (bool swiglu : {false, true})
          for (bool bias : {false, true}) {
            const int64_t N = swiglu ? 2 * 96 : 200, out = swiglu ? N / 2 : N;
            SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " K=" << K << " rows=" << rows
                                              << (swiglu ? " swiglu" : "")
                                              << (bias ? " bias" : ""));
            const uint64_t seed = uint64_t(K * 16 + rows * 4 + swiglu * 2 + bias);
            const Tensor x = to_gpu(rand_in({rows, K}, seed, dt, -3.f, 3.f), dt);
            const Tensor nw = to_gpu(rand_in({K}, seed + 1, dt, 0.5f, 1.5f), dt);
            const Tensor w = to_gpu(rand_in({N, K}, seed + 2, dt, -0.1f, 0.1f), dt);
            const Tensor b = bias ? to_gpu(rand_in({N}, seed + 3, dt), dt) : Tensor();
            // The composition.
            Tensor xn = gpu_nan({rows, K}, dt), rstd = gpu_nan({rows}, DType::F32);
            Tensor fc1 = gpu_nan({rows, N}, dt), ref = gpu_nan({rows, out}, dt);
            gpu::rmsnorm_forward(x, nw, eps, xn, rstd, GS());
            if (swiglu)
              gpu::linear_swiglu_decode(xn, w, b, fc1, ref, GS());
            else
              gpu::linear_decode(xn, w, b, Tensor(), ref, GS());
            // The fold: y equal, and the composition's buffers left as they were (not run).
            Tensor xn2 = gpu_nan({rows, K}, dt), rstd2 = gpu_nan({rows}, DType::F32);
            Tensor fc1b = gpu_nan({rows, N}, dt), y = gpu_nan({rows, out}, dt);
            gpu::rmsnorm_linear_decode(x, nw, eps, xn2, rstd2, w, b, swiglu, fc1b, y, GS());
            EXPECT_TRUE(same_bits(y, ref));
            if (rows == 1)  // folded: the norm kernel did not run
              EXPECT_TRUE(std::isnan(to_cpu(rstd2).data<float>()[0])) << "the fold ran the norm";
            else  // the composition (its norm output written)
              EXPECT_TRUE(same_bits(rstd2, rstd));
          }
}

// The tensor-core decode GEMM's persistent grid (a block per tile where the GPU holds every
// block at once, otherwise as many blocks as it holds, each looping over tiles and
// requesting its next tile's weights ahead) against a block per tile (MCPP_DECODE_PERSISTENT
// =0), bit for bit: the fold at one row (the 1B model's fc1 with SwiGLU, 1,024 tiles, and
// its output layer, 2,008), linear_decode at 1, 8 and 33 rows with a residual and a ragged
// last tile, linear_swiglu_decode at 5 rows.
TEST(GpuDecode, PersistentGridGivesTheTilesBits) {
  MCPP_REQUIRE_GPU();
  const DType dt = DType::BF16;
  auto both = [](auto&& run) {  // run() -> y, with and without the persistent grid
    ASSERT_EQ(setenv("MCPP_DECODE_PERSISTENT", "0", 1), 0);
    const Tensor tiles = to_cpu(run());
    ASSERT_EQ(unsetenv("MCPP_DECODE_PERSISTENT"), 0);
    const Tensor pers = to_cpu(run());
    ASSERT_EQ(tiles.numel(), pers.numel());
    EXPECT_EQ(std::memcmp(tiles.raw(), pers.raw(), tiles.nbytes()), 0);
    const float* p = static_cast<const float*>(pers.raw());
    for (int64_t i = 0; i < pers.numel(); ++i) ASSERT_FALSE(std::isnan(p[i])) << "unwritten " << i;
  };
  for (auto [N, swiglu] : {std::pair{int64_t(16384), true}, {int64_t(32128), false}}) {
    SCOPED_TRACE(::testing::Message() << "fold at 1 row, [" << N << ", 2048]"
                                      << (swiglu ? " SwiGLU (fc1)" : " (output layer)"));
    const int64_t K = 2048, out = swiglu ? N / 2 : N;
    const uint64_t sd = uint64_t(N) + swiglu;
    const Tensor x = to_gpu(rand_in({1, K}, sd + 1, dt, -3.f, 3.f), dt);
    const Tensor nw = to_gpu(rand_in({K}, sd + 2, dt, 0.5f, 1.5f), dt);
    const Tensor w = to_gpu(rand_in({N, K}, sd + 3, dt, -0.1f, 0.1f), dt);
    both([&] {
      Tensor xn = gpu_nan({1, K}, dt), rstd = gpu_nan({1}, DType::F32);
      Tensor fc1 = gpu_nan({1, N}, dt), y = gpu_nan({1, out}, dt);
      gpu::rmsnorm_linear_decode(x, nw, 1e-5, xn, rstd, w, Tensor(), swiglu, fc1, y, GS());
      return y;
    });
  }
  for (int64_t rows : {1, 8, 33}) {
    SCOPED_TRACE(::testing::Message() << "linear_decode [20007, 512] + residual, " << rows << " rows");
    const int64_t K = 512, N = 20007;
    const Tensor x = to_gpu(rand_in({rows, K}, 87 + rows, dt), dt);
    const Tensor w = to_gpu(rand_in({N, K}, 88, dt, -0.1f, 0.1f), dt);
    const Tensor b = to_gpu(rand_in({N}, 89, dt), dt);
    const Tensor r = to_gpu(rand_in({rows, N}, 90, dt), dt);
    both([&] {
      Tensor y = gpu_nan({rows, N}, dt);
      ops::cuda::linear_decode_with(ops::cuda::DecodeGemm::TensorCore, x, w, b, r, y, GS());
      return y;
    });
  }
  {
    SCOPED_TRACE("linear_swiglu_decode [2 x 9000, 1024], 5 rows");
    const int64_t K = 1024, F = 9000;
    const Tensor x = to_gpu(rand_in({5, K}, 91, dt), dt);
    const Tensor w = to_gpu(rand_in({2 * F, K}, 92, dt, -0.1f, 0.1f), dt);
    both([&] {
      Tensor fc1 = gpu_nan({5, 2 * F}, dt), y = gpu_nan({5, F}, dt);
      gpu::linear_swiglu_decode(x, w, Tensor(), fc1, y, GS());
      return y;
    });
  }
}

// The norm forward's few-row launch (a row a block where rows taken 4 or 8 at a time would
// leave SMs idle: a decode step's 64 rows) against the block of several rows
// (MCPP_NORM_ROW_BLOCKS=0), bit for bit: RMSNorm and LayerNorm with a bias, bf16 and f32,
// rows of 2 to 16 warps, 1 to 300 rows, the outputs, means and rstds.
TEST(GpuDecode, NormRowBlocksGiveTheBlocksBits) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::BF16, DType::F32})
    for (int64_t H : {1024, 2048, 4096, 8192})
      for (int64_t rows : {1, 7, 64, 300})
        for (bool rms : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " H=" << H << " rows=" << rows
                                            << (rms ? " RMSNorm" : " LayerNorm"));
          const uint64_t sd = uint64_t(H + rows * 3 + rms);
          const Tensor x = to_gpu(rand_in({rows, H}, sd, dt, -3.f, 3.f), dt);
          const Tensor w = to_gpu(rand_in({H}, sd + 1, dt, 0.5f, 1.5f), dt);
          const Tensor b = to_gpu(rand_in({H}, sd + 2, dt), dt);
          auto run = [&] {
            Tensor y = gpu_nan({rows, H}, dt), mean = gpu_nan({rows}, DType::F32);
            Tensor rstd = gpu_nan({rows}, DType::F32);
            if (rms)
              gpu::rmsnorm_forward(x, w, 1e-5, y, rstd, GS());
            else
              gpu::layernorm_forward(x, w, b, 1e-5, y, mean, rstd, GS());
            return std::tuple{to_cpu(y), to_cpu(rstd), rms ? Tensor() : to_cpu(mean)};
          };
          ASSERT_EQ(setenv("MCPP_NORM_ROW_BLOCKS", "0", 1), 0);
          const auto [y0, r0, m0] = run();
          ASSERT_EQ(unsetenv("MCPP_NORM_ROW_BLOCKS"), 0);
          const auto [y1, r1, m1] = run();
          EXPECT_EQ(std::memcmp(y0.raw(), y1.raw(), y0.nbytes()), 0);
          EXPECT_EQ(std::memcmp(r0.raw(), r1.raw(), r0.nbytes()), 0);
          if (!rms) EXPECT_EQ(std::memcmp(m0.raw(), m1.raw(), m0.nbytes()), 0);
          const float* rp = r1.data<float>();
          for (int64_t i = 0; i < rows; ++i) ASSERT_FALSE(std::isnan(rp[i])) << "rstd " << i;
        }
}

TEST(GpuDecode, RmsnormFoldFallsBackToTheComposition) {
  MCPP_REQUIRE_GPU();
  const double eps = 1e-6;
  const int64_t K = 256, N = 64;
  // 9 rows (past the folded kernel's 8), f32 activations, an f32 norm weight with bf16 x.
  const std::tuple<DType, DType, int64_t> cases[] = {
      {DType::BF16, DType::BF16, 9}, {DType::F32, DType::F32, 2}, {DType::BF16, DType::F32, 2}};
  for (auto [dt, wdt, rows] : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " norm " << dtype_name(wdt)
                                      << " rows=" << rows);
    const Tensor x = to_gpu(rand_in({rows, K}, 5, dt, -2.f, 2.f), dt);
    const Tensor nw = to_gpu(rand_in({K}, 6, wdt, 0.5f, 1.5f), wdt);
    const Tensor w = to_gpu(rand_in({N, K}, 7, dt, -0.1f, 0.1f), dt);
    Tensor xn = gpu_nan({rows, K}, dt), rstd = gpu_nan({rows}, DType::F32);
    Tensor ref = gpu_nan({rows, N}, dt), unused;
    gpu::rmsnorm_forward(x, nw, eps, xn, rstd, GS());
    gpu::linear_decode(xn, w, Tensor(), Tensor(), ref, GS());
    Tensor xn2 = gpu_nan({rows, K}, dt), rstd2 = gpu_nan({rows}, DType::F32);
    Tensor y = gpu_nan({rows, N}, dt);
    gpu::rmsnorm_linear_decode(x, nw, eps, xn2, rstd2, w, Tensor(), false, unused, y, GS());
    EXPECT_TRUE(same_bits(y, ref));
    EXPECT_TRUE(same_bits(xn2, xn));  // the composition ran: its norm output is there
    EXPECT_TRUE(same_bits(rstd2, rstd));
  }
}

}  // namespace decode_norm_gpu_test
}  // namespace mcpp::test
