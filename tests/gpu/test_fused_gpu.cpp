// Fused CUDA ops (GEMM epilogues, op profiler) against the CPU ops they stand for.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace mcpp::test {
namespace fused_gpu_test {

class GpuFused : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

// fc1 + GELU through cuBLASLt's GELU_AUX(_BIAS) epilogue and fc2's input gradient with the
// DGELU epilogue, against cpu::linear_forward + gelu_forward and linear_backward +
// gelu_backward. Widths are multiples of 8 (the epilogue path); pre-activations spread
// over [-4, 4] where the tanh form and the erf form of GELU differ by up to 1e-3, so an
// epilogue computing another GELU than the catalogue's would fail the f32 case.
TEST_P(GpuFused, LinearGeluMatchesTheTwoOps) {
  const int64_t T = 50, in = 64, ffn = 256;
  for (bool with_bias : {true, false}) {
    Tensor x = rand_in({T, in}, 80, dt(), -2.f, 2.f), w = rand_in({ffn, in}, 81, dt(), -0.3f, 0.3f);
    Tensor b = with_bias ? rand_in({ffn}, 82, dt()) : Tensor();
    Tensor pre = Tensor::empty({T, ffn}, DType::F32), y = Tensor::empty({T, ffn}, DType::F32);
    cpu::linear_forward(x, w, b, pre, CS());
    cpu::gelu_forward(pre, y, CS());
    Tensor gpre = gpu_nan({T, ffn}, dt()), gy = gpu_nan({T, ffn}, dt());
    gpu::linear_gelu_forward(to_gpu(x, dt()), to_gpu(w, dt()),
                             with_bias ? to_gpu(b, dt()) : Tensor(), gpre, gy, GS());
    EXPECT_CLOSE(gpre, pre, dt()) << "bias " << with_bias;
    EXPECT_CLOSE(gy, y, dt()) << "bias " << with_bias;
  }
  // Backward of fc2(gelu(pre)): fc2 is [in2 = 96, ffn].
  const int64_t out2 = 96;
  Tensor pre = rand_in({T, ffn}, 83, dt(), -4.f, 4.f), act = Tensor::empty({T, ffn}, DType::F32);
  cpu::gelu_forward(pre, act, CS());
  Tensor w2 = rand_in({out2, ffn}, 84, dt(), -0.2f, 0.2f), dy = rand_in({T, out2}, 85, dt());
  Tensor dpre = Tensor::empty({T, ffn}, DType::F32), dw = rand_f32({out2, ffn}, 86),
         db = rand_f32({out2}, 87);
  Tensor gdpre = gpu_nan({T, ffn}, dt()), gdw = to_gpu(dw, DType::F32),
         gdb = to_gpu(db, DType::F32);
  gpu::linear_gelu_backward(to_gpu(dy, dt()), to_gpu(act, dt()), to_gpu(w2, dt()),
                            to_gpu(pre, dt()), gdpre, gdw, gdb, GS());
  cpu::linear_gelu_backward(dy, act, w2, pre, dpre, dw, db, CS());
  EXPECT_CLOSE(gdpre, dpre, dt());
  EXPECT_CLOSE(gdw, dw, dt() == DType::F32 ? DType::F32 : DType::F16);
  EXPECT_CLOSE(gdb, db, dt() == DType::F32 ? DType::F32 : DType::F16);
}

// GEMM tuning (ops/cuda/gemm.cu) times several cuBLASLt algorithms per shape and may pick
// any of them, but only one whose output is bitwise equal to the heuristic's first pick:
// every linear op gives the same bits with tuning on as with it off. Shapes large enough
// that cuBLASLt offers several candidates (the report must show tuning ran).
TEST_P(GpuFused, GemmTuningKeepsTheBits) {
  const int64_t T = 2048, in = 512, ffn = 2048;
  Tensor x = to_gpu(rand_in({T, in}, 120, dt()), dt());
  Tensor w1 = to_gpu(rand_in({ffn, in}, 121, dt(), -0.2f, 0.2f), dt());
  Tensor b1 = to_gpu(rand_in({ffn}, 122, dt()), dt());
  Tensor w2 = to_gpu(rand_in({in, ffn}, 123, dt(), -0.2f, 0.2f), dt());
  Tensor dy = to_gpu(rand_in({T, in}, 124, dt()), dt());
  Tensor r = to_gpu(rand_in({T, in}, 125, dt()), dt());
  Tensor dw0 = rand_f32({in, ffn}, 126);
  // Every output, copied to the host in its own dtype.
  auto run = [&] {
    Tensor pre = gpu_nan({T, ffn}, dt()), act = gpu_nan({T, ffn}, dt());
    Tensor y = gpu_nan({T, in}, dt()), dpre = gpu_nan({T, ffn}, dt()), dx = gpu_nan({T, in}, dt());
    Tensor dw = to_gpu(dw0, DType::F32), db = to_gpu(rand_f32({in}, 127), DType::F32), none;
    gpu::linear_gelu_forward(x, w1, b1, pre, act, GS());
    gpu::linear_residual_forward(act, w2, Tensor(), r, y, GS());
    gpu::linear_gelu_backward(dy, act, w2, pre, dpre, dw, db, GS());
    gpu::linear_backward(dpre, x, w1, dx, false, none, none, GS());
    std::vector<Tensor> host;
    for (Tensor* t : {&pre, &act, &y, &dpre, &dx, &dw}) {
      host.push_back(Tensor::empty(t->shape(), t->dtype()));
      gpu::copy(*t, host.back(), GS());
    }
    return host;
  };
  const bool before = gpu::set_gemm_autotune(false);
  auto plain = run();
  gpu::set_gemm_autotune(true);
  auto tuned = run();
  const std::string report = gpu::gemm_tuning_report();
  gpu::set_gemm_autotune(before);
  EXPECT_NE(report.find("bitwise equal"), std::string::npos) << "no GEMM was tuned:\n" << report;
  const char* names[] = {"pre", "act", "y", "dpre", "dx", "dw"};
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(std::memcmp(plain[i].raw(), tuned[i].raw(), plain[i].nbytes()), 0)
        << names[i] << " differs with tuning on; report:\n" << report;
}

// The residual add in the GEMM epilogue (cuBLASLt's separate C input), with a bias of the
// activation dtype (fused), an f32 bias (the unfused path), none, and residual == y.
TEST_P(GpuFused, LinearResidualMatchesLinearThenAdd) {
  const int64_t T = 40, in = 64, out = 96;
  Tensor x = rand_in({T, in}, 100, dt()), w = rand_in({out, in}, 101, dt(), -0.3f, 0.3f);
  Tensor r = rand_in({T, out}, 102, dt(), -3.f, 3.f);
  for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
    for (bool alias : {false, true}) {
      Tensor b = bias_kind == 0 ? Tensor() : rand_in({out}, 103, dt());
      Tensor y = Tensor::empty({T, out}, DType::F32);
      cpu::linear_forward(x, w, b, y, CS());
      for (int64_t i = 0; i < T * out; ++i) y.data<float>()[i] += r.data<float>()[i];
      Tensor gb = bias_kind == 0 ? Tensor() : to_gpu(b, bias_kind == 1 ? dt() : DType::F32);
      Tensor gr = to_gpu(r, dt());
      Tensor gy = alias ? gr : gpu_nan({T, out}, dt());
      gpu::linear_residual_forward(to_gpu(x, dt()), to_gpu(w, dt()), gb, gr, gy, GS());
      EXPECT_CLOSE(gy, y, dt()) << "bias kind " << bias_kind << " alias " << alias;
    }
  }
}

// The op profiler counts each dispatched op once, nested or not, and its times add up.
TEST(GpuProfiler, CountsDispatchedOps) {
  MCPP_REQUIRE_GPU();
  Tensor x = to_gpu(rand_f32({256, 512}, 90), DType::BF16), w =
      to_gpu(rand_f32({384, 512}, 91), DType::BF16);
  Tensor y = Tensor::empty({256, 384}, DType::BF16, Device::CUDA);
  Stream& s = GS();
  gpu::op_profile_collect();
  gpu::set_op_profiling(true);
  for (int i = 0; i < 3; ++i) ops::linear_forward(x, w, Tensor(), y, s);
  ops::scale(y, 0.5, s);
  gpu::set_op_profiling(false);
  ops::scale(y, 2.0, s);  // not recorded
  auto times = gpu::op_profile_collect();
  ASSERT_EQ(times.size(), 2u);
  int64_t lin = 0, sc = 0;
  for (const auto& t : times) {
    EXPECT_GT(t.ms, 0.0) << t.name;
    if (t.name == "linear_forward [384x512]") lin = t.calls;
    if (t.name == "scale") sc = t.calls;
  }
  EXPECT_EQ(lin, 3);
  EXPECT_EQ(sc, 1);
  EXPECT_TRUE(gpu::op_profile_collect().empty());  // collect clears
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuFused, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace fused_gpu_test
}  // namespace mcpp::test
