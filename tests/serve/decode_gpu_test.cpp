// The CUDA inference ops against the CPU reference (label gpu; tests/gpu/gpu_test_util.h):
// decode_attention at the 1B model's head shape and others, sequences of one batch at
// different positions (1 key, part of a 32-key chunk, several chunks per warp), one row
// (a decode step) and seven (a prefill chunk), f32 and bf16; argmax_rows on bf16 logits
// with a tie, a NaN and a padded vocabulary; linear_decode (the GEMV and tensor-core
// kernels of ops/cuda/gemv.cu, the split-K kernel of gemv_splitk.cu) against the CPU op and
// the GPU GEMM (linear_forward then add), and each row's numbers independent of the row
// count; the tensor-core kernel on one row equals its rows of a larger batch;
// rope_attention_decode against the CPU and, bit for bit, against the GPU ops it fuses;
// attention_prefill (prompts from position 0 through the training attention) against the
// CPU. The attention ops also under sliding windows (AttentionDims::window_left).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "ops/cuda/gemv.h"

namespace mcpp::test {
namespace decode_gpu_test {

TEST(GpuDecode, AttentionMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [S, NH, NG, HD] :
         {std::tuple{1, 32, 8, 64}, {1, 4, 4, 128}, {1, 6, 2, 80}, {1, 2, 1, 32}, {7, 32, 8, 64}})
      for (int64_t window : {-1, 0, 100}) {  // none, the own key only, a sliding window
      ops::AttentionDims d;
      d.S = S, d.B = 5, d.NH = NH, d.NG = NG, d.HD = HD, d.window_left = window;
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
                                        << " window=" << window << " dtype=" << dtype_name(dt));
      EXPECT_CLOSE(gout, out, dt);
    }
}

// A decode step's attention (the split kernel on an sm_90 GPU): each sequence alone, a
// batch of one, equal bit for bit to its row of a batch of seven at different positions --
// one key, a partial warp, splits left empty, several passes per block (up to 1,100 keys) --
// and the batch close to the CPU op; f32, bf16 and f16, the 1B model's heads (G 4, HD 64),
// G 8 x HD 128 and G 1 x HD 32.
TEST(GpuDecode, AttentionBatchInvariantAtAnyLength) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (auto [NH, NG, HD] : {std::tuple{32, 8, 64}, {16, 2, 128}, {4, 4, 32}}) {
      ops::AttentionDims d;
      d.S = 1, d.B = 7, d.NH = NH, d.NG = NG, d.HD = HD;
      const int64_t Tmax = 1100, W = d.qkv_width(), O = int64_t(NH) * HD;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      Tensor kc = rand_in(cache, 41, dt, -2.f, 2.f), vc = rand_in(cache, 42, dt);
      Tensor qkv = rand_in({1, d.B, W}, 43, dt, -2.f, 2.f);
      Tensor pos = Tensor::empty({d.B}, DType::I64);
      const int64_t p[] = {0, 5, 63, 64, 200, 257, Tmax - 1};
      for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
      const double scale = 1.0 / std::sqrt(double(HD));
      SCOPED_TRACE(::testing::Message() << "NH=" << NH << " NG=" << NG << " HD=" << HD
                                        << " dtype=" << dtype_name(dt));
      Tensor out = Tensor::empty({1, d.B, O}, DType::F32);
      cpu::decode_attention(qkv, d, pos, scale, kc, vc, out, CS());
      Tensor gall = gpu_nan(out.shape(), dt);
      gpu::decode_attention(to_gpu(qkv, dt), d, to_gpu(pos, DType::I64), scale, to_gpu(kc, dt),
                            to_gpu(vc, dt), gall, GS());
      EXPECT_CLOSE(gall, out, dt);
      const Tensor all = to_cpu(gall);
      for (int64_t b = 0; b < d.B; ++b) {
        ops::AttentionDims d1 = d;
        d1.B = 1;
        const Tensor q1 = qkv.view({d.B, W}).narrow(b, 1).clone().view({1, 1, W});
        Tensor g1 = gpu_nan({1, 1, O}, dt);
        gpu::decode_attention(to_gpu(q1, dt), d1, to_gpu(pos.narrow(b, 1).clone(), DType::I64),
                              scale, to_gpu(kc.narrow(b, 1).clone(), dt),
                              to_gpu(vc.narrow(b, 1).clone(), dt), g1, GS());
        const Tensor one = to_cpu(g1);
        EXPECT_EQ(std::memcmp(one.raw(), static_cast<const float*>(all.raw()) + b * O,
                              size_t(O) * sizeof(float)),
                  0)
            << "sequence " << b << " at position " << p[b] << " alone differs from its batch row";
      }
    }
}

// Rows of 16-byte words (the kernel's word path: Vp 32064 and 32128 in bf16, V a multiple
// of the word or ending mid-word) and rows that are not (Vp 32001: element by element),
// bf16 and f32; a tie, a winner beyond V, a NaN, a row of equal values, a row of NaNs, the
// maximum in the last real element.
TEST(GpuDecode, ArgmaxMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (auto [Vp, V, dt] : {std::tuple{int64_t(32064), int64_t(32000), DType::BF16},
                           {int64_t(32128), int64_t(31999), DType::BF16},
                           {int64_t(32001), int64_t(32000), DType::BF16},
                           {int64_t(32064), int64_t(32003), DType::F32}}) {
    SCOPED_TRACE(::testing::Message() << "Vp=" << Vp << " V=" << V << " " << dtype_name(dt));
    const int64_t R = 8;
    Tensor x = rand_in({R, Vp}, 21, dt, -4.f, 4.f);
    float* p = static_cast<float*>(x.raw());
    p[1 * Vp + 5] = p[1 * Vp + 31000] = 8.f;  // a tie: the lower index
    p[2 * Vp + V] = 100.f;                    // beyond V
    p[3 * Vp + 0] = NAN, p[3 * Vp + 777] = 9.f;
    for (int64_t i = 0; i < V; ++i) p[4 * Vp + i] = 1.f;  // all equal: index 0
    for (int64_t i = 0; i < V; ++i) p[6 * Vp + i] = NAN;  // all NaN: index 0
    p[7 * Vp + V - 1] = 50.f;                             // the last real element
    Tensor ids = Tensor::empty({R}, DType::I64);
    cpu::argmax_rows(x, V, ids, CS());
    Tensor gids = Tensor::empty({R}, DType::I64, Device::CUDA);
    gpu::argmax_rows(to_gpu(x, dt), V, gids, GS());
    Tensor back = to_cpu(gids);
    for (int64_t r = 0; r < R; ++r)
      EXPECT_EQ(back.data<int64_t>()[r], ids.data<int64_t>()[r]) << "row " << r;
    EXPECT_EQ(back.data<int64_t>()[1], 5);
    EXPECT_NE(back.data<int64_t>()[2], V);
    EXPECT_EQ(back.data<int64_t>()[3], 777);
    EXPECT_EQ(back.data<int64_t>()[4], 0);
    EXPECT_EQ(back.data<int64_t>()[6], 0);
    EXPECT_EQ(back.data<int64_t>()[7], V - 1);
  }
}

// Shapes: the 1B model's QKV, a width that takes 4 rows per GEMV warp and ends mid-block
// (N % 16 != 0), fc2's long rows, a K that is not a multiple of 64 (no tensor-core path),
// and one whose rows are not whole 16-byte words (cuBLASLt only); for the split-K kernel
// (its split as an H200's 132 SMs make it) K split 8 ways (3072 x 2048: one x chunk a
// block; 300 and 1000 x 8192: four, and a ragged last tile of 128 rows), 2 ways (8450 x
// 512), 4 ways (4200 x 1024), and not at all (8450 x 320, 520 x 192: K / 64 odd, the
// slice's last chunk partial). Rows 1..65 (the large shapes 3, 8, 33, 64), with and
// without bias and residual. Every kernel that takes the case (the op's own choice, the
// GEMV up to 8 rows, the tensor-core and split-K kernels up to 64) against the CPU op and
// the GPU GEMM, and each kernel's rows equal to the same row alone.
TEST(GpuDecode, LinearDecodeMatchesCpuAndGemm) {
  MCPP_REQUIRE_GPU();
  using gpu::DecodeGemm;
  struct Case { int64_t N, K; bool large = false; };
  for (DType dt : {DType::BF16, DType::F32, DType::F16})
    for (Case c : {Case{3072, 2048}, Case{8450, 320, true}, Case{300, 8192}, Case{37, 136},
                   Case{33, 20}, Case{1000, 8192, true}, Case{8450, 512, true},
                   Case{4200, 1024, true}, Case{520, 192}}) {
      // One weight per shape and dtype (drawn on the host: up to 8.2M values, most of this
      // test's time when it was drawn again for every row count and variant).
      const Tensor w = rand_in({c.N, c.K}, uint64_t(c.N * 131 + c.K * 7) + 2, dt);
      const Tensor gw = to_gpu(w, dt);
      for (int64_t rows : {1, 2, 3, 5, 8, 9, 16, 33, 64, 65})
        for (int variant = 0; variant < 3; ++variant) {  // plain, bias, bias + residual
          if (c.large && rows != 3 && rows != 8 && rows != 33 && rows != 64) continue;
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " N=" << c.N << " K=" << c.K
                                            << " rows=" << rows << " variant=" << variant);
          const uint64_t sd = uint64_t(c.N * 131 + c.K * 7 + rows * 3 + variant);
          Tensor x = rand_in({rows, c.K}, sd + 1, dt);
          Tensor b = variant >= 1 ? rand_in({c.N}, sd + 3, dt) : Tensor();
          Tensor r = variant == 2 ? rand_in({rows, c.N}, sd + 4, dt, -4.f, 4.f) : Tensor();
          Tensor ref = Tensor::empty({rows, c.N}, DType::F32);
          cpu::linear_decode(x, w, b, r, ref, CS());
          Tensor gx = to_gpu(x, dt);
          Tensor gb = b.defined() ? to_gpu(b, dt) : Tensor();
          Tensor gr = r.defined() ? to_gpu(r, dt) : Tensor();
          // The GPU GEMM and add on the same inputs.
          Tensor gg = gpu_nan({rows, c.N}, dt);
          gpu::linear_forward(gx, gw, gb, gg, GS());
          if (gr.defined()) gpu::add(gr, gg, gg, GS());
          const Tensor gemm = to_cpu(gg);
          std::vector<DecodeGemm> paths{DecodeGemm::Auto};
          if (rows <= 8 && c.K % (16 / int64_t(dtype_size(dt))) == 0)
            paths.push_back(DecodeGemm::Gemv);
          if (rows <= 64 && dt != DType::F32 && c.K % 64 == 0) {
            paths.push_back(DecodeGemm::TensorCore);
            paths.push_back(DecodeGemm::SplitK);
          }
          for (DecodeGemm path : paths) {
            SCOPED_TRACE(::testing::Message() << "path " << int(path));
            Tensor gy = gpu_nan({rows, c.N}, dt);
            if (path == DecodeGemm::Auto)
              gpu::linear_decode(gx, gw, gb, gr, gy, GS());
            else
              gpu::linear_decode_with(path, gx, gw, gb, gr, gy, GS());
            EXPECT_CLOSE(gy, ref, dt);
            const Tensor all = to_cpu(gy);
            EXPECT_LE(rel_err(all, gemm), tol(dt)) << "against linear_forward";
            if (path == DecodeGemm::Auto) continue;
            // Batch invariance: row t alone gives row t's bits (the engine's batches and
            // `megatron generate`'s single sequence then decode alike).
            for (int64_t t = 0; t < rows; t += rows <= 8 ? 1 : (rows - 1) / 2) {  // (<= 3)
              Tensor y1 = gpu_nan({1, c.N}, dt);
              Tensor r1 = gr.defined() ? gr.narrow(t, 1) : Tensor();
              gpu::linear_decode_with(path, gx.narrow(t, 1), gw, gb, r1, y1, GS());
              const Tensor one = to_cpu(y1);
              EXPECT_EQ(std::memcmp(one.raw(), static_cast<const float*>(all.raw()) + t * c.N,
                                    size_t(c.N) * sizeof(float)),
                        0)
                  << "row " << t << " of " << rows << " differs from the row alone";
            }
          }
        }
    }
}

// linear_swiglu_decode: the fused tensor-core kernel (bf16/f16, up to 8 rows) and its
// fallback through fc1 (more rows, K not a multiple of 64, f32) against the CPU composition
// linear_forward + swiglu_forward; the fused kernel's rows independent of the row count.
TEST(GpuDecode, LinearSwigluDecodeMatchesCpu) {
  MCPP_REQUIRE_GPU();
  struct Case { int64_t F, K; };
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (Case c : {Case{8192, 2048}, Case{100, 320}, Case{21, 136}}) {
      // One weight per shape and dtype (up to 33.6M values drawn on the host).
      const Tensor w = rand_in({2 * c.F, c.K}, uint64_t(c.F * 17 + c.K) + 2, dt);
      const Tensor gw = to_gpu(w, dt);
      for (int64_t rows : {1, 3, 8, 9})
        for (bool bias : {false, true}) {
          if (c.F == 8192 && rows == 3) continue;
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " F=" << c.F << " K=" << c.K
                                            << " rows=" << rows << " bias=" << bias);
          const uint64_t sd = uint64_t(c.F * 17 + c.K + rows * 5 + bias);
          Tensor x = rand_in({rows, c.K}, sd + 1, dt);
          Tensor b = bias ? rand_in({2 * c.F}, sd + 3, dt) : Tensor();
          Tensor fc1 = Tensor::empty({rows, 2 * c.F}, DType::F32);
          Tensor ref = Tensor::empty({rows, c.F}, DType::F32);
          cpu::linear_swiglu_decode(x, w, b, fc1, ref, CS());
          Tensor gx = to_gpu(x, dt);
          Tensor gb = bias ? to_gpu(b, dt) : Tensor();
          Tensor gfc1 = gpu_nan({rows, 2 * c.F}, dt), gy = gpu_nan({rows, c.F}, dt);
          gpu::linear_swiglu_decode(gx, gw, gb, gfc1, gy, GS());
          EXPECT_CLOSE(gy, ref, dt);
          const bool fused = rows <= 8 && dt != DType::F32 && c.K % 64 == 0;
          if (!fused) continue;
          Tensor all = to_cpu(gy);
          for (int64_t t = 0; t < rows; ++t) {
            Tensor y1 = gpu_nan({1, c.F}, dt), f1 = gpu_nan({1, 2 * c.F}, dt);
            gpu::linear_swiglu_decode(gx.narrow(t, 1), gw, gb, f1, y1, GS());
            Tensor one = to_cpu(y1);
            EXPECT_EQ(std::memcmp(one.raw(), static_cast<const float*>(all.raw()) + t * c.F,
                                  size_t(c.F) * sizeof(float)),
                      0)
                << "row " << t << " of " << rows << " differs from the row alone";
          }
        }
    }
}

// rope_attention_decode (the fused RoPE + append kernel, then decode_attention) against the
// CPU's rope_decode + attention_kv_cache_forward: the attention output and the cache rows it
// wrote (the rotated keys, the values), sequences at different positions, whole and partial
// rotary dims, grouped and ungrouped heads.
TEST(GpuDecode, RopeAttentionDecodeMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [NH, NG, HD, rot] :
         {std::tuple{32, 8, 64, 64}, {4, 4, 128, 64}, {6, 2, 80, 80}, {8, 2, 32, 16}})
      for (int64_t window : {-1, 50}) {
      ops::AttentionDims d;
      d.S = 1, d.B = 4, d.NH = NH, d.NG = NG, d.HD = HD, d.window_left = window;
      const int64_t Tmax = 300;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      Tensor kc = rand_in(cache, 31, dt, -2.f, 2.f), vc = rand_in(cache, 32, dt);
      Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 33, dt, -2.f, 2.f);
      Tensor pos = Tensor::empty({d.B}, DType::I64);
      const int64_t p[] = {0, 37, 200, Tmax - 1};
      for (int64_t b = 0; b < d.B; ++b) pos.data<int64_t>()[b] = p[b];
      const double scale = 1.0 / std::sqrt(double(HD));
      Tensor gq = to_gpu(qkv, dt), gk = to_gpu(kc, dt), gv = to_gpu(vc, dt);
      Tensor kc2 = kc.clone(), vc2 = vc.clone(), q2 = qkv.clone();
      Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F32);
      cpu::rope_attention_decode(q2, d, rot, 10000.0, pos, scale, kc2, vc2, out, CS());
      Tensor gout = gpu_nan(out.shape(), dt);
      gpu::rope_attention_decode(gq, d, rot, 10000.0, to_gpu(pos, DType::I64), scale, gk, gv,
                                 gout, GS());
      SCOPED_TRACE(::testing::Message() << "NH=" << NH << " NG=" << NG << " HD=" << HD
                                        << " rot=" << rot << " window=" << window
                                        << " dtype=" << dtype_name(dt));
      EXPECT_CLOSE(gout, out, dt);
      EXPECT_CLOSE(gk, kc2, dt) << "k_cache";
      EXPECT_CLOSE(gv, vc2, dt) << "v_cache";
    }
}

// Where two host copies of GPU tensors (widened to f32, exact for bf16 and f16) first differ
// in their bits; -1 where every element is the same.
int64_t first_diff(const Tensor& a, const Tensor& b) {
  const uint32_t* x = static_cast<const uint32_t*>(a.raw());
  const uint32_t* y = static_cast<const uint32_t*>(b.raw());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (x[i] != y[i]) return i;
  return -1;
}

// rope_attention_decode (one kernel a layer where the decode group kernel has an instance:
// RoPE, the cache append and the attention per (sequence, KV group)) equal bit for bit to
// the GPU composition it replaces -- rope_decode into a copy of qkv, then
// attention_kv_cache_forward (the append, then decode_attention) -- in the output, both
// caches (the rotated key and the value at pos[b], every other row untouched) and qkv (the
// query heads rotated in place, key and value heads as they came in). f32, bf16, f16; the
// 1B model's heads (G 4, HD 64) and G 1 x HD 128, each with whole and partial rotary dims,
// plus G 3 x HD 80 (no group kernel: the rotation kernel, then decode_attention); batches of
// 1, 3 and 64 sequences at different positions from 0 to 299 (past one pass of the block's
// 8 x 32 keys). The bits catch what a tolerance would not: a query scaled before its
// rounding to the dtype, a key read from the cache before the block wrote it. Each case
// runs the fused op with every cache-row prefetch level (MCPP_DECODE_ATTN_PREFETCH 0, 1, 2:
// none, L2, L1 -- the L1 lines of rows the block then appends to must not go stale) and
// with and without weights requested into L2 by extra blocks (l2_next: a 3 MiB and a 5 MiB
// tensor under a 6 MiB budget, so the second range is cut mid-tensor), and with the V loop's
// probabilities from shared memory or from shuffles (MCPP_DECODE_ATTN_PSMEM 1, 0; the
// composition's attention runs the default, 1): all the same bits.
TEST(GpuDecode, RopeAttentionDecodeFusedMatchesComposition) {
  MCPP_REQUIRE_GPU();
  const int64_t Tmax = 300;
  const double base = 10000.0;
  const Tensor w1 = to_gpu(rand_f32({768, 1024}, 71), DType::F32);   // 3 MiB
  const Tensor w2 = to_gpu(rand_f32({1280, 1024}, 72), DType::F32);  // 5 MiB
  const Tensor* const next[2] = {&w1, &w2};
  ASSERT_EQ(setenv("MCPP_DECODE_L2_AHEAD_MB", "6", 1), 0);
  for (auto [NH, NG, HD, rot] : {std::tuple{32, 8, 64, 64},
                                 {32, 8, 64, 32},
                                 {4, 4, 128, 128},
                                 {4, 4, 128, 64},
                                 {6, 2, 80, 40}})
    for (int64_t B : {1, 3, 64}) {
      ops::AttentionDims d;
      d.S = 1, d.B = B, d.NH = NH, d.NG = NG, d.HD = HD;
      d.window_left = B == 3 ? 100 : -1;  // the batches of three under a sliding window
      const int64_t W = d.qkv_width(), G = NH / NG;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      const uint64_t sd = uint64_t(NH * 1000 + HD * 10 + rot + B * 7);
      const Tensor kc32 = rand_f32(cache, sd + 1, -2.f, 2.f), vc32 = rand_f32(cache, sd + 2);
      const Tensor qkv32 = rand_f32({1, d.B, W}, sd + 3, -2.f, 2.f);
      Tensor pos = Tensor::empty({d.B}, DType::I64);
      for (int64_t b = 0; b < d.B; ++b)  // 0, 131, 262, 93, ...; the last at Tmax - 1
        pos.data<int64_t>()[b] = b == d.B - 1 && b > 0 ? Tmax - 1 : (b * 131) % Tmax;
      if (d.B == 1) pos.data<int64_t>()[0] = 260;
      const Tensor gpos = to_gpu(pos, DType::I64);
      const double scale = 1.0 / std::sqrt(double(HD));
      for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
        SCOPED_TRACE(::testing::Message() << "NH=" << NH << " NG=" << NG << " HD=" << HD << " rot="
                                          << rot << " B=" << B << " dtype=" << dtype_name(dt));
        const Tensor qkv = rounded(qkv32, dt), kc = rounded(kc32, dt), vc = rounded(vc32, dt);
        // The composition: rope_decode out of place (query and key heads rotated), then the
        // append and the attention.
        Tensor rq = gpu_nan({1, d.B, W}, dt);
        gpu::rope_decode(to_gpu(qkv, dt), d, rot, base, gpos, rq, GS());
        Tensor rk = to_gpu(kc, dt), rv = to_gpu(vc, dt);
        Tensor rout = gpu_nan({1, d.B, NH * HD}, dt);
        gpu::attention_kv_cache_forward(rq, d, gpos, scale, rk, rv, rout, GS());
        for (const char* level : {"2", "1", "0"})
          for (bool ahead : {false, true})
            for (const char* ps : {"1", "0"}) {
        SCOPED_TRACE(::testing::Message() << "prefetch level " << level << (ahead ? ", l2_next" : "")
                                          << ", MCPP_DECODE_ATTN_PSMEM=" << ps);
        ASSERT_EQ(setenv("MCPP_DECODE_ATTN_PREFETCH", level, 1), 0);
        ASSERT_EQ(setenv("MCPP_DECODE_ATTN_PSMEM", ps, 1), 0);
        // The fused op, in place on qkv.
        Tensor fq = to_gpu(qkv, dt), fk = to_gpu(kc, dt), fv = to_gpu(vc, dt);
        Tensor fout = gpu_nan({1, d.B, NH * HD}, dt);
        gpu::rope_attention_decode(fq, d, rot, base, gpos, scale, fk, fv, fout, GS(),
                                   ahead ? std::span<const Tensor* const>(next, 2)
                                         : std::span<const Tensor* const>());

        const Tensor ref = to_cpu(rout), got = to_cpu(fout);
        const float* r = static_cast<const float*>(ref.raw());
        bool finite = true;
        for (int64_t i = 0; i < ref.numel(); ++i) finite = finite && std::isfinite(r[i]);
        ASSERT_TRUE(finite) << "the composition left an output element unwritten";
        const int64_t o = first_diff(got, ref);
        EXPECT_EQ(o, -1) << "out differs first at element " << o << " (sequence " << o / (NH * HD)
                         << ", head " << o % (NH * HD) / HD
                         << "): " << static_cast<const float*>(got.raw())[std::max<int64_t>(o, 0)]
                         << " vs " << r[std::max<int64_t>(o, 0)];
        EXPECT_EQ(first_diff(to_cpu(fk), to_cpu(rk)), -1) << "k_cache";
        EXPECT_EQ(first_diff(to_cpu(fv), to_cpu(rv)), -1) << "v_cache";
        // qkv: the query heads as rope_decode rotated them, the key and value heads unchanged.
        Tensor want = to_cpu(rq);
        float* w = static_cast<float*>(want.raw());
        const float* in = static_cast<const float*>(qkv.raw());
        for (int64_t bg = 0; bg < d.B * NG; ++bg)
          for (int64_t c = G * HD; c < (G + 2) * HD; ++c)
            w[bg * (G + 2) * HD + c] = in[bg * (G + 2) * HD + c];
        EXPECT_EQ(first_diff(to_cpu(fq), want), -1) << "qkv";
            }
        unsetenv("MCPP_DECODE_ATTN_PSMEM");
      }
    }
  unsetenv("MCPP_DECODE_ATTN_PREFETCH");
  unsetenv("MCPP_DECODE_L2_AHEAD_MB");
}

// attention_prefill (prompts from position 0: the append, then the training attention --
// cuDNN / flash for bf16 and f16, the CUDA-core kernel for f32; head dim 80 the decode
// kernel) against the
// CPU op (attention_kv_cache_forward at position 0): the output and both caches, whose rows
// past the prompt must stay untouched. The 1B model's heads at a 128-token prompt, others.
TEST(GpuDecode, AttentionPrefillMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (auto [S, B, NH, NG, HD] : {std::tuple{128, 3, 32, 8, 64}, {77, 2, 4, 4, 128},
                                    {5, 2, 6, 2, 80}, {9, 2, 4, 2, 16}, {1, 4, 32, 8, 64}})
      for (int64_t window : {-1, 3, 40}) {
      ops::AttentionDims d;
      d.S = S, d.B = B, d.NH = NH, d.NG = NG, d.HD = HD, d.window_left = window;
      const int64_t Tmax = 160;
      const Shape cache{d.B, Tmax, d.NG, d.HD};
      Tensor kc = rand_in(cache, 41, dt, -2.f, 2.f), vc = rand_in(cache, 42, dt);
      Tensor qkv = rand_in({d.S, d.B, d.qkv_width()}, 43, dt, -2.f, 2.f);
      const double scale = 1.0 / std::sqrt(double(HD));
      Tensor gk = to_gpu(kc, dt), gv = to_gpu(vc, dt);
      Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F32);
      Tensor lse = Tensor::empty({d.B, d.NH, d.S}, DType::F32);
      cpu::attention_prefill(qkv, d, scale, kc, vc, out, lse, CS());
      Tensor gout = gpu_nan(out.shape(), dt);
      Tensor glse = Tensor::empty({d.B, d.NH, d.S}, DType::F32, Device::CUDA);
      gpu::attention_prefill(to_gpu(qkv, dt), d, scale, gk, gv, gout, glse, GS());
      SCOPED_TRACE(::testing::Message() << "S=" << S << " B=" << B << " NH=" << NH << " NG="
                                        << NG << " HD=" << HD << " window=" << window
                                        << " dtype=" << dtype_name(dt));
      EXPECT_CLOSE(gout, out, dt);
      EXPECT_CLOSE(gk, kc, dt) << "k_cache";
      EXPECT_CLOSE(gv, vc, dt) << "v_cache";
    }
}

}  // namespace decode_gpu_test
}  // namespace mcpp::test
