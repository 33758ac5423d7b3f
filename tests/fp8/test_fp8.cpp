// FP8 on the CPU: the rounding to the E4M3/E5M2 grids against the formats' bit-field
// definition (every code, round-to-nearest-even at every midpoint, saturation, subnormals,
// NaN), the quantise/amax/scale-update ops against scalar references, and the emulated FP8
// linear layer: its forward against an independent scalar evaluation, its backward against
// f64 central finite differences of its own emulated function (straight-through: the
// derivative in each operand with the other operands quantised), delayed-scaling state
// recorded by the layer and updated once per step.
#include <gtest/gtest.h>

#include <cstring>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "fp8_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/linear.h"
#include "ops/fp8_grid.h"
#include "ops/ops.h"

using namespace mcpp;
using namespace mcpp::model;
using ops::Fp8Format;

namespace fp8_emulation_test {

using fp8_test::contract;
using fp8_test::fd;
using fp8_test::max_rel;
using fp8_test::randn;
using fp8_test::q;
using fp8_test::amax;
using fp8_test::scale_of;

using fp8_test::S;

const Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};

// Finite positive values of a format in increasing order (codes 0x00..0x7f, NaN/Inf out).
std::vector<double> positive_grid(Fp8Format f) {
  std::vector<double> v;
  for (int c = 0; c < 0x80; ++c) {
    const double x = ops::fp8_decode(uint8_t(c), f);
    if (std::isfinite(x)) v.push_back(x);
  }
  return v;
}


TEST(Fp8Grid, DecodeKnownValues) {
  EXPECT_EQ(ops::fp8_decode(0x7e, Fp8Format::E4M3), 448.0);
  EXPECT_TRUE(std::isnan(ops::fp8_decode(0x7f, Fp8Format::E4M3)));
  EXPECT_EQ(ops::fp8_decode(0x01, Fp8Format::E4M3), std::ldexp(1.0, -9));
  EXPECT_EQ(ops::fp8_decode(0x08, Fp8Format::E4M3), std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(ops::fp8_decode(0x38, Fp8Format::E4M3), 1.0);
  EXPECT_EQ(ops::fp8_decode(0xb8, Fp8Format::E4M3), -1.0);
  EXPECT_EQ(ops::fp8_decode(0x7b, Fp8Format::E5M2), 57344.0);
  EXPECT_TRUE(std::isinf(ops::fp8_decode(0x7c, Fp8Format::E5M2)));
  EXPECT_TRUE(std::isnan(ops::fp8_decode(0x7d, Fp8Format::E5M2)));
  EXPECT_EQ(ops::fp8_decode(0x01, Fp8Format::E5M2), std::ldexp(1.0, -16));
  EXPECT_EQ(ops::fp8_decode(0x3c, Fp8Format::E5M2), 1.0);
  EXPECT_EQ(positive_grid(Fp8Format::E4M3).size(), 127u);  // 0 .. 448
  EXPECT_EQ(positive_grid(Fp8Format::E5M2).size(), 124u);  // 0 .. 57344
}

TEST(Fp8Grid, EveryCodeIsAFixedPointInFloatAndDouble) {
  for (Fp8Format f : kFormats)
    for (double v : positive_grid(f)) {
      EXPECT_EQ(ops::fp8_round(v, f), v);
      EXPECT_EQ(ops::fp8_round(-v, f), -v);
      EXPECT_EQ(ops::fp8_round(float(v), f), float(v));
    }
}

// The host's f32 fast path (bit operations) against the generic form (frexp, ldexp,
// nearbyint), bit for bit: both signs, every exponent (f32 subnormals, Inf and NaN
// included), all 2^16 values of the mantissa's top 16 bits (the bits that decide the
// rounding in both formats, ties included) with the low 7 bits zero, all ones, and mixed.
TEST(Fp8Grid, HostF32FastPathEqualsTheGenericForm) {
  int64_t checked = 0, differ = 0;
  for (Fp8Format f : kFormats)
    for (uint32_t sign = 0; sign < 2; ++sign)
      for (uint32_t e = 0; e < 256; ++e)
        for (uint32_t top = 0; top < (1u << 16); ++top)
          for (uint32_t low : {0u, 0x7Fu, 0x2Au}) {
            const uint32_t bits = sign << 31 | e << 23 | top << 7 | low;
            float v;
            std::memcpy(&v, &bits, 4);
            const float fast = ops::fp8_round_f32(v, f), slow = ops::fp8_round_generic(v, f);
            uint32_t a, b;
            std::memcpy(&a, &fast, 4);
            std::memcpy(&b, &slow, 4);
            ++checked;
            if (a != b && !(std::isnan(fast) && std::isnan(slow)) && ++differ <= 5)
              ADD_FAILURE() << "input bits 0x" << std::hex << bits << ": fast 0x" << a
                            << ", generic 0x" << b;
          }
  EXPECT_EQ(differ, 0) << "of " << checked;
  EXPECT_EQ(checked, int64_t(2) * 2 * 256 * 65536 * 3);
}

// Between two neighbours a < b: below the midpoint -> a, above -> b, at it -> the one whose
// code is even (the last mantissa bit is the code's last bit).
TEST(Fp8Grid, RoundsToNearestTiesToEven) {
  for (Fp8Format f : kFormats) {
    const auto g = positive_grid(f);
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      const double a = g[i], b = g[i + 1], mid = 0.5 * (a + b), eps = (b - a) * 1e-3;
      EXPECT_EQ(ops::fp8_round(mid - eps, f), a) << a << " " << b;
      EXPECT_EQ(ops::fp8_round(mid + eps, f), b) << a << " " << b;
      const double even = (i % 2 == 0) ? a : b;  // code i is g[i]
      EXPECT_EQ(ops::fp8_round(mid, f), even) << a << " " << b;
      EXPECT_EQ(ops::fp8_round(-mid, f), -even);
      EXPECT_EQ(ops::fp8_round(float(mid), f), float(even));
    }
  }
}

TEST(Fp8Grid, SaturatesAndKeepsNaNAndZeros) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ops::fp8_round(449.0, Fp8Format::E4M3), 448.0);
  EXPECT_EQ(ops::fp8_round(464.0, Fp8Format::E4M3), 448.0);  // IEEE-like rounding would give 480
  EXPECT_EQ(ops::fp8_round(1e30, Fp8Format::E4M3), 448.0);
  EXPECT_EQ(ops::fp8_round(-inf, Fp8Format::E4M3), -448.0);
  EXPECT_EQ(ops::fp8_round(61440.0, Fp8Format::E5M2), 57344.0);  // would round to Inf
  EXPECT_EQ(ops::fp8_round(inf, Fp8Format::E5M2), 57344.0);
  EXPECT_EQ(ops::fp8_round(float(-1e20), Fp8Format::E5M2), -57344.0f);
  EXPECT_TRUE(std::isnan(ops::fp8_round(std::nan(""), Fp8Format::E4M3)));
  EXPECT_TRUE(std::isnan(ops::fp8_round(std::nanf(""), Fp8Format::E5M2)));
  // Below half the smallest subnormal: a signed zero; exactly half: the tie goes to 0 (even).
  const double s4 = std::ldexp(1.0, -9), s5 = std::ldexp(1.0, -16);
  EXPECT_EQ(ops::fp8_round(0.49 * s4, Fp8Format::E4M3), 0.0);
  EXPECT_TRUE(std::signbit(ops::fp8_round(-0.49 * s4, Fp8Format::E4M3)));
  EXPECT_EQ(ops::fp8_round(0.5 * s4, Fp8Format::E4M3), 0.0);
  EXPECT_EQ(ops::fp8_round(0.51 * s4, Fp8Format::E4M3), s4);
  EXPECT_EQ(ops::fp8_round(1.5 * s5, Fp8Format::E5M2), 2 * s5);  // tie to even code 2
  EXPECT_EQ(ops::fp8_round(0.0, Fp8Format::E5M2), 0.0);
}

TEST(Fp8Ops, QuantizeIsScaleRoundUnscale) {
  std::mt19937_64 gen(3);
  std::normal_distribution<double> d(0, 30);
  Tensor x = Tensor::empty({257}, DType::F32), y = Tensor::empty({257}, DType::F32);
  for (int i = 0; i < 257; ++i) x.data<float>()[i] = float(d(gen));
  x.data<float>()[0] = 1e9f;  // saturates
  Tensor sc = Tensor::from(std::vector<float>{0.37f}, {1});
  for (Fp8Format f : kFormats) {
    ops::cpu::fp8_quantize(x, f, sc, y, S());
    const float s = 0.37f, inv = 1.0f / s;
    for (int i = 0; i < 257; ++i) {
      const float want = float(ops::fp8_round(double(x.data<float>()[i] * s), f)) * inv;
      EXPECT_EQ(y.data<float>()[i], want) << i;
    }
    EXPECT_EQ(y.data<float>()[0], float(ops::fp8_max(f)) * inv);
  }
  // In place, f64.
  Tensor z = Tensor::from(std::vector<double>{1.0 / 3, -1000, 7e-5}, {3});
  Tensor one = Tensor::from(std::vector<float>{1.0f}, {1});
  ops::cpu::fp8_quantize(z, Fp8Format::E4M3, one, z, S());
  EXPECT_EQ(z.data<double>()[0], 0.34375);  // 1/3 -> 1.375 * 2^-2
  EXPECT_EQ(z.data<double>()[1], -448.0);
  EXPECT_EQ(z.data<double>()[2], 0.0);  // below half of E4M3's smallest subnormal 2^-9
}

TEST(Fp8Ops, AmaxAccumulatesAndPropagatesNaN) {
  Tensor a = Tensor::from(std::vector<float>{2.0f}, {1});
  ops::cpu::fp8_amax(Tensor::from(std::vector<float>{-1.5f, 0.5f}, {2}), a, S());
  EXPECT_EQ(a.data<float>()[0], 2.0f);  // max with what was recorded
  ops::cpu::fp8_amax(Tensor::from(std::vector<double>{-3.25, 1.0}, {2}), a, S());
  EXPECT_EQ(a.data<float>()[0], 3.25f);
  ops::cpu::fp8_amax(Tensor::from(std::vector<float>{1.0f, std::nanf("")}, {2}), a, S());
  EXPECT_TRUE(std::isnan(a.data<float>()[0]));
}

TEST(Fp8Ops, DelayedScaleUpdate) {
  // history [3, 3] (row 0 newest); columns: x (E4M3), w (E4M3), dy (E5M2: bit 2).
  Tensor h = Tensor::from(std::vector<float>{2, 0, 4,  //
                                             8, 1, NAN, 1, 5, 2},
                          {3, 3});
  Tensor s = Tensor::from(std::vector<float>{1, 1, 1}, {3});
  Tensor h2 = h.clone(), s2 = s.clone();
  ops::cpu::fp8_scale_update(h, s, int64_t(1) << 2, 0, /*max=*/false, /*roll=*/true, S());
  EXPECT_EQ(s.data<float>()[0], 224.0f);        // 448 / 2
  EXPECT_EQ(s.data<float>()[1], 1.0f);          // amax 0: the old scale
  EXPECT_EQ(s.data<float>()[2], 57344.0f / 4);  // E5M2 column
  const float rolled[] = {0, 0, 0, 2, 0, 4, 8, 1, NAN};
  for (int i = 0; i < 9; ++i)
    if (std::isnan(rolled[i]))
      EXPECT_TRUE(std::isnan(h.data<float>()[i]));
    else
      EXPECT_EQ(h.data<float>()[i], rolled[i]) << i;
  // max over the history, margin 1: x max 8, w max 5, dy NaN in the history -> kept.
  ops::cpu::fp8_scale_update(h2, s2, int64_t(1) << 2, 1, /*max=*/true, /*roll=*/false, S());
  EXPECT_EQ(s2.data<float>()[0], 448.0f / 8 / 2);
  EXPECT_EQ(s2.data<float>()[1], 448.0f / 5 / 2);
  EXPECT_EQ(s2.data<float>()[2], 1.0f);
  EXPECT_EQ(h2.data<float>()[0], 2.0f);  // no roll
  // An amax so small that the scale overflows: the largest float.
  Tensor h3 = Tensor::from(std::vector<float>{1e-40f}, {1, 1}),
         s3 = Tensor::from(std::vector<float>{1}, {1});
  ops::cpu::fp8_scale_update(h3, s3, 0, 0, false, false, S());
  EXPECT_EQ(s3.data<float>()[0], std::numeric_limits<float>::max());
}

// ---- the emulated FP8 linear layer ---------------------------------------------------


struct LinearFixture {
  TransformerConfig c;
  ParamStore store;
  std::string w = "decoder.layers.0.self_attention.linear_qkv.weight";
  std::string b = "decoder.layers.0.self_attention.linear_qkv.bias";
  std::string prefix = "decoder.layers.0.self_attention.linear_qkv";
  int64_t T = 6, in = 8, out = 12;

  LinearFixture(Fp8Config::Recipe recipe, Fp8Config::Format fmt, bool wgrad) {
    c.num_layers = 1, c.hidden_size = in, c.num_attention_heads = 2, c.kv_channels = 4;
    c.num_query_groups = 2, c.ffn_hidden_size = 16, c.seq_length = 3;
    c.max_position_embeddings = 3, c.padded_vocab_size = 16, c.dtype = DType::F64;
    c.fp8.format = fmt, c.fp8.recipe = recipe, c.fp8.wgrad = wgrad;
    std::vector<ParamInfo> params;
    ColumnParallelLinear::add_params(c, prefix, 0, out, in, TpSplit::Rows, 0.5, true, params);
    for (auto& p : params) store.add(p);
    add_fp8_buffers(c, {0}, store);
    store.allocate(DType::F64, 0, 1);
    store.initialize(11);
    Tensor bias = store.param(b);
    for (int64_t i = 0; i < out; ++i) bias.data<double>()[i] = 0.1 * double(i) - 0.5;
  }
  StepContext cx(bool training = true) {
    StepKeys k;
    k.training = training;
    return make_step_context(c, c.seq_length, T / c.seq_length, k, nullptr);
  }
};

// Runs forward + backward of the FP8 layer on x with output gradient G; checks forward,
// dx, dw, db against the scalar reference and finite differences, given the scales the
// layer uses for x, w and G.
void check_layer(LinearFixture& fx, const Tensor& x, const Tensor& G, double sx, double sw,
                 double sg) {
  const Fp8Format g_fmt = fx.c.fp8.grads_e5m2() ? Fp8Format::E5M2 : Fp8Format::E4M3;
  ColumnParallelLinear lin(&fx.store, fx.w, fx.b);
  StepContext cx = fx.cx();
  ColumnParallelLinear::Saved saved;
  Tensor y = Tensor::empty({fx.T, fx.out}, DType::F64);
  Workspace fws;  // the SP gather buffer (unused here: no TP)
  lin.forward(x, saved, y, fws, cx);
  Tensor W = fx.store.param(fx.w).clone(), B = fx.store.param(fx.b).clone();
  // forward: Q(x) Q(w)^T + b, element by element.
  const Tensor qx = q(x, sx, Fp8Format::E4M3), qw = q(W, sw, Fp8Format::E4M3);
  double worst = 0;
  for (int64_t t = 0; t < fx.T; ++t)
    for (int64_t j = 0; j < fx.out; ++j) {
      double want = B.data<double>()[j];
      for (int64_t i = 0; i < fx.in; ++i)
        want += qx.data<double>()[t * fx.in + i] * qw.data<double>()[j * fx.in + i];
      worst = std::max(worst, std::fabs(y.data<double>()[t * fx.out + j] - want));
    }
  EXPECT_LT(worst, 1e-12);
  // The layer really quantised: x @ w^T differs.
  EXPECT_GT(std::fabs(contract(G, x, W) - contract(G, qx, qw)), 1e-6);

  fx.store.zero_grads();
  Workspace ws;
  Tensor dx = Tensor::empty({fx.T, fx.in}, DType::F64);
  lin.backward(G, x, saved, dx, ws, cx);
  const Tensor qg = q(G, sg, g_fmt);
  Tensor xv = x.clone(), wv = W.clone(), bv = B.clone();
  // dx = d/dx <Q(G), x Q(w)^T>
  Tensor want_dx = fd(xv, [&] { return contract(qg, xv, qw); });
  EXPECT_LT(max_rel(dx, want_dx), 1e-8);
  // dw = d/dw <Q(G), Q(x) w^T>, or <G, x w^T> under --no-fp8-wgrad
  Tensor want_dw = fx.c.fp8.wgrad ? fd(wv, [&] { return contract(qg, qx, wv); })
                                  : fd(wv, [&] { return contract(G, x, wv); });
  EXPECT_LT(max_rel(fx.store.grad(fx.w), want_dw), 1e-8);
  // db = d/db <G, y>: from the unquantised gradient
  Tensor ones = Tensor::empty({fx.T, 1}, DType::F64);
  for (int64_t t = 0; t < fx.T; ++t) ones.data<double>()[t] = 1;
  Tensor want_db = fd(bv, [&] {
    Tensor bb = bv.view({fx.out, 1});
    return contract(G, ones, bb);
  });
  EXPECT_LT(max_rel(fx.store.grad(fx.b), want_db), 1e-8);
  // The quantised gradient is not the plain one (the test can tell them apart).
  EXPECT_GT(max_rel(fd(xv, [&] { return contract(G, xv, W); }), want_dx), 1e-4);
}


TEST(Fp8Linear, TensorwiseHybridAgainstFiniteDifferences) {
  LinearFixture fx(Fp8Config::Recipe::Tensorwise, Fp8Config::Format::Hybrid, true);
  Tensor x = randn({fx.T, fx.in}, 1, 3.0), G = randn({fx.T, fx.out}, 2, 1e-3);
  Tensor W = fx.store.param(fx.w);
  check_layer(fx, x, G, scale_of(448, amax(x)), scale_of(448, amax(W)), scale_of(57344, amax(G)));
}

TEST(Fp8Linear, TensorwiseE4m3WithoutFp8Wgrad) {
  LinearFixture fx(Fp8Config::Recipe::Tensorwise, Fp8Config::Format::E4M3, false);
  Tensor x = randn({fx.T, fx.in}, 3, 0.2), G = randn({fx.T, fx.out}, 4, 10.0);
  Tensor W = fx.store.param(fx.w);
  check_layer(fx, x, G, scale_of(448, amax(x)), scale_of(448, amax(W)), scale_of(448, amax(G)));
}

// Delayed scaling: the layer uses the stored scales, records this step's amaxes in row 0
// of the history (forward: x and w; backward: dy), and fp8_update_scales turns them into
// the next step's scales and clears row 0.
TEST(Fp8Linear, DelayedUsesStoredScalesAndRecordsAmaxes) {
  LinearFixture fx(Fp8Config::Recipe::Delayed, Fp8Config::Format::Hybrid, true);
  fx.c.fp8.amax_history_len = 1;
  Tensor scale = fx.store.buffer(fp8_scale_name(fx.prefix));
  Tensor hist = fx.store.buffer(fp8_history_name(fx.prefix));
  ASSERT_EQ(hist.shape(), (Shape{1, 3}));
  EXPECT_EQ(scale.data<float>()[0], 1.0f);  // Transformer Engine's initial scale
  scale.data<float>()[0] = 16, scale.data<float>()[1] = 64, scale.data<float>()[2] = 4096;
  Tensor x = randn({fx.T, fx.in}, 5, 2.0), G = randn({fx.T, fx.out}, 6, 0.01);
  check_layer(fx, x, G, 16, 64, 4096);
  const Tensor W = fx.store.param(fx.w);
  EXPECT_EQ(hist.data<float>()[0], amax(x));
  EXPECT_EQ(hist.data<float>()[1], amax(W));
  EXPECT_EQ(hist.data<float>()[2], amax(G));
  fp8_update_scales(fx.c, fx.store, S());
  EXPECT_EQ(scale.data<float>()[0], float(scale_of(448, amax(x))));
  EXPECT_EQ(scale.data<float>()[2], float(scale_of(57344, amax(G))));
  EXPECT_EQ(hist.data<float>()[0], 0.0f);
  // An evaluation pass records nothing.
  ColumnParallelLinear lin(&fx.store, fx.w, fx.b);
  ColumnParallelLinear::Saved saved;
  Tensor y = Tensor::empty({fx.T, fx.out}, DType::F64);
  StepContext ev = fx.cx(false);
  Workspace ws;
  lin.forward(x, saved, y, ws, ev);
  EXPECT_EQ(hist.data<float>()[0], 0.0f);
}

TEST(Fp8Linear, FirstAndLastLayersStayInModelPrecision) {
  Fp8Config f;
  f.format = Fp8Config::Format::E4M3;
  f.bf16_start = 1, f.bf16_end = 2;
  EXPECT_FALSE(f.layer_in_fp8(0, 6));
  EXPECT_TRUE(f.layer_in_fp8(1, 6));
  EXPECT_TRUE(f.layer_in_fp8(3, 6));
  EXPECT_FALSE(f.layer_in_fp8(4, 6));
  EXPECT_FALSE(Fp8Config{}.layer_in_fp8(2, 6));
}

}  // namespace fp8_emulation_test
