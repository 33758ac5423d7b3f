// The CUDA inference ops against the CPU reference (label gpu; tests/gpu/gpu_test_util.h):
// decode_attention at the 1B model's head shape and others, sequences of one batch at
// different positions (1 key, part of a 32-key chunk, several chunks per warp), one row
// (a decode step) and seven (a prefill chunk), f32 and bf16; argmax_rows on bf16 logits with a tie, a NaN and a padded vocabulary.
#include <cmath>
#include <tuple>

#include "gpu_test_util.h"

namespace mcpp::test {
namespace {

TEST(GpuDecode, AttentionMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [S, NH, NG, HD] :
         {std::tuple{1, 32, 8, 64}, {1, 4, 4, 128}, {1, 6, 2, 80}, {1, 2, 1, 32}, {7, 32, 8, 64}}) {
      ops::AttentionDims d;
      d.S = S, d.B = 5, d.NH = NH, d.NG = NG, d.HD = HD;
      const int64_t Tmax = 300;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      Tensor kc = rand_in(cache, 11, dt, -2.f, 2.f), vc = rand_in(cache, 12, dt);
      Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 13, dt, -2.f, 2.f);
      Tensor pos = Tensor::empty({d.B}, DType::I64);
      const int64_t p[] = {0, 20, 127, 128, Tmax - S};
      for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
      const double scale = 1.0 / std::sqrt(double(HD));
      Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F32);
      cpu::decode_attention(qkv, d, pos, scale, kc, vc, out, CS());
      Tensor gout = gpu_nan(out.shape(), dt);
      gpu::decode_attention(to_gpu(qkv, dt), d, to_gpu(pos, DType::I64), scale, to_gpu(kc, dt),
                            to_gpu(vc, dt), gout, GS());
      SCOPED_TRACE(::testing::Message() << "S=" << S << " NH=" << NH << " NG=" << NG << " HD=" << HD
                                        << " dtype=" << dtype_name(dt));
      EXPECT_CLOSE(gout, out, dt);
    }
}

TEST(GpuDecode, ArgmaxMatchesCpu) {
  MCPP_REQUIRE_GPU();
  const int64_t R = 6, Vp = 32064, V = 32000;
  Tensor x = rand_in({R, Vp}, 21, DType::BF16, -4.f, 4.f);
  float* p = static_cast<float*>(x.raw());
  p[1 * Vp + 5] = p[1 * Vp + 31000] = 8.f;  // a tie: the lower index
  p[2 * Vp + 32010] = 100.f;                // beyond V
  p[3 * Vp + 0] = NAN, p[3 * Vp + 777] = 9.f;
  for (int64_t i = 0; i < V; ++i) p[4 * Vp + i] = 1.f;  // all equal: index 0
  Tensor ids = Tensor::empty({R}, DType::I64);
  cpu::argmax_rows(x, V, ids, CS());
  Tensor gids = Tensor::empty({R}, DType::I64, Device::CUDA);
  gpu::argmax_rows(to_gpu(x, DType::BF16), V, gids, GS());
  Tensor back = to_cpu(gids);
  for (int64_t r = 0; r < R; ++r)
    EXPECT_EQ(back.data<int64_t>()[r], ids.data<int64_t>()[r]) << "row " << r;
  EXPECT_EQ(back.data<int64_t>()[1], 5);
  EXPECT_EQ(back.data<int64_t>()[3], 777);
  EXPECT_EQ(back.data<int64_t>()[4], 0);
}

}  // namespace
}  // namespace mcpp::test
