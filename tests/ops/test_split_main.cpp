// fp32 main parameters held as (bf16 model parameter, lower 16 bits): ops/split_main.h.
// The encoding against an independent reference (rounding half away from zero worked out in
// double), the round trip over every class of fp32 value, adamw_step_split against
// adamw_step on whole fp32 main parameters, and AdamW itself with split and whole main
// parameters (the same fp32 values after several steps, 2 bytes an element less state);
// bf16 Adam moments (--use-precision-aware-optimizer) on whole and split main parameters.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "op_test_util.h"
#include "ops/split_main.h"
#include "model/params.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace split_main_test {

float f_of(uint32_t b) { return bits_float(b); }
Stream& CS() { return Stream::cpu(); }

Tensor rand_f32(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The bf16 value nearest to x (finite, not NaN), ties away from zero, by comparing the two
// neighbours in double: an implementation that shares nothing with the bit arithmetic.
uint16_t reference_round_half_away(float x) {
  const uint32_t b = float_bits(x);
  const uint16_t down = uint16_t(b >> 16);  // truncation toward zero
  if ((b & 0xFFFFu) == 0) return down;
  const uint16_t up = uint16_t(down + 1);  // the next bf16 away from zero
  const double dd = std::fabs(double(x) - double(bf16_to_float(down)));
  // Past the largest finite bf16 the next step is 2^128, which rounds to infinity (as
  // IEEE rounding treats overflow).
  const double up_value = std::isinf(bf16_to_float(up)) ? std::copysign(std::ldexp(1.0, 128), x)
                                                        : double(bf16_to_float(up));
  const double du = std::fabs(up_value - double(x));
  return du <= dd ? up : down;
}

// Patterns of every kind: random, ties with even and odd upper halves, just below and above
// ties, zeros, subnormals, the largest finite values, infinities.
std::vector<uint32_t> interesting_bits() {
  std::vector<uint32_t> v;
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(uint32_t(rng()));
  for (uint32_t hi : {0x0000u, 0x0001u, 0x0002u, 0x3F80u, 0x3F81u, 0x7F7Eu, 0x7F7Fu, 0x4049u,
                      0x8000u, 0x8001u, 0xBF80u, 0xBF81u, 0xFF7Fu, 0x0080u, 0x007Fu})
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      v.push_back(hi << 16 | lo);
  v.push_back(0x7F800000u), v.push_back(0xFF800000u);  // +-inf
  return v;
}


TEST(SplitMain, ModelParameterRoundsHalfAwayFromZero) {
  int ties = 0;
  for (uint32_t b : interesting_bits()) {
    const float x = f_of(b);
    if (std::isnan(x)) continue;
    const uint16_t model = ops::split_main_model(b);
    if (std::isinf(x)) {
      EXPECT_EQ(model, uint16_t(b >> 16));
      continue;
    }
    ASSERT_EQ(model, reference_round_half_away(x)) << std::hex << "bits 0x" << b;
    // Round-to-nearest-even agrees except at exact ties of an even upper half.
    const bool even_tie = (b & 0xFFFFu) == 0x8000u && ((b >> 16) & 1u) == 0;
    if (even_tie) {
      ++ties;
      EXPECT_EQ(model, uint16_t(float_to_bf16(x) + 1)) << std::hex << "bits 0x" << b;
    } else {
      EXPECT_EQ(model, float_to_bf16(x)) << std::hex << "bits 0x" << b;
    }
  }
  EXPECT_GE(ties, 8);  // the table above has eight
}

TEST(SplitMain, JoinGivesBackEveryValueButNaNPayloads) {
  for (uint32_t b : interesting_bits()) {
    const uint32_t back = ops::split_main_join(ops::split_main_model(b), uint16_t(b));
    if (std::isnan(f_of(b)))
      EXPECT_TRUE(std::isnan(f_of(back))) << std::hex << "bits 0x" << b;
    else
      ASSERT_EQ(back, b) << std::hex << "bits 0x" << b;
  }
  // NaNs whose upper half is the largest pattern stay NaN (no carry into the sign).
  for (uint32_t b : {0x7FFFFFFFu, 0x7FFF8000u, 0xFFFFFFFFu, 0x7FFE8000u}) {
    EXPECT_TRUE(std::isnan(f_of(ops::split_main_join(ops::split_main_model(b), uint16_t(b)))));
    EXPECT_TRUE(std::isnan(bf16_to_float(ops::split_main_model(b))));
  }
}

TEST(SplitMain, SplitAndJoinOpsRoundTrip) {
  const std::vector<uint32_t> bits = interesting_bits();
  const int64_t n = int64_t(bits.size());
  Tensor x = Tensor::empty({n}, DType::F32), model = Tensor::empty({n}, DType::BF16);
  Tensor lo = Tensor::empty({n}, DType::U16), back = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = f_of(bits[size_t(i)]);
  cpu::split_main_params(x, model, lo, CS());
  cpu::join_main_params(model, lo, back, CS());
  const auto* M = static_cast<const uint16_t*>(model.raw());
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits[size_t(i)];
    ASSERT_EQ(M[i], ops::split_main_model(b));
    ASSERT_EQ(lo.data<uint16_t>()[i], uint16_t(b));
    if (!std::isnan(f_of(b))) ASSERT_EQ(float_bits(back.data<float>()[i]), b);
  }
  // Without lo: the model parameters alone, the same bits.
  Tensor model2 = Tensor::empty({n}, DType::BF16), none;
  cpu::split_main_params(x, model2, none, CS());
  EXPECT_TRUE(same_bits(model, model2));
  cpu::clear_main_lo(lo, CS());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(lo.data<uint16_t>()[i], 0);
  // Argument checks name the op and the tensor.
  Tensor wrong = Tensor::empty({n}, DType::F16);
  EXPECT_THROW(cpu::split_main_params(x, wrong, lo, CS()), Error);
  Tensor short_lo = Tensor::empty({n - 1}, DType::U16);
  EXPECT_THROW(cpu::join_main_params(model, short_lo, back, CS()), Error);
}

// adamw_step_split leaves, bit for bit, the main parameters and moments adamw_step leaves
// on the joined fp32 values, and the model parameters rounded half away from zero.
TEST(SplitMain, AdamWStepSplitIsAdamWStepOnTheJoinedValues) {
  const int64_t n = 50003;
  Tensor x = rand_f32({n}, 11), m = rand_f32({n}, 12, -0.1f, 0.1f),
         v = rand_f32({n}, 13, 0.f, 0.01f);
  float* X = x.data<float>();
  for (int64_t i = 0; i < n; ++i) X[i] = std::ldexp(X[i], int(i % 31) - 16);  // many binades
  Tensor model = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16);
  cpu::split_main_params(x, model, lo, CS());
  Tensor wm = m.clone(), wv = v.clone(), none;
  ops::AdamWParams ap;
  ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1, ap.grad_scale = 0.75;
  for (int step = 1; step <= 4; ++step) {
    ap.step = step;
    Tensor g = rand_f32({n}, 100 + step);
    cpu::adamw_step(x, g, wm, wv, none, ap, CS());
    cpu::adamw_step_split(model, lo, g, m, v, ap, CS());
  }
  Tensor joined = Tensor::empty({n}, DType::F32);
  cpu::join_main_params(model, lo, joined, CS());
  EXPECT_TRUE(same_bits(joined, x));
  EXPECT_TRUE(same_bits(m, wm));
  EXPECT_TRUE(same_bits(v, wv));
  const auto* M = static_cast<const uint16_t*>(model.raw());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(M[i], reference_round_half_away(X[i])) << i;
}

// AdamW on a bf16 model: split by default, whole fp32 with MCPP_FP32_MAIN_PARAMS=1; the same
// fp32 main parameters (full_main_params) and moments after several steps with weight decay
// and clipping, and 2 bytes an element less state.
TEST(SplitMain, AdamWSplitAndWholeMainParamsAgree) {
  auto make = [] { return two_group_params(DType::BF16, 257 * 31, 999, 1234); };
  model::ParamStore a = make(), b = make();
  ASSERT_EQ(std::getenv("MCPP_FP32_MAIN_PARAMS"), nullptr);
  optim::AdamW split(a, {});
  setenv("MCPP_FP32_MAIN_PARAMS", "1", 1);
  optim::AdamW whole(b, {});
  unsetenv("MCPP_FP32_MAIN_PARAMS");
  ASSERT_TRUE(split.main_params_split());
  ASSERT_FALSE(whole.main_params_split());
  EXPECT_EQ(whole.state_bytes() - split.state_bytes(), 2 * a.total_numel());
  for (int step = 1; step <= 5; ++step) {
    Tensor g = rand_f32({a.total_numel()}, 40 + step);
    cpu::copy(g, a.flat_grads(), CS());
    cpu::copy(g, b.flat_grads(), CS());
    split.clip(1.0, 3.0), whole.clip(1.0, 3.0);
    split.step(1e-2, 0.1), whole.step(1e-2, 0.1);
  }
  const Tensor sm = split.full_main_params(), wm = whole.full_main_params();
  EXPECT_TRUE(same_bits(sm, wm));
  EXPECT_TRUE(same_bits(split.exp_avg(), whole.exp_avg()));
  EXPECT_TRUE(same_bits(split.exp_avg_sq(), whole.exp_avg_sq()));
  const auto* P = static_cast<const uint16_t*>(a.flat_params().raw());
  for (int64_t i = 0; i < a.total_numel(); ++i)
    ASSERT_EQ(P[i], ops::split_main_model(float_bits(sm.data<float>()[i]))) << i;
  EXPECT_DOUBLE_EQ(split.main_sum_squares(0, a.total_numel()),
                   whole.main_sum_squares(0, a.total_numel()));
  // A checkpoint's values back in: the same fp32 values exactly.
  Tensor values = rand_f32({a.total_numel()}, 77);
  split.set_params(values);
  EXPECT_TRUE(same_bits(split.full_main_params(), values));
}

// ---- bf16 moments (--use-precision-aware-optimizer --exp-avg-dtype / --exp-avg-sq-dtype) --


// The bf16 value nearest to x, ties to the even one, by comparing the two neighbours in
// double (finite x): independent of float_to_bf16's bit arithmetic.
uint16_t reference_round_nearest_even(float x) {
  const uint32_t b = float_bits(x);
  const uint16_t down = uint16_t(b >> 16);
  if ((b & 0xFFFFu) == 0) return down;
  const uint16_t up = uint16_t(down + 1);
  const double dd = std::fabs(double(x) - double(bf16_to_float(down)));
  const double du = std::fabs(double(bf16_to_float(up)) - double(x));
  if (du != dd) return du < dd ? up : down;
  return (down & 1u) ? up : down;
}

Tensor round_to_bf16(const Tensor& f) {
  Tensor h = Tensor::empty(f.shape(), DType::BF16);
  auto* H = static_cast<uint16_t*>(h.raw());
  for (int64_t i = 0; i < f.numel(); ++i) H[i] = reference_round_nearest_even(f.data<float>()[i]);
  return h;
}

Tensor widen(const Tensor& h) {
  Tensor f = Tensor::empty(h.shape(), DType::F32);
  const auto* H = static_cast<const uint16_t*>(h.raw());
  for (int64_t i = 0; i < h.numel(); ++i) f.data<float>()[i] = bf16_to_float(H[i]);
  return f;
}


// Each of m / v in bf16 (and both), on whole fp32 main parameters (with and without the
// bf16 model output) and on split ones: after every step the parameters are bit for bit
// those of the f32-moment step from the same moments, and each bf16 moment is that step's
// f32 moment rounded to nearest even (the update reads the unrounded value, as
// TransformerEngine's FusedAdam does).
TEST(Bf16Moments, StepIsTheF32StepWithItsMomentsRounded) {
  const int64_t n = 50003;  // packs and a scalar tail
  ops::AdamWParams ap;
  ap.lr = 1e-3, ap.beta1 = 0.9, ap.beta2 = 0.95, ap.weight_decay = 0.1, ap.grad_scale = 0.75;
  for (int mode = 0; mode < 3; ++mode)  // whole, whole + bf16 model output, split
    for (auto [m16, v16] :
         {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      SCOPED_TRACE(testing::Message() << "mode " << mode << ", bf16 m " << m16 << ", v " << v16);
      Tensor x = rand_f32({n}, 21), rm = rand_f32({n}, 22, -0.1f, 0.1f),
             rv = rand_f32({n}, 23, 0.f, 0.01f);
      // Start from bf16-valued moments so that both runs begin equal.
      rm = widen(round_to_bf16(rm)), rv = widen(round_to_bf16(rv));
      Tensor m = m16 ? round_to_bf16(rm) : rm.clone(), v = v16 ? round_to_bf16(rv) : rv.clone();
      Tensor ref = x.clone(), none;
      Tensor model = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16);
      Tensor out = mode == 1 ? Tensor::empty({n}, DType::BF16) : none;
      Tensor ref_out = mode == 1 ? Tensor::empty({n}, DType::BF16) : none;
      if (mode == 2) cpu::split_main_params(x, model, lo, CS());
      for (int step = 1; step <= 4; ++step) {
        ap.step = step;
        Tensor g = rand_f32({n}, 300 + step);
        cpu::adamw_step(ref, g, rm, rv, ref_out, ap, CS());
        if (mode == 2)
          cpu::adamw_step_split(model, lo, g, m, v, ap, CS());
        else
          cpu::adamw_step(x, g, m, v, out, ap, CS());
        if (m16) ASSERT_TRUE(same_bits(m, round_to_bf16(rm))) << step;
        if (v16) ASSERT_TRUE(same_bits(v, round_to_bf16(rv))) << step;
        if (!m16) ASSERT_TRUE(same_bits(m, rm)) << step;
        if (!v16) ASSERT_TRUE(same_bits(v, rv)) << step;
        // The reference continues from the moments the bf16 run kept.
        if (m16) rm = widen(m);
        if (v16) rv = widen(v);
        if (mode == 2) {
          Tensor joined = Tensor::empty({n}, DType::F32);
          cpu::join_main_params(model, lo, joined, CS());
          ASSERT_TRUE(same_bits(joined, ref)) << step;
        } else {
          ASSERT_TRUE(same_bits(x, ref)) << step;
          if (mode == 1) ASSERT_TRUE(same_bits(out, ref_out)) << step;
        }
      }
    }
}

// bf16 moments need f32 main parameters (not the f64 reference models'), and a moment
// of another dtype is refused naming it.
TEST(Bf16Moments, OpChecksTheMomentDtypes) {
  ops::AdamWParams ap;
  ap.step = 1;
  Tensor none;
  Tensor p64 = Tensor::zeros({8}, DType::F64), g64 = Tensor::zeros({8}, DType::F64);
  Tensor m16 = Tensor::zeros({8}, DType::BF16), v64 = Tensor::zeros({8}, DType::F64);
  EXPECT_THROW(cpu::adamw_step(p64, g64, m16, v64, none, ap, CS()), Error);
  Tensor p = Tensor::zeros({8}, DType::F32), g = Tensor::zeros({8}, DType::F32);
  Tensor vh = Tensor::zeros({8}, DType::F16);
  try {
    cpu::adamw_step(p, g, m16, vh, none, ap, CS());
    FAIL() << "an f16 moment was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'v'"), std::string::npos) << e.what();
  }
}

// optim::AdamW with bf16 moments: 4 bytes an element less state than with fp32 ones, and
// the run is the fp32-moment run with its moments rounded after every step (ops above),
// here over the optimizer's parameter groups, clipping and a bf16 model's split main
// parameters.
TEST(Bf16Moments, OptimizerKeepsBf16MomentsAndStepsAsTheOp) {
  for (DType dt : {DType::F32, DType::BF16}) {
    auto make = [dt] { return two_group_params(dt, 257 * 31, 999, 1234); };
    model::ParamStore a = make(), b = make();
    optim::OptimizerConfig c16;
    c16.exp_avg_dtype = c16.exp_avg_sq_dtype = DType::BF16;
    optim::AdamW half(a, c16), full(b, {});
    ASSERT_EQ(half.exp_avg().dtype(), DType::BF16);
    ASSERT_EQ(half.exp_avg_sq().dtype(), DType::BF16);
    EXPECT_EQ(full.state_bytes() - half.state_bytes(), 4 * a.total_numel());
    for (int step = 1; step <= 4; ++step) {
      Tensor g = rand_f32({a.total_numel()}, 60 + step);
      cpu::copy(g, a.flat_grads(), CS());
      cpu::copy(g, b.flat_grads(), CS());
      half.clip(1.0, 3.0), full.clip(1.0, 3.0);
      half.step(1e-2, 0.1), full.step(1e-2, 0.1);
      ASSERT_TRUE(same_bits(half.exp_avg(), round_to_bf16(full.exp_avg()))) << step;
      ASSERT_TRUE(same_bits(half.exp_avg_sq(), round_to_bf16(full.exp_avg_sq()))) << step;
      ASSERT_TRUE(same_bits(a.flat_params(), b.flat_params())) << step;
      if (dt == DType::BF16)
        ASSERT_TRUE(same_bits(half.full_main_params(), full.full_main_params())) << step;
      // The fp32-moment run continues from the rounded moments.
      cpu::copy(widen(half.exp_avg()), full.exp_avg(), CS());
      cpu::copy(widen(half.exp_avg_sq()), full.exp_avg_sq(), CS());
    }
    EXPECT_TRUE(same_bits(a.flat_params(), b.flat_params()));
  }
  optim::OptimizerConfig lion;
  lion.rule = optim::UpdateRule::Lion, lion.exp_avg_dtype = DType::BF16;
  model::ParamStore p = two_group_params(DType::F32, 64, 8, 1);
  EXPECT_THROW(optim::AdamW(p, lion), Error);
}

}  // namespace split_main_test
