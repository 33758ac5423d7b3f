// Multi-Latent Attention's tensor ops (ops/mla.h), CPU backend: the forward against a naive
// per-element reference written here from the definition (its own de-interleave, rotation
// and YaRN frequencies), YaRN's inverse frequencies against values worked out by hand, the
// backward as the exact adjoint of the forward, the value-width narrowing and its adjoint, and
// the argument checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "op_test_util.h"
#include "ops/mla.h"

using namespace mcpp;
using namespace mcpp::test;
using ops::MlaDims;
using ops::MlaRope;

namespace mla_ops_test {

struct MlaCase {
  MlaDims d;
  MlaRope r;
  int64_t S = 0, B = 0, pos0 = 0;
  bool positions = false;  // a positions tensor instead of pos0 + s
  int64_t R() const { return S * B; }
};

MlaRope yarn_rope() {
  MlaRope r;
  r.yarn = true;
  r.factor = 40;
  r.mscale = 1.3;
  r.original_max_positions = 64;
  r.base = 10000;
  return r;
}

// heads=3, Dn=4, Dr=8, Dv=6: Dv != Dq = 12, so the value block has 6 padded entries.
std::vector<MlaCase> cases() {
  const MlaDims small{3, 4, 8, 6};
  std::vector<MlaCase> c;
  c.push_back({small, MlaRope{}, 5, 2, 7, false});                // plain rope, pos0
  c.push_back({small, yarn_rope(), 5, 2, 3, false});              // YaRN, pos0
  c.push_back({small, yarn_rope(), 4, 2, 0, true});               // YaRN, positions tensor
  c.push_back({MlaDims{2, 6, 4, 10}, MlaRope{}, 3, 1, 0, true});  // Dv == Dq: no padding
  return c;
}

// Arbitrary (unsorted, repeated, large) positions for rows r < R.
Tensor positions_for(const MlaCase& c) {
  if (!c.positions) return Tensor();
  std::vector<int64_t> p(size_t(c.R()));
  for (size_t r = 0; r < p.size(); ++r) p[r] = int64_t((r * 37 + 11) % 23) * 9;
  return Tensor::from(p, {c.R()});
}

// The reference's own YaRN, written from Megatron's YarnRotaryEmbedding.
double ref_inv_freq(const MlaRope& r, int64_t i, int64_t Dr) {
  const double extra = std::pow(r.base, -2.0 * double(i) / double(Dr));
  if (!r.yarn) return extra;
  auto corr = [&](double rot) {
    return double(Dr) * std::log(double(r.original_max_positions) / (rot * 2 * std::numbers::pi)) /
           (2 * std::log(r.base));
  };
  const double low = std::max(std::floor(corr(r.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(r.beta_slow)), double(Dr - 1));
  if (low == high) high += 0.001;
  const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
  return (extra / r.factor) * ramp + extra * (1 - ramp);
}

// The forward from its definition, in f64 on f64 copies of the inputs: [R, heads, 3, Dq].
std::vector<double> ref_forward(const MlaCase& c, const Tensor& q_, const Tensor& kv_,
                                const Tensor& kpe_, const Tensor& positions) {
  const MlaDims& d = c.d;
  const int64_t H = d.heads, Dn = d.Dn, Dr = d.Dr, Dv = d.Dv, Dq = Dn + Dr, half = Dr / 2;
  Tensor qt = f64(q_), kvt = f64(kv_), kpet = f64(kpe_);
  const double *q = qt.data<double>(), *kv = kvt.data<double>(), *kpe = kpet.data<double>();
  std::vector<double> out(size_t(c.R() * H * 3 * Dq), -1.0);
  auto deint = [&](const double* x) {
    std::vector<double> y(static_cast<size_t>(Dr));
    for (int64_t j = 0; j < Dr; ++j) y[size_t(j)] = j < half ? x[2 * j] : x[2 * (j - half) + 1];
    return y;
  };
  for (int64_t row = 0; row < c.R(); ++row) {
    const double p =
        double(positions.defined() ? positions.data<int64_t>()[row] : c.pos0 + row / c.B);
    auto rope = [&](const std::vector<double>& y) {
      std::vector<double> o(static_cast<size_t>(Dr));
      for (int64_t i = 0; i < half; ++i) {
        const double a = p * ref_inv_freq(c.r, i, Dr), co = std::cos(a), si = std::sin(a);
        o[size_t(i)] = (y[size_t(i)] * co - y[size_t(i + half)] * si) * c.r.mscale;
        o[size_t(i + half)] = (y[size_t(i + half)] * co + y[size_t(i)] * si) * c.r.mscale;
      }
      return o;
    };
    const std::vector<double> kr = rope(deint(kpe + row * Dr));
    for (int64_t h = 0; h < H; ++h) {
      const double* qh = q + (row * H + h) * Dq;
      const double* kvh = kv + (row * H + h) * (Dn + Dv);
      double* o = out.data() + (row * H + h) * 3 * Dq;
      const std::vector<double> qr = rope(deint(qh + Dn));
      for (int64_t j = 0; j < Dq; ++j) {
        o[j] = j < Dr ? qr[size_t(j)] : qh[j - Dr];
        o[Dq + j] = j < Dr ? kr[size_t(j)] : kvh[j - Dr];
        o[2 * Dq + j] = j < Dv ? kvh[Dn + j] : 0.0;
      }
    }
  }
  return out;
}

Tensor nan_tensor(const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  cpu::fill(t, std::numeric_limits<double>::quiet_NaN(), S());
  return t;
}

struct Inputs {
  Tensor q, kv, kpe;
};
Inputs random_inputs(const MlaCase& c, uint64_t seed, DType dt) {
  const MlaDims& d = c.d;
  return {randn({c.R(), d.heads * d.Dq()}, seed, 1.0, dt),
          randn({c.R(), d.heads * (d.Dn + d.Dv)}, seed + 1, 1.0, dt),
          randn({c.R(), d.Dr}, seed + 2, 1.0, dt)};
}


TEST(MlaOps, ForwardMatchesNaiveReference) {
  for (DType dt : {DType::F64, DType::F32}) {
    int n = 0;
    for (const MlaCase& c : cases()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " case " << n++);
      const Inputs in = random_inputs(c, 100 + uint64_t(n), dt);
      const Tensor pos = positions_for(c);
      Tensor qkv = nan_tensor({c.R(), c.d.heads * 3 * c.d.Dq()}, dt);
      // The dispatching entry point on the CPU stream reaches the CPU backend.
      ops::mla_qkv_forward(in.q, in.kv, in.kpe, c.d, c.r, c.B, c.pos0, pos, qkv, S());
      const std::vector<double> want = ref_forward(c, in.q, in.kv, in.kpe, pos);
      Tensor got = f64(qkv);
      double err = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got.data<double>()[i])) << "element " << i << " not written";
        err = std::max(err, std::abs(got.data<double>()[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
      }
      EXPECT_LE(err / scale, dt == DType::F64 ? 1e-13 : 2e-6);
      // The padding is exactly zero and copies are exact.
      const int64_t Dq = c.d.Dq();
      for (int64_t j = c.d.Dv; j < Dq; ++j) EXPECT_EQ(got.data<double>()[2 * Dq + j], 0.0);
      EXPECT_EQ(got.data<double>()[c.d.Dr], f64(in.q).data<double>()[0]);
    }
  }
}

// Rows at pos0 + s and a positions tensor holding the same numbers give the same bits.
TEST(MlaOps, PositionsTensorEqualsPos0) {
  MlaCase c{MlaDims{3, 4, 8, 6}, yarn_rope(), 4, 3, 5, false};
  const Inputs in = random_inputs(c, 7, DType::F32);
  std::vector<int64_t> p(size_t(c.R()));
  for (int64_t r = 0; r < c.R(); ++r) p[size_t(r)] = c.pos0 + r / c.B;
  const Tensor pos = Tensor::from(p, {c.R()});
  Tensor a = nan_tensor({c.R(), c.d.heads * 3 * c.d.Dq()}, DType::F32);
  Tensor b = nan_tensor(a.shape(), DType::F32);
  cpu::mla_qkv_forward(in.q, in.kv, in.kpe, c.d, c.r, c.B, c.pos0, Tensor(), a, S());
  cpu::mla_qkv_forward(in.q, in.kv, in.kpe, c.d, c.r, c.B, 1000, pos, b, S());
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
}

// Values from the formula in Python (math module): Dr = 8, L = 64, factor 40, base 10000,
// beta 32 / 1 give corr(32) = -0.497 -> low 0, corr(1) = 1.008 -> high 2, ramp 0, 1/2, 1, 1:
// inv = 1, (0.1 + 0.1/40)/2, 0.01/40, 0.001/40. Dr = 64, L = 4096 (DeepSeek-V3's rope): low
// 10, high 23.
TEST(MlaOps, YarnInverseFrequencies) {
  MlaRope r = yarn_rope();
  const double small[4] = {1.0, 0.05125, 0.00025, 2.5e-05};
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(ops::mla_inv_freq(r, i, 8), small[i], 1e-15 * small[i]) << i;
    EXPECT_NEAR(ref_inv_freq(r, i, 8), small[i], 1e-15 * small[i]) << i;
  }
  r.original_max_positions = 4096;
  const std::pair<int64_t, double> large[] = {{0, 1.0},
                                              {5, 0.23713737056616552},
                                              {10, 0.05623413251903491},
                                              {11, 0.03900692656714386},
                                              {12, 0.026879360111431223},
                                              {15, 0.008334508951020777},
                                              {20, 0.0007905694150420946},
                                              {22, 0.0001778279410038922},
                                              {23, 3.33380358040831e-05},
                                              {31, 3.3338035804083097e-06}};
  for (const auto& [i, want] : large)
    EXPECT_NEAR(ops::mla_inv_freq(r, i, 64), want, 1e-13 * want) << i;
  // Plain rope is base^(-2i / Dr) whatever the YaRN fields hold.
  r.yarn = false;
  EXPECT_DOUBLE_EQ(ops::mla_inv_freq(r, 3, 8), std::pow(10000.0, -0.75));
  // 0.1 * 0.707 * ln 40 + 1; 1 at or below scale 1.
  EXPECT_NEAR(ops::yarn_get_mscale(40, 0.707), 1.2608037774058554, 1e-15);
  EXPECT_EQ(ops::yarn_get_mscale(1, 0.707), 1.0);
  EXPECT_EQ(ops::yarn_get_mscale(0.5, 1.0), 1.0);
}

// <dqkv, F(q, kv, kpe)> = <dq, q> + <dkv, kv> + <dkpe, kpe> for random inputs and gradients
// (padding of dqkv included: the forward writes zeros there, the backward ignores it).
TEST(MlaOps, BackwardIsAdjoint) {
  int n = 0;
  for (const MlaCase& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "case " << n++);
    const MlaDims& d = c.d;
    const Inputs in = random_inputs(c, 200 + uint64_t(n), DType::F64);
    const Tensor pos = positions_for(c);
    Tensor qkv = nan_tensor({c.R(), d.heads * 3 * d.Dq()}, DType::F64);
    cpu::mla_qkv_forward(in.q, in.kv, in.kpe, d, c.r, c.B, c.pos0, pos, qkv, S());
    const Tensor dqkv = randn(qkv.shape(), 300 + uint64_t(n));
    Tensor dq = nan_tensor(in.q.shape(), DType::F64), dkv = nan_tensor(in.kv.shape(), DType::F64);
    Tensor dkpe = nan_tensor(in.kpe.shape(), DType::F64);
    ops::mla_qkv_backward(dqkv, d, c.r, c.B, c.pos0, pos, dq, dkv, dkpe, S());
    const double lhs = dot(dqkv, qkv);
    const double rhs = dot(dq, in.q) + dot(dkv, in.kv) + dot(dkpe, in.kpe);
    EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs));
    // The f32 path computes the same gradients to f32 rounding.
    Tensor dq32 = nan_tensor(dq.shape(), DType::F32), dkv32 = nan_tensor(dkv.shape(), DType::F32);
    Tensor dkpe32 = nan_tensor(dkpe.shape(), DType::F32);
    cpu::mla_qkv_backward(as(dqkv, DType::F32), d, c.r, c.B, c.pos0, pos, dq32, dkv32, dkpe32, S());
    EXPECT_LE(rel_err(dq32, dq), 2e-6);
    EXPECT_EQ(max_abs_diff(dkv32, as(dkv, DType::F32)), 0.0) << "dkv copies dqkv's entries";
    EXPECT_LE(rel_err(dkpe32, dkpe), 2e-6);
  }
}

TEST(MlaOps, CtxNarrowPadRoundTripAndAdjoint) {
  const MlaDims d{3, 4, 8, 6};
  const int64_t R = 5;
  for (DType dt : {DType::F64, DType::F32}) {
    const Tensor ctx = randn({R, d.heads * d.Dq()}, 1, 1.0, dt);
    const Tensor y = randn({R, d.heads * d.Dv}, 2, 1.0, dt);
    Tensor out = nan_tensor(y.shape(), dt), dctx = nan_tensor(ctx.shape(), dt);
    ops::mla_ctx_narrow(ctx, d, out, S());
    ops::mla_ctx_pad(y, d, dctx, S());
    Tensor c64 = f64(ctx), o64 = f64(out), p64 = f64(dctx), y64 = f64(y);
    for (int64_t rh = 0; rh < R * d.heads; ++rh)
      for (int64_t j = 0; j < d.Dq(); ++j) {
        if (j < d.Dv)
          ASSERT_EQ(o64.data<double>()[rh * d.Dv + j], c64.data<double>()[rh * d.Dq() + j]);
        ASSERT_EQ(p64.data<double>()[rh * d.Dq() + j],
                  j < d.Dv ? y64.data<double>()[rh * d.Dv + j] : 0.0);
      }
    // narrow(pad(y)) = y exactly; <narrow(ctx), y> = <ctx, pad(y)>.
    Tensor back = nan_tensor(y.shape(), dt);
    cpu::mla_ctx_narrow(dctx, d, back, S());
    EXPECT_EQ(max_abs_diff(back, y), 0.0);
    const double lhs = dot(out, y);
    EXPECT_NEAR(lhs, dot(ctx, dctx), 1e-12 * (std::abs(lhs) + 1));
  }
}

TEST(MlaOps, BadArgumentsThrow) {
  const MlaCase c{MlaDims{3, 4, 8, 6}, MlaRope{}, 4, 2, 0, false};
  const MlaDims& d = c.d;
  const Inputs in = random_inputs(c, 9, DType::F64);
  auto fwd = [&](const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& dd,
                 const MlaRope& r, int64_t B, const Tensor& pos,
                 Tensor& qkv) { cpu::mla_qkv_forward(q, kv, kpe, dd, r, B, 0, pos, qkv, S()); };
  Tensor qkv = Tensor::empty({c.R(), d.heads * 3 * d.Dq()}, DType::F64);
  EXPECT_NO_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, c.B, Tensor(), qkv));
  Tensor small_qkv = Tensor::empty({c.R(), d.heads * 3 * d.Dq() - 1}, DType::F64);
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, c.B, Tensor(), small_qkv), Error);
  const Tensor kv_wide = randn({c.R(), d.heads * (d.Dn + d.Dv) + 1}, 1);
  EXPECT_THROW(fwd(in.q, kv_wide, in.kpe, d, c.r, c.B, Tensor(), qkv), Error);
  EXPECT_THROW(fwd(in.q, in.kv, randn({c.R(), d.Dr + 2}, 1), d, c.r, c.B, Tensor(), qkv), Error);
  EXPECT_THROW(fwd(in.q, as(in.kv, DType::F32), in.kpe, d, c.r, c.B, Tensor(), qkv), Error);
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, 3, Tensor(), qkv), Error);  // R = 8, B = 3
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, 0, Tensor(), qkv), Error);
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, MlaDims{3, 5, 7, 6}, c.r, c.B, Tensor(), qkv), Error);
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, MlaDims{3, 4, 8, 13}, c.r, c.B, Tensor(), qkv), Error);
  const Tensor short_pos = Tensor::from(std::vector<int64_t>(size_t(c.R() - 1), 0), {c.R() - 1});
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, c.B, short_pos, qkv), Error);
  const Tensor i32_pos = Tensor::from(std::vector<int32_t>(size_t(c.R()), 0), {c.R()});
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, c.r, c.B, i32_pos, qkv), Error);
  MlaRope bad_yarn = yarn_rope();
  bad_yarn.factor = 0;
  EXPECT_THROW(fwd(in.q, in.kv, in.kpe, d, bad_yarn, c.B, Tensor(), qkv), Error);
  Tensor bf16_q = Tensor::empty(in.q.shape(), DType::BF16);
  EXPECT_THROW(fwd(bf16_q, in.kv, in.kpe, d, c.r, c.B, Tensor(), qkv), Error);

  Tensor dq = Tensor::empty(in.q.shape(), DType::F64),
         dkv = Tensor::empty(in.kv.shape(), DType::F64);
  Tensor dkpe = Tensor::empty(in.kpe.shape(), DType::F64);
  EXPECT_NO_THROW(cpu::mla_qkv_backward(qkv, d, c.r, c.B, 0, Tensor(), dq, dkv, dkpe, S()));
  Tensor dkpe_short = Tensor::empty({c.R(), d.Dr - 2}, DType::F64);
  EXPECT_THROW(cpu::mla_qkv_backward(qkv, d, c.r, c.B, 0, Tensor(), dq, dkv, dkpe_short, S()),
               Error);
  EXPECT_THROW(cpu::mla_qkv_backward(qkv, d, c.r, c.B, 0, Tensor(), dkv, dq, dkpe, S()), Error);

  Tensor out = Tensor::empty({c.R(), d.heads * d.Dv}, DType::F64);
  Tensor ctx = Tensor::empty({c.R(), d.heads * d.Dq()}, DType::F64);
  EXPECT_NO_THROW(cpu::mla_ctx_narrow(ctx, d, out, S()));
  EXPECT_THROW(cpu::mla_ctx_narrow(out, d, ctx, S()), Error);
  EXPECT_THROW(cpu::mla_ctx_pad(ctx, d, out, S()), Error);
  Tensor ctx32 = Tensor::empty(ctx.shape(), DType::F32);
  EXPECT_THROW(cpu::mla_ctx_pad(out, d, ctx32, S()), Error);
}

}  // namespace mla_ops_test
