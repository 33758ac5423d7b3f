// The context-parallel attention ops on the GPU (label gpu) against the CPU op (f32) on
// the same inputs: one causal and one non-causal block, forward (out, lse) and backward
// (+= into dQ / dK,dV destinations that already hold values), and the lse merge, in f32
// and bf16, with and without attention dropout; then a whole CP=2 decomposition (every
// visible block, merged, backward with the final out/lse) against the GPU's own full
// causal attention. bf16/f16 blocks at head dim 64/128 run the tensor-core kernels of
// ops/cuda/attention_block.cu, f32 the CUDA-core ones.
//
// Document masking (--reset-attention-mask) on the GPU against the CPU op: the attention op
// with key_start (f32, bf16 and f16, head dim 64 and 128, dropout on and off; forward and
// backward), CP blocks with the mask where some rows see no key at all (lse -inf), and the
// whole model (GPT-2 and Llama, f32 and bf16) on packed documents: loss and every parameter
// gradient against the CPU model, and a loss that differs from the unmasked one; the same
// with --reset-position-ids too (per-token RoPE / learned positions on the GPU), whose loss
// differs from the one at row positions.
#include <algorithm>
#include <cmath>
#include <limits>

#include "../gpu/gpu_test_util.h"
#include "model/gpt_model.h"
#include "ops/attention_backend.h"
#include "ops/cuda/cudnn_attention.h"
#include "parallel/context_parallel/cp_attention.h"

namespace cp_gpu_test {

using namespace mcpp;
using namespace mcpp::test;
namespace model = mcpp::model;

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

// bf16 without dropout: cuDNN's fused attention (causal and unmasked graphs with a separate
// key/value chunk) where this build and device have it -- the calls must have run there --
// and the own tensor-core block kernel under --attention-backend flash.
void check_block_cudnn(bool causal) {
  MCPP_REQUIRE_GPU();
  const auto before = gpu::cudnn_attention_stats();
  check_block(DType::BF16, causal, 0.0);
  const auto after = gpu::cudnn_attention_stats();
  std::printf("[cp blocks] cuDNN %s: %lld forward, %lld backward calls (%s)\n",
              causal ? "causal" : "non-causal",
              (long long)(after.forward_calls - before.forward_calls),
              (long long)(after.backward_calls - before.backward_calls),
              gpu::cudnn_attention_status().c_str());
  if (gpu::cudnn_attention_enabled()) {
    EXPECT_EQ(after.forward_calls - before.forward_calls, 1) << "the block ran elsewhere";
    EXPECT_GE(after.backward_calls - before.backward_calls, 1) << "the block ran elsewhere";
  }
}
TEST(ContextParallelGpu, NonCausalBlockBF16Cudnn) { check_block_cudnn(false); }
TEST(ContextParallelGpu, CausalBlockBF16Cudnn) { check_block_cudnn(true); }

struct FlashRequest {  // --attention-backend flash for one test
  FlashRequest() { ops::set_attention_request(ops::AttentionRequest::Flash); }
  ~FlashRequest() { ops::set_attention_request(ops::AttentionRequest::Auto); }
};
TEST(ContextParallelGpu, NonCausalBlockBF16Flash) {
  FlashRequest f;
  check_block(DType::BF16, false, 0.0);
}
TEST(ContextParallelGpu, CausalBlockF16Flash) {
  FlashRequest f;
  check_block(DType::F16, true, 0.0);
}

// Head dim 64: the 16-byte-pack kernel (8 or 16 threads a row); 96 in f32: 24 packs a row,
// the warp-a-row kernel. Rows where neither block saw a key (both lse -inf) stay as they are.
TEST(ContextParallelGpu, LseMergeMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (const int64_t hd : {64, 96})
    for (DType dt : {DType::F32, DType::BF16}) {
      Dims z;
      z.HD = hd;
      const ops::AttentionDims d = block(z, 0, 0, 0);
      const int64_t n = z.C * z.B * z.NH * z.HD;
      const Tensor oa = rand_in({n}, 21, dt), ob = rand_in({n}, 22, dt);
      Tensor la = rand_f32({z.B, z.NH, z.C}, 23, -3.f, 3.f), lb = rand_f32({z.B, z.NH, z.C}, 24, -3.f, 3.f);
      for (int64_t i = 0; i < la.numel(); i += 7)
        la.data<float>()[i] = lb.data<float>()[i] = -std::numeric_limits<float>::infinity();
      Tensor o_c = oa.clone(), l_c = la.clone();
      cpu::attention_lse_merge(ob, lb, d, o_c, l_c, CS());
      Tensor o_g = to_gpu(oa, dt), l_g = to_gpu(la, DType::F32);
      gpu::attention_lse_merge(to_gpu(ob, dt), to_gpu(lb, DType::F32), d, o_g, l_g, GS());
      EXPECT_CLOSE(o_g, o_c, dt) << "head dim " << hd;
      EXPECT_EQ(to_cpu(o_g).data<float>()[0], to_cpu(to_gpu(oa, dt)).data<float>()[0])
          << "a row without keys changed";
      const Tensor lg = to_cpu(l_g);
      for (int64_t i = 0; i < la.numel(); ++i) {
        if (i % 7 == 0) EXPECT_EQ(lg.data<float>()[i], la.data<float>()[i]) << i;
        else EXPECT_NEAR(lg.data<float>()[i], l_c.data<float>()[i], 1e-5f) << i;
      }
    }
}

// The ring's own code (parallel/context_parallel's RingRank) for every rank of a CP ring on
// one GPU, bf16 without dropout: forward steps in ring order with their merges, backward
// from the diagonal step (writing dQ and the rank's own dK/dV, =), then the other steps
// with dK/dV summed per owner as the ring carries them home. With cuDNN each step is
// one block of Megatron's shape -- a causal block over both local chunks, rectangular
// blocks of 2C x C and C x 2C rows, lse rows 2C apart -- and the chunk blocks
// (MCPP_CP_FUSED_STEPS=0) four at most a step. Both must give the full causal attention's
// output, lse and gradients (the CPU op in f32 on the same bf16 inputs). cap > 0: cuDNN's
// deterministic backward workspace capped there, so every block's backward runs in chunks of
// one key/value group (strided views, the lse rows 2C apart included).
void check_ring_steps(int64_t CP, bool fused_env, int64_t cap = 0) {
  MCPP_REQUIRE_GPU();
  struct Cap {  // restores the process's cap
    int64_t before = -1;
    ~Cap() {
      if (before >= 0) gpu::set_cudnn_attention_bwd_workspace_cap(before);
    }
  } restore;
  if (cap > 0) restore.before = gpu::set_cudnn_attention_bwd_workspace_cap(cap);
  namespace cpa = mcpp::parallel::context_parallel;
  const DType dt = DType::BF16;
  const Dims z;  // C 80: a full and a partial tile per chunk
  const int64_t C = z.C, B = z.B, n = 2 * CP, S = n * C, O = z.NH * z.HD;
  ops::AttentionDims full = block(z, 0, 0, S);
  full.S = S;
  const int64_t W = full.qkv_width();
  const Tensor qkv_c = rand_in({S * B, W}, 41 + CP, dt), dout_c = rand_in({S * B, O}, 42, dt);
  const double scale = 0.125;
  const ops::DropoutKey key{7, 8};
  Tensor out_c = Tensor::empty({S * B, O}, DType::F32), lse_c = Tensor::empty({B, z.NH, S}, DType::F32);
  cpu::attention_forward(qkv_c, full, scale, 0.0, key, out_c, lse_c, CS());
  Tensor dqkv_c = Tensor::empty({S * B, W}, DType::F32);
  cpu::attention_backward(dout_c, qkv_c, rounded(out_c, dt), lse_c, full, scale, 0.0, key, dqkv_c,
                          CS());

  // Rank r's rows: global chunks r and 2CP-1-r.
  auto chunk_of = [&](int64_t r, int k) { return k == 0 ? r : n - 1 - r; };
  auto local = [&](const Tensor& t, int64_t r) {
    const int64_t w = t.numel() / (S * B);
    Tensor l = Tensor::empty({2 * C * B, w}, DType::F32);
    for (int k = 0; k < 2; ++k)
      std::copy_n(t.data<float>() + chunk_of(r, k) * C * B * w, C * B * w,
                  l.data<float>() + k * C * B * w);
    return l;
  };
  cpa::CpAttention a;
  a.ad = full, a.ad.S = 2 * C, a.ad.S_global = S;
  a.scale = scale, a.key = key;
  if (fused_env) unsetenv("MCPP_CP_FUSED_STEPS");
  else setenv("MCPP_CP_FUSED_STEPS", "0", 1);
  std::vector<cpa::RingRank> rk;
  for (int64_t r = 0; r < CP; ++r) rk.emplace_back(a, CP, r, dt, GS());
  unsetenv("MCPP_CP_FUSED_STEPS");
  const bool cudnn = gpu::cudnn_attention_enabled();
  for (const auto& g : rk) EXPECT_EQ(g.fused, fused_env && cudnn) << "CP " << CP;
  const size_t np = static_cast<size_t>(CP);
  std::vector<Tensor> q(np), dO(np), o(np), l(np), dq(np), dkv(np);
  for (size_t r = 0; r < np; ++r) {
    q[r] = to_gpu(local(qkv_c, int64_t(r)), dt), dO[r] = to_gpu(local(dout_c, int64_t(r)), dt);
    o[r] = gpu_nan({2 * C * B, O}, dt), l[r] = gpu_nan({B * z.NH * 2 * C}, DType::F32);
    // dq: NaN, so that the diagonal step must write every element of it (=).
    dq[r] = gpu_nan(q[r].shape(), dt), dkv[r] = Tensor::empty(q[r].shape(), dt, Device::CUDA);
    gpu::fill(dkv[r], 0.0, GS());
  }
  const auto before = gpu::cudnn_attention_stats();
  for (int64_t r = 0; r < CP; ++r) {
    rk[size_t(r)].start_forward(o[size_t(r)], l[size_t(r)], GS());
    for (int64_t i = 0; i < CP; ++i) {
      const int64_t j = (r - i + CP) % CP;
      rk[size_t(r)].forward_step(q[size_t(r)], q[size_t(j)], j, o[size_t(r)], l[size_t(r)], GS());
    }
  }
  for (int64_t r = 0; r < CP; ++r) {
    rk[size_t(r)].backward_diagonal(dO[size_t(r)], q[size_t(r)], o[size_t(r)], l[size_t(r)],
                                    dq[size_t(r)], GS());
    for (int64_t i = 1; i < CP; ++i) {
      const int64_t j = (r - i + CP) % CP;
      rk[size_t(r)].backward_step(dO[size_t(r)], q[size_t(r)], o[size_t(r)], l[size_t(r)],
                                  q[size_t(j)], j, dq[size_t(r)], dkv[size_t(j)], GS());
    }
  }
  const auto after = gpu::cudnn_attention_stats();
  if (fused_env && cudnn)  // one block a step: CP steps on each of CP ranks
    EXPECT_EQ(after.forward_calls - before.forward_calls, CP * CP);
  for (size_t r = 0; r < np; ++r) {
    gpu::axpy(1.0, dkv[r], dq[r], GS());
    EXPECT_CLOSE(o[r], local(out_c, int64_t(r)), dt) << "rank " << r;
    EXPECT_CLOSE(dq[r], local(dqkv_c, int64_t(r)), dt) << "rank " << r;
    // lse: [B, NH, 2C] (fused) or [2][B, NH, C] (chunk blocks) against the full [B, NH, S].
    const Tensor lg = to_cpu(l[r]);
    Tensor ref = Tensor::empty(lg.shape(), DType::F32);
    for (int64_t bh = 0; bh < B * z.NH; ++bh)
      for (int k = 0; k < 2; ++k)
        for (int64_t i = 0; i < C; ++i) {
          const float v = lse_c.data<float>()[bh * S + chunk_of(int64_t(r), k) * C + i];
          const int64_t at = rk[r].fused ? bh * 2 * C + k * C + i : (k * B * z.NH + bh) * C + i;
          ref.data<float>()[at] = v;
        }
    EXPECT_LE(rel_err(lg, ref), 1e-3) << "rank " << r << " lse";
  }
}
TEST(ContextParallelGpu, RingFusedStepsCp2) { check_ring_steps(2, true); }
TEST(ContextParallelGpu, RingFusedStepsCp3) { check_ring_steps(3, true); }
TEST(ContextParallelGpu, RingChunkBlocksCp3) { check_ring_steps(3, false); }
TEST(ContextParallelGpu, RingFusedStepsCp2GroupChunks) { check_ring_steps(2, true, 1); }

// A rectangular block is only for cuDNN: where the own kernels would run it (dropout),
// the op says so and refuses it with an error naming the shape.
TEST(ContextParallelGpu, RectangularBlocksOnlyWhereCudnnTakesThem) {
  MCPP_REQUIRE_GPU();
  const Dims z;
  ops::AttentionDims d = block(z, 0, 0, 4 * z.C);
  d.S = 2 * z.C, d.S_kv = z.C, d.lse_ld = 2 * z.C;
  EXPECT_FALSE(gpu::attention_block_rect_supported(DType::BF16, d, false, 0.1, GS()));
  EXPECT_FALSE(gpu::attention_block_rect_supported(DType::F32, d, false, 0.0, GS()));
  EXPECT_FALSE(gpu::attention_block_rect_supported(DType::BF16, d, true, 0.0, GS()));
  EXPECT_FALSE(cpu::attention_block_rect_supported(DType::BF16, d, false, 0.0, CS()));
  EXPECT_EQ(gpu::attention_block_rect_supported(DType::BF16, d, false, 0.0, GS()),
            gpu::cudnn_attention_enabled());
  const int64_t W = d.qkv_width();
  Tensor q = to_gpu(rand_in({2 * z.C * z.B, W}, 1, DType::BF16), DType::BF16);
  Tensor kv = to_gpu(rand_in({z.C * z.B, W}, 2, DType::BF16), DType::BF16);
  Tensor out = gpu_nan({2 * z.C * z.B, z.NH * z.HD}, DType::BF16);
  Tensor lse = gpu_nan({d.lse_span()}, DType::F32);
  try {
    gpu::attention_block_forward(q, kv, d, false, 0.125, 0.1, ops::DropoutKey{1, 2}, out, lse, GS());
    ADD_FAILURE() << "a rectangular block with dropout ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("160 query and 80 key rows"), std::string::npos) << e.what();
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

// ---- document masking --------------------------------------------------------------------

// key_start [B, S] (host): sample b's documents end where (s * 13 + b * 5) % 47 == 0 (EOD at s),
// plus one long document, so query tiles start both on and off tile boundaries.
Tensor doc_starts(int64_t B, int64_t S) {
  Tensor ks = Tensor::empty({B, S}, DType::I64);
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0;
    for (int64_t s = 0; s < S; ++s) {
      ks.data<int64_t>()[b * S + s] = doc;
      if ((s * 13 + b * 5) % 47 == 0 && s < S / 2) doc = s + 1;
    }
  }
  return ks;
}

Tensor ks_gpu(const Tensor& ks) {
  Tensor g = Tensor::empty(ks.shape(), DType::I64, Device::CUDA);
  gpu::copy(ks, g, GS());
  return g;
}

// lse with -inf rows (a row that sees no key): the same rows -inf, the rest close.
void expect_lse_close(const Tensor& gpu_lse, const Tensor& cpu_lse, int64_t* empty_rows = nullptr) {
  const Tensor g = to_cpu(gpu_lse);
  const float* x = static_cast<const float*>(g.raw());
  const float* y = static_cast<const float*>(cpu_lse.raw());
  double num = 0, den = 0;
  int64_t empty = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (std::isinf(y[i])) {
      ASSERT_TRUE(std::isinf(x[i]) && x[i] < 0) << "lse row " << i << " should be -inf: " << x[i];
      ++empty;
      continue;
    }
    ASSERT_TRUE(std::isfinite(x[i])) << "lse row " << i << ": " << x[i];
    num += (x[i] - y[i]) * double(x[i] - y[i]), den += double(y[i]) * y[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 2e-5) << "lse";
  if (empty_rows) *empty_rows = empty;
}

void check_doc_attention(DType dt, int64_t HD, double p) {
  MCPP_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " HD " << HD << " p " << p);
  const int64_t S = 200, B = 2, NH = 4, NG = 2, O = NH * HD;
  ops::AttentionDims d;
  d.S = S, d.B = B, d.NH = NH, d.NG = NG, d.HD = HD;
  const int64_t W = d.qkv_width();
  const Tensor ks = doc_starts(B, S);
  const Tensor qkv = rand_in({S * B, W}, 41, dt), dout = rand_in({S * B, O}, 42, dt);
  const ops::DropoutKey key{7, 8};
  const double scale = 1.0 / std::sqrt(double(HD));
  ops::AttentionDims dc = d, dg = d;
  dc.key_start = ks, dg.key_start = ks_gpu(ks);
  Tensor out_c = Tensor::empty({S * B, O}, DType::F32), lse_c = Tensor::empty({B, NH, S}, DType::F32);
  cpu::attention_forward(qkv, dc, scale, p, key, out_c, lse_c, CS());
  Tensor gq = to_gpu(qkv, dt);
  Tensor out_g = gpu_nan({S * B, O}, dt), lse_g = gpu_nan({B, NH, S}, DType::F32);
  gpu::attention_forward(gq, dg, scale, p, key, out_g, lse_g, GS());
  EXPECT_CLOSE(out_g, out_c, dt);
  EXPECT_CLOSE(lse_g, lse_c, DType::F32);
  // The mask matters: the unmasked call gives another output.
  Tensor out_u = gpu_nan({S * B, O}, dt), lse_u = gpu_nan({B, NH, S}, DType::F32);
  gpu::attention_forward(gq, d, scale, p, key, out_u, lse_u, GS());
  EXPECT_GT(rel_err(to_cpu(out_u), out_c), 10 * tol(dt));
  // Backward from the CPU's output rounded to dt; dqkv (=) poisoned first.
  const Tensor out_r = rounded(out_c, dt);
  Tensor dqkv_c = Tensor::empty({S * B, W}, DType::F32);
  cpu::attention_backward(dout, qkv, out_r, lse_c, dc, scale, p, key, dqkv_c, CS());
  Tensor dqkv_g = gpu_nan({S * B, W}, dt);
  gpu::attention_backward(to_gpu(dout, dt), gq, to_gpu(out_r, dt), to_gpu(lse_c, DType::F32), dg,
                          scale, p, key, dqkv_g, GS());
  EXPECT_CLOSE(dqkv_g, dqkv_c, dt);
}

TEST(DocumentMaskGpu, AttentionF32) { check_doc_attention(DType::F32, 64, 0.0); }
TEST(DocumentMaskGpu, AttentionF32Dropout) { check_doc_attention(DType::F32, 64, 0.1); }
TEST(DocumentMaskGpu, AttentionBF16) { check_doc_attention(DType::BF16, 64, 0.0); }
TEST(DocumentMaskGpu, AttentionBF16Dropout) { check_doc_attention(DType::BF16, 64, 0.1); }
TEST(DocumentMaskGpu, AttentionBF16HeadDim128) { check_doc_attention(DType::BF16, 128, 0.0); }
TEST(DocumentMaskGpu, AttentionF16Dropout) { check_doc_attention(DType::F16, 128, 0.1); }

// One CP block with the document mask: query chunk 2 against key chunk 1 (not causal) or
// itself (causal), 80 rows each; a document starting inside chunk 2 hides chunk 1 from its
// rows, which then see no key in the non-causal block (out 0, lse -inf).
void check_doc_block(DType dt, bool causal, double p) {
  MCPP_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (causal ? " causal" : " non-causal")
                                    << " p " << p);
  const Dims z;
  const int64_t C = z.C, B = z.B, S = 4 * C, O = z.NH * z.HD;
  const ops::AttentionDims d0 = block(z, 2 * C, causal ? 2 * C : C, S);
  const Tensor full_ks = doc_starts(B, S);
  Tensor ks = Tensor::empty({B, C}, DType::I64);  // the query chunk's rows
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < C; ++i) {
      int64_t v = full_ks.data<int64_t>()[b * S + 2 * C + i];
      if (i >= 50) v = std::max(v, 2 * C + 50);  // a document from global 210 on
      ks.data<int64_t>()[b * C + i] = v;
    }
  ops::AttentionDims dc = d0, dg = d0;
  dc.key_start = ks, dg.key_start = ks_gpu(ks);
  const int64_t W = d0.qkv_width(), rows = C * B;
  const Tensor q = rand_in({rows, W}, 51, dt), kv = causal ? q : rand_in({rows, W}, 52, dt);
  const Tensor dout = rand_in({rows, O}, 53, dt);
  const Tensor dq0 = rand_in({rows, W}, 54, dt), dkv0 = rand_in({rows, W}, 55, dt);
  const ops::DropoutKey key{13, 14};
  const double scale = 0.125;
  Tensor out_c = Tensor::empty({rows, O}, DType::F32), lse_c = Tensor::empty({B, z.NH, C}, DType::F32);
  cpu::attention_block_forward(q, kv, dc, causal, scale, p, key, out_c, lse_c, CS());
  Tensor gq = to_gpu(q, dt), gkv = causal ? gq : to_gpu(kv, dt);
  Tensor out_g = gpu_nan({rows, O}, dt), lse_g = gpu_nan({B, z.NH, C}, DType::F32);
  gpu::attention_block_forward(gq, gkv, dg, causal, scale, p, key, out_g, lse_g, GS());
  EXPECT_CLOSE(out_g, out_c, dt);
  int64_t empty = 0;
  expect_lse_close(lse_g, lse_c, &empty);
  if (!causal) EXPECT_GT(empty, 0) << "the test meant some rows to see no key";
  // Backward (+=) into filled destinations, from the CPU's out rounded to dt and a FINAL lse
  // as the ring passes it: finite for every row (the diagonal block always sees the row
  // itself), here the block's lse raised by 0.25 as if other blocks had been merged, and 0.75
  // for the rows this block leaves empty. (With lse = -inf the CPU reference's exp(s - lse)
  // would be NaN; the ring never passes that.)
  const Tensor out_r = rounded(out_c, dt);
  Tensor lse_fin = lse_c.clone();
  for (int64_t i = 0; i < lse_fin.numel(); ++i) {
    float& v = static_cast<float*>(lse_fin.raw())[i];
    v = std::isinf(v) ? 0.75f : v + 0.25f;
  }
  Tensor dq_c = dq0.clone(), dkv_c = causal ? dq_c : dkv0.clone();
  cpu::attention_block_backward(dout, q, kv, out_r, lse_fin, dc, causal, scale, p, key, dq_c,
                                dkv_c, CS());
  Tensor dq_g = to_gpu(dq0, dt), dkv_g = causal ? dq_g : to_gpu(dkv0, dt);
  gpu::attention_block_backward(to_gpu(dout, dt), gq, gkv, to_gpu(out_r, dt),
                                to_gpu(lse_fin, DType::F32), dg, causal, scale, p, key, dq_g,
                                dkv_g, GS());
  EXPECT_CLOSE(dq_g, dq_c, dt);
  if (!causal) EXPECT_CLOSE(dkv_g, dkv_c, dt);
}

TEST(DocumentMaskGpu, BlockF32) { check_doc_block(DType::F32, false, 0.1); }
TEST(DocumentMaskGpu, CausalBlockF32) { check_doc_block(DType::F32, true, 0.0); }
TEST(DocumentMaskGpu, BlockBF16) { check_doc_block(DType::BF16, false, 0.0); }
TEST(DocumentMaskGpu, CausalBlockBF16Dropout) { check_doc_block(DType::BF16, true, 0.1); }

// The whole model on packed documents, GPU against CPU (head dim 64, S = 80: the bf16 runs
// take the tensor-core block kernel; f32 the CUDA-core one).
constexpr int64_t kB = 2, kS = 80, kVocab = 120;

model::TransformerConfig model_cfg(bool llama, Device dev, DType dt, double dropout) {
  model::TransformerConfig c;
  c.num_layers = 2, c.kv_channels = 64, c.seq_length = kS, c.max_position_embeddings = 96;
  c.padded_vocab_size = 128, c.hidden_dropout = dropout, c.attention_dropout = dropout;
  c.seed = 5, c.init_method_std = 0.05, c.device = dev, c.dtype = dt;
  if (llama) {
    c.hidden_size = 256, c.num_attention_heads = 4, c.num_query_groups = 2;
    c.ffn_hidden_size = 320, c.rope = true, c.rmsnorm = true, c.swiglu = true;
    c.tie_embeddings = false, c.add_bias_linear = false;
  } else {
    c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
    c.ffn_hidden_size = 512;
  }
  return c;
}

model::MicroBatch packed_batch(uint64_t seed) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({kB, kS}, DType::I64);
  mb.labels = Tensor::empty({kB, kS}, DType::I64);
  mb.loss_mask = Tensor::empty({kB, kS}, DType::F32);
  for (int64_t i = 0; i < kB * kS; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, i) % kVocab);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, i) % kVocab);
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  mb.key_start = doc_starts(kB, kS);
  return mb;
}

// positions: --reset-position-ids too (each token at its place in its document: RoPE and
// the learned position embedding at per-token positions on the GPU).
void compare_packed(bool llama, DType dt, double dropout, double tol_loss, double tol_grad,
                    bool positions = false) {
  MCPP_REQUIRE_GPU();
  SCOPED_TRACE(::testing::Message() << (llama ? "llama " : "gpt ") << dtype_name(dt)
                                    << " dropout " << dropout << " positions " << positions);
  model::GPTModel cm(model_cfg(llama, Device::CPU, DType::F32, dropout));
  model::GPTModel gm(model_cfg(llama, Device::CUDA, dt, dropout));
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  ops::copy(gm.params().flat_params(), cm.params().flat_params(), GS());
  model::MicroBatch mb = packed_batch(19);
  if (positions) {
    mb.position_ids = Tensor::empty({kB, kS}, DType::I64);
    for (int64_t i = 0; i < kB * kS; ++i)
      mb.position_ids.data<int64_t>()[i] = i % kS - mb.key_start.data<int64_t>()[i];
  }
  model::StepKeys k;
  k.iteration = 3;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  EXPECT_NEAR(lg, lc, tol_loss * std::abs(lc)) << "loss sum";
  const double inv = 1.0 / double(kB * kS);
  cm.backward(inv), gm.backward(inv);
  double worst = 0;
  for (size_t i = 0; i < cm.params().infos().size(); ++i) {
    const double e = rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i));
    EXPECT_LE(e, tol_grad) << cm.params().infos()[i].name;
    worst = std::max(worst, e);
  }
  // Without the document mask (or the per-token positions) the same tokens give another loss
  // -- except RoPE's per-token positions under the document mask: RoPE scores see only the
  // distance between a query and a key, which the reset keeps within a document, and the
  // mask removes every pair across documents, so there the loss must stay (within the
  // dtype's tolerance), and the positions must change it once the mask is off.
  model::MicroBatch plain = mb;
  (positions ? plain.position_ids : plain.key_start) = Tensor();
  const double lu = gm.forward(plain, k);
  gm.backward(inv);
  if (positions && llama) {
    EXPECT_NEAR(lu, lg, tol_loss * std::abs(lc)) << "RoPE positions changed the masked loss";
    model::MicroBatch unmasked = mb;
    unmasked.key_start = Tensor();
    const double lp = gm.forward(unmasked, k);
    gm.backward(inv);
    unmasked.position_ids = Tensor();
    const double l0 = gm.forward(unmasked, k);
    gm.backward(inv);
    EXPECT_GT(std::abs(lp - l0), 1e-5 * std::abs(lc)) << "the positions changed nothing";
  } else {
    EXPECT_GT(std::abs(lu - lg), 1e-5 * std::abs(lc)) << "the mask changed nothing";
  }
  std::printf("[documents %s %s p=%.1f%s] loss %.6f vs cpu %.6f (without the %s %.6f), worst "
              "grad rel %.2e\n",
              llama ? "llama" : "gpt", std::string(dtype_name(dt)).c_str(), dropout,
              positions ? " positions" : "", lg, lc, positions ? "positions" : "mask", lu, worst);
}

TEST(DocumentMaskGpu, ModelGptF32) { compare_packed(false, DType::F32, 0.0, 1e-5, 1e-4); }
TEST(DocumentMaskGpu, ModelLlamaF32Dropout) { compare_packed(true, DType::F32, 0.1, 1e-5, 1e-4); }
// (bf16: the tolerances of tests/gpu/test_model_gpu.cpp's unmasked bf16 runs.)
TEST(DocumentMaskGpu, ModelGptBF16Dropout) { compare_packed(false, DType::BF16, 0.1, 3e-2, 8e-2); }
TEST(DocumentMaskGpu, ModelLlamaBF16) { compare_packed(true, DType::BF16, 0.0, 3e-2, 8e-2); }
// --reset-position-ids with --reset-attention-mask: GPT-2's learned positions, Llama's RoPE.
TEST(DocumentMaskGpu, ModelGptF32Positions) {
  compare_packed(false, DType::F32, 0.1, 1e-5, 1e-4, true);
}
TEST(DocumentMaskGpu, ModelLlamaF32Positions) {
  compare_packed(true, DType::F32, 0.0, 1e-5, 1e-4, true);
}
TEST(DocumentMaskGpu, ModelGptBF16Positions) {
  compare_packed(false, DType::BF16, 0.0, 3e-2, 8e-2, true);
}
TEST(DocumentMaskGpu, ModelLlamaBF16DropoutPositions) {
  compare_packed(true, DType::BF16, 0.1, 3e-2, 8e-2, true);
}

}  // namespace cp_gpu_test
