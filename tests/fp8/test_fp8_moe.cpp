// The routed experts' GEMMs in FP8 (model/moe/experts.h; docs/fp8.md "Routed experts"), on
// the CPU emulation in f64: the forward against an explicit quantise-dequantise of each
// expert's operands with that expert's own scales and plain loops; the backward against f64
// central finite differences of the emulated function (straight-through, as the dense layer's
// test: each operand's derivative with the other operands quantised); per-expert scaling
// (tensorwise: each expert's scales from its own rows; delayed: each expert's history and
// scale, updated after the step); an expert without rows records nothing and keeps a finite
// scale; the zero-row padding of the CUDA path changes nothing; layers kept in the model's
// precision by --first-last-layers-bf16 leave their experts unquantised.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "fp8_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/moe/experts.h"
#include "ops/fp8_grid.h"
#include "ops/ops.h"

using namespace mcpp;
using namespace mcpp::model;
using ops::Fp8Format;

namespace fp8_moe_test {

using fp8_test::max_rel;
using fp8_test::randn;
using fp8_test::q;
using fp8_test::amax;
using fp8_test::scale_of;
// Central differences with a step of 1e-5 (the objectives here are bilinear).
Tensor fd5(Tensor x, const std::function<double()>& f) { return fp8_test::fd(x, f, 1e-5); }

using fp8_test::S;

using fp8_test::mm_t;

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}
Tensor scale_rows(const Tensor& a, const Tensor& p) {
  Tensor o = a.clone();
  const int64_t C = a.size(1);
  for (int64_t i = 0; i < o.numel(); ++i) o.data<double>()[i] *= p.data<double>()[i / C];
  return o;
}
Tensor rows(const Tensor& t, int64_t off, int64_t n) { return t.narrow(off, n).clone(); }

std::string w1(int64_t e) {
  return "decoder.layers.0.mlp.experts.linear_fc1.weight" + std::to_string(e);
}
std::string w2(int64_t e) {
  return "decoder.layers.0.mlp.experts.linear_fc2.weight" + std::to_string(e);
}

// E GELU experts, H 8, I 4, f64, one MoE layer (of `layers`).
struct ExpertsFixture {
  TransformerConfig c;
  ParamStore store;
  int64_t E, H = 8, I = 4;

  ExpertsFixture(Fp8Config::Recipe recipe, int64_t experts, int64_t history = 1, int layers = 1,
                 bool biases = false)
      : E(experts) {
    c.num_layers = layers, c.hidden_size = H, c.num_attention_heads = 2, c.kv_channels = 4;
    c.num_query_groups = 2, c.ffn_hidden_size = 16, c.seq_length = 4;
    c.max_position_embeddings = 4, c.padded_vocab_size = 16, c.dtype = DType::F64;
    c.init_method_std = 0.5, c.add_bias_linear = biases;
    c.moe.num_experts = E, c.moe.topk = 1, c.moe.ffn_hidden_size = I;
    c.fp8.format = Fp8Config::Format::Hybrid, c.fp8.recipe = recipe;
    c.fp8.amax_history_len = history, c.fp8.amax_max = true;
    std::vector<ParamInfo> params;
    moe::GroupedExperts::add_params(c, 0, params);
    for (auto& p : params) store.add(p);
    add_fp8_buffers(c, {0}, store);
    store.allocate(DType::F64, 0, 1);
    store.initialize(5);
  }
  StepContext cx() {
    StepKeys k;
    k.training = true;
    return make_step_context(c, c.seq_length, 1, k, nullptr);
  }
  Tensor hist(const std::string& w) { return store.buffer(fp8_history_name(w)); }
  Tensor scale(const std::string& w) { return store.buffer(fp8_scale_name(w)); }
};

// One forward and backward of the experts: y, dx, dp, and the weight gradients in the store.
struct Pass {
  Tensor y, dx, dp;
};
Pass run(ExpertsFixture& fx, moe::GroupedExperts& ge, const Tensor& x, const Tensor& p,
         const std::vector<int64_t>& counts, const Tensor& G) {
  const int64_t N = x.size(0);
  moe::GroupedExperts::Saved s;
  moe::GroupedExperts::Scratch w;
  s.fc1 = Tensor::empty({N, fx.I}, DType::F64), s.ap = Tensor::empty({N, fx.I}, DType::F64);
  for (Tensor* t : {&w.dap, &w.dfc1}) *t = Tensor::empty({N, fx.I}, DType::F64);
  Pass r{Tensor::empty({N, fx.H}, DType::F64), Tensor::empty({N, fx.H}, DType::F64),
         Tensor::empty({N}, DType::F64)};
  StepContext cx = fx.cx();
  fx.store.zero_grads();
  ge.forward(x, p, counts, s, r.y, w, cx, nullptr);
  ge.backward(G, x, p, counts, s, r.dx, r.dp, w, cx, nullptr);
  return r;
}

// Inputs of N rows: expert 0's rows ~ 1, expert 1's ~ 100 (very different ranges); the
// output gradient of expert 1 ~ 1e-3, the others' ~ 1.
struct Inputs {
  Tensor x, p, G;
};
Inputs inputs(const ExpertsFixture& fx, const std::vector<int64_t>& counts, uint64_t seed) {
  int64_t N = 0;
  for (int64_t n : counts) N += n;
  Inputs in{randn({N, fx.H}, seed, 1.0), Tensor::empty({N}, DType::F64),
            randn({N, fx.H}, seed + 1, 1.0)};
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int64_t i = off * fx.H; i < (off + counts[e]) * fx.H; ++i) {
      if (e == 1) in.x.data<double>()[i] *= 100, in.G.data<double>()[i] *= 1e-3;
    }
    off += counts[e];
  }
  std::mt19937_64 gen(seed + 2);
  std::uniform_real_distribution<double> u(0.2, 0.9);
  for (int64_t n = 0; n < N; ++n) in.p.data<double>()[n] = u(gen);
  return in;
}

// The tensorwise reference for expert e's rows: every operand quantised with its own amax,
// plain loops; checks y, dx, dp and the weight gradients (finite differences).
void check_tensorwise_expert(ExpertsFixture& fx, const Inputs& in, const Pass& r, int64_t e,
                             int64_t off, int64_t n) {
  const Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  const Tensor x = rows(in.x, off, n), p = rows(in.p, off, n);
  const Tensor G = rows(in.G, off, n);
  const Tensor W1 = fx.store.param(w1(e)).clone(), W2 = fx.store.param(w2(e)).clone();
  const Tensor qx = q(x, scale_of(448, amax(x)), E4), qw1 = q(W1, scale_of(448, amax(W1)), E4);
  Tensor h = mm_t(qx, qw1), a = Tensor::empty(h.shape(), DType::F64);
  ops::gelu_forward(h, a, S());
  const Tensor ap = scale_rows(a, p);
  const Tensor qap = q(ap, scale_of(448, amax(ap)), E4), qw2 = q(W2, scale_of(448, amax(W2)), E4);
  const Tensor y = mm_t(qap, qw2);
  EXPECT_LT(max_rel(rows(r.y, off, n), y), 1e-12) << "expert " << e;
  // The test tells quantised from plain: the unquantised expert differs.
  Tensor a0 = Tensor::empty(h.shape(), DType::F64);
  ops::gelu_forward(mm_t(x, W1), a0, S());
  EXPECT_GT(max_rel(mm_t(scale_rows(a0, p), W2), y), 1e-4) << "expert " << e;

  // backward, straight-through: each GEMM's derivative with its other operand quantised
  const Tensor qg = q(G, scale_of(57344, amax(G)), E5);
  Tensor W2v = W2.clone(), pv = p.clone();
  EXPECT_LT(max_rel(fx.store.grad(w2(e)), fd5(W2v, [&] { return dot(qg, mm_t(qap, W2v)); })), 1e-8);
  const Tensor dp_want = fd5(pv, [&] { return dot(qg, mm_t(scale_rows(a, pv), qw2)); });
  EXPECT_LT(max_rel(rows(r.dp, off, n), dp_want), 1e-8);
  // dh = gelu'(h) (p * Q(G) Q(W2)), quantised for fc1's GEMMs
  const int64_t Hh = fx.H, I = fx.I;
  Tensor dap = Tensor::empty({n, I}, DType::F64);  // Q(G) @ Q(W2): [n, H] x [H, I]
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t j = 0; j < Hh; ++j)
        s += qg.data<double>()[t * Hh + j] * qw2.data<double>()[j * I + i];
      dap.data<double>()[t * I + i] = s;
    }
  Tensor dh = Tensor::empty({n, I}, DType::F64);
  ops::gelu_backward(scale_rows(dap, p), h, dh, S());
  const Tensor qdh = q(dh, scale_of(57344, amax(dh)), E5);
  Tensor W1v = W1.clone(), xv = x.clone();
  EXPECT_LT(max_rel(fx.store.grad(w1(e)), fd5(W1v, [&] { return dot(qdh, mm_t(qx, W1v)); })), 1e-8);
  EXPECT_LT(max_rel(rows(r.dx, off, n), fd5(xv, [&] { return dot(qdh, mm_t(xv, qw1)); })), 1e-8);
}


// Tensorwise: each expert's operands scaled by their own amaxes (expert 1's input is 100x
// expert 0's); an expert without rows is skipped.
TEST(Fp8Experts, TensorwisePerExpertAgainstQuantizeDequantizeAndFiniteDifferences) {
  ExpertsFixture fx(Fp8Config::Recipe::Tensorwise, 3);
  moe::GroupedExperts ge(fx.c, 0, &fx.store);
  const std::vector<int64_t> counts = {5, 3, 0};
  const Inputs in = inputs(fx, counts, 21);
  const Pass r = run(fx, ge, in.x, in.p, counts, in.G);
  check_tensorwise_expert(fx, in, r, 0, 0, 5);
  check_tensorwise_expert(fx, in, r, 1, 5, 3);
  // The expert without rows: no gradient.
  EXPECT_EQ(amax(fx.store.grad(w1(2))), 0.0f);
  EXPECT_EQ(amax(fx.store.grad(w2(2))), 0.0f);
  // One scale for both experts' inputs (their joint amax) gives a different output.
  const double joint = scale_of(448, amax(in.x));
  const Tensor x0 = rows(in.x, 0, 5);
  EXPECT_GT(max_rel(q(x0, joint, Fp8Format::E4M3), q(x0, scale_of(448, amax(x0)), Fp8Format::E4M3)),
            1e-3);
}

// Delayed: each expert GEMM has its own buffers, named after the expert's weight and carrying
// the expert index; the step's amaxes go to each expert's history, and after the update each
// expert's scales are its own. An expert without rows in a step records nothing: its history
// keeps the earlier steps' amaxes (max algorithm) and its scale stays finite and unchanged.
TEST(Fp8Experts, DelayedPerExpertStateAndZeroRowExpert) {
  ExpertsFixture fx(Fp8Config::Recipe::Delayed, 2, /*history=*/3);
  int found = 0;
  for (const auto& b : fx.store.buffer_infos())
    if (b.name.find("mlp.experts.") != std::string::npos) {
      EXPECT_EQ(b.expert, b.name.find("weight1.") != std::string::npos ? 1 : 0) << b.name;
      ++found;
    }
  EXPECT_EQ(found, 8);  // 2 experts x 2 GEMMs x (history, scale)
  moe::GroupedExperts ge(fx.c, 0, &fx.store);
  const std::vector<int64_t> counts = {4, 4};
  const Inputs in = inputs(fx, counts, 31);
  // Step 1: scales 1, amaxes recorded per expert.
  run(fx, ge, in.x, in.p, counts, in.G);
  const float ax0 = amax(rows(in.x, 0, 4)), ax1 = amax(rows(in.x, 4, 4));
  EXPECT_EQ(fx.hist(w1(0)).data<float>()[0], ax0);
  EXPECT_EQ(fx.hist(w1(1)).data<float>()[0], ax1);
  EXPECT_EQ(fx.hist(w1(1)).data<float>()[1], amax(fx.store.param(w1(1))));
  EXPECT_EQ(fx.hist(w2(1)).data<float>()[2], amax(rows(in.G, 4, 4)));
  fp8_update_scales(fx.c, fx.store, S());
  const float s0 = fx.scale(w1(0)).data<float>()[0], s1 = fx.scale(w1(1)).data<float>()[0];
  EXPECT_EQ(s0, float(scale_of(448, ax0)));
  EXPECT_EQ(s1, float(scale_of(448, ax1)));
  EXPECT_GT(s0 / s1, 20.0f);  // expert 1's input is ~100x larger
  // Step 2: expert 1 gets no row. Expert 0's output uses its stored scale.
  const std::vector<int64_t> counts2 = {6, 0};
  const Inputs in2 = inputs(fx, counts2, 41);
  const Tensor hist1 = fx.hist(w1(1)).clone(), scale1 = fx.scale(w1(1)).clone();
  const Pass r2 = run(fx, ge, in2.x, in2.p, counts2, in2.G);
  EXPECT_EQ(fx.hist(w1(1)).data<float>()[0], 0.0f);  // nothing recorded
  for (int64_t i = 0; i < hist1.numel(); ++i)
    EXPECT_EQ(fx.hist(w1(1)).data<float>()[i], hist1.data<float>()[i]);
  const Tensor qx = q(in2.x, s0, Fp8Format::E4M3);
  const Tensor W1 = fx.store.param(w1(0));
  const Tensor qw = q(W1, fx.scale(w1(0)).data<float>()[1], Fp8Format::E4M3);
  Tensor h = mm_t(qx, qw), a = Tensor::empty(h.shape(), DType::F64);
  ops::gelu_forward(h, a, S());
  const Tensor ap = scale_rows(a, in2.p);
  const Tensor s2 = fx.scale(w2(0));
  const Tensor y = mm_t(q(ap, s2.data<float>()[0], Fp8Format::E4M3),
                        q(fx.store.param(w2(0)), s2.data<float>()[1], Fp8Format::E4M3));
  EXPECT_LT(max_rel(r2.y, y), 1e-12);
  fp8_update_scales(fx.c, fx.store, S());
  for (int k = 0; k < 3; ++k) {
    const float s = fx.scale(w1(1)).data<float>()[k];
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_EQ(s, scale1.data<float>()[k]) << "operand " << k;  // from step 1's amaxes
  }
  EXPECT_EQ(fx.hist(w1(1)).data<float>()[2 * 3 + 0], ax1);  // rolled, not lost
}

// The CUDA path's zero-padded rows (forced here on the CPU, 16 and 128 rows) change no
// output, no input gradient, no weight gradient and no amax, in every recipe.
TEST(Fp8Experts, ZeroRowPaddingChangesNothing) {
  for (auto recipe :
       {Fp8Config::Recipe::Tensorwise, Fp8Config::Recipe::Delayed, Fp8Config::Recipe::Blockwise}) {
    for (int64_t m : {16, 128}) {
      const std::vector<int64_t> counts = {1, 15, 0, 17};
      Pass ref, pad;
      Tensor g_ref, g_pad, h_ref, h_pad;
      for (int padded = 0; padded < 2; ++padded) {
        ExpertsFixture fx(recipe, 4);
        moe::GroupedExperts ge(fx.c, 0, &fx.store);
        if (padded) ge.set_fp8_row_multiple(m);
        const Inputs in = inputs(fx, counts, 51);
        (padded ? pad : ref) = run(fx, ge, in.x, in.p, counts, in.G);
        (padded ? g_pad : g_ref) = fx.store.grad(w1(3)).clone();
        if (recipe == Fp8Config::Recipe::Delayed) (padded ? h_pad : h_ref) = fx.hist(w2(1)).clone();
      }
      const int r = int(recipe);
      EXPECT_LT(max_rel(pad.y, ref.y), 1e-13) << r << " " << m;
      EXPECT_LT(max_rel(pad.dx, ref.dx), 1e-13) << r << " " << m;
      EXPECT_LT(max_rel(pad.dp, ref.dp), 1e-13) << r << " " << m;
      EXPECT_LT(max_rel(g_pad, g_ref), 1e-13) << r << " " << m;
      EXPECT_GT(amax(g_ref), 0.0f);
      if (h_ref.defined())
        for (int k = 0; k < 3; ++k) EXPECT_EQ(h_pad.data<float>()[k], h_ref.data<float>()[k]);
    }
  }
}

// Linear biases (--add-bias-linear) through the FP8 experts: fc1's in its GEMM (the padded
// rows' copies dropped, their zero gradients adding nothing), fc2's times the probability after
// the GEMM (y = the bias-free output + p b2, db2 = p^T G from the unquantised G), in every recipe
// with and without the CUDA path's zero-row padding.
TEST(Fp8Experts, BiasesWithAndWithoutPadding) {
  const std::string b1 = "decoder.layers.0.mlp.experts.linear_fc1.bias",
                    b2 = "decoder.layers.0.mlp.experts.linear_fc2.bias";
  for (auto recipe :
       {Fp8Config::Recipe::Tensorwise, Fp8Config::Recipe::Delayed, Fp8Config::Recipe::Blockwise}) {
    const std::vector<int64_t> counts = {3, 5};
    Pass ref;
    Tensor g1_ref;
    for (int padded = 0; padded < 2; ++padded) {
      ExpertsFixture fx(recipe, 2, 1, 1, /*biases=*/true);
      for (int64_t e = 0; e < 2; ++e)  // zero-initialised: random values instead
        for (const std::string& n : {b1 + std::to_string(e), b2 + std::to_string(e)}) {
          Tensor t = fx.store.param(n);
          const Tensor r = randn(t.shape(), 60 + e, 0.5);
          std::memcpy(t.raw(), r.raw(), t.nbytes());
        }
      moe::GroupedExperts ge(fx.c, 0, &fx.store);
      if (padded) ge.set_fp8_row_multiple(16);
      const Inputs in = inputs(fx, counts, 61);
      const Pass r = run(fx, ge, in.x, in.p, counts, in.G);
      const Tensor g1 = fx.store.grad(b1 + "1").clone();
      EXPECT_GT(amax(g1), 0.0f);
      // db2 of expert 1: sum over its rows of p G (unquantised).
      const Tensor db2 = fx.store.grad(b2 + "1");
      for (int64_t h = 0; h < fx.H; ++h) {
        double want = 0;
        for (int64_t n = 3; n < 8; ++n)
          want += in.p.data<double>()[n] * in.G.data<double>()[n * fx.H + h];
        EXPECT_NEAR(db2.data<double>()[h], want, 1e-12 * std::max(1.0, std::abs(want)));
      }
      if (!padded) {
        ref = r, g1_ref = g1;
        continue;
      }
      const int rc = int(recipe);
      EXPECT_LT(max_rel(r.y, ref.y), 1e-13) << rc;
      EXPECT_LT(max_rel(r.dx, ref.dx), 1e-13) << rc;
      EXPECT_LT(max_rel(r.dp, ref.dp), 1e-13) << rc;
      EXPECT_LT(max_rel(g1, g1_ref), 1e-13) << rc;
    }
  }
}

// --first-last-layers-bf16: a MoE layer kept in the model's precision runs its experts
// unquantised (and registers no FP8 state for them).
TEST(Fp8Experts, LayersKeptInModelPrecisionLeaveExpertsUnquantised) {
  ExpertsFixture fx(Fp8Config::Recipe::Delayed, 2, 1, /*layers=*/2);
  fx.c.fp8.bf16_start = 1;  // layer 0 stays in f64
  std::vector<BufferInfo> bufs;
  moe::GroupedExperts::add_fp8_buffers(fx.c, 0, bufs);
  EXPECT_TRUE(bufs.empty());
  moe::GroupedExperts ge(fx.c, 0, &fx.store);
  const std::vector<int64_t> counts = {3, 2};
  const Inputs in = inputs(fx, counts, 61);
  const Pass r = run(fx, ge, in.x, in.p, counts, in.G);
  int64_t off = 0;
  for (int64_t e = 0; e < 2; ++e) {
    const int64_t n = counts[size_t(e)];
    const Tensor x = rows(in.x, off, n), p = rows(in.p, off, n);
    Tensor a = Tensor::empty({n, fx.I}, DType::F64);
    ops::gelu_forward(mm_t(x, fx.store.param(w1(e))), a, S());
    EXPECT_LT(max_rel(rows(r.y, off, n), mm_t(scale_rows(a, p), fx.store.param(w2(e)))), 1e-12);
    off += n;
  }
}

// --no-fp8-wgrad: the experts' weight gradients from the unquantised operands (dyᵀ x), their
// fprop and dgrad still in FP8.
TEST(Fp8Experts, NoFp8WgradKeepsWeightGradientsUnquantised) {
  ExpertsFixture fx(Fp8Config::Recipe::Tensorwise, 2);
  fx.c.fp8.wgrad = false;
  moe::GroupedExperts ge(fx.c, 0, &fx.store);
  const std::vector<int64_t> counts = {4, 3};
  const Inputs in = inputs(fx, counts, 71);
  const Pass r = run(fx, ge, in.x, in.p, counts, in.G);
  const int64_t n = 3, off = 4;
  const Tensor x = rows(in.x, off, n), p = rows(in.p, off, n), G = rows(in.G, off, n);
  const Tensor W1 = fx.store.param(w1(1)).clone(), W2 = fx.store.param(w2(1)).clone();
  const Tensor qx = q(x, scale_of(448, amax(x)), Fp8Format::E4M3);
  const Tensor qw1 = q(W1, scale_of(448, amax(W1)), Fp8Format::E4M3);
  Tensor h = mm_t(qx, qw1), a = Tensor::empty(h.shape(), DType::F64);
  ops::gelu_forward(h, a, S());
  const Tensor ap = scale_rows(a, p);  // fc2's unquantised input
  Tensor W2v = W2.clone();
  const Tensor want = fd5(W2v, [&] { return dot(G, mm_t(ap, W2v)); });
  EXPECT_LT(max_rel(fx.store.grad(w2(1)), want), 1e-8);
  // and the FP8 wgrad would differ (the test tells them apart)
  const Tensor qap = q(ap, scale_of(448, amax(ap)), Fp8Format::E4M3);
  const Tensor qg = q(G, scale_of(57344, amax(G)), Fp8Format::E5M2);
  EXPECT_GT(max_rel(fd5(W2v, [&] { return dot(qg, mm_t(qap, W2v)); }), want), 1e-4);
  // fprop still FP8
  const Tensor qw2 = q(W2, scale_of(448, amax(W2)), Fp8Format::E4M3);
  EXPECT_LT(max_rel(rows(r.y, off, n), mm_t(qap, qw2)), 1e-12);
}

}  // namespace fp8_moe_test
