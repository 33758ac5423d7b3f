// cuDNN's fused attention (src/ops/cuda/cudnn_attention.cpp), called directly so that a
// silent fallback to another kernel cannot pass for cuDNN: against the CPU op (f32 on the
// same rounded inputs) and against the own flash kernel, forward (out, lse) and backward
// (dqkv), MHA and GQA, head dims 32/64/128, S not a multiple of 64; the backward bitwise
// deterministic; and the op dispatch routing dropout-free bf16/f16 calls to cuDNN and
// calls with attention dropout away from it.
#include <cmath>
#include <cstring>

#include "gpu_test_util.h"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/flash_attention.h"

namespace mcpp::test {
namespace cudnn_attention_test {

// A build without cuDNN skips (cuDNN is optional); a build with it must be able to use it.
#define MCPP_REQUIRE_CUDNN()                                                                 \
  do {                                                                                       \
    MCPP_REQUIRE_GPU();                                                                      \
    if (!gpu::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN";            \
    ASSERT_TRUE(gpu::cudnn_attention_enabled()) << gpu::cudnn_attention_status();           \
  } while (0)

class CudnnAttention : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_CUDNN(); }
  DType dt() const { return GetParam(); }
};

struct Case {
  int64_t S, B, NH, NG, HD;
};

cudaStream_t cs() { return static_cast<cudaStream_t>(GS().handle); }

void check_case(DType dt, const Case& c) {
  ops::AttentionDims d;
  d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
  const double scale = 1.0 / std::sqrt(double(c.HD));
  SCOPED_TRACE(::testing::Message() << "S=" << c.S << " B=" << c.B << " NH=" << c.NH
                                    << " NG=" << c.NG << " HD=" << c.HD
                                    << " dtype=" << dtype_name(dt));
  Tensor qkv = rand_in({c.S, c.B, d.qkv_width()}, 210 + c.S, dt, -2.f, 2.f);
  Tensor out = Tensor::empty({c.S, c.B, c.NH * c.HD}, DType::F32);
  Tensor lse = Tensor::empty({c.B, c.NH, c.S}, DType::F32);
  cpu::attention_forward(qkv, d, scale, 0.0, {}, out, lse, CS());

  Tensor gqkv = to_gpu(qkv, dt);
  const gpu::FlashArgs fa{gqkv.raw(), d, dt, scale};
  Tensor gout = gpu_nan(out.shape(), dt), glse = gpu_nan(lse.shape(), DType::F32);
  ASSERT_TRUE(gpu::cudnn_attention_forward(fa, gout.raw(), static_cast<float*>(glse.raw()), cs()))
      << "cuDNN rejected the forward graph (see the log line above)";
  EXPECT_CLOSE(gout, out, dt);
  EXPECT_CLOSE(glse, lse, DType::F32);

  Tensor dout = rand_in(out.shape(), 211, dt);
  Tensor out_r = rounded(out, dt);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
  cpu::attention_backward(dout, qkv, out_r, lse, d, scale, 0.0, {}, dqkv, CS());
  Tensor gdout = to_gpu(dout, dt), gout_r = to_gpu(out_r, dt), glse_c = to_gpu(lse, DType::F32);
  Tensor gdqkv = gpu_nan(qkv.shape(), dt);
  ASSERT_TRUE(gpu::cudnn_attention_backward(fa, gdout.raw(), gout_r.raw(),
                                            static_cast<const float*>(glse_c.raw()),
                                            gdqkv.raw(), cs()))
      << "cuDNN rejected the backward graph (see the log line above)";
  EXPECT_CLOSE(gdqkv, dqkv, dt);

  // The own flash kernel on the same device inputs computes the same function.
  if (gpu::flash_attention_applies(dt, c.HD, 0.0)) {
    Tensor fout = gpu_nan(out.shape(), dt), flse = gpu_nan(lse.shape(), DType::F32);
    gpu::flash_attention_forward(fa, fout.raw(), static_cast<float*>(flse.raw()), cs());
    EXPECT_LE(rel_err(to_cpu(gout), to_cpu(fout)), tol(dt)) << "cuDNN vs flash: out";
    EXPECT_LE(rel_err(to_cpu(glse), to_cpu(flse)), tol(DType::F32)) << "cuDNN vs flash: lse";
  }
}

TEST_P(CudnnAttention, MatchesCpuAndFlashKernel) {
  for (Case c : {Case{100, 2, 4, 4, 64}, Case{130, 2, 6, 2, 64}, Case{64, 1, 4, 1, 128},
                 Case{77, 2, 4, 2, 32}, Case{256, 2, 8, 2, 128}, Case{192, 3, 8, 8, 128},
                 Case{96, 2, 4, 4, 192}, Case{70, 1, 2, 1, 256}})  // MLA's 128 + 64; 256
    check_case(dt(), c);
}

// The deterministic backward in batch chunks (a workspace cap of 0 makes each sequence its
// own cuDNN call on strided views): the same function as the CPU op, and the same values
// as the whole-batch call.
TEST_P(CudnnAttention, ChunkedBackwardMatches) {
  if (std::getenv("MCPP_ATTENTION_DETERMINISTIC") != nullptr &&
      std::strcmp(std::getenv("MCPP_ATTENTION_DETERMINISTIC"), "0") == 0)
    GTEST_SKIP() << "MCPP_ATTENTION_DETERMINISTIC=0: the atomic backward is not chunked";
  const int64_t before = gpu::set_cudnn_attention_bwd_workspace_cap(0);
  for (Case c : {Case{130, 2, 6, 2, 64}, Case{192, 3, 8, 8, 128}}) check_case(dt(), c);
  // Chunked against whole-batch on one input.
  ops::AttentionDims d;
  d.S = 256, d.B = 4, d.NH = 8, d.NG = 2, d.HD = 64;
  Tensor gqkv = to_gpu(rand_in({d.S, d.B, d.qkv_width()}, 230, dt(), -2.f, 2.f), dt());
  const gpu::FlashArgs fa{gqkv.raw(), d, dt(), 0.125};
  Tensor gout = gpu_nan({d.S, d.B, d.NH * d.HD}, dt()), glse = gpu_nan({d.B, d.NH, d.S}, DType::F32);
  ASSERT_TRUE(gpu::cudnn_attention_forward(fa, gout.raw(), static_cast<float*>(glse.raw()), cs()));
  Tensor gdout = to_gpu(rand_in(gout.shape(), 231, dt()), dt());
  Tensor parts[2];
  for (int64_t cap : {int64_t(0), int64_t(1) << 40}) {
    gpu::set_cudnn_attention_bwd_workspace_cap(cap);
    Tensor g = gpu_nan(gqkv.shape(), dt());
    ASSERT_TRUE(gpu::cudnn_attention_backward(fa, gdout.raw(), gout.raw(),
                                              static_cast<const float*>(glse.raw()), g.raw(),
                                              cs()));
    parts[cap == 0 ? 0 : 1] = to_cpu(g);
  }
  gpu::set_cudnn_attention_bwd_workspace_cap(before);
  EXPECT_LE(rel_err(parts[0], parts[1]), 1e-6) << "chunked vs whole-batch backward";
}

// Two backward calls on the same inputs give the same bits (the default, deterministic
// backward); several query and key tiles and a group of 4 query heads per key head.
TEST(CudnnAttentionDeterminism, BackwardIsBitwiseRepeatable) {
  MCPP_REQUIRE_CUDNN();
  if (std::getenv("MCPP_ATTENTION_DETERMINISTIC") != nullptr &&
      std::strcmp(std::getenv("MCPP_ATTENTION_DETERMINISTIC"), "0") == 0)
    GTEST_SKIP() << "MCPP_ATTENTION_DETERMINISTIC=0 selects the atomic backward";
  const DType dt = DType::BF16;
  ops::AttentionDims d;
  d.S = 640, d.B = 2, d.NH = 16, d.NG = 4, d.HD = 64;
  const double scale = 0.125;
  Tensor gqkv = to_gpu(rand_in({d.S, d.B, d.qkv_width()}, 220, dt, -2.f, 2.f), dt);
  const gpu::FlashArgs fa{gqkv.raw(), d, dt, scale};
  Tensor gout = gpu_nan({d.S, d.B, d.NH * d.HD}, dt), glse = gpu_nan({d.B, d.NH, d.S}, DType::F32);
  ASSERT_TRUE(gpu::cudnn_attention_forward(fa, gout.raw(), static_cast<float*>(glse.raw()), cs()));
  Tensor gdout = to_gpu(rand_in(gout.shape(), 221, dt), dt);
  Tensor first;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor g = gpu_nan(gqkv.shape(), dt);
    ASSERT_TRUE(gpu::cudnn_attention_backward(fa, gdout.raw(), gout.raw(),
                                              static_cast<const float*>(glse.raw()), g.raw(),
                                              cs()));
    Tensor h = Tensor::empty(g.shape(), dt);
    gpu::copy(g, h, GS());
    gpu::synchronize(GS());
    if (rep == 0) {
      first = h;
      continue;
    }
    EXPECT_EQ(std::memcmp(first.raw(), h.raw(), size_t(h.numel()) * 2), 0)
        << "backward run " << rep << " differs from run 0";
  }
}

// ops::attention_* send dropout-free bf16 calls to cuDNN and calls with attention dropout
// to the own kernels (cuDNN cannot draw our dropout mask).
TEST(CudnnAttentionDispatch, DropoutFreeCallsUseCudnnDropoutDoesNot) {
  MCPP_REQUIRE_CUDNN();
  const DType dt = DType::BF16;
  ops::AttentionDims d;
  d.S = 96, d.B = 2, d.NH = 4, d.NG = 2, d.HD = 64;
  Tensor gqkv = to_gpu(rand_in({d.S, d.B, d.qkv_width()}, 230, dt), dt);
  Tensor gout = gpu_nan({d.S, d.B, d.NH * d.HD}, dt), glse = gpu_nan({d.B, d.NH, d.S}, DType::F32);
  Tensor gdqkv = gpu_nan(gqkv.shape(), dt);
  Tensor gdout = to_gpu(rand_in(gout.shape(), 231, dt), dt);
  for (double p : {0.0, 0.1}) {
    auto before = gpu::cudnn_attention_stats();
    gpu::attention_forward(gqkv, d, 0.125, p, {3, 4}, gout, glse, GS());
    gpu::attention_backward(gdout, gqkv, gout, glse, d, 0.125, p, {3, 4}, gdqkv, GS());
    gpu::synchronize(GS());
    auto after = gpu::cudnn_attention_stats();
    const int64_t expect = p == 0.0 ? 1 : 0;
    EXPECT_EQ(after.forward_calls - before.forward_calls, expect) << "p=" << p;
    EXPECT_EQ(after.backward_calls - before.backward_calls, expect) << "p=" << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudnnAttention, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace cudnn_attention_test
}  // namespace mcpp::test
