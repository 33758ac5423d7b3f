// The fused FP8 casts (src/ops/cuda/fp8_fused.cu, docs/fp8.md) against the compositions
// they replace: every FP8 byte (row-wise and column-wise), the amax, 1/scale and the bf16
// tensor they may also write equal, byte for byte, the CUDA ops run one after the other
// (gelu_forward / gelu_backward / swiglu_forward / swiglu_backward, then the row-wise
// fp8_cast_transpose, itself byte-identical to the CPU emulation: test_fp8_gpu.cpp, and
// its bytes transposed); the FP8 values also equal the CPU emulation of the
// composition (CPU gelu, bf16 rounding, fp8_quantize) wherever the CPU's and the GPU's
// GELU round to the same bf16 value, and the bias gradient equals f64 column sums.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gpu_test_util.h"
#include "ops/fp8_grid.h"

using namespace mcpp;
using namespace mcpp::test;
using ops::Fp8Format;

namespace fp8_fused_gpu_test {

Tensor scalar_gpu(float v) { return to_gpu(Tensor::from(std::vector<float>{v}, {1}), DType::F32); }

// The raw bytes of a GPU tensor.
std::vector<uint8_t> bytes_of(const Tensor& g) {
  Tensor h = Tensor::empty(g.shape(), g.dtype());
  gpu::copy(g, h, GS());
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

DType f8_of(Fp8Format f) { return f == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2; }

struct Out {
  Tensor q, qt, amax, scale_inv, out16, db;
};
Out fresh(int64_t R, int64_t C, Fp8Format f, const Tensor& db0) {
  Out o;
  o.q = Tensor::empty({R, C}, f8_of(f), Device::CUDA);
  o.qt = Tensor::empty({C, R}, f8_of(f), Device::CUDA);
  o.amax = scalar_gpu(0.f);
  o.scale_inv = scalar_gpu(0.f);
  o.out16 = gpu_nan({R, C}, DType::BF16);
  o.db = to_gpu(db0, DType::F32);
  return o;
}

// The composition's cast of the bf16 GPU tensor v: the row-wise copy by the row-wise-only
// kernel, the column-wise copy its bytes transposed on the host (a column-wise cast on the
// GPU would run the fused kernel under test).
Out reference_cast(const Tensor& v, Fp8Format f, float scale) {
  const int64_t R = v.size(0), C = v.size(1);
  Out o = fresh(R, C, f, Tensor::zeros({C}, DType::F32));
  Tensor none;
  gpu::fp8_cast_transpose(v, f, scalar_gpu(scale), o.q, none, o.amax, o.scale_inv, GS());
  const std::vector<uint8_t> b = bytes_of(o.q);
  Tensor t = Tensor::empty({C, R}, f8_of(f));
  auto* p = static_cast<uint8_t*>(t.raw());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) p[c * R + r] = b[r * C + c];
  gpu::copy(t, o.qt, GS());
  return o;
}

void expect_same_cast(const Out& got, const Out& want, const char* what) {
  EXPECT_EQ(bytes_of(got.q), bytes_of(want.q)) << what << ": row-wise";
  EXPECT_EQ(bytes_of(got.qt), bytes_of(want.qt)) << what << ": column-wise";
  EXPECT_EQ(to_cpu(got.amax).data<float>()[0], to_cpu(want.amax).data<float>()[0]) << what;
  EXPECT_EQ(to_cpu(got.scale_inv).data<float>()[0], to_cpu(want.scale_inv).data<float>()[0]);
}

// db0 + f64 column sums of the (bf16) GPU tensor v, and the fused result's relative error.
double db_err(const Tensor& db_gpu, const Tensor& db0, const Tensor& v_gpu) {
  const Tensor v = to_cpu(v_gpu);
  const int64_t R = v.size(0), C = v.size(1);
  Tensor want = Tensor::empty({C}, DType::F32);
  for (int64_t c = 0; c < C; ++c) {
    double s = db0.data<float>()[c];
    for (int64_t r = 0; r < R; ++r) s += v.data<float>()[r * C + c];
    want.data<float>()[c] = float(s);
  }
  return rel_err(to_cpu(db_gpu), want);
}

// The CPU emulation of the composition: f(x) on the CPU in f32, rounded to bf16 (what the
// activation op writes), then fp8_quantize. Compared with the decoded fused bytes where the
// CPU's bf16 value equals the GPU's (the two GELUs agree to f32 rounding, not bit for bit).
void expect_matches_emulation(const Tensor& v_cpu_bf16, const Tensor& v_gpu_bf16, const Tensor& q,
                              Fp8Format f, float scale, const char* what) {
  Tensor want = Tensor::empty(v_cpu_bf16.shape(), DType::F32);
  cpu::fp8_quantize(v_cpu_bf16, f, Tensor::from(std::vector<float>{scale}, {1}), want, CS());
  const Tensor gv = to_cpu(v_gpu_bf16);
  const std::vector<uint8_t> b = bytes_of(q);
  int64_t same_bf16 = 0, equal = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (gv.data<float>()[i] != v_cpu_bf16.data<float>()[i]) continue;
    ++same_bf16;
    equal += float(ops::fp8_decode(b[i], f)) * (1.0f / scale) == want.data<float>()[i];
  }
  EXPECT_EQ(equal, same_bf16) << what;
  // (The CPU's tanh form loses digits where 1 + tanh(y) cancels, below x ~ -4; the GPU's
  // sigmoid form for bf16 does not: there the two bf16 results may differ.)
  EXPECT_GT(same_bf16, want.numel() * 3 / 4) << what << ": the GELUs should mostly agree";
}

const std::pair<int64_t, int64_t> kShapes[] = {{64, 96}, {160, 208}, {384, 128}};


TEST(Fp8FusedGpu, CastWithBiasGradientMatchesCastAndColumnSums) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (auto [R, C] : kShapes) {
      Tensor x = rand_in({R, C}, 11, DType::BF16, -2.f, 2.f);
      const Tensor xg = to_gpu(x, DType::BF16);
      const float scale = f == Fp8Format::E4M3 ? 150.f : 9000.f;
      const Tensor db0 = rand_in({C}, 12, DType::F32, -1.f, 1.f);
      const Out want = reference_cast(xg, f, scale);
      Out got = fresh(R, C, f, db0);
      gpu::fp8_cast_transpose_dbias(xg, f, scalar_gpu(scale), got.q, got.qt, got.amax,
                                    got.scale_inv, got.db, GS());
      expect_same_cast(got, want, "cast + dbias");
      EXPECT_LT(db_err(got.db, db0, xg), 1e-6) << R << "x" << C;
      // db accumulates (+=): a second call adds the sums again.
      Tensor none;
      gpu::fp8_cast_transpose_dbias(xg, f, scalar_gpu(scale), none, got.qt, none, none, got.db,
                                    GS());
      Tensor db1 = to_cpu(got.db);
      double worst = 0;
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t r = 0; r < R; ++r) s += x.data<float>()[r * C + c];
        worst = std::max(worst, std::abs(db1.data<float>()[c] - (db0.data<float>()[c] + 2 * s)));
      }
      EXPECT_LT(worst, 1e-3) << "accumulating";
      // The row-wise-only form writes the same bytes.
      Out row = fresh(R, C, f, db0);
      gpu::fp8_cast_transpose_dbias(xg, f, scalar_gpu(scale), row.q, none, row.amax, none, row.db,
                                    GS());
      EXPECT_EQ(bytes_of(row.q), bytes_of(want.q)) << "row-wise only";
      EXPECT_LT(db_err(row.db, db0, xg), 1e-6) << "row-wise only";
      // Both copies without a bias gradient (the FP8 linear's both-copies cast).
      Out both = fresh(R, C, f, db0);
      gpu::fp8_cast_transpose_dbias(xg, f, scalar_gpu(scale), both.q, both.qt, both.amax,
                                    both.scale_inv, none, GS());
      expect_same_cast(both, want, "cast, no dbias");
    }
}

TEST(Fp8FusedGpu, GeluCastMatchesGeluThenCast) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (auto [R, C] : kShapes) {
      Tensor pre = rand_in({R, C}, 21, DType::BF16, -5.f, 5.f);
      const Tensor pg = to_gpu(pre, DType::BF16);
      const float scale = f == Fp8Format::E4M3 ? 80.f : 9000.f;
      // the composition: gelu_forward, then the cast of its bf16 output
      Tensor a = gpu_nan({R, C}, DType::BF16);
      gpu::gelu_forward(pg, a, GS());
      const Out want = reference_cast(a, f, scale);
      Out got = fresh(R, C, f, Tensor::zeros({C}, DType::F32));
      gpu::fp8_gelu_cast(pg, f, scalar_gpu(scale), got.out16, got.q, got.qt, got.amax,
                         got.scale_inv, GS());
      expect_same_cast(got, want, "gelu + cast");
      EXPECT_EQ(bytes_of(got.out16), bytes_of(a)) << "the bf16 activation";
      // Without the bf16 output, and column-wise only (the backward's recomputation).
      Tensor none;
      Out col = fresh(R, C, f, Tensor::zeros({C}, DType::F32));
      gpu::fp8_gelu_cast(pg, f, scalar_gpu(scale), none, none, col.qt, none, none, GS());
      EXPECT_EQ(bytes_of(col.qt), bytes_of(want.qt)) << "column-wise only";
      // The CPU emulation of the composition.
      Tensor act_cpu = Tensor::empty({R, C}, DType::F32);
      cpu::gelu_forward(pre, act_cpu, CS());
      expect_matches_emulation(rounded(act_cpu, DType::BF16), a, got.q, f, scale, "gelu");
    }
}

TEST(Fp8FusedGpu, DgeluCastMatchesGeluBackwardThenCastWithBiasGradient) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E5M2, Fp8Format::E4M3})
    for (auto [R, C] : kShapes) {
      Tensor pre = rand_in({R, C}, 31, DType::BF16, -5.f, 5.f);
      Tensor dact = rand_in({R, C}, 32, DType::BF16, -1e-2f, 1e-2f);
      const Tensor pg = to_gpu(pre, DType::BF16), dg = to_gpu(dact, DType::BF16);
      const float scale = f == Fp8Format::E4M3 ? 3e4f : 3e6f;
      const Tensor db0 = rand_in({C}, 33, DType::F32, -1e-2f, 1e-2f);
      Tensor g = gpu_nan({R, C}, DType::BF16);
      gpu::gelu_backward(dg, pg, g, GS());
      const Out want = reference_cast(g, f, scale);
      Out got = fresh(R, C, f, db0);
      gpu::fp8_dgelu_cast(dg, pg, f, scalar_gpu(scale), got.out16, got.q, got.qt, got.amax,
                          got.scale_inv, got.db, GS());
      expect_same_cast(got, want, "dgelu + cast");
      EXPECT_EQ(bytes_of(got.out16), bytes_of(g)) << "the bf16 gradient";
      EXPECT_LT(db_err(got.db, db0, g), 1e-6) << R << "x" << C;
      // In place (dpre = dact), as the MLP calls it with --no-fp8-wgrad.
      Tensor d2 = to_gpu(dact, DType::BF16);
      Out inplace = fresh(R, C, f, db0);
      Tensor none;
      gpu::fp8_dgelu_cast(d2, pg, f, scalar_gpu(scale), d2, inplace.q, none, inplace.amax, none,
                          none, GS());
      EXPECT_EQ(bytes_of(d2), bytes_of(g)) << "in place";
      EXPECT_EQ(bytes_of(inplace.q), bytes_of(want.q)) << "in place";
      // The CPU emulation of the composition.
      Tensor g_cpu = Tensor::empty({R, C}, DType::F32);
      cpu::gelu_backward(dact, pre, g_cpu, CS());
      expect_matches_emulation(rounded(g_cpu, DType::BF16), g, got.q, f, scale, "dgelu");
    }
}

// SwiGLU: pre [R, 2F] = [gate | up]; F 64 (one tile of each half), 192 (three), with a
// ragged row count.
const std::pair<int64_t, int64_t> kSwigluShapes[] = {{64, 64}, {160, 192}, {384, 128}};

TEST(Fp8FusedGpu, SwigluCastMatchesSwigluThenCast) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (auto [R, F] : kSwigluShapes) {
      Tensor pre = rand_in({R, 2 * F}, 41, DType::BF16, -4.f, 4.f);
      const Tensor pg = to_gpu(pre, DType::BF16);
      const float scale = f == Fp8Format::E4M3 ? 30.f : 3000.f;
      Tensor a = gpu_nan({R, F}, DType::BF16);
      gpu::swiglu_forward(pg, a, GS());
      const Out want = reference_cast(a, f, scale);
      Out got = fresh(R, F, f, Tensor::zeros({F}, DType::F32));
      gpu::fp8_swiglu_cast(pg, f, scalar_gpu(scale), got.out16, got.q, got.qt, got.amax,
                           got.scale_inv, GS());
      expect_same_cast(got, want, "swiglu + cast");
      EXPECT_EQ(bytes_of(got.out16), bytes_of(a)) << "the bf16 activation";
      Tensor none;
      Out col = fresh(R, F, f, Tensor::zeros({F}, DType::F32));
      gpu::fp8_swiglu_cast(pg, f, scalar_gpu(scale), none, none, col.qt, none, none, GS());
      EXPECT_EQ(bytes_of(col.qt), bytes_of(want.qt)) << "column-wise only";
      Tensor act_cpu = Tensor::empty({R, F}, DType::F32);
      cpu::swiglu_forward(pre, act_cpu, CS());
      expect_matches_emulation(rounded(act_cpu, DType::BF16), a, got.q, f, scale, "swiglu");
    }
}

TEST(Fp8FusedGpu, DswigluCastMatchesSwigluBackwardThenCastWithBiasGradient) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E5M2, Fp8Format::E4M3})
    for (auto [R, F] : kSwigluShapes) {
      Tensor pre = rand_in({R, 2 * F}, 51, DType::BF16, -4.f, 4.f);
      Tensor dact = rand_in({R, F}, 52, DType::BF16, -1e-2f, 1e-2f);
      const Tensor pg = to_gpu(pre, DType::BF16), dg = to_gpu(dact, DType::BF16);
      const float scale = f == Fp8Format::E4M3 ? 3e4f : 3e6f;
      const Tensor db0 = rand_in({2 * F}, 53, DType::F32, -1e-2f, 1e-2f);
      Tensor g = gpu_nan({R, 2 * F}, DType::BF16);
      gpu::swiglu_backward(dg, pg, g, GS());
      const Out want = reference_cast(g, f, scale);
      Out got = fresh(R, 2 * F, f, db0);
      gpu::fp8_dswiglu_cast(dg, pg, f, scalar_gpu(scale), got.out16, got.q, got.qt, got.amax,
                            got.scale_inv, got.db, GS());
      expect_same_cast(got, want, "dswiglu + cast");
      EXPECT_EQ(bytes_of(got.out16), bytes_of(g)) << "the bf16 gradient";
      EXPECT_LT(db_err(got.db, db0, g), 1e-6) << R << "x" << F;
      Tensor g_cpu = Tensor::empty({R, 2 * F}, DType::F32);
      cpu::swiglu_backward(dact, pre, g_cpu, CS());
      expect_matches_emulation(rounded(g_cpu, DType::BF16), g, got.q, f, scale, "dswiglu");
    }
  // F not a multiple of 64: a tile would straddle gate and up.
  Tensor none;
  Tensor dg = to_gpu(rand_in({32, 48}, 1, DType::BF16), DType::BF16);
  Tensor pg = to_gpu(rand_in({32, 96}, 2, DType::BF16), DType::BF16);
  Tensor q = Tensor::empty({32, 96}, DType::FP8E5M2, Device::CUDA);
  EXPECT_THROW(gpu::fp8_dswiglu_cast(dg, pg, Fp8Format::E5M2, scalar_gpu(1.f), none, q, none, none,
                                     none, none, GS()),
               Error);
}

TEST(Fp8FusedGpu, RejectsWhatItCannotFuse) {
  MCPP_REQUIRE_GPU();
  Tensor x = to_gpu(rand_in({40, 24}, 1, DType::BF16), DType::BF16), none;  // 40 % 16 != 0
  Tensor q = Tensor::empty({40, 24}, DType::FP8E4M3, Device::CUDA);
  Tensor db = to_gpu(Tensor::zeros({24}, DType::F32), DType::F32);
  EXPECT_THROW(gpu::fp8_cast_transpose_dbias(x, Fp8Format::E4M3, scalar_gpu(1.f), q, none, none,
                                             none, db, GS()),
               Error);
}

}  // namespace fp8_fused_gpu_test
