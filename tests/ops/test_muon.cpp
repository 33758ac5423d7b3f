// Muon (optim/muon.h; --optimizer muon): the Newton-Schulz iteration against the same
// iteration written out here in double, the bf16 GEMM emulation, the coefficient schedules
// and scale factors, the QKV split, and the optimizer around them (matrices by Muon, the
// rest bitwise as AdamW steps them).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "model/params.h"
#include "op_test_util.h"
#include "optim/muon.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace muon_test {

using Coeffs = std::vector<std::array<double, 3>>;

std::vector<double> values_of(const Tensor& t) {
  Tensor d = f64(t);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

Tensor f32_of(const std::vector<double>& v, const Shape& shape) {
  Tensor d = Tensor::from(v, shape);
  return as(d, DType::F32);
}

// NS in double: X / ||X||_F, then X <- a X + (b A + c A A) X with A = X X^T, on X^T when X
// has more rows than columns.
std::vector<double> ns_reference(std::vector<double> x, int64_t r, int64_t c, const Coeffs& co) {
  const bool tr = r > c;
  const int64_t n = tr ? c : r, m = tr ? r : c;
  std::vector<double> y(size_t(n * m));
  double sq = 0;
  for (double v : x) sq += v * v;
  const double norm = std::max(std::sqrt(sq), 1e-15);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      y[size_t(tr ? j * m + i : i * m + j)] = x[size_t(i * c + j)] / norm;
  for (const auto& [a, b, cc] : co) {
    std::vector<double> A(size_t(n * n), 0.0), P(size_t(n * n), 0.0), Y(size_t(n * m), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < m; ++k) A[size_t(i * n + j)] += y[size_t(i * m + k)] * y[size_t(j * m + k)];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < n; ++k) aa += A[size_t(i * n + k)] * A[size_t(k * n + j)];
        P[size_t(i * n + j)] = b * A[size_t(i * n + j)] + cc * aa;
      }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double s = a * y[size_t(i * m + j)];
        for (int64_t k = 0; k < n; ++k) s += P[size_t(i * n + k)] * y[size_t(k * m + j)];
        Y[size_t(i * m + j)] = s;
      }
    y = Y;
  }
  std::vector<double> out(size_t(r * c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out[size_t(i * c + j)] = y[size_t(tr ? j * m + i : i * m + j)];
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

optim::MuonConfig fp32_config(const std::string& coefficients = "quintic") {
  optim::MuonConfig c;
  c.coefficients = coefficients;
  c.bf16_matmul = false;
  return c;
}

// Two sets transcribed here from emerging_optimizers' muon_utils.py (independently of
// optim/muon.cpp's table), the others checked through the schedule test below.
const Coeffs kQuintic = {{4.0848, -6.8946, 2.9270},
                         {3.9505, -6.3029, 2.6377},
                         {3.7418, -5.5913, 2.3037},
                         {2.8769, -3.1427, 1.2046},
                         {2.8366, -3.0525, 1.2012}};
const Coeffs kCubic5 = {{3.3656576, -3.3420992, 0.0},
                        {2.5744352, -1.4957376, 0.0},
                        {2.5368962, -1.4312570, 0.0},
                        {2.4418906, -1.2764040, 0.0},
                        {2.2230472, -0.9630650, 0.0}};

TEST(Muon, NewtonSchulzFollowsTheIterationInFp64) {
  EXPECT_EQ(optim::muon_coefficients("quintic", 5), kQuintic);
  EXPECT_EQ(optim::muon_coefficients("cubic5", 5), kCubic5);
  EXPECT_EQ(optim::muon_coefficients("simple", 3), Coeffs(3, {3.4445, -4.7750, 2.0315}));
  for (const char* type : {"simple", "quintic", "polar_express", "cans", "aol", "deepseekv4",
                           "cubic5"}) {
    for (auto [r, c] : {std::pair<int64_t, int64_t>{6, 10}, {10, 6}, {8, 8}}) {
      SCOPED_TRACE(fmt::format("{} [{}, {}]", type, r, c));
      const int steps = std::string(type) == "deepseekv4" ? 10 : 5;
      optim::MuonConfig cfg = fp32_config(type);
      cfg.ns_steps = steps;
      const std::vector<double> x = values_of(randn({r, c}, 11 + uint64_t(r)));
      const Tensor got = optim::newton_schulz(f32_of(x, {r, c}), cfg, nullptr, -1, S());
      const std::vector<double> want = ns_reference(x, r, c, optim::muon_coefficients(type, steps));
      EXPECT_LT(max_abs_diff(values_of(got), want), 2e-4);
      // The iteration drives the singular values towards 1: far from the input's scale.
      double sq = 0;
      for (double v : want) sq += v * v;
      EXPECT_GT(sq, 0.3 * double(std::min(r, c)));
    }
  }
}

// --muon-fp32-matmul-prec medium: every GEMM's output is rounded to bf16 (on the CPU by
// rounding f32 outputs), so the result is bf16 values, near the fp64 iteration.
TEST(Muon, Bf16MatmulRoundsEveryProduct) {
  const int64_t r = 12, c = 20;
  const std::vector<double> x = values_of(randn({r, c}, 5));
  optim::MuonConfig cfg = fp32_config();
  const Tensor f32 = optim::newton_schulz(f32_of(x, {r, c}), cfg, nullptr, -1, S());
  cfg.bf16_matmul = true;
  const Tensor bf = optim::newton_schulz(f32_of(x, {r, c}), cfg, nullptr, -1, S());
  const std::vector<double> want = ns_reference(x, r, c, optim::muon_coefficients("quintic", 5));
  const std::vector<double> got = values_of(bf);
  int not_bf16 = 0;
  for (double v : got) {
    const Tensor one = f32_of({v}, {1});
    not_bf16 += values_of(as(as(one, DType::BF16), DType::F32))[0] != v;
  }
  EXPECT_EQ(not_bf16, 0);
  EXPECT_LT(max_abs_diff(got, want), 0.06);
  EXPECT_GT(max_abs_diff(got, values_of(f32)), 1e-4);  // not the fp32 path
}

TEST(Muon, CoefficientSchedulesAndScaleFactors) {
  const auto q = optim::muon_coefficients("quintic", 7);
  EXPECT_EQ(q[5], q[0]);  // cycles
  EXPECT_EQ(q[0][0], 4.0848);
  const auto pe = optim::muon_coefficients("polar_express", 10);
  EXPECT_EQ(pe[9], pe[7]);  // repeats the last
  EXPECT_EQ(pe[7][0], 1.8750);
  const auto ds = optim::muon_coefficients("deepseekv4", 12);
  EXPECT_EQ(ds[11][0], 2.0);
  EXPECT_EQ(ds[7][0], 3.4445);
  EXPECT_THROW(optim::muon_coefficients("custom", 5), Error);
  using optim::MuonScale;
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(MuonScale::Spectral, 3, 12), std::sqrt(12.0));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(MuonScale::UnitRmsNorm, 3, 12), 0.5);
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(MuonScale::ShapeScaling, 3, 12), 1.0);
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(MuonScale::ShapeScaling, 12, 3), 2.0);
}

// --muon-split-qkv: each query group's rows [query 4, key 2, value 2]; the query rows of
// both groups are one matrix, and so on.
TEST(Muon, QkvRowsAreOrthogonalisedApart) {
  model::ParamInfo p;
  p.name = "decoder.layers.0.self_attention.linear_qkv.weight";
  p.global_shape = p.local_shape = {16, 6};
  p.split = model::TpSplit::Rows;
  optim::MuonConfig cfg = fp32_config();
  cfg.qkv_split = {4, 2, 2};
  const std::vector<double> u = values_of(randn({16, 6}, 7));
  const std::vector<double> got = values_of(optim::muon_update(p, f32_of(u, {16, 6}), cfg, {}, S()));
  const Coeffs co = optim::muon_coefficients("quintic", 5);
  int64_t offset = 0;
  for (int64_t len : cfg.qkv_split) {
    std::vector<int64_t> rows;
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t j = 0; j < len; ++j) rows.push_back(g * 8 + offset + j);
    std::vector<double> part;
    for (int64_t r : rows) part.insert(part.end(), u.begin() + r * 6, u.begin() + r * 6 + 6);
    const int64_t n = int64_t(rows.size());
    std::vector<double> want = ns_reference(part, n, 6, co);
    const double s = std::sqrt(double(std::max<int64_t>(n, 6)));  // spectral, of the part
    for (size_t k = 0; k < rows.size(); ++k)
      for (int64_t j = 0; j < 6; ++j)
        EXPECT_NEAR(got[size_t(rows[k] * 6 + j)], s * want[k * 6 + size_t(j)], 2e-4)
            << "row " << rows[k];
    offset += len;
  }
  // Without the split (another layer's name) the whole matrix is one: different values.
  p.name = "decoder.layers.0.mlp.linear_fc1.weight";
  const std::vector<double> whole = values_of(optim::muon_update(p, f32_of(u, {16, 6}), cfg, {}, S()));
  EXPECT_GT(max_abs_diff(whole, got), 1e-2);
}

// The optimizer: the matrix steps by Muon (decoupled decay, momentum, Nesterov, clipping,
// the spectral scale) as written out here; the bias and the embedding bitwise as AdamW
// alone steps them.
TEST(Muon, OptimizerStepsMatricesByMuonTheRestAsAdamW) {
  auto make = [] {
    model::ParamStore ps;
    auto add = [&](const char* name, Shape shape, bool decay, bool emb) {
      model::ParamInfo info;
      info.name = name;
      info.global_shape = info.local_shape = shape;
      info.init_std = 0.5;
      info.weight_decay = decay;
      info.embedding_or_output = emb;
      ps.add(info);
    };
    add("decoder.layers.0.mlp.linear_fc1.weight", {6, 4}, true, false);
    add("decoder.layers.0.mlp.linear_fc1.bias", {6}, false, false);
    add("embedding.word_embeddings.weight", {10, 4}, true, true);
    ps.allocate(DType::F32, DType::F32, Device::CPU, 0, 1);
    ps.initialize(3);
    return ps;
  };
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "plain momentum");
    model::ParamStore ps = make(), ref_ps = make();
    optim::OptimizerConfig oc;
    optim::AdamW opt(ps, oc), adam(ref_ps, oc);
    optim::MuonConfig mc = fp32_config();
    mc.momentum = 0.8, mc.nesterov = nesterov, mc.extra_scale = 0.5;
    opt.enable_muon(mc, {});
    EXPECT_EQ(opt.state_name(), "muon");
    const int64_t n = ps.total_numel(), wn = 24;
    const double lr = 0.02, wd = 0.1, gs = 1.0 / (4.0 + 1e-6);
    for (int step = 1; step <= 3; ++step) {
      // The reference step from the optimizer's own state before it (no drift over steps).
      std::vector<double> w = values_of(ps.flat_params().narrow(0, wn));
      std::vector<double> m = values_of(opt.exp_avg().narrow(0, wn));
      const std::vector<double> w0 = w;
      const Tensor g = randn({n}, 40 + uint64_t(step), 1.0, DType::F32);
      for (auto* s : {&ps, &ref_ps}) ops::cpu::copy(g, s->flat_grads(), S());
      opt.clip(1.0, 4.0), adam.clip(1.0, 4.0);
      opt.step(lr, wd), adam.step(lr, wd);
      const std::vector<double> gv = values_of(g);
      std::vector<double> u(static_cast<size_t>(wn), 0.0);
      for (int64_t i = 0; i < wn; ++i) {
        const double gi = gv[size_t(i)] * gs;
        w[size_t(i)] -= lr * wd * w[size_t(i)];
        m[size_t(i)] = 0.8 * m[size_t(i)] + 0.2 * gi;
        u[size_t(i)] = nesterov ? 0.2 * gi + 0.8 * m[size_t(i)] : m[size_t(i)];
      }
      const std::vector<double> o = ns_reference(u, 6, 4, kQuintic);
      for (int64_t i = 0; i < wn; ++i) w[size_t(i)] -= lr * std::sqrt(6.0) * 0.5 * o[size_t(i)];
      // The update (about 0.02 an element) to 1e-4 of its size.
      const std::vector<double> got = values_of(ps.flat_params().narrow(0, wn));
      double worst = 0, size = 0;
      for (int64_t i = 0; i < wn; ++i) {
        worst = std::max(worst, std::abs((got[size_t(i)] - w0[size_t(i)]) - (w[size_t(i)] - w0[size_t(i)])));
        size = std::max(size, std::abs(w[size_t(i)] - w0[size_t(i)]));
      }
      EXPECT_GT(size, 1e-2);
      EXPECT_LT(worst, 1e-4 * size) << "step " << step;
      EXPECT_LT(max_abs_diff(values_of(opt.exp_avg().narrow(0, wn)), m), 1e-6);
      EXPECT_TRUE(same_bits(ps.flat_params().narrow(wn, n - wn),
                            ref_ps.flat_params().narrow(wn, n - wn)));
    }
  }
}

// --optimizer adaptive_muon: Muon's scaled update, then the second moment per element (kept
// where Adam's exp_avg_sq would be) and the scale again -- of the local shape, as Megatron's
// TensorParallelAdaptiveMuon applies it to a TP shard.
TEST(Muon, AdaptiveMuonNormalisesByASecondMoment) {
  model::ParamStore ps;
  model::ParamInfo info;
  info.name = "decoder.layers.0.mlp.linear_fc1.weight";
  info.global_shape = info.local_shape = {6, 4};
  info.init_std = 0.5;
  info.weight_decay = true;
  ps.add(info);
  ps.allocate(DType::F32, DType::F32, Device::CPU, 0, 1);
  ps.initialize(3);
  optim::OptimizerConfig oc;
  oc.rule = optim::UpdateRule::Lion;  // no second moment of its own: adaptive Muon adds one
  optim::AdamW opt(ps, oc);
  ASSERT_FALSE(opt.exp_avg_sq().defined());
  optim::MuonConfig mc = fp32_config();
  mc.momentum = 0.8, mc.extra_scale = 0.5, mc.adaptive = true;
  opt.enable_muon(mc, {});
  EXPECT_EQ(opt.state_name(), "adaptive_muon_lion");
  ASSERT_TRUE(opt.exp_avg_sq().defined());
  const int64_t n = 24;
  const double lr = 0.02, wd = 0.1, s = std::sqrt(6.0) * 0.5;  // spectral [6, 4], extra
  std::vector<double> v(size_t(n), 0.0);
  for (int step = 1; step <= 3; ++step) {
    std::vector<double> w = values_of(ps.flat_params().narrow(0, n));
    std::vector<double> m = values_of(opt.exp_avg().narrow(0, n));
    const std::vector<double> w0 = w;
    const Tensor g = randn({n}, 50 + uint64_t(step), 1.0, DType::F32);
    Tensor gd = ps.flat_grads().narrow(0, n);
    ops::cpu::copy(g, gd, S());
    opt.step(lr, wd);
    const std::vector<double> gv = values_of(g);
    for (int64_t i = 0; i < n; ++i) {
      w[size_t(i)] -= lr * wd * w[size_t(i)];
      m[size_t(i)] = 0.8 * m[size_t(i)] + 0.2 * gv[size_t(i)];
    }
    const std::vector<double> o = ns_reference(m, 6, 4, kQuintic);
    for (int64_t i = 0; i < n; ++i) {
      const double u = s * o[size_t(i)];  // Muon's update, scaled once
      v[size_t(i)] += 0.05 * (u * u - v[size_t(i)]);
      w[size_t(i)] -= lr * s * u / (std::sqrt(v[size_t(i)]) + 1e-8);  // and scaled again
    }
    const std::vector<double> got = values_of(ps.flat_params().narrow(0, n));
    double worst = 0, size = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs((got[size_t(i)] - w0[size_t(i)]) -
                                       (w[size_t(i)] - w0[size_t(i)])));
      size = std::max(size, std::abs(w[size_t(i)] - w0[size_t(i)]));
    }
    EXPECT_GT(size, 1e-2);
    EXPECT_LT(worst, 1e-4 * size) << "step " << step;
    EXPECT_LT(max_abs_diff(values_of(opt.exp_avg_sq().narrow(0, n)), v),
              1e-4 * *std::max_element(v.begin(), v.end()));
  }
  // The second scale reads the local shape: a column-parallel shard [3, 4] of [6, 4] gets
  // sqrt(max(3, 4)) = 2, where the serial matrix gets sqrt(6).
  model::ParamInfo shard = info;
  shard.local_shape = {3, 4};
  EXPECT_DOUBLE_EQ(optim::muon_adaptive_scale(shard, mc), 2.0 * 0.5);
  EXPECT_DOUBLE_EQ(optim::muon_adaptive_scale(info, mc), std::sqrt(6.0) * 0.5);
}

// Several parameters at once (the optimizer's path): matrices of one shape share batched
// GEMMs, and every update is bitwise the one-parameter call's, for both orientations, the
// QKV split, bf16 emulation and Nesterov-free fp32 alike.
TEST(Muon, BatchedUpdatesAreBitwiseTheOneAtATimeOnes) {
  struct P {
    const char* name;
    Shape shape;
  };
  const std::vector<P> list = {
      {"decoder.layers.0.self_attention.linear_qkv.weight", {16, 6}},
      {"decoder.layers.0.mlp.linear_fc1.weight", {12, 6}},
      {"decoder.layers.0.mlp.linear_fc2.weight", {6, 12}},
      {"decoder.layers.1.self_attention.linear_qkv.weight", {16, 6}},
      {"decoder.layers.1.mlp.linear_fc1.weight", {12, 6}},
      {"decoder.layers.1.self_attention.linear_proj.weight", {8, 6}},
      {"decoder.layers.1.mlp.linear_fc2.weight", {6, 12}},
  };
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 emulated" : "fp32");
    optim::MuonConfig cfg = fp32_config();
    cfg.bf16_matmul = bf16;
    cfg.qkv_split = {4, 2, 2};  // the QKV parts are [8, 6], [4, 6], [4, 6]: proj joins q's
    std::vector<model::ParamInfo> infos(list.size());
    std::vector<const model::ParamInfo*> ps;
    std::vector<Tensor> us;
    for (size_t k = 0; k < list.size(); ++k) {
      infos[k].name = list[k].name;
      infos[k].global_shape = infos[k].local_shape = list[k].shape;
      ps.push_back(&infos[k]);
      us.push_back(as(randn(list[k].shape, 40 + k), DType::F32));
    }
    const std::vector<Tensor> batched = optim::muon_updates(ps, us, cfg, {}, S());
    ASSERT_EQ(batched.size(), list.size());
    for (size_t k = 0; k < list.size(); ++k) {
      const Tensor one = optim::muon_update(infos[k], us[k], cfg, {}, S());
      ASSERT_EQ(batched[k].shape(), one.shape()) << list[k].name;
      EXPECT_EQ(std::memcmp(batched[k].raw(), one.raw(), one.nbytes()), 0) << list[k].name;
    }
    // A 3-D batch through newton_schulz: each matrix as its own call.
    Tensor x = as(randn({3, 5, 7}, 9), DType::F32);
    const Tensor all = optim::newton_schulz(x, cfg, nullptr, -1, S());
    for (int64_t i = 0; i < 3; ++i) {
      const Tensor one =
          optim::newton_schulz(x.narrow(i, 1).view({5, 7}), cfg, nullptr, -1, S());
      EXPECT_EQ(std::memcmp(all.narrow(i, 1).raw(), one.raw(), one.nbytes()), 0) << i;
    }
  }
}

// The distributed optimizer's owners: the largest Newton-Schulz cost first, each to the
// least loaded rank, ties to the lower rank; a pure function of the shapes (every rank
// computes the same), and one rank owns everything.
TEST(Muon, OwnersBalanceTheNewtonSchulzCost) {
  const std::vector<Shape> shapes = {{8, 8}, {32, 8}, {8, 8}, {16, 16}, {4, 4}, {32, 8}};
  // costs r c min(r, c): 512, 2048, 512, 4096, 64, 2048
  std::vector<model::ParamInfo> infos(shapes.size());
  std::vector<const model::ParamInfo*> ps;
  for (size_t k = 0; k < shapes.size(); ++k) {
    infos[k].local_shape = infos[k].global_shape = shapes[k];
    ps.push_back(&infos[k]);
  }
  // #3 -> 0 (loads 4096, 0); #1 -> 1 (4096, 2048); #5 -> 1 (4096, 4096); #0 -> 0, the
  // tie to the lower rank (4608, 4096); #2 -> 1 (4608, 4608); #4 -> 0, a tie again
  EXPECT_EQ(optim::muon_owners(ps, 2), (std::vector<int>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(optim::muon_owners(ps, 1), std::vector<int>(shapes.size(), 0));
  // More ranks than matrices: each matrix its own rank, the largest first.
  const std::vector<int> eight = optim::muon_owners(ps, 8);
  EXPECT_EQ(eight, (std::vector<int>{3, 1, 4, 0, 5, 2}));
  EXPECT_EQ(optim::muon_owners({}, 4), std::vector<int>{});
}

}  // namespace muon_test
