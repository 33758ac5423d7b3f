// The context-parallel attention ops on the GPU (label gpu) against the CPU op (f32) on
// the same inputs: one causal and one non-causal block, forward (out, lse) and backward
// (+= into dQ / dK,dV destinations that already hold values), and the lse merge, in f32
// and bf16, with and without attention dropout; then a whole CP=2 decomposition (every
// visible block, merged, backward with the final out/lse) against the GPU's own full
// causal attention.
#include <limits>

#include "../gpu/gpu_test_util.h"

namespace {

using namespace mcpp;
using namespace mcpp::test;

struct Dims {
  int64_t C = 80, B = 2, NH = 4, NG = 2, HD = 64;  // 80 rows: a full and a partial tile
};

ops::AttentionDims block(const Dims& z, int64_t q_off, int64_t k_off, int64_t Sg) {
  ops::AttentionDims d;
  d.S = z.C, d.B = z.B, d.NH = z.NH, d.NG = z.NG, d.HD = z.HD;
  d.S_global = Sg, d.q_offset = q_off, d.k_offset = k_off;
  return d;
}

void check_block(DType dt, bool causal, double p) {
  MCPP_REQUIRE_GPU();
  const Dims z;
  const ops::AttentionDims d = block(z, causal ? 80 : 160, 80, 320);
  const int64_t W = d.qkv_width(), O = z.NH * z.HD, rows = z.C * z.B;
  const Tensor q = rand_in({rows, W}, 1, dt), kv = causal ? q : rand_in({rows, W}, 2, dt);
  const Tensor dout = rand_in({rows, O}, 3, dt);
  const Tensor dq0 = rand_in({rows, W}, 4, dt), dkv0 = rand_in({rows, W}, 5, dt);
  const ops::DropoutKey key{11, 12};
  const double scale = 0.125;
  // CPU reference, f32.
  Tensor out_c = Tensor::empty({rows, O}, DType::F32), lse_c = Tensor::empty({z.B, z.NH, z.C}, DType::F32);
  cpu::attention_block_forward(q, kv, d, causal, scale, p, key, out_c, lse_c, CS());
  Tensor dq_c = dq0.clone(), dkv_c = dkv0.clone();
  cpu::attention_block_backward(dout, q, kv, out_c, lse_c, d, causal, scale, p, key, dq_c, dkv_c, CS());
  // GPU.
  Tensor gq = to_gpu(q, dt), gkv = causal ? gq : to_gpu(kv, dt), gdo = to_gpu(dout, dt);
  Tensor out_g = gpu_nan({rows, O}, dt), lse_g = gpu_nan({z.B, z.NH, z.C}, DType::F32);
  gpu::attention_block_forward(gq, gkv, d, causal, scale, p, key, out_g, lse_g, GS());
  EXPECT_CLOSE(out_g, out_c, dt);
  EXPECT_CLOSE(lse_g, lse_c, DType::F32);
  // Backward from the CPU's out (rounded to dt) so both see the same numbers.
  Tensor out_r = rounded(out_c, dt);
  Tensor gout = to_gpu(out_r, dt), glse = to_gpu(lse_c, DType::F32);
  Tensor dq_ref = dq0.clone(), dkv_ref = dkv0.clone();
  cpu::attention_block_backward(dout, q, kv, out_r, lse_c, d, causal, scale, p, key, dq_ref,
                                dkv_ref, CS());
  Tensor dq_g = to_gpu(dq0, dt), dkv_g = causal ? dq_g : to_gpu(dkv0, dt);
  if (causal) {  // one destination for both, as the CPU reference below
    dq_ref = dq0.clone();
    cpu::attention_block_backward(dout, q, kv, out_r, lse_c, d, causal, scale, p, key, dq_ref,
                                  dq_ref, CS());
  }
  gpu::attention_block_backward(gdo, gq, gkv, gout, glse, d, causal, scale, p, key, dq_g, dkv_g,
                                GS());
  EXPECT_CLOSE(dq_g, dq_ref, dt);
  if (!causal) EXPECT_CLOSE(dkv_g, dkv_ref, dt);
}

TEST(ContextParallelGpu, CausalBlockF32) { check_block(DType::F32, true, 0.0); }
TEST(ContextParallelGpu, NonCausalBlockF32Dropout) { check_block(DType::F32, false, 0.1); }
TEST(ContextParallelGpu, CausalBlockBF16Dropout) { check_block(DType::BF16, true, 0.1); }
TEST(ContextParallelGpu, NonCausalBlockBF16) { check_block(DType::BF16, false, 0.0); }

TEST(ContextParallelGpu, LseMergeMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Dims z;
    const ops::AttentionDims d = block(z, 0, 0, 0);
    const int64_t n = z.C * z.B * z.NH * z.HD;
    const Tensor oa = rand_in({n}, 21, dt), ob = rand_in({n}, 22, dt);
    const Tensor la = rand_f32({z.B, z.NH, z.C}, 23, -3.f, 3.f), lb = rand_f32({z.B, z.NH, z.C}, 24, -3.f, 3.f);
    Tensor o_c = oa.clone(), l_c = la.clone();
    cpu::attention_lse_merge(ob, lb, d, o_c, l_c, CS());
    Tensor o_g = to_gpu(oa, dt), l_g = to_gpu(la, DType::F32);
    gpu::attention_lse_merge(to_gpu(ob, dt), to_gpu(lb, DType::F32), d, o_g, l_g, GS());
    EXPECT_CLOSE(o_g, o_c, dt);
    EXPECT_CLOSE(l_g, l_c, DType::F32);
  }
}

// CP = 2 on one GPU: chunks 0..3 of 80 rows; every rank's visible blocks merged give the
// full causal attention (the GPU's own attention_forward/backward), f32, dropout on.
TEST(ContextParallelGpu, BlocksMergeToFullAttention) {
  MCPP_REQUIRE_GPU();
  const DType dt = DType::F32;
  const Dims z;
  const int64_t C = z.C, B = z.B, S = 4 * C, O = z.NH * z.HD;
  ops::AttentionDims full = block(z, 0, 0, S);
  full.S = S;
  const int64_t W = full.qkv_width();
  const Tensor qkv_c = rand_in({S * B, W}, 31, dt), dout_c = rand_in({S * B, O}, 32, dt);
  const ops::DropoutKey key{5, 6};
  const double scale = 0.125, p = 0.1;
  Tensor qkv = to_gpu(qkv_c, dt), dout = to_gpu(dout_c, dt);
  Tensor out_ref = gpu_nan({S * B, O}, dt), lse_ref = gpu_nan({B, z.NH, S}, DType::F32);
  gpu::attention_forward(qkv, full, scale, p, key, out_ref, lse_ref, GS());
  Tensor dqkv_ref = gpu_nan(qkv.shape(), dt);
  gpu::attention_backward(dout, qkv, out_ref, lse_ref, full, scale, p, key, dqkv_ref, GS());

  auto rows = [&](const Tensor& t, int64_t c) { return t.narrow(c * C * B, C * B); };
  Tensor out = Tensor::empty({S * B, O}, dt, Device::CUDA), dqkv = Tensor::empty(qkv.shape(), dt, Device::CUDA);
  gpu::fill(dqkv, 0.0, GS());
  for (int64_t qa = 0; qa < 4; ++qa) {
    Tensor o = Tensor::empty({C * B, O}, dt, Device::CUDA), l = Tensor::empty({B, z.NH, C}, DType::F32, Device::CUDA);
    gpu::fill(o, 0.0, GS());
    gpu::fill(l, -std::numeric_limits<double>::infinity(), GS());
    Tensor oi = Tensor::empty(o.shape(), dt, Device::CUDA), li = Tensor::empty(l.shape(), DType::F32, Device::CUDA);
    for (int64_t kc = 0; kc <= qa; ++kc) {
      const ops::AttentionDims d = block(z, qa * C, kc * C, S);
      gpu::attention_block_forward(rows(qkv, qa), rows(qkv, kc), d, kc == qa, scale, p, key, oi, li, GS());
      gpu::attention_lse_merge(oi, li, d, o, l, GS());
    }
    for (int64_t kc = 0; kc <= qa; ++kc) {
      const ops::AttentionDims d = block(z, qa * C, kc * C, S);
      Tensor dq = rows(dqkv, qa), dkv = rows(dqkv, kc);
      gpu::attention_block_backward(rows(dout, qa), rows(qkv, qa), rows(qkv, kc), o, l, d, kc == qa,
                                    scale, p, key, dq, dkv, GS());
    }
    Tensor dst = rows(out, qa);
    gpu::copy(o, dst, GS());
  }
  EXPECT_LE(rel_err(to_cpu(out), to_cpu(out_ref)), 1e-5);
  EXPECT_LE(rel_err(to_cpu(dqkv), to_cpu(dqkv_ref)), 1e-4);
}

}  // namespace
