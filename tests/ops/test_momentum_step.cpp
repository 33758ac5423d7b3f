// SGD with momentum and Lion (ops/momentum_step.h; --optimizer sgd / lion): the op against
// the published update rules written out here in double (torch.optim.SGD's algorithm with
// dampening 0; Lion's from Chen et al. 2023 with decoupled weight decay), the split fp32
// main parameters against whole ones, and the optimizer around them (parameter groups,
// clipping, the buffer's first step, a loaded buffer, its one state buffer).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/params.h"
#include "op_test_util.h"
#include "ops/momentum_step.h"
#include "ops/split_main.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace momentum_step_test {

Stream& CS() { return Stream::cpu(); }
using Rule = ops::MomentumStepParams::Rule;

std::vector<double> rand_vec(int64_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(size_t(n), 0.0);
  for (double& x : v) x = dist(gen);
  return v;
}

Tensor f64_of(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F64);
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(double));
  return t;
}

// The message of the mcpp::Error f throws ("" when none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// torch.optim.SGD, one step (weight decay into the gradient; the buffer starts as the
// gradient; p -= lr buf).
void sgd_reference(std::vector<double>& p, std::vector<double>& buf, const std::vector<double>& g,
                   double lr, double wd, double momentum, double gs, bool first) {
  for (size_t i = 0; i < p.size(); ++i) {
    double d = g[i] * gs;
    if (wd != 0) d += wd * p[i];
    if (momentum != 0) {
      buf[i] = first ? d : momentum * buf[i] + d;
      d = buf[i];
    }
    p[i] -= lr * d;
  }
}

// Lion: decay, the sign of the interpolation, then the moving average.
void lion_reference(std::vector<double>& p, std::vector<double>& m, const std::vector<double>& g,
                    double lr, double wd, double b1, double b2, double gs) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * gs;
    p[i] *= 1 - lr * wd;
    const double c = b1 * m[i] + (1 - b1) * gi;
    p[i] -= lr * double((c > 0) - (c < 0));
    m[i] = b2 * m[i] + (1 - b2) * gi;
  }
}

void expect_close(const Tensor& t, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(t.numel(), int64_t(want.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double got = t.data<double>()[i];
    ASSERT_NEAR(got, want[size_t(i)], 1e-13 * (1 + std::fabs(want[size_t(i)]))) << what << " " << i;
  }
}


TEST(MomentumStep, SgdFollowsTorchSgd) {
  const int64_t n = 1031;
  for (auto [momentum, wd, gs] : {std::tuple(0.9, 0.05, 1.0), std::tuple(0.5, 0.0, 0.25),
                                  std::tuple(0.0, 0.1, 0.5)}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << momentum << " wd " << wd);
    std::vector<double> p = rand_vec(n, 1), buf(size_t(n), 0.0);
    Tensor P = f64_of(p), M = Tensor::zeros({n}, DType::F64), none;
    for (int step = 1; step <= 4; ++step) {
      const std::vector<double> g = rand_vec(n, 10 + step);
      sgd_reference(p, buf, g, 0.1, wd, momentum, gs, step == 1);
      ops::MomentumStepParams mp;
      mp.rule = Rule::Sgd, mp.lr = 0.1, mp.weight_decay = wd, mp.momentum = momentum;
      mp.grad_scale = gs, mp.first = step == 1;
      Tensor& m = momentum == 0 ? none : M;  // plain SGD keeps no state
      ops::momentum_step(P, f64_of(g), m, none, mp, CS());
      expect_close(P, p, "param");
      if (momentum != 0) expect_close(M, buf, "momentum buffer");
    }
  }
}

TEST(MomentumStep, LionFollowsThePaper) {
  const int64_t n = 777;
  std::vector<double> p = rand_vec(n, 2), m(size_t(n), 0.0);
  Tensor P = f64_of(p), M = Tensor::zeros({n}, DType::F64), none;
  for (int step = 1; step <= 4; ++step) {
    std::vector<double> g = rand_vec(n, 20 + step);
    for (int64_t i = 0; i < n; i += 7) g[size_t(i)] = 0;  // sign(0) = 0 at the first step
    lion_reference(p, m, g, 3e-3, 0.1, 0.9, 0.99, 0.5);
    ops::MomentumStepParams mp;
    mp.rule = Rule::Lion, mp.lr = 3e-3, mp.weight_decay = 0.1, mp.beta1 = 0.9, mp.beta2 = 0.99;
    mp.grad_scale = 0.5;
    ops::momentum_step(P, f64_of(g), M, none, mp, CS());
    expect_close(P, p, "param");
    expect_close(M, m, "exp_avg");
  }
  // At the first step an element with zero gradient only decays.
  std::vector<double> p0 = rand_vec(n, 2);
  Tensor Q = f64_of(p0), Z = Tensor::zeros({n}, DType::F64);
  ops::MomentumStepParams mp;
  mp.rule = Rule::Lion, mp.lr = 1e-2, mp.weight_decay = 0.5;
  ops::momentum_step(Q, Tensor::zeros({n}, DType::F64), Z, none, mp, CS());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(Q.data<double>()[i], p0[size_t(i)] * (1 - 1e-2 * 0.5)) << i;
}

// bf16 models: the split main parameters give the whole fp32 ones' bits, for both rules.
TEST(MomentumStep, SplitMainParamsMatchWholeFp32) {
  const int64_t n = 4099;
  for (Rule rule : {Rule::Sgd, Rule::Lion}) {
    Tensor w = Tensor::empty({n}, DType::F32), mw = Tensor::zeros({n}, DType::F32);
    Tensor ms = Tensor::zeros({n}, DType::F32), out = Tensor::empty({n}, DType::BF16);
    const std::vector<double> w0 = rand_vec(n, 3);
    for (int64_t i = 0; i < n; ++i) w.data<float>()[i] = float(w0[size_t(i)]);
    Tensor model = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16);
    ops::split_main_params(w, model, lo, CS());
    for (int step = 1; step <= 3; ++step) {
      const std::vector<double> gd = rand_vec(n, 30 + step, 1e-2);
      Tensor g = Tensor::empty({n}, DType::F32);
      for (int64_t i = 0; i < n; ++i) g.data<float>()[i] = float(gd[size_t(i)]);
      ops::MomentumStepParams mp;
      mp.rule = rule, mp.lr = 1e-2, mp.weight_decay = 0.1, mp.grad_scale = 0.75;
      mp.first = step == 1;
      ops::momentum_step(w, g, mw, out, mp, CS());
      ops::momentum_step_split(model, lo, g, ms, mp, CS());
    }
    Tensor joined = Tensor::empty({n}, DType::F32);
    ops::join_main_params(model, lo, joined, CS());
    EXPECT_TRUE(same_bits(joined, w)) << optim::rule_name(rule == Rule::Lion
                                                               ? optim::UpdateRule::Lion
                                                               : optim::UpdateRule::Sgd);
    EXPECT_TRUE(same_bits(ms, mw));
  }
}

TEST(MomentumStep, BadArgumentsNameTheOp) {
  Tensor p = Tensor::zeros({8}, DType::F32), g = Tensor::zeros({8}, DType::F32), none;
  ops::MomentumStepParams mp;
  mp.rule = Rule::Lion;
  auto has = [](const std::string& err, const char* what) {
    return err.find(what) != std::string::npos && err.find("momentum_step") != std::string::npos;
  };
  EXPECT_PRED2(has, error_of([&] { ops::momentum_step(p, g, none, none, mp, CS()); }),
               "state buffer m");
  mp.rule = Rule::Sgd, mp.momentum = -1;
  Tensor m = Tensor::zeros({8}, DType::F32);
  EXPECT_PRED2(has, error_of([&] { ops::momentum_step(p, g, m, none, mp, CS()); }),
               "momentum -1");
  mp.momentum = 0.9;
  Tensor short_m = Tensor::zeros({7}, DType::F32);
  EXPECT_PRED2(has, error_of([&] { ops::momentum_step(p, g, short_m, none, mp, CS()); }), "m");
}

// adamuon_normalize (--optimizer adaptive_muon) against the formula in double over three
// steps, the second moment carried: v = v + (1 - b2)(u^2 - v), u / (sqrt(v) + eps) * scale.
TEST(MomentumStep, AdamuonNormalizeFollowsTheFormula) {
  const int64_t n = 1000;
  Tensor v = Tensor::zeros({n}, DType::F32);
  std::vector<double> vr(size_t(n), 0.0);
  for (int step = 1; step <= 3; ++step) {
    Tensor u = randn({n}, 70 + uint64_t(step), 0.3, DType::F32);
    const float* U0 = u.data<float>();
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double ui = U0[i];
      vr[size_t(i)] += 0.05 * (ui * ui - vr[size_t(i)]);
      want[size_t(i)] = ui / (std::sqrt(vr[size_t(i)]) + 1e-8) * 1.7;
    }
    ops::adamuon_normalize(u, v, 0.95, 1e-8, 1.7, CS());
    const float* U = u.data<float>();
    const float* V = v.data<float>();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::abs(U[i] - want[size_t(i)]) / std::abs(want[size_t(i)]));
      worst = std::max(worst, std::abs(V[i] - vr[size_t(i)]) / vr[size_t(i)]);
    }
    EXPECT_LT(worst, 1e-5) << "step " << step;
  }
  // The first step of a zero moment: |u| / sqrt(0.05 u^2) = sqrt(20), whatever u.
  Tensor u = Tensor::from(std::vector<float>{0.25f, -3.0f}, {2});
  Tensor z = Tensor::zeros({2}, DType::F32);
  ops::adamuon_normalize(u, z, 0.95, 0.0, 1.0, CS());
  EXPECT_NEAR(u.data<float>()[0], std::sqrt(20.0), 1e-5);
  EXPECT_NEAR(u.data<float>()[1], -std::sqrt(20.0), 1e-5);
  Tensor bad = Tensor::zeros({3}, DType::F32);
  EXPECT_NE(error_of([&] { ops::adamuon_normalize(u, bad, 0.95, 1e-8, 1.0, CS()); })
                .find("adamuon_normalize"),
            std::string::npos);
}

// The optimizer: Megatron's parameter groups (no decay on "b"), clipping folded into the
// pass, the SGD buffer's first step, one state buffer, and a loaded buffer continued.
TEST(MomentumStep, OptimizerGroupsClippingAndLoadedState) {
  auto make = [] { return two_group_params(DType::F64, 301, 37, 99); };
  for (optim::UpdateRule rule : {optim::UpdateRule::Sgd, optim::UpdateRule::Lion}) {
    SCOPED_TRACE(optim::rule_name(rule));
    model::ParamStore ps = make();
    optim::OptimizerConfig oc;
    oc.rule = rule, oc.sgd_momentum = 0.8, oc.lion_beta1 = 0.9, oc.lion_beta2 = 0.95;
    optim::AdamW opt(ps, oc);
    EXPECT_FALSE(opt.exp_avg_sq().defined());
    EXPECT_EQ(opt.state_bytes(), int64_t(opt.exp_avg().nbytes()));
    const int64_t n = ps.total_numel();
    auto values = [&] {
      std::vector<double> v(static_cast<size_t>(n), 0.0);
      std::memcpy(v.data(), ps.flat_params().raw(), size_t(n) * sizeof(double));
      return v;
    };
    // The reference per group: "w" from its offset with decay, "b" without.
    std::vector<double> p = values(), m(size_t(n), 0.0);
    const double lr = 0.05, wd = 0.1;
    auto reference = [&](const std::vector<double>& g, double gs, bool first) {
      for (const auto& info : ps.infos()) {
        const auto o = size_t(info.offset), len = size_t(info.numel());
        std::vector<double> pp(p.begin() + long(o), p.begin() + long(o + len));
        std::vector<double> mm(m.begin() + long(o), m.begin() + long(o + len));
        std::vector<double> gg(g.begin() + long(o), g.begin() + long(o + len));
        const double d = info.weight_decay ? wd : 0.0;
        if (rule == optim::UpdateRule::Sgd)
          sgd_reference(pp, mm, gg, lr, d, 0.8, gs, first);
        else
          lion_reference(pp, mm, gg, lr, d, 0.9, 0.95, gs);
        std::copy(pp.begin(), pp.end(), p.begin() + long(o));
        std::copy(mm.begin(), mm.end(), m.begin() + long(o));
      }
    };
    for (int step = 1; step <= 3; ++step) {
      const std::vector<double> g = rand_vec(n, 50 + step);
      std::memcpy(ps.flat_grads().raw(), g.data(), size_t(n) * sizeof(double));
      opt.clip(1.0, 4.0);  // factor 1 / (4 + 1e-6)
      opt.step(lr, wd);
      reference(g, 1.0 / (4.0 + 1e-6), step == 1);
      expect_close(ps.flat_params(), p, "params");
      expect_close(opt.exp_avg(), m, "state");
    }
    // A checkpoint's buffer loaded into a fresh optimizer continues it (SGD: not reset to
    // the gradient at the next step).
    model::ParamStore ps2 = make();
    optim::AdamW opt2(ps2, oc);
    opt2.load_state(f64_of(values()), &opt.exp_avg(), nullptr);
    const std::vector<double> g = rand_vec(n, 60);
    for (auto* s : {&ps, &ps2}) std::memcpy(s->flat_grads().raw(), g.data(), size_t(n) * 8);
    opt.step(lr, wd), opt2.step(lr, wd);
    EXPECT_TRUE(same_bits(ps.flat_params(), ps2.flat_params()));
    EXPECT_TRUE(same_bits(opt.exp_avg(), opt2.exp_avg()));
  }
}

}  // namespace momentum_step_test
