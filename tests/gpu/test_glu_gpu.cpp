// The gated units with offset and clamp (glu_forward / glu_backward: quick-GEGLU, SwiGLU) and
// the experts' fc2-bias ops (moe_bias_scale_*) on CUDA against the CPU ops (label gpu): f32,
// bf16 and f16, the 16-byte vector kernel (F a whole number of packs) and the scalar one (an
// odd F, an unaligned view), clamps that cut, outputs poisoned with NaN first; plain SwiGLU
// through glu_* gives swiglu_*'s bits; the bias gradients (+=) from non-zero starting values.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "gpu_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace glu_gpu_test {

using ops::GluParams;
using ops::MlpAct;
using ops::MlpActivation;

MlpAct act(MlpActivation k, double offset, double clamp) {
  GluParams p;
  p.offset = offset, p.clamp = clamp;
  return {k, p};
}
const double kNone = std::numeric_limits<double>::infinity();

std::vector<MlpAct> cases() {
  return {act(MlpActivation::QuickGeglu, 0, kNone), act(MlpActivation::QuickGeglu, 1.0, 0.75),
          act(MlpActivation::Swiglu, 0, 0.75), act(MlpActivation::Swiglu, 0.5, kNone)};
}

class GpuGlu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

TEST_P(GpuGlu, MatchesCpu) {
  const int64_t T = 29;
  for (MlpAct a : cases())
    for (int64_t F : {64, 37})
      for (int64_t offset : {0, 1}) {  // 1: an unaligned f32 view (the scalar kernel)
        if (offset && dt() != DType::F32) continue;
        SCOPED_TRACE(::testing::Message() << int(a.kind) << " offset " << a.glu.offset
                                          << " clamp " << a.glu.clamp << " F " << F
                                          << " view offset " << offset);
        const Tensor x = rand_in({T, 2 * F}, 1, dt(), -2.f, 2.f), dy = rand_in({T, F}, 2, dt());
        Tensor y = Tensor::empty({T, F}, DType::F32), dx = Tensor::empty({T, 2 * F}, DType::F32);
        cpu::glu_forward(x, a, y, CS());
        cpu::glu_backward(dy, x, a, dx, CS());
        const Tensor gx = offset ? gpu_at(x, offset).view({T, 2 * F}) : to_gpu(x, dt());
        const Tensor gdy = offset ? gpu_at(dy, offset).view({T, F}) : to_gpu(dy, dt());
        Tensor gy = gpu_nan({T, F}, dt()), gdx = gpu_nan({T, 2 * F}, dt());
        gpu::glu_forward(gx, a, gy, GS());
        gpu::glu_backward(gdy, gx, a, gdx, GS());
        EXPECT_CLOSE(gy, y, dt());
        EXPECT_CLOSE(gdx, dx, dt());
      }
}

TEST_P(GpuGlu, PlainSwigluIsSwiglusBits) {
  const int64_t T = 17, F = 128;
  const Tensor x = rand_in({T, 2 * F}, 3, dt(), -3.f, 3.f), dy = rand_in({T, F}, 4, dt());
  const Tensor gx = to_gpu(x, dt()), gdy = to_gpu(dy, dt());
  Tensor y1 = gpu_nan({T, F}, dt()), y2 = gpu_nan({T, F}, dt());
  Tensor d1 = gpu_nan({T, 2 * F}, dt()), d2 = gpu_nan({T, 2 * F}, dt());
  gpu::swiglu_forward(gx, y1, GS());
  gpu::glu_forward(gx, MlpActivation::Swiglu, y2, GS());
  gpu::swiglu_backward(gdy, gx, d1, GS());
  gpu::glu_backward(gdy, gx, MlpActivation::Swiglu, d2, GS());
  EXPECT_TRUE(equal_bits(y1, y2));
  EXPECT_TRUE(equal_bits(d1, d2));
}

TEST_P(GpuGlu, MoeBiasScaleMatchesCpu) {
  for (auto [N, H] : {std::pair<int64_t, int64_t>{37, 72}, {300, 33}, {1, 8}}) {
    SCOPED_TRACE(::testing::Message() << "N " << N << " H " << H);
    const Tensor b = rand_in({H}, 5, dt()), y0 = rand_in({N, H}, 6, dt());
    const Tensor dy = rand_in({N, H}, 7, dt());
    const Tensor p = rand_f32({N}, 8, 0.f, 1.f), db0 = rand_f32({H}, 9), dp0 = rand_f32({N}, 10);
    Tensor y = y0.clone(), db = db0.clone(), dp = dp0.clone();
    cpu::moe_bias_scale_forward(b, p, y, CS());
    cpu::moe_bias_scale_backward(dy, b, p, db, dp, CS());
    Tensor gy = to_gpu(y0, dt()), gdb = to_gpu(db0, DType::F32), gdp = to_gpu(dp0, DType::F32);
    const Tensor gb = to_gpu(b, dt()), gp = to_gpu(p, DType::F32);
    gpu::moe_bias_scale_forward(gb, gp, gy, GS());
    gpu::moe_bias_scale_backward(to_gpu(dy, dt()), gb, gp, gdb, gdp, GS());
    EXPECT_CLOSE(gy, y, dt());
    EXPECT_LE(rel_err(to_cpu(gdb), db), 1e-5);  // f32 sums of the same inputs
    EXPECT_LE(rel_err(to_cpu(gdp), dp), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuGlu, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace glu_gpu_test
