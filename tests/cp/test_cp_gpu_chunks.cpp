// cuDNN's deterministic attention backward in chunks of key/value groups (label gpu):
// when one sequence's dP (NH x S^2 x 2 bytes) is over the workspace cap, the sequence runs
// as several cuDNN calls on whole groups (ops/types.h's attention_bwd_chunking). The
// chunked dQKV must be bit for bit the unchunked one (each group's dK/dV come from its own
// query heads only, by the same per-head math), and match the CPU op, for MHA and GQA in
// bf16, for self-attention and for a context-parallel block (a separate key/value chunk,
// not causal). The cap is forced through set_cudnn_attention_bwd_workspace_cap; the chunk
// counts each cap gives are asserted first so that a test that did not chunk cannot pass.
#include <cmath>
#include <cstring>

#include "../gpu/gpu_test_util.h"
#include "ops/cuda/cudnn_attention.h"

namespace cp_gpu_chunks_test {

using namespace mcpp;
using namespace mcpp::test;

struct Case {
  int64_t S, B, NH, NG, HD;
};

cudaStream_t cs() { return static_cast<cudaStream_t>(GS().handle); }

// Restores the process's cap when a test ends, pass or fail.
struct CapGuard {
  int64_t before = gpu::set_cudnn_attention_bwd_workspace_cap(int64_t(1) << 40);
  ~CapGuard() { gpu::set_cudnn_attention_bwd_workspace_cap(before); }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!std::isfinite(static_cast<const float*>(a.raw())[i])) return false;  // unwritten
  return a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), size_t(a.numel()) * sizeof(float)) == 0;
}

// causal: self-attention (cudnn_attention_backward); else a CP block, queries against a
// separate key/value chunk without a mask (cudnn_block_backward into dq and dkv).
void check_group_chunks(const Case& c, bool causal) {
  MCPP_REQUIRE_GPU();
  if (!gpu::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN";
  ASSERT_TRUE(gpu::cudnn_attention_enabled()) << gpu::cudnn_attention_status();
  if (const char* e = std::getenv("MCPP_ATTENTION_DETERMINISTIC"); e && std::strcmp(e, "0") == 0)
    GTEST_SKIP() << "MCPP_ATTENTION_DETERMINISTIC=0: the atomic backward is not chunked";
  const DType dt = DType::BF16;
  SCOPED_TRACE(::testing::Message() << "S=" << c.S << " B=" << c.B << " NH=" << c.NH
                                    << " NG=" << c.NG << " causal=" << causal);
  ops::AttentionDims d;
  d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
  if (!causal) d.S_global = 2 * c.S, d.q_offset = c.S, d.k_offset = 0;  // a later query chunk
  const double scale = 1.0 / std::sqrt(double(c.HD));
  const int64_t W = d.qkv_width(), O = c.NH * c.HD, rows = c.S * c.B;
  const Tensor q = rand_in({rows, W}, 300 + c.NG, dt, -2.f, 2.f);
  const Tensor kv = causal ? q : rand_in({rows, W}, 400 + c.NG, dt, -2.f, 2.f);
  const Tensor dout = rand_in({rows, O}, 500 + c.NG, dt);
  Tensor gq = to_gpu(q, dt), gkv = causal ? gq : to_gpu(kv, dt), gdo = to_gpu(dout, dt);
  const gpu::FlashArgs fa{gq.raw(), d, dt, scale};
  Tensor gout = gpu_nan({rows, O}, dt), glse = gpu_nan({c.B, c.NH, c.S}, DType::F32);
  ASSERT_TRUE(causal ? gpu::cudnn_attention_forward(fa, gout.raw(), static_cast<float*>(glse.raw()), cs())
                     : gpu::cudnn_block_forward(fa, gkv.raw(), false, gout.raw(),
                                                static_cast<float*>(glse.raw()), cs()));
  // The CPU op on the same (rounded) inputs and the GPU's out/lse.
  Tensor out_c = to_cpu(gout), lse_c = to_cpu(glse);
  Tensor dq_c = Tensor::zeros({rows, W}, DType::F32), dkv_c = Tensor::zeros({rows, W}, DType::F32);
  if (causal) {
    cpu::attention_backward(dout, q, out_c, lse_c, d, scale, 0.0, {}, dq_c, CS());
  } else {
    cpu::attention_block_backward(dout, q, kv, out_c, lse_c, d, false, scale, 0.0, {}, dq_c,
                                  dkv_c, CS());
  }

  const int64_t per_seq = ops::attention_bwd_per_seq_bytes(c.NH, c.S);
  const int64_t per_group = per_seq / c.NG;
  CapGuard guard;
  // Caps: none (one call), one group a call, and half the groups a call.
  const int64_t caps[] = {int64_t(1) << 40, 0, per_group * (c.NG / 2)};
  const int64_t want_groups[] = {c.NG, 1, c.NG / 2};
  Tensor dq_ref, dkv_ref;
  for (int i = 0; i < 3; ++i) {
    const auto chunk = ops::attention_bwd_chunking(c.B, c.NH, c.NG, c.S, caps[i]);
    ASSERT_EQ(chunk.groups, want_groups[i]) << "cap " << caps[i];
    ASSERT_EQ(chunk.seqs, i == 0 ? c.B : 1) << "cap " << caps[i];
    gpu::set_cudnn_attention_bwd_workspace_cap(caps[i]);
    const auto before = gpu::cudnn_attention_stats();
    Tensor dq = gpu_nan({rows, W}, dt), dkv = causal ? dq : gpu_nan({rows, W}, dt);
    ASSERT_TRUE(causal ? gpu::cudnn_attention_backward(fa, gdo.raw(), gout.raw(),
                                                       static_cast<const float*>(glse.raw()),
                                                       dq.raw(), cs(), 1)
                       : gpu::cudnn_block_backward(fa, gkv.raw(), false, gdo.raw(), gout.raw(),
                                                   static_cast<const float*>(glse.raw()),
                                                   dq.raw(), dkv.raw(), cs()));
    EXPECT_EQ(gpu::cudnn_attention_stats().backward_calls - before.backward_calls, 1);
    Tensor dq_h = to_cpu(dq), dkv_h = to_cpu(dkv);
    if (causal) {
      EXPECT_LE(rel_err(dq_h, dq_c), tol(dt)) << "dqkv vs CPU, cap " << caps[i];
    } else {
      // dq holds dQ in its query slots, dkv dK/dV in its key/value slots; the other slots
      // stay unwritten (NaN), so compare the written ones only.
      const int64_t QW = c.NH * c.HD / c.NG;  // the query heads of a group
      Tensor q_only = dq_h.clone(), kv_only = dkv_h.clone();
      float* a = static_cast<float*>(q_only.raw());
      float* b = static_cast<float*>(kv_only.raw());
      const float* rq = static_cast<const float*>(dq_c.raw());
      const float* rk = static_cast<const float*>(dkv_c.raw());
      double nq = 0, dq2 = 0, nk = 0, dk2 = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < c.NG; ++g)
          for (int64_t j = 0; j < QW + 2 * c.HD; ++j) {
            const int64_t at = r * W + g * (QW + 2 * c.HD) + j;
            double& n = j < QW ? nq : nk;
            double& e = j < QW ? dq2 : dk2;
            const float got = j < QW ? a[at] : b[at], want = j < QW ? rq[at] : rk[at];
            if (!std::isfinite(got)) {  // an unwritten element fails the comparison
              e = INFINITY;
              continue;
            }
            n += double(want) * want, e += double(got - want) * (got - want);
            (j < QW ? b : a)[at] = 0.f;  // the unwritten slot, for the bitwise check
          }
      EXPECT_LE(std::sqrt(dq2 / nq), tol(dt)) << "dQ vs CPU, cap " << caps[i];
      EXPECT_LE(std::sqrt(dk2 / nk), tol(dt)) << "dK/dV vs CPU, cap " << caps[i];
      dq_h = q_only, dkv_h = kv_only;
    }
    if (i == 0) {
      dq_ref = dq_h, dkv_ref = dkv_h;
    } else {
      EXPECT_TRUE(same_bits(dq_h, dq_ref)) << "chunked dQ differs from one call, cap " << caps[i];
      if (!causal)
        EXPECT_TRUE(same_bits(dkv_h, dkv_ref)) << "chunked dK/dV differ, cap " << caps[i];
    }
  }
}

// GQA: 16 heads in 4 groups (4 query heads each); MHA: 8 heads, 8 groups; S not a multiple
// of the tile; two sequences (so the sequence and the group loops both run).
TEST(AttentionGroupChunks, SelfAttentionGqaBitwise) { check_group_chunks({200, 2, 16, 4, 64}, true); }
TEST(AttentionGroupChunks, SelfAttentionMhaBitwise) { check_group_chunks({200, 2, 8, 8, 64}, true); }
TEST(AttentionGroupChunks, CpBlockGqaBitwise) { check_group_chunks({144, 2, 16, 4, 128}, false); }
TEST(AttentionGroupChunks, CpBlockMhaBitwise) { check_group_chunks({144, 1, 8, 8, 64}, false); }

}  // namespace cp_gpu_chunks_test
