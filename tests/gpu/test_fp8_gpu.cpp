// FP8 on the GPU against the CPU emulation (docs/fp8.md): the fused cast + transpose +
// amax kernel (every FP8 byte, decoded, equals the CPU's fp8_quantize of the same bf16
// input; the transpose is the transpose; the amax and 1/scale are exact), and cuBLASLt's
// FP8 GEMM in all three passes of a linear layer -- fprop X·Wᵀ + b, dgrad G·W (through
// Wᵀ's column-wise copy, E5M2 gradients), wgrad dW += Gᵀ·X (through both column-wise
// copies, accumulating into f32) -- against f32 GEMMs of the emulated operands.
#include "gpu_test_util.h"
#include "ops/fp8_grid.h"

using namespace mcpp;
using namespace mcpp::test;
using ops::Fp8Format;

namespace fp8_gpu_test {

Tensor scalar_gpu(float v) { return to_gpu(Tensor::from(std::vector<float>{v}, {1}), DType::F32); }

// The FP8 bytes of a GPU tensor, decoded and multiplied by 1/scale (f32 on the host).
Tensor decoded(const Tensor& q, Fp8Format f, float scale_inv) {
  Tensor bytes = Tensor::empty(q.shape(), q.dtype());
  gpu::copy(q, bytes, GS());
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  const auto* b = static_cast<const uint8_t*>(bytes.raw());
  for (int64_t i = 0; i < q.numel(); ++i)
    out.data<float>()[i] = float(ops::fp8_decode(b[i], f)) * scale_inv;
  return out;
}

struct Cast {
  Tensor q, qt, amax, scale_inv;
};
Cast cast(const Tensor& x_gpu, Fp8Format f, float scale) {
  const DType dt = f == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2;
  Cast c;
  c.q = Tensor::empty(x_gpu.shape(), dt, Device::CUDA);
  c.qt = Tensor::empty({x_gpu.size(1), x_gpu.size(0)}, dt, Device::CUDA);
  c.amax = scalar_gpu(0.f);
  c.scale_inv = scalar_gpu(0.f);
  gpu::fp8_cast_transpose(x_gpu, f, scalar_gpu(scale), c.q, c.qt, c.amax, c.scale_inv, GS());
  return c;
}

// The CPU emulation of an operand: fp8_quantize of the same (bf16-representable) values.
Tensor emulated(const Tensor& x_cpu, Fp8Format f, float scale) {
  Tensor y = Tensor::empty(x_cpu.shape(), DType::F32);
  cpu::fp8_quantize(x_cpu, f, Tensor::from(std::vector<float>{scale}, {1}), y, CS());
  return y;
}

Tensor transposed(const Tensor& x) {
  Tensor y = Tensor::empty({x.size(1), x.size(0)}, DType::F32);
  cpu::transpose(x, y, CS());
  return y;
}


TEST(Fp8Gpu, CastTransposeAmaxMatchesTheEmulation) {
  MCPP_REQUIRE_GPU();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    // 64x96, 160x208, 384x128: the vectorised kernel (partial 128x64 tiles in the second);
    // 37x70: the general one (dimensions not multiples of 16)
    for (auto [R, C] : {std::pair<int64_t, int64_t>{64, 96}, {160, 208}, {384, 128}, {37, 70}}) {
      Tensor x = rand_in({R, C}, 7, DType::BF16, -3.f, 3.f);
      const float big = bf16_to_float(float_to_bf16(1e6f));  // saturates (999424 in bf16)
      x.data<float>()[R * C - 5] = big;  // in the last tile: its block's atomic counts
      const float scale = f == Fp8Format::E4M3 ? 100.f : 9000.f;
      Cast c = cast(to_gpu(x, DType::BF16), f, scale);
      const float inv = to_cpu(c.scale_inv).data<float>()[0];
      EXPECT_EQ(inv, 1.0f / scale);
      const Tensor want = emulated(x, f, scale);
      Tensor got = decoded(c.q, f, inv), got_t = decoded(c.qt, f, inv);
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << R << "x" << C;
      const Tensor want_t = transposed(want);
      EXPECT_EQ(std::memcmp(got_t.raw(), want_t.raw(), want_t.nbytes()), 0) << R << "x" << C;
      EXPECT_EQ(to_cpu(c.amax).data<float>()[0], big);
      // The row-wise-only and column-wise-only variants write the same bytes and amax.
      const DType dt = f == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2;
      Tensor none, q1 = Tensor::empty({R, C}, dt, Device::CUDA),
                   qt1 = Tensor::empty({C, R}, dt, Device::CUDA);
      Tensor a1 = scalar_gpu(0.f), a2 = scalar_gpu(0.f);
      const Tensor x_gpu = to_gpu(x, DType::BF16), sc = scalar_gpu(scale);
      gpu::fp8_cast_transpose(x_gpu, f, sc, q1, none, a1, none, GS());
      gpu::fp8_cast_transpose(x_gpu, f, sc, none, qt1, a2, none, GS());
      Tensor d1 = decoded(q1, f, inv), d2 = decoded(qt1, f, inv);
      EXPECT_EQ(std::memcmp(d1.raw(), want.raw(), want.nbytes()), 0) << "row-wise only " << R;
      EXPECT_EQ(std::memcmp(d2.raw(), want_t.raw(), want_t.nbytes()), 0) << "col-wise only " << R;
      EXPECT_EQ(to_cpu(a1).data<float>()[0], big);
      EXPECT_EQ(to_cpu(a2).data<float>()[0], big);
      // fp8_amax alone (tensorwise scaling; 8 values a load when R*C % 8 == 0), and a NaN
      // wins over every number as in the CPU op.
      Tensor a3 = scalar_gpu(0.f);
      gpu::fp8_amax(x_gpu, a3, GS());
      EXPECT_EQ(to_cpu(a3).data<float>()[0], big) << R << "x" << C;
      Tensor xn = x.clone();
      xn.data<float>()[R * C / 2] = NAN;
      Tensor a4 = scalar_gpu(0.f);
      gpu::fp8_amax(to_gpu(xn, DType::BF16), a4, GS());
      EXPECT_TRUE(std::isnan(to_cpu(a4).data<float>()[0])) << R << "x" << C;
    }
}

TEST(Fp8Gpu, GemmAllThreePassesAgainstTheEmulation) {
  MCPP_REQUIRE_GPU();
  const int64_t T = 64, in = 96, out = 128;
  Tensor x = rand_in({T, in}, 1, DType::BF16, -2.f, 2.f);
  Tensor w = rand_in({out, in}, 2, DType::BF16, -0.1f, 0.1f);
  Tensor b = rand_in({out}, 3, DType::BF16);
  Tensor dy = rand_in({T, out}, 4, DType::BF16, -1e-3f, 1e-3f);
  const float sx = 200.f, sw = 4000.f, sg = 5e7f;  // as delayed scaling would pick them
  Cast X = cast(to_gpu(x, DType::BF16), Fp8Format::E4M3, sx);
  Cast W = cast(to_gpu(w, DType::BF16), Fp8Format::E4M3, sw);
  Cast G = cast(to_gpu(dy, DType::BF16), Fp8Format::E5M2, sg);
  const Tensor qx = emulated(x, Fp8Format::E4M3, sx), qw = emulated(w, Fp8Format::E4M3, sw),
               qg = emulated(dy, Fp8Format::E5M2, sg);
  Tensor none;
  // fprop: y = Q(x) Q(w)^T + b, bf16 out
  Tensor y = gpu_nan({T, out}, DType::BF16);
  gpu::fp8_gemm(X.q, X.scale_inv, W.q, W.scale_inv, to_gpu(b, DType::BF16), none, false, true, y,
                GS());
  Tensor y_ref = Tensor::empty({T, out}, DType::F32);
  cpu::linear_forward(qx, qw, b, y_ref, CS());
  EXPECT_LT(rel_err(to_cpu(y), y_ref), 5e-3);  // bf16 output rounding
  // The emulation is not the unquantised layer (the comparison can tell them apart).
  Tensor y_plain = Tensor::empty({T, out}, DType::F32);
  cpu::linear_forward(x, w, b, y_plain, CS());
  EXPECT_GT(rel_err(y_plain, y_ref), 1e-2);
  // dgrad: dx = Q(dy) Q(w), through Wᵀ's FP8 copy
  Tensor dx = gpu_nan({T, in}, DType::BF16);
  gpu::fp8_gemm(G.q, G.scale_inv, W.qt, W.scale_inv, none, none, false, false, dx, GS());
  Tensor dx_ref = Tensor::empty({T, in}, DType::F32);
  cpu::gemm(false, false, 1.0, qg, qw, 0.0, dx_ref, CS());
  EXPECT_LT(rel_err(to_cpu(dx), dx_ref), 5e-3);
  // wgrad: dw (f32) += Q(dy)^T Q(x), through both column-wise copies
  Tensor dw0 = rand_in({out, in}, 5, DType::F32, -1e-3f, 1e-3f);
  Tensor dw = to_gpu(dw0, DType::F32);
  gpu::fp8_gemm(G.qt, G.scale_inv, X.qt, X.scale_inv, none, none, true, false, dw, GS());
  Tensor dw_ref = dw0.clone();
  cpu::gemm(true, false, 1.0, qg, qx, 1.0, dw_ref, CS());
  // f32 out; Hopper's FP8 tensor cores keep fewer than fp32's bits between their promotions
  // to the fp32 accumulator (measured 5.4e-5 here), far below the FP8 rounding itself.
  EXPECT_LT(rel_err(to_cpu(dw), dw_ref), 2e-4);
  // The residual addend (fprop's epilogue C): y2 = Q(x) Q(w)^T + r
  Tensor r = rand_in({T, out}, 6, DType::BF16);
  Tensor y2 = gpu_nan({T, out}, DType::BF16);
  gpu::fp8_gemm(X.q, X.scale_inv, W.q, W.scale_inv, none, to_gpu(r, DType::BF16), false, true, y2,
                GS());
  Tensor y2_ref = r.clone();
  cpu::gemm(false, true, 1.0, qx, qw, 1.0, y2_ref, CS());
  EXPECT_LT(rel_err(to_cpu(y2), y2_ref), 5e-3);
}

// Delayed scaling's update (the parallel CUDA kernel) against the CPU op, bit for bit: the
// history rolled and row 0 zeroed, the scales of both formats with a margin, the max over
// the history or row 0 alone, a NaN anywhere keeping the old scale, a zero column keeping
// it too; history lengths around the kernel's chunk of 1024 elements.
TEST(Fp8Gpu, ScaleUpdateMatchesTheCpuOp) {
  MCPP_REQUIRE_GPU();
  for (int64_t L : {1, 7, 341, 342, 1024, 2049})
    for (bool amax_max : {true, false})
      for (int nan_row : {-1, 0, 3}) {
        const int64_t K = 3;
        Tensor h = Tensor::empty({L, K}, DType::F32);
        for (int64_t i = 0; i < L * K; ++i)
          h.data<float>()[i] = float((i * 2654435761u) % 1000) * 0.37f + 0.01f;
        for (int64_t r = 0; r < L; ++r) h.data<float>()[r * K + 2] = 0.f;  // a zero column
        if (nan_row >= 0 && nan_row < L) h.data<float>()[nan_row * K + 1] = NAN;
        Tensor sc = Tensor::from(std::vector<float>{2.f, 3.f, 5.f}, {3});
        Tensor gh = to_gpu(h, DType::F32), gsc = to_gpu(sc, DType::F32);
        cpu::fp8_scale_update(h, sc, /*e5m2_columns=*/0b010, /*margin=*/1, amax_max, true, CS());
        gpu::fp8_scale_update(gh, gsc, 0b010, 1, amax_max, true, GS());
        const Tensor bh = to_cpu(gh), bsc = to_cpu(gsc);
        SCOPED_TRACE(::testing::Message() << "L " << L << " max " << amax_max << " nan row "
                                          << nan_row);
        for (int64_t i = 0; i < L * K; ++i) {
          const float a = h.data<float>()[i], b = bh.data<float>()[i];
          ASSERT_TRUE((a != a && b != b) || a == b) << "history element " << i << ": CPU " << a
                                                    << ", GPU " << b;
        }
        for (int k = 0; k < 3; ++k)
          EXPECT_EQ(sc.data<float>()[k], bsc.data<float>()[k]) << "scale " << k;
        EXPECT_EQ(bsc.data<float>()[2], 5.f) << "a zero column keeps its scale";
      }
}

}  // namespace fp8_gpu_test
