// Attention sinks on CUDA against the CPU ops (f32 references of the same rounded inputs): the
// sink's forward (out scaled, lse joined) and its gradient (deterministic: two runs, the same
// bits), and the generation ops with AttentionDims::sink -- the fused RoPE + decode step and
// decode_attention, on the group kernels (G 4 x HD 64, G 2 x HD 128) and the per-head one
// (G 3 x HD 80), and the prefill (the training kernel then the sink; at HD 80 the decode
// kernel).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "gpu_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace attention_sink_gpu_test {

ops::AttentionDims dims(int64_t S, int64_t B, int64_t NH, int64_t NG, int64_t HD) {
  ops::AttentionDims d;
  d.S = S, d.B = B, d.NH = NH, d.NG = NG, d.HD = HD;
  return d;
}

TEST(AttentionSinkGpu, ForwardAndGradientMatchCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t h0 : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " h0 " << h0);
      const ops::AttentionDims d = dims(37, 3, 4, 2, 64);
      const int64_t n = d.S * d.B * d.NH * d.HD;
      const Tensor out = rand_in({n}, 31, dt), dout = rand_in({n}, 32, dt);
      const Tensor lse = rand_f32({d.B, d.NH, d.S}, 33, -2.f, 3.f);
      const Tensor sink = rand_in({h0 + d.NH}, 34, dt, -2.f, 2.f);
      Tensor o_c = out.clone(), l_c = lse.clone();
      cpu::attention_sink_forward(o_c, l_c, sink, h0, d, CS());
      Tensor o_g = to_gpu(out, dt), l_g = to_gpu(lse, DType::F32);
      const Tensor s_g = to_gpu(sink, dt);
      gpu::attention_sink_forward(o_g, l_g, s_g, h0, d, GS());
      EXPECT_CLOSE(o_g, o_c, dt);
      EXPECT_CLOSE(l_g, l_c, DType::F32);
      // The gradient from the sink's (out, lse), added to what dsink held.
      Tensor ds_c = rand_f32({h0 + d.NH}, 35);
      const Tensor ds0 = ds_c.clone();
      const Tensor o_r = to_cpu(o_g);  // the rounded output both backends read
      cpu::attention_sink_backward(dout, o_r, l_c, sink, h0, d, ds_c, CS());
      Tensor ds_g = to_gpu(ds0, DType::F32), ds_g2 = to_gpu(ds0, DType::F32);
      const Tensor dout_g = to_gpu(dout, dt);
      gpu::attention_sink_backward(dout_g, o_g, l_g, s_g, h0, d, ds_g, GS());
      gpu::attention_sink_backward(dout_g, o_g, l_g, s_g, h0, d, ds_g2, GS());
      EXPECT_CLOSE(ds_g, ds_c, DType::F32);
      EXPECT_TRUE(equal_bits(ds_g, ds_g2)) << "the sink gradient is not deterministic";
      for (int64_t h = 0; h < h0; ++h)  // heads outside [h0, h0 + NH) untouched
        EXPECT_EQ(to_cpu(ds_g).data<float>()[h], ds0.data<float>()[h]);
    }
}

TEST(AttentionSinkGpu, GenerationOpsMatchCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [NH, NG, HD] : {std::tuple{8, 2, 64}, {6, 3, 128}, {6, 2, 80}})
      for (int64_t window : {-1, 4}) {  // gpt-oss's layers: sinks, some with a sliding window
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " NH " << NH << " NG " << NG
                                        << " HD " << HD << " window " << window);
      const int64_t B = 2, Tmax = 40, S = 9;
      const double scale = 1.0 / std::sqrt(double(HD));
      const Tensor sink = rand_in({NH}, 41, dt, -1.f, 2.f);
      const Tensor sink_g = to_gpu(sink, dt);
      const Shape cache{B, Tmax, NG, HD};
      // Prefill of S rows from position 0.
      ops::AttentionDims d = dims(S, B, NH, NG, HD);
      d.window_left = window;
      const Tensor qkv = rand_in({S, B, d.qkv_width()}, 42, dt, -2.f, 2.f);
      Tensor kc = Tensor::zeros(cache, DType::F32), vc = Tensor::zeros(cache, DType::F32);
      Tensor out = Tensor::empty({S, B, NH * HD}, DType::F32);
      d.sink = sink;
      Tensor lse_unused = Tensor::empty({B, NH, S}, DType::F32);
      cpu::attention_prefill(qkv, d, scale, kc, vc, out, lse_unused, CS());
      d.sink = sink_g;
      Tensor gk = to_gpu(Tensor::zeros(cache, DType::F32), dt);
      Tensor gv = to_gpu(Tensor::zeros(cache, DType::F32), dt);
      Tensor gout = gpu_nan(out.shape(), dt), glse = gpu_nan({B, NH, S}, DType::F32);
      gpu::attention_prefill(to_gpu(qkv, dt), d, scale, gk, gv, gout, glse, GS());
      EXPECT_CLOSE(gout, out, dt) << "attention_prefill";
      // Without the sinks the prefill differs (they are not a no-op at these values).
      Tensor plain = Tensor::empty(out.shape(), DType::F32);
      Tensor kc0 = Tensor::zeros(cache, DType::F32), vc0 = Tensor::zeros(cache, DType::F32);
      ops::AttentionDims d0 = dims(S, B, NH, NG, HD);
      d0.window_left = window;
      cpu::attention_prefill(qkv, d0, scale, kc0, vc0, plain, lse_unused, CS());
      EXPECT_GT(rel_err(plain, out), 1e-2);
      // A decode step at position S with RoPE (the fused op), and the same rows through
      // decode_attention directly.
      ops::AttentionDims d1 = dims(1, B, NH, NG, HD);
      d1.window_left = window;
      const Tensor step = rand_in({1, B, d1.qkv_width()}, 43, dt, -2.f, 2.f);
      Tensor pos = Tensor::empty({B}, DType::I64);
      for (int64_t b = 0; b < B; ++b) pos.data<int64_t>()[b] = S;
      const Tensor gpos = to_gpu(pos, DType::I64);
      Tensor q2 = step.clone(), o1 = Tensor::empty({1, B, NH * HD}, DType::F32);
      d1.sink = sink;
      cpu::rope_attention_decode(q2, d1, HD, 10000.0, pos, scale, kc, vc, o1, CS());
      d1.sink = sink_g;
      Tensor gq = to_gpu(step, dt), go1 = gpu_nan(o1.shape(), dt);
      gpu::rope_attention_decode(gq, d1, HD, 10000.0, gpos, scale, gk, gv, go1, GS());
      EXPECT_CLOSE(go1, o1, dt) << "rope_attention_decode";
      Tensor go2 = gpu_nan(o1.shape(), dt);
      gpu::decode_attention(gq, d1, gpos, scale, gk, gv, go2, GS());
      EXPECT_CLOSE(go2, o1, dt) << "decode_attention";
    }
}

}  // namespace attention_sink_gpu_test
