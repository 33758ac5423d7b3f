// The dense MLP in FP8 with an activation that is neither GELU nor plain SwiGLU (squared
// ReLU; quick-GEGLU with an offset and a clamp), on the CPU emulation in f64, tensorwise
// scaling: fc1's and fc2's GEMMs read quantised operands, the activation between them runs
// in the model precision and fc2 quantises its output as its input (Transformer Engine's
// split). Forward and backward against a hand-written reference of those semantics, each
// scale from its tensor's own amax:
//   pre = Q(x) Q(W1)^T + b1,  a = act(pre),  y = Q(a) Q(W2)^T + b2
//   dact = Q(G) Q(W2),  dpre = act'(pre) dact,  dx = Q(dpre) Q(W1)
//   dW2 = Q(G)^T Q(a),  dW1 = Q(dpre)^T Q(x),  db2 = sum G,  db1 = sum dpre
// and the same module run without FP8 against the same reference with Q the identity, so
// that the FP8 result is shown to differ from the unquantised one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "fp8_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/mlp.h"
#include "ops/fp8_grid.h"

using namespace mcpp;
using namespace mcpp::model;
using ops::Fp8Format;

namespace fp8_mlp_test {

using fp8_test::amax;
using fp8_test::max_rel;
using fp8_test::q;
using fp8_test::randn;
using fp8_test::scale_of;

using fp8_test::mm_t;
using fp8_test::transpose;

Tensor add_rows(Tensor y, const Tensor& b) {  // y[t, :] += b
  const int64_t m = b.numel();
  for (int64_t i = 0; i < y.numel(); ++i) y.data<double>()[i] += b.data<double>()[i % m];
  return y;
}
Tensor col_sums(const Tensor& g) {
  const int64_t m = g.size(1);
  Tensor s = Tensor::empty({m}, DType::F64);
  for (int64_t j = 0; j < m; ++j) s.data<double>()[j] = 0;
  for (int64_t i = 0; i < g.numel(); ++i) s.data<double>()[i % m] += g.data<double>()[i];
  return s;
}
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  return d;
}

// The activations as written in ops/catalogue.inc, one element (or gate/up pair) at a time.
struct Act {
  bool gated = false;  // quick-GEGLU: pre [T, 2F] = [gate | up]
  double off = 0, C = 0;
  double sig(double g) const { return 1 / (1 + std::exp(-1.702 * g)); }
  // pre [T, W] -> a [T, F]
  Tensor forward(const Tensor& pre) const {
    const int64_t T = pre.size(0), F = gated ? pre.size(1) / 2 : pre.size(1);
    Tensor a = Tensor::empty({T, F}, DType::F64);
    const double* p = pre.data<double>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        double& o = a.data<double>()[t * F + f];
        if (!gated) {
          const double r = std::max(p[t * F + f], 0.0);
          o = r * r;
          continue;
        }
        const double g = std::min(p[t * 2 * F + f], C);
        const double u = std::clamp(p[t * 2 * F + F + f], -C, C);
        o = g * sig(g) * (u + off);
      }
    return a;
  }
  // dact [T, F], pre [T, W] -> dpre [T, W]
  Tensor backward(const Tensor& dact, const Tensor& pre) const {
    const int64_t T = pre.size(0), W = pre.size(1), F = dact.size(1);
    Tensor d = Tensor::empty({T, W}, DType::F64);
    const double *p = pre.data<double>(), *da = dact.data<double>();
    double* o = d.data<double>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        const double dy = da[t * F + f];
        if (!gated) {
          o[t * F + f] = dy * 2 * std::max(p[t * F + f], 0.0);
          continue;
        }
        const double gt = p[t * 2 * F + f], ut = p[t * 2 * F + F + f];
        const double g = std::min(gt, C), u = std::clamp(ut, -C, C), s = sig(g);
        o[t * 2 * F + f] = gt <= C ? dy * (u + off) * s * (1 + 1.702 * g * (1 - s)) : 0;
        o[t * 2 * F + F + f] = ut >= -C && ut <= C ? dy * g * s : 0;
      }
    return d;
  }
};

struct Grads {
  Tensor y, dx, dw1, db1, dw2, db2;
};

// The reference; fp8 false: every Q the identity.
Grads reference(const Act& act, bool fp8, const Tensor& x, const Tensor& W1, const Tensor& b1,
                const Tensor& W2, const Tensor& b2, const Tensor& G) {
  auto Q = [&](const Tensor& v, Fp8Format f) {
    const double mx = f == Fp8Format::E4M3 ? 448 : 57344;
    return fp8 ? q(v, scale_of(mx, amax(v)), f) : v.clone();
  };
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;  // hybrid: gradients E5M2
  const Tensor qx = Q(x, e4), qw1 = Q(W1, e4), qw2 = Q(W2, e4), qg = Q(G, e5);
  const Tensor pre = add_rows(mm_t(qx, qw1), b1);
  const Tensor qa = Q(act.forward(pre), e4);
  Grads r;
  r.y = add_rows(mm_t(qa, qw2), b2);
  const Tensor dact = mm_t(qg, transpose(qw2));
  const Tensor dpre = act.backward(dact, pre), qd = Q(dpre, e5);
  r.dx = mm_t(qd, transpose(qw1));
  r.dw2 = mm_t(transpose(qg), transpose(qa));
  r.dw1 = mm_t(transpose(qd), transpose(qx));
  r.db2 = col_sums(G), r.db1 = col_sums(dpre);
  return r;
}

const std::string kW1 = "decoder.layers.0.mlp.linear_fc1.weight",
                  kB1 = "decoder.layers.0.mlp.linear_fc1.bias",
                  kW2 = "decoder.layers.0.mlp.linear_fc2.weight",
                  kB2 = "decoder.layers.0.mlp.linear_fc2.bias";

struct MlpFixture {
  TransformerConfig c;      // FP8: hybrid, tensorwise
  TransformerConfig plain;  // the same without FP8
  ParamStore store;
  int64_t S = 3, B = 2, T = 6, H = 8, F = 12;

  explicit MlpFixture(const Act& a) {
    c.num_layers = 1, c.hidden_size = H, c.num_attention_heads = 2, c.kv_channels = 4;
    c.num_query_groups = 2, c.ffn_hidden_size = F, c.seq_length = S;
    c.max_position_embeddings = S, c.padded_vocab_size = 16, c.dtype = DType::F64;
    c.init_method_std = 0.5;
    c.squared_relu = !a.gated, c.quick_geglu = a.gated;
    if (a.gated) c.glu_linear_offset = a.off, c.activation_func_clamp_value = a.C;
    plain = c;
    c.fp8.format = Fp8Config::Format::Hybrid, c.fp8.recipe = Fp8Config::Recipe::Tensorwise;
    std::vector<ParamInfo> params;
    DenseMlp::add_params(c, 0, params);
    for (auto& p : params) store.add(p);
    add_fp8_buffers(c, {0}, store);
    store.allocate(DType::F64, 0, 1);
    store.initialize(17);
    for (const std::string* b : {&kB1, &kB2}) {  // biases of both signs (init: zeros)
      Tensor t = store.param(*b);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = 0.15 * double(i % 9) - 0.6;
    }
  }

  // One forward and backward of `mlp` (keeping its activation or not) under config k.
  Grads run(DenseMlp& mlp, const TransformerConfig& k, bool keep, const Tensor& x,
            const Tensor& G) {
    StepKeys keys;
    keys.training = true;
    const StepContext cx = make_step_context(k, S, B, keys, nullptr);
    auto saved = mlp.new_saved();
    allocate([&](const TensorVisitor& v) { mlp.saved_specs(cx, keep, *saved, v); }, Device::CPU,
             true);
    Workspace ws;
    allocate([&](const TensorVisitor& v) { mlp.scratch_specs(cx, !keep, ws, v); }, Device::CPU,
             false);
    Grads r;
    r.y = Tensor::empty({T, H}, DType::F64), r.dx = Tensor::empty({T, H}, DType::F64);
    store.zero_grads();
    mlp.forward(x, *saved, nullptr, r.y, ws, cx);
    mlp.backward(G, x, *saved, r.dx, ws, cx);
    r.dw1 = store.grad(kW1).clone(), r.db1 = store.grad(kB1).clone();
    r.dw2 = store.grad(kW2).clone(), r.db2 = store.grad(kB2).clone();
    return r;
  }
};

void expect_matches(const Grads& got, const Grads& want) {
  EXPECT_LT(max_abs_diff(got.y, want.y), 1e-12);
  EXPECT_LT(max_rel(got.dx, want.dx), 1e-9);
  EXPECT_LT(max_rel(got.dw1, want.dw1), 1e-9);
  EXPECT_LT(max_rel(got.db1, want.db1), 1e-9);
  EXPECT_LT(max_rel(got.dw2, want.dw2), 1e-9);
  EXPECT_LT(max_rel(got.db2, want.db2), 1e-9);
}

void check(const Act& act) {
  MlpFixture fx(act);
  DenseMlp mlp(fx.c, 0, &fx.store);
  const Tensor x = randn({fx.T, fx.H}, 3, 1.5), G = randn({fx.T, fx.H}, 4, 1e-2);
  const Tensor W1 = fx.store.param(kW1).clone(), b1 = fx.store.param(kB1).clone();
  const Tensor W2 = fx.store.param(kW2).clone(), b2 = fx.store.param(kB2).clone();
  const Grads want = reference(act, true, x, W1, b1, W2, b2, G);
  const Grads want_plain = reference(act, false, x, W1, b1, W2, b2, G);
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "activation kept" : "activation recomputed");
    expect_matches(fx.run(mlp, fx.c, keep, x, G), want);
    expect_matches(fx.run(mlp, fx.plain, keep, x, G), want_plain);
  }
  // The test can tell FP8 from the model precision: every output moves.
  EXPECT_GT(max_rel(want.y, want_plain.y), 1e-3);
  EXPECT_GT(max_rel(want.dx, want_plain.dx), 1e-3);
  EXPECT_GT(max_rel(want.dw1, want_plain.dw1), 1e-3);
  EXPECT_GT(max_rel(want.dw2, want_plain.dw2), 1e-3);
  // ... and the activation's branches are all taken: ReLU's two sides, the clamp's inside
  // and outside.
  const Tensor pre = add_rows(mm_t(x, W1), b1);
  int64_t in = 0, out = 0;
  for (int64_t i = 0; i < pre.numel(); ++i) {
    const double v = pre.data<double>()[i];
    (act.gated ? std::fabs(v) > act.C : v > 0) ? ++out : ++in;
  }
  EXPECT_GT(in, pre.numel() / 10);
  EXPECT_GT(out, pre.numel() / 10);
}

TEST(Fp8DenseMlp, SquaredReluTensorwiseAgainstTheReference) { check(Act{}); }

TEST(Fp8DenseMlp, QuickGegluWithOffsetAndClampTensorwiseAgainstTheReference) {
  check(Act{true, 1.0, 3.0});
}

}  // namespace fp8_mlp_test
