// The blockwise FP8 recipe on the GPU against the CPU emulation (docs/fp8.md "Blockwise"):
// fp8_block_cast (1x128 blocks along each copy's own K, and 128x128 tiles) byte for byte
// against fp8_block_quantize of the same values -- every FP8 code of both copies and every
// block's scale_inv, read from cuBLASLt's layout -- for bf16 and f32 input, E4M3 and E5M2,
// whole and partial blocks, a block of zeros and an Inf; and cuBLASLt's block-scaled FP8
// GEMM in the three passes of a linear layer (fprop 1x128 x 128x128 with the bias, and with
// the residual addend; dgrad E5M2 1x128 x 128x128 through Wᵀ; wgrad 1x128 x 1x128 along the
// tokens, accumulating into f32) against f32 GEMMs of the emulated operands, on operands
// whose blocks have scales 2^-12 .. 2^10 apart, so a scale read from the wrong block shows.
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "ops/fp8_grid.h"

using namespace mcpp;
using namespace mcpp::test;
using ops::Fp8Format;

namespace fp8_block_gpu_test {

DType fp8_dtype(Fp8Format f) { return f == Fp8Format::E4M3 ? DType::FP8E4M3 : DType::FP8E5M2; }

// Values of very different magnitudes by 128-blocks of rows and columns, representable in dt.
Tensor graded(int64_t R, int64_t C, uint64_t seed, DType dt, float base) {
  Tensor t = rand_f32({R, C}, seed, -1.f, 1.f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      t.data<float>()[r * C + c] *=
          base * std::ldexp(1.f, int((r / 128 * 5 + c / 128 * 3 + r % 7) % 23) - 12);
  return dt == DType::F32 ? t : rounded(t, dt);
}

std::vector<uint8_t> bytes_of(const Tensor& q) {
  std::vector<uint8_t> b(size_t(q.numel()));
  Tensor h = Tensor::empty(q.shape(), q.dtype());
  gpu::copy(q, h, GS());
  std::memcpy(b.data(), h.raw(), b.size());
  return b;
}

struct Emulated {
  Tensor y, si;  // the dequantised values and the blocks' scale_inv [nbr, nbc]
};
Emulated emulate(const Tensor& x, Fp8Format f, int64_t br, int64_t bc) {
  const int64_t R = x.size(0), C = x.size(1);
  Emulated e{Tensor::empty({R, C}, DType::F32),
             Tensor::empty({(R + br - 1) / br, (C + bc - 1) / bc}, DType::F32)};
  cpu::fp8_block_quantize(x, f, br, bc, e.y, e.si, CS());
  return e;
}

// Every code of copy `q` ([rows, K], blocks along K, or tiles) equals the emulation's value
// times its block's scale, and every scale_inv in cuBLASLt's layout equals the emulation's.
// em(r, k): the emulated value at q's (r, k); esi(rb, kb): the emulated block scale_inv.
template <typename EV, typename ES>
void expect_copy(const Tensor& q, const Tensor& s, Fp8Format f, bool tile, EV em, ES esi,
                 const char* what) {
  const int64_t rows = q.size(0), K = q.size(1);
  const std::vector<uint8_t> b = bytes_of(q);
  const Tensor sc = to_cpu(s);
  const float* sp = sc.data<float>();
  int64_t sr = 0, scols = 0;
  ops::fp8_block_scale_dims(rows, K, tile, &sr, &scols);
  int bad = 0, bad_s = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t rb = r / 128, kb = k / 128;
      const float inv = tile ? sp[rb * scols + kb] : sp[kb * scols + r];
      const float want_inv = esi(tile ? rb : r, kb);
      if (inv != want_inv && bad_s++ < 5)
        ADD_FAILURE() << what << ": scale_inv of block (" << r << ", " << kb << ") " << inv
                      << " vs " << want_inv;
      const double got = ops::fp8_decode(b[size_t(r * K + k)], f);
      const double want = double(em(r, k)) / double(want_inv);  // exact: powers of two
      if (got != want && bad++ < 5)
        ADD_FAILURE() << what << ": (" << r << ", " << k << ") code " << int(b[size_t(r * K + k)])
                      << " = " << got << " vs " << want;
    }
  EXPECT_EQ(bad, 0) << what;
  EXPECT_EQ(bad_s, 0) << what;
}

struct Cast {
  Tensor q, s_q, qt, s_qt;
};
Cast cast(const Tensor& xg, Fp8Format f, bool tile, bool row = true, bool col = true) {
  const int64_t R = xg.size(0), C = xg.size(1);
  Cast c;
  int64_t a = 0, b = 0;
  if (row) {
    c.q = Tensor::empty({R, C}, fp8_dtype(f), Device::CUDA);
    ops::fp8_block_scale_dims(R, C, tile, &a, &b);
    c.s_q = gpu_nan({a, b}, DType::F32);
  }
  if (col) {
    c.qt = Tensor::empty({C, R}, fp8_dtype(f), Device::CUDA);
    ops::fp8_block_scale_dims(C, R, tile, &a, &b);
    c.s_qt = gpu_nan({a, b}, DType::F32);
  }
  gpu::fp8_block_cast(xg, f, tile, c.q, c.s_q, c.qt, c.s_qt, GS());
  return c;
}


TEST(Fp8BlockGpu, CastMatchesTheEmulationByteForByte) {
  MCPP_REQUIRE_GPU();
  for (DType in : {DType::BF16, DType::F32})
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
      // whole tiles; partial tiles both ways; one partial tile
      for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 384}, {160, 208}, {64, 96}}) {
        Tensor x = graded(R, C, 11, in, 3.f);
        for (int64_t c = 0; c < C; ++c) x.data<float>()[5 * C + c] = 0.f;  // a row of zeros
        for (int64_t r = 0; r < R; ++r) x.data<float>()[r * C + 7] = 0.f;  // a column of zeros
        x.data<float>()[(R - 3) * C + C - 2] = INFINITY;                   // saturates, scale 1
        const Tensor xg = to_gpu(x, in);
        const std::string tag = std::string(in == DType::BF16 ? "bf16 " : "f32 ") +
                                (f == Fp8Format::E4M3 ? "e4m3 " : "e5m2 ") + std::to_string(R) +
                                "x" + std::to_string(C);
        // 1x128 blocks: q along x's rows, qt along x's columns (its own scales)
        const Emulated er = emulate(x, f, 1, 128), ec = emulate(x, f, 128, 1);
        Cast c = cast(xg, f, false);
        expect_copy(
            c.q, c.s_q, f, false,
            [&](int64_t r, int64_t k) { return er.y.data<float>()[r * C + k]; },
            [&](int64_t r, int64_t kb) { return er.si.data<float>()[r * er.si.size(1) + kb]; },
            (tag + " q").c_str());
        expect_copy(
            c.qt, c.s_qt, f, false,
            [&](int64_t cc, int64_t r) { return ec.y.data<float>()[r * C + cc]; },
            [&](int64_t cc, int64_t rb) { return ec.si.data<float>()[rb * ec.si.size(1) + cc]; },
            (tag + " qt").c_str());
        // one copy at a time writes the same
        Cast r1 = cast(xg, f, false, true, false), c1 = cast(xg, f, false, false, true);
        EXPECT_EQ(bytes_of(r1.q), bytes_of(c.q)) << tag;
        EXPECT_EQ(bytes_of(c1.qt), bytes_of(c.qt)) << tag;
        // 128x128 tiles: one scale a tile for both copies
        const Emulated et = emulate(x, f, 128, 128);
        Cast t = cast(xg, f, true);
        auto esi = [&](int64_t rb, int64_t cb) {
          return et.si.data<float>()[rb * et.si.size(1) + cb];
        };
        expect_copy(
            t.q, t.s_q, f, true,
            [&](int64_t r, int64_t k) { return et.y.data<float>()[r * C + k]; }, esi,
            (tag + " tile q").c_str());
        expect_copy(
            t.qt, t.s_qt, f, true,
            [&](int64_t cc, int64_t r) { return et.y.data<float>()[r * C + cc]; },
            [&](int64_t cb, int64_t rb) { return esi(rb, cb); }, (tag + " tile qt").c_str());
        // the device emulation op agrees with the CPU's too
        Tensor yg = Tensor::empty({R, C}, in, Device::CUDA),
               sig = Tensor::empty(er.si.shape(), DType::F32, Device::CUDA);
        gpu::fp8_block_quantize(xg, f, 1, 128, yg, sig, GS());
        const Tensor ygc = to_cpu(yg), want = in == DType::F32 ? er.y : rounded(er.y, in);
        EXPECT_EQ(std::memcmp(ygc.raw(), want.raw(), want.nbytes()), 0) << tag;
      }
  // A shape the FP8 GEMMs cannot take is an error naming it.
  Tensor odd = to_gpu(rand_in({37, 64}, 1, DType::BF16), DType::BF16);
  EXPECT_THROW(cast(odd, Fp8Format::E4M3, false), Error);
}

TEST(Fp8BlockGpu, GemmAllThreePassesAgainstTheEmulation) {
  MCPP_REQUIRE_GPU();
  // K of fprop 384 (3 blocks), of dgrad 256 (2), of wgrad T = 384 (3)
  const int64_t T = 384, in = 384, out = 256;
  const Tensor x = graded(T, in, 1, DType::BF16, 2.f), w = graded(out, in, 2, DType::BF16, 0.05f);
  const Tensor dy = graded(T, out, 4, DType::BF16, 1e-3f), b = rand_in({out}, 3, DType::BF16);
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  Cast X = cast(to_gpu(x, DType::BF16), e4, false), W = cast(to_gpu(w, DType::BF16), e4, true);
  Cast G = cast(to_gpu(dy, DType::BF16), e5, false);
  const Tensor qx = emulate(x, e4, 1, 128).y, qw = emulate(w, e4, 128, 128).y;
  const Tensor qg = emulate(dy, e5, 1, 128).y;
  const Tensor qx_t = emulate(x, e4, 128, 1).y, qg_t = emulate(dy, e5, 128, 1).y;
  Tensor none;
  // fprop: y = Q1(x) Q2(w)^T + b, bf16 out
  Tensor y = gpu_nan({T, out}, DType::BF16);
  gpu::fp8_block_gemm(X.q, X.s_q, false, W.q, W.s_q, true, to_gpu(b, DType::BF16), none, false, y,
                      GS());
  Tensor y_ref = Tensor::empty({T, out}, DType::F32);
  cpu::linear_forward(qx, qw, b, y_ref, CS());
  EXPECT_LT(rel_err(to_cpu(y), y_ref), 5e-3);
  // The emulation is told apart from the unquantised layer and from per-tensor scales.
  Tensor y_plain = Tensor::empty({T, out}, DType::F32);
  cpu::linear_forward(x, w, b, y_plain, CS());
  EXPECT_GT(rel_err(y_plain, y_ref), 1e-2);
  // dgrad: dx = Q1(dy) Q2(w), through Wᵀ's copy (its 128x128 scales transposed)
  Tensor dx = gpu_nan({T, in}, DType::BF16);
  gpu::fp8_block_gemm(G.q, G.s_q, false, W.qt, W.s_qt, true, none, none, false, dx, GS());
  Tensor dx_ref = Tensor::empty({T, in}, DType::F32);
  cpu::gemm(false, false, 1.0, qg, qw, 0.0, dx_ref, CS());
  EXPECT_LT(rel_err(to_cpu(dx), dx_ref), 5e-3);
  // wgrad: dw (f32) += Qc(dy)^T Qc(x), both 1x128 along the tokens
  Tensor dw0 = rand_in({out, in}, 5, DType::F32, -1e-3f, 1e-3f);
  Tensor dw = to_gpu(dw0, DType::F32);
  gpu::fp8_block_gemm(G.qt, G.s_qt, false, X.qt, X.s_qt, false, none, none, true, dw, GS());
  Tensor dw_ref = dw0.clone();
  cpu::gemm(true, false, 1.0, qg_t, qx_t, 1.0, dw_ref, CS());
  // f32 out: measured 2.3e-4 on the H200 (the per-tensor-scaled wgrad of test_fp8_gpu.cpp:
  // 5.4e-5): the block-scaled kernel adds each 128-long K block's partial sum, rescaled, to
  // the f32 accumulator. Still far below the FP8 rounding (~6%); a scale read from a wrong
  // block would be off by a factor of 2^3 or more.
  EXPECT_LT(rel_err(to_cpu(dw), dw_ref), 5e-4);
  // (Row- and column-blocked operands are not told apart here: on these values, whose
  // range inside a block stays within FP8's normal range, power-of-two block scales give
  // the same values either way (measured 2.4e-8 apart). The column-blocked scales of the
  // casts are checked one by one above; the CPU tests tell the two functions apart.)
  // The residual addend: y2 = Q1(x) Q2(w)^T + r
  Tensor r = rand_in({T, out}, 6, DType::BF16);
  Tensor y2 = gpu_nan({T, out}, DType::BF16);
  gpu::fp8_block_gemm(X.q, X.s_q, false, W.q, W.s_q, true, none, to_gpu(r, DType::BF16), false, y2,
                      GS());
  Tensor y2_ref = r.clone();
  cpu::gemm(false, true, 1.0, qx, qw, 1.0, y2_ref, CS());
  EXPECT_LT(rel_err(to_cpu(y2), y2_ref), 5e-3);
  // 128x128 by 128x128 is not a cuBLASLt GEMM: an error.
  Tensor y3 = gpu_nan({out, out}, DType::BF16);
  EXPECT_THROW(gpu::fp8_block_gemm(W.q, W.s_q, true, W.q, W.s_q, true, none, none, false, y3, GS()),
               Error);
}

}  // namespace fp8_block_gpu_test
