// --rotary-interleaved's permutation (ops/rope_interleave.h) on the GPU against the CPU op: a
// copy, so the bits must agree exactly, in f32 and bf16 (2- and 4-byte words), forward and
// inverse, whole heads and rotary_percent 0.5. GPU outputs start as NaN: a skipped element
// fails.
#include "gpu_test_util.h"
#include "ops/rope_interleave.h"

namespace mcpp::test {
namespace rope_interleave_gpu_test {

TEST(GpuRopeInterleave, MatchesCpuBitForBit) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t rot : {64, 32})
      for (bool inverse : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rot " << rot << " inverse "
                                          << inverse);
        ops::RopePermuteDims d;
        d.groups = 2, d.heads_per_group = 3, d.head_dim = 64, d.rot_dim = rot;
        const int64_t T = 37, W = d.groups * (d.heads_per_group + 2) * d.head_dim;
        const Tensor x = rand_in({T, W}, 11, dt);
        Tensor y = Tensor::empty({T, W}, DType::F32);
        ops::cpu::rope_deinterleave(x, d, inverse, y, CS());
        Tensor gy = gpu_nan({T, W}, dt);
        ops::rope_deinterleave(to_gpu(x, dt), d, inverse, gy, GS());
        EXPECT_EQ(rel_err(to_cpu(gy), y), 0.0);
      }
}

}  // namespace rope_interleave_gpu_test
}  // namespace mcpp::test
