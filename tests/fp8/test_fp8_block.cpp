// The blockwise FP8 recipe on the CPU (--fp8-recipe blockwise; docs/fp8.md "Blockwise"):
// the block scale against Transformer Engine's rule written out independently (f32 division,
// then the power of two at or below it, taken with frexp); fp8_block_quantize against a
// scalar block-by-block reference (1x128 along rows, 128x1 along columns, 128x128 tiles,
// dimensions that are not multiples of 128, blocks independent of each other, zeros, Inf
// saturating, NaN kept and skipped by the amax); the emulated FP8 linear layer under the
// recipe against f64 central finite differences of its own emulated function (fprop Q1(x)
// Q2(w)^T, dgrad with Q1(dy) along its rows, wgrad with dy and x quantised along the tokens);
// the flags.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "../training/test_util.h"
#include "fp8_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/linear.h"
#include "ops/fp8_grid.h"
#include "ops/ops.h"
#include "training/validate_fp8.h"

using namespace mcpp;
using namespace mcpp::model;
using ops::Fp8Format;

namespace fp8_block_test {

using fp8_test::contract;
using fp8_test::fd;
using fp8_test::max_rel;
using fp8_test::randn;

using fp8_test::S;

// TE's compute_scale_from_amax (epsilon 0, power-of-two scales), written independently.
double ref_scale(double amax, Fp8Format f) {
  if (!(amax > 0) || std::isinf(amax)) return 1;
  float s = float(ops::fp8_max(f)) / float(amax);
  if (std::isinf(s)) s = std::numeric_limits<float>::max();
  int e = 0;
  (void)std::frexp(double(s), &e);  // s = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 1);
}

// v [R, C] quantised block by block (br x bc), f64; scale_inv per block into si (row-major).
Tensor ref_quantize(const Tensor& v, int64_t br, int64_t bc, Fp8Format f,
                    std::vector<double>* si = nullptr) {
  const int64_t C = v.size(-1), R = v.numel() / C;
  Tensor o = v.clone();
  const double* x = v.data<double>();
  double* y = o.data<double>();
  for (int64_t r0 = 0; r0 < R; r0 += br)
    for (int64_t c0 = 0; c0 < C; c0 += bc) {
      double m = 0;
      for (int64_t r = r0; r < std::min(R, r0 + br); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + bc); ++c)
          if (!std::isnan(x[r * C + c])) m = std::max(m, std::fabs(double(float(x[r * C + c]))));
      const double s = ref_scale(m, f);
      for (int64_t r = r0; r < std::min(R, r0 + br); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + bc); ++c)
          y[r * C + c] = ops::fp8_round(x[r * C + c] * s, f) / s;
      if (si) si->push_back(1 / s);
    }
  return o;
}

// Rows (or columns) of very different magnitudes, so each block gets another scale.
Tensor graded(int64_t R, int64_t C, uint64_t seed) {
  Tensor t = randn({R, C}, seed, 1.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      t.data<double>()[r * C + c] *= std::ldexp(1.0, int((r * 7 + c / 50) % 23) - 11);
  return t;
}

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.numel(), want.numel());
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.data<double>()[i], b = want.data<double>()[i];
    if (!(a == b || (std::isnan(a) && std::isnan(b))) && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": " << a << " vs " << b;
  }
  EXPECT_EQ(bad, 0);
}

// fp8_block_quantize of v (f64 and, on the f32 copy, f32) against the reference.
void check_quantize(const Tensor& v, int64_t br, int64_t bc, Fp8Format f) {
  std::vector<double> want_si;
  const Tensor want = ref_quantize(v, br, bc, f, &want_si);
  Tensor y = Tensor::empty(v.shape(), DType::F64);
  Tensor si = Tensor::empty({int64_t(want_si.size())}, DType::F32);
  ops::fp8_block_quantize(v, f, br, bc, y, si, S());
  expect_same(y, want);
  for (size_t i = 0; i < want_si.size(); ++i) EXPECT_EQ(si.data<float>()[i], want_si[i]) << i;
  // f32: the same values (f32 inputs, exact FP8 values and power-of-two scales)
  Tensor v32 = Tensor::empty(v.shape(), DType::F32), y32 = Tensor::empty(v.shape(), DType::F32);
  for (int64_t i = 0; i < v.numel(); ++i) v32.data<float>()[i] = float(v.data<double>()[i]);
  Tensor v64 = v.clone();
  for (int64_t i = 0; i < v.numel(); ++i) v64.data<double>()[i] = v32.data<float>()[i];
  const Tensor want32 = ref_quantize(v64, br, bc, f);
  Tensor none;
  ops::fp8_block_quantize(v32, f, br, bc, y32, none, S());
  Tensor got32 = Tensor::empty(v.shape(), DType::F64);
  for (int64_t i = 0; i < v.numel(); ++i) got32.data<double>()[i] = y32.data<float>()[i];
  expect_same(got32, want32);
}


TEST(Fp8Block, ScaleIsTransformerEnginesPowerOfTwo) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<double> u(-40, 40);
    for (int i = 0; i < 20000; ++i) {
      const float a = float(std::exp2(u(gen)));
      EXPECT_EQ(ops::fp8_block_scale(a, f), float(ref_scale(a, f))) << a;
    }
    EXPECT_EQ(ops::fp8_block_scale(0.f, f), 1.f);  // a block of zeros
    EXPECT_EQ(ops::fp8_block_scale(NAN, f), 1.f);
    EXPECT_EQ(ops::fp8_block_scale(INFINITY, f), 1.f);
    EXPECT_EQ(ops::fp8_block_scale(1e-45f, f), std::ldexp(1.f, 127));  // fp8_max / amax = Inf
  }
  EXPECT_EQ(ops::fp8_block_scale(1.f, Fp8Format::E4M3), 256.f);  // 448 -> 256
  EXPECT_EQ(ops::fp8_block_scale(448.f, Fp8Format::E4M3), 1.f);
  EXPECT_EQ(ops::fp8_block_scale(449.f, Fp8Format::E4M3), 0.5f);
  EXPECT_EQ(ops::fp8_block_scale(1.f, Fp8Format::E5M2), 32768.f);  // 57344 -> 2^15
  EXPECT_EQ(ops::fp8_block_scale(3.5f, Fp8Format::E4M3), 128.f);
}

TEST(Fp8Block, RowColumnAndTileBlocksWithPartialEdges) {
  // 300 = 128 + 128 + 44: the last block of each row / column is shorter.
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    check_quantize(graded(5, 300, 1), 1, 128, f);
    check_quantize(graded(300, 6, 2), 128, 1, f);
    check_quantize(graded(260, 300, 3), 128, 128, f);
    check_quantize(graded(128, 256, 4), 1, 128, f);  // whole blocks
  }
}

TEST(Fp8Block, BlocksAreIndependentAndEdgeValues) {
  Tensor x = graded(3, 300, 5);
  Tensor y0 = Tensor::empty(x.shape(), DType::F64), y1 = y0.clone(), none;
  ops::fp8_block_quantize(x, Fp8Format::E4M3, 1, 128, y0, none, S());
  // One huge element in block (0, 1) changes that block only.
  x.data<double>()[130] = 1e6;
  ops::fp8_block_quantize(x, Fp8Format::E4M3, 1, 128, y1, none, S());
  int changed_elsewhere = 0, changed_in = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool same = y0.data<double>()[i] == y1.data<double>()[i];
    if (i >= 128 && i < 256)
      changed_in += !same;
    else
      changed_elsewhere += !same;
  }
  EXPECT_EQ(changed_elsewhere, 0);
  EXPECT_GT(changed_in, 10);
  // scale 2^-12 (448 / 1e6 = 4.5e-4); 1e6 * 2^-12 = 244.1 rounds to 240 on E4M3's grid
  EXPECT_EQ(y1.data<double>()[130], 240.0 * 4096);
  // Zeros stay zeros with scale_inv 1; Inf saturates at scale 1 (and so does its block); a
  // NaN is kept and skipped by its block's amax.
  Tensor z = Tensor::empty({2, 256}, DType::F64);
  for (int64_t i = 0; i < z.numel(); ++i)
    z.data<double>()[i] = i < 256 ? 0.0 : 1e-3 * double(i - 256);
  z.data<double>()[256 + 3] = INFINITY;
  z.data<double>()[256 + 130] = NAN;
  check_quantize(z, 1, 128, Fp8Format::E4M3);
  Tensor y = Tensor::empty(z.shape(), DType::F64), si = Tensor::empty({4}, DType::F32);
  ops::fp8_block_quantize(z, Fp8Format::E4M3, 1, 128, y, si, S());
  EXPECT_EQ(si.data<float>()[0], 1.f);
  EXPECT_EQ(y.data<double>()[5], 0.0);
  EXPECT_EQ(si.data<float>()[2], 1.f);  // the Inf block
  EXPECT_EQ(y.data<double>()[256 + 3], 448.0);
  EXPECT_TRUE(std::isnan(y.data<double>()[256 + 130]));
  // block (1, 1): 0.128 .. 0.255, its NaN skipped
  EXPECT_EQ(si.data<float>()[3], 1.0f / float(ref_scale(1e-3 * 255, Fp8Format::E4M3)));
  // Saturation by rounding cannot happen: amax * scale <= fp8_max for every block.
  Tensor big = Tensor::empty({1, 128}, DType::F64);
  for (int64_t i = 0; i < 128; ++i) big.data<double>()[i] = 447.99 * (i + 1) / 128.0;
  check_quantize(big, 1, 128, Fp8Format::E4M3);
}

TEST(Fp8Block, ScaleDimsAreCublasLtsLayout) {
  int64_t r = 0, c = 0;
  ops::fp8_block_scale_dims(4096, 1024, false, &r, &c);  // 1x128: [K/128, R]
  EXPECT_EQ(r, 8);
  EXPECT_EQ(c, 4096);
  ops::fp8_block_scale_dims(6, 300, false, &r, &c);  // rows padded to 4
  EXPECT_EQ(r, 3);
  EXPECT_EQ(c, 8);
  ops::fp8_block_scale_dims(6144, 2048, true, &r, &c);  // 128x128: [R/128, K/128 padded to 4]
  EXPECT_EQ(r, 48);
  EXPECT_EQ(c, 16);
  ops::fp8_block_scale_dims(300, 300, true, &r, &c);
  EXPECT_EQ(r, 3);
  EXPECT_EQ(c, 4);
}

// ---- the emulated layer --------------------------------------------------------------


struct BlockFixture {
  TransformerConfig c;
  ParamStore store;
  std::string w = "decoder.layers.0.mlp.linear_fc1.weight";
  std::string b = "decoder.layers.0.mlp.linear_fc1.bias";
  int64_t T, in, out;

  BlockFixture(int64_t T_, int64_t in_, int64_t out_, Fp8Config::Format fmt, bool wgrad)
      : T(T_), in(in_), out(out_) {
    c.num_layers = 1, c.hidden_size = in, c.num_attention_heads = 2, c.kv_channels = in / 2;
    c.num_query_groups = 2, c.ffn_hidden_size = out, c.seq_length = 3;
    c.max_position_embeddings = 3, c.padded_vocab_size = 16, c.dtype = DType::F64;
    c.fp8.format = fmt, c.fp8.recipe = Fp8Config::Recipe::Blockwise, c.fp8.wgrad = wgrad;
    std::vector<ParamInfo> params;
    ColumnParallelLinear::add_params(c, "decoder.layers.0.mlp.linear_fc1", 0, out, in,
                                     TpSplit::Rows, 0.5, true, params);
    for (auto& p : params) store.add(p);
    add_fp8_buffers(c, {0}, store);
    store.allocate(DType::F64, 0, 1);
    store.initialize(11);
    // Weights of graded magnitudes, so the 128x128 tiles get different scales.
    Tensor W = store.param(w);
    for (int64_t j = 0; j < out; ++j)
      for (int64_t i = 0; i < in; ++i)
        W.data<double>()[j * in + i] *= std::ldexp(1.0, int((j / 128) * 3 + (i / 128) * 5) - 4);
  }
  StepContext cx() {
    StepKeys k;
    k.training = true;
    return make_step_context(c, c.seq_length, T / c.seq_length, k, nullptr);
  }
};

// Forward and backward of the layer under the recipe against the scalar reference and
// finite differences; `fd_x`: also dx by finite differences (small shapes).
void check_block_layer(BlockFixture& fx, const Tensor& x, const Tensor& G, bool fd_x) {
  const Fp8Format gf = fx.c.fp8.grads_e5m2() ? Fp8Format::E5M2 : Fp8Format::E4M3;
  const Fp8Format e4 = Fp8Format::E4M3;
  ColumnParallelLinear lin(&fx.store, fx.w, fx.b);
  StepContext cx = fx.cx();
  ColumnParallelLinear::Saved saved;
  Tensor y = Tensor::empty({fx.T, fx.out}, DType::F64);
  Workspace fws;
  lin.forward(x, saved, y, fws, cx);
  const Tensor W = fx.store.param(fx.w).clone(), B = fx.store.param(fx.b).clone();
  const Tensor qx = ref_quantize(x, 1, 128, e4), qw = ref_quantize(W, 128, 128, e4);
  double worst = 0;
  for (int64_t t = 0; t < fx.T; ++t)
    for (int64_t j = 0; j < fx.out; ++j) {
      double want = B.data<double>()[j];
      for (int64_t i = 0; i < fx.in; ++i)
        want += qx.data<double>()[t * fx.in + i] * qw.data<double>()[j * fx.in + i];
      worst = std::max(worst,
                       std::fabs(y.data<double>()[t * fx.out + j] - want) / (1 + std::fabs(want)));
    }
  EXPECT_LT(worst, 1e-12);

  fx.store.zero_grads();
  Workspace ws;
  Tensor dx = Tensor::empty({fx.T, fx.in}, DType::F64);
  lin.backward(G, x, saved, dx, ws, cx);
  const Tensor qg_rows = ref_quantize(G, 1, 128, gf);  // dgrad: along dy's rows
  const Tensor qg_cols = ref_quantize(G, 128, 1, gf);  // wgrad: along the tokens
  const Tensor qx_cols = ref_quantize(x, 128, 1, e4);
  Tensor xv = x.clone(), wv = W.clone();
  if (fd_x) {  // dx = d/dx <Q1(G), x Q2(w)^T>
    Tensor want_dx = fd(xv, [&] { return contract(qg_rows, xv, qw); });
    EXPECT_LT(max_rel(dx, want_dx), 1e-8);
  }
  // dw = d/dw <Qc(G), Qc(x) w^T> (FP8 wgrad), or <G, x w^T>
  Tensor want_dw = fx.c.fp8.wgrad ? fd(wv, [&] { return contract(qg_cols, qx_cols, wv); })
                                  : fd(wv, [&] { return contract(G, x, wv); });
  EXPECT_LT(max_rel(fx.store.grad(fx.w), want_dw), 1e-8);
  if (fx.c.fp8.wgrad) {  // the test tells column blocks from row blocks
    Tensor rows_dw = fd(wv, [&] { return contract(qg_rows, qx, wv); });
    EXPECT_GT(max_rel(rows_dw, want_dw), 1e-6);
  }
  // db: the unquantised gradient's column sums
  for (int64_t j = 0; j < fx.out; ++j) {
    double s = 0;
    for (int64_t t = 0; t < fx.T; ++t) s += G.data<double>()[t * fx.out + j];
    EXPECT_NEAR(fx.store.grad(fx.b).data<double>()[j], s, 1e-12 * (1 + std::fabs(s)));
  }
}

Tensor graded_tokens(int64_t T, int64_t n, uint64_t seed, double scale) {
  Tensor t = randn({T, n}, seed, scale);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t c = 0; c < n; ++c)
      t.data<double>()[r * n + c] *= std::ldexp(1.0, int((r * 3 + c * 5) % 13) - 6);
  return t;
}


TEST(Fp8BlockLinear, HybridAgainstFiniteDifferences) {
  // in = 136: x's rows and w's columns are two K blocks (128 + 8); out = 12.
  BlockFixture fx(6, 136, 12, Fp8Config::Format::Hybrid, true);
  check_block_layer(fx, graded_tokens(6, 136, 1, 2.0), graded_tokens(6, 12, 2, 1e-3), true);
}

TEST(Fp8BlockLinear, E4m3WithoutFp8Wgrad) {
  BlockFixture fx(6, 136, 12, Fp8Config::Format::E4M3, false);
  check_block_layer(fx, graded_tokens(6, 136, 3, 0.3), graded_tokens(6, 12, 4, 5.0), true);
}

TEST(Fp8BlockLinear, WgradBlocksAlongTheTokens) {
  // T = 132 tokens: wgrad's K is two blocks (128 + 4); out = 136: two weight tiles by rows.
  BlockFixture fx(132, 16, 136, Fp8Config::Format::Hybrid, true);
  check_block_layer(fx, graded_tokens(132, 16, 5, 1.0), graded_tokens(132, 136, 6, 1e-2), false);
}

TEST(Fp8BlockLinear, NoStateIsRegistered) {
  BlockFixture fx(6, 16, 16, Fp8Config::Format::Hybrid, true);
  EXPECT_TRUE(fx.store.buffer_infos().empty());  // nothing to checkpoint, nothing to reduce
}

// ---- flags -----------------------------------------------------------------------------

TEST(Fp8BlockFlags, BlockwiseIsARecipe) {
  using namespace mcpp::training;
  using namespace mcpp::training::test;
  Args a = parse_and_validate(
      with(base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--no-fp8-wgrad"}));
  const Fp8Config c = fp8_config(a);
  EXPECT_EQ(c.recipe, Fp8Config::Recipe::Blockwise);
  EXPECT_TRUE(c.blockwise());
  EXPECT_FALSE(c.delayed());
  EXPECT_TRUE(c.grads_e5m2());
  EXPECT_FALSE(c.wgrad);
  EXPECT_EQ(fp8_config(parse_and_validate(with(
                           base_argv(), {"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"})))
                .format,
            Fp8Config::Format::E4M3);
  for (const char* f : {"--fp8-margin", "--fp8-amax-history-len"})
    expect_error(
        [&] {
          parse_and_validate(
              with(base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise", f, "2"}));
        },
        {"sets delayed scaling", "--fp8-recipe blockwise scales each block"});
  expect_error(
      [] {
        parse_and_validate(with(base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise",
                                              "--fp8-amax-compute-algo", "max"}));
      },
      {"--fp8-amax-compute-algo sets delayed scaling"});
  expect_error(
      [] {
        parse_and_validate(with(base_argv(), {"--fp8-recipe", "blockwise"}));
      },
      {"--fp8-recipe acts on FP8 training only"});
  EXPECT_NO_THROW(
      check_fp8_device(parse_and_validate(with(
                           base_argv(), {"--fp8-format", "hybrid", "--fp8-recipe", "blockwise"})),
                       Device::CPU));
}

}  // namespace fp8_block_test
