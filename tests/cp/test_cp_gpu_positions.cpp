// RoPE at per-token positions (--reset-position-ids) on the GPU (label gpu) against the
// CPU op, which has the semantics: rope_positions on qkv [S, B, QKVW] with positions
// [S, B] i64 on the device (documents restarting at 0 mid-sequence, and large positions
// where the angle needs f64), forward and inverse, f32 and bf16, GQA, a partial rotary
// dimension, in place and out of place; the inverse undoes the forward.
#include <cmath>

#include "../gpu/gpu_test_util.h"
#include "base/error.h"

namespace cp_gpu_positions_test {

using namespace mcpp;
using namespace mcpp::test;

void check_rope_positions(DType dt, int64_t rot_dim, bool in_place) {
  MCPP_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rot_dim " << rot_dim
                                    << (in_place ? " in place" : ""));
  ops::AttentionDims d;
  d.S = 37, d.B = 3, d.NH = 8, d.NG = 2, d.HD = 64;
  const double base = 10000.0;
  const Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 71, dt, -2.f, 2.f);
  // Sequence b: documents of 5 + 3b tokens (positions restart at 0), the last row of
  // sequence 2 far out (angles of thousands of radians).
  Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[s * d.B + b] = s % (5 + 3 * b);
  pos.data<int64_t>()[(d.S - 1) * d.B + 2] = 30000;
  Tensor gpos = Tensor::empty(pos.shape(), DType::I64, Device::CUDA);
  ops::copy(pos, gpos, GS());
  for (bool inverse : {false, true}) {
    Tensor ref = Tensor::empty(qkv.shape(), DType::F32);
    cpu::rope_positions(qkv, d, rot_dim, base, pos, inverse, ref, CS());
    Tensor g = to_gpu(qkv, dt);
    Tensor out = in_place ? g : gpu_nan(qkv.shape(), dt);
    gpu::rope_positions(g, d, rot_dim, base, gpos, inverse, out, GS());
    EXPECT_CLOSE(out, ref, dt) << (inverse ? "inverse" : "forward");
    // Against rows at positions s (rope_forward) the documents make a difference.
    if (!inverse) {
      Tensor plain = Tensor::empty(qkv.shape(), DType::F32);
      cpu::rope_forward(qkv, d, rot_dim, base, 0, plain, CS());
      EXPECT_GT(rel_err(to_cpu(out), plain), 10 * tol(dt)) << "positions made no difference";
    }
  }
  // The inverse undoes the forward (f32: to rounding).
  if (dt == DType::F32) {
    Tensor g = to_gpu(qkv, dt), fwd = gpu_nan(qkv.shape(), dt), back = gpu_nan(qkv.shape(), dt);
    gpu::rope_positions(g, d, rot_dim, base, gpos, false, fwd, GS());
    gpu::rope_positions(fwd, d, rot_dim, base, gpos, true, back, GS());
    EXPECT_LE(rel_err(to_cpu(back), qkv), 1e-6);
  }
}

TEST(RopePositionsGpu, F32) { check_rope_positions(DType::F32, 64, false); }
TEST(RopePositionsGpu, F32PartialInPlace) { check_rope_positions(DType::F32, 32, true); }
TEST(RopePositionsGpu, BF16) { check_rope_positions(DType::BF16, 64, false); }
TEST(RopePositionsGpu, BF16PartialInPlace) { check_rope_positions(DType::BF16, 48, true); }

// Positions on the host are refused by name (the model uploads them once per micro-batch).
TEST(RopePositionsGpu, HostPositionsRefused) {
  MCPP_REQUIRE_GPU();
  ops::AttentionDims d;
  d.S = 4, d.B = 1, d.NH = 2, d.NG = 2, d.HD = 16;
  Tensor g = to_gpu(rand_in({d.S, d.B, d.qkv_width()}, 72, DType::F32), DType::F32);
  Tensor pos = Tensor::zeros({d.S, d.B}, DType::I64);
  try {
    gpu::rope_positions(g, d, 16, 10000.0, pos, false, g, GS());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("on the GPU"), std::string::npos) << e.what();
  }
}

}  // namespace cp_gpu_positions_test
