// Llama 3.x RoPE scaling (ops::rope_inv_freq, ops/rope_math.h, and the CPU rope ops that use
// it): the scaled frequencies against the formula written out here in fp64, in each of its
// three regions; the ops against a direct rotation at those frequencies; backward against
// forward; scaling off (and factor 1) giving plain RoPE. Linear position interpolation
// (RopeFreqs::interpolation): the ops at position p against the direct rotation at p / N,
// alone and on top of the Llama 3.x scaling.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_test_util.h"
#include "ops/rope_math.h"

using namespace attn_test;
namespace cpu = mcpp::ops::cpu;
using mcpp::Stream;
using mcpp::ops::RopeFreqs;

namespace rope_scaling_test {

constexpr double kPi = 3.14159265358979323846;

// Llama-3.2-1B's RoPE: head dim 64, theta 500000, rope_scaling {factor 32, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192}.
RopeFreqs llama32() {
  RopeFreqs f(500000.0);
  f.scaled = true;
  f.factor = 32, f.low_freq_factor = 1, f.high_freq_factor = 4, f.original_max_positions = 8192;
  return f;
}

enum class Region { Kept, Divided, Smoothed };

// The scaled inverse frequency of pair i, stated through the number of its periods that fit
// the original context (L / wavelength): more than high_freq_factor -> kept; fewer than
// low_freq_factor -> divided by the factor; between, the linear blend of the two.
double ref_inv_freq(const RopeFreqs& f, int64_t i, int64_t rot_dim, Region* region = nullptr) {
  const double plain = 1.0 / std::pow(f.base, double(2 * i) / double(rot_dim));
  if (!f.scaled) return plain;
  const double periods = double(f.original_max_positions) /
                         (2 * kPi * std::pow(f.base, double(2 * i) / double(rot_dim)));
  Region r = periods > f.high_freq_factor  ? Region::Kept
             : periods < f.low_freq_factor ? Region::Divided
                                           : Region::Smoothed;
  if (region) *region = r;
  if (r == Region::Kept) return plain;
  if (r == Region::Divided) return plain / f.factor;
  const double w = (periods - f.low_freq_factor) / (f.high_freq_factor - f.low_freq_factor);
  return plain * (w + (1 - w) / f.factor);
}

// Element (s, b, g, slot, c) of qkv rotated at position t by the test's own frequencies.
double rotated(const Tensor& x, const AttentionDims& d, int64_t rot_dim, const RopeFreqs& f,
               double t, int64_t s, int64_t b, int64_t g, int64_t slot, int64_t c) {
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  const double* p = x.data<double>() + s * d.B * W + b * W + (g * (G + 2) + slot) * d.HD;
  if (slot == G + 1 || c >= rot_dim) return p[c];
  const int64_t half = rot_dim / 2, i = c % half;
  const double a = t * ref_inv_freq(f, i, rot_dim);
  if (c < half) return p[c] * std::cos(a) - p[c + half] * std::sin(a);
  return p[c] * std::cos(a) + p[c - half] * std::sin(a);
}

// Largest |y - rotated(x)| over all elements, row s at position pos(s, b).
template <typename Pos>
double max_err(const Tensor& y, const Tensor& x, const AttentionDims& d, int64_t rot_dim,
               const RopeFreqs& f, Pos pos) {
  const int64_t G = d.NH / d.NG;
  double err = 0;
  int64_t k = 0;
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t g = 0; g < d.NG; ++g)
        for (int64_t slot = 0; slot < G + 2; ++slot)
          for (int64_t c = 0; c < d.HD; ++c, ++k)
            err = std::max(err, std::abs(y.data<double>()[k] -
                                         rotated(x, d, rot_dim, f, pos(s, b), s, b, g, slot, c)));
  return err;
}


TEST(RopeScaling, InvFreqMatchesFormulaInAllThreeRegions) {
  const RopeFreqs f = llama32();
  int counts[3] = {0, 0, 0};
  for (int64_t i = 0; i < 32; ++i) {
    Region r;
    const double want = ref_inv_freq(f, i, 64, &r);
    ++counts[int(r)];
    EXPECT_NEAR(mcpp::ops::rope_inv_freq(f, i, 64), want, 1e-14 * want) << "pair " << i;
  }
  // Llama-3.2-1B: pairs 0..14 kept, 15..17 smoothed, 18..31 divided by 32.
  EXPECT_EQ(counts[int(Region::Kept)], 15);
  EXPECT_EQ(counts[int(Region::Smoothed)], 3);
  EXPECT_EQ(counts[int(Region::Divided)], 14);
  const double plain31 = std::pow(500000.0, -62.0 / 64.0);
  EXPECT_NEAR(mcpp::ops::rope_inv_freq(f, 31, 64), plain31 / 32, 1e-15 * plain31);
  EXPECT_EQ(mcpp::ops::rope_inv_freq(f, 3, 64), std::pow(500000.0, -6.0 / 64.0));
  // A smoothed pair lies strictly between its divided and its kept value.
  const double plain16 = std::pow(500000.0, -32.0 / 64.0),
               s16 = mcpp::ops::rope_inv_freq(f, 16, 64);
  EXPECT_GT(s16, plain16 / 32 * 1.01);
  EXPECT_LT(s16, plain16 * 0.99);
}

TEST(RopeScaling, OffOrFactorOneIsPlainRope) {
  RopeFreqs f = llama32();
  f.scaled = false;  // the factor and the rest are then ignored: bit for bit the plain formula
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_EQ(mcpp::ops::rope_inv_freq(f, i, 64), std::pow(500000.0, -2.0 * double(i) / 64.0));
  EXPECT_EQ(mcpp::ops::rope_inv_freq(RopeFreqs(10000.0), 5, 48), std::pow(10000.0, -10.0 / 48.0));
  f = llama32();
  f.factor = 1;  // every region then keeps the frequency (the blend up to rounding)
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_DOUBLE_EQ(mcpp::ops::rope_inv_freq(f, i, 64),
                     std::pow(500000.0, -2.0 * double(i) / 64.0));
}

TEST(RopeScaling, CpuOpsMatchDirectRotation) {
  const RopeFreqs f = llama32();
  for (int64_t rot_dim : {64, 32}) {  // full rotation and rotary_percent 0.5
    SCOPED_TRACE(rot_dim);
    const AttentionDims d = dims(7, 2, 4, 2, 64);
    const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 40);
    // Positions past the original context, where scaling matters most.
    const int64_t off = 20000;
    Tensor y = Tensor::empty(x.shape(), DType::F64);
    cpu::rope_forward(x, d, rot_dim, f, off, y, Stream::cpu());
    EXPECT_LT(max_err(y, x, d, rot_dim, f, [&](int64_t s, int64_t) { return double(s + off); }),
              1e-11);
    // And it is not plain RoPE: the low frequencies turned 32 times slower.
    RopeFreqs plain = f;
    plain.scaled = false;
    EXPECT_GT(max_err(y, x, d, rot_dim, plain, [&](int64_t s, int64_t) { return double(s + off); }),
              0.1);
    // Per-token positions (--reset-position-ids) and a decode step's per-sequence positions.
    Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
    for (int64_t k = 0; k < d.S * d.B; ++k) pos.data<int64_t>()[k] = 9000 + 37 * k;
    cpu::rope_positions(x, d, rot_dim, f, pos, false, y, Stream::cpu());
    EXPECT_LT(max_err(y, x, d, rot_dim, f,
                      [&](int64_t s, int64_t b) { return double(9000 + 37 * (s * d.B + b)); }),
              1e-11);
    AttentionDims d1 = d;
    d1.S = 1;
    const Tensor x1 = x.narrow(0, 1).clone();
    Tensor p1 = Tensor::empty({d.B}, DType::I64), y1 = Tensor::empty(x1.shape(), DType::F64);
    for (int64_t b = 0; b < d.B; ++b) p1.data<int64_t>()[b] = 12345 + 1000 * b;
    cpu::rope_decode(x1, d1, rot_dim, f, p1, y1, Stream::cpu());
    EXPECT_LT(max_err(y1, x1, d1, rot_dim, f,
                      [&](int64_t, int64_t b) { return double(12345 + 1000 * b); }),
              1e-11);
  }
}

TEST(RopeScaling, BackwardIsTheTransposeOfForward) {
  // <rope(x), r> = <x, rope'(r)> for random x and r: the backward is the forward's adjoint.
  const RopeFreqs f = llama32();
  const AttentionDims d = dims(5, 2, 4, 2, 64);
  const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 41);
  const Tensor r = randn<double>(x.shape(), 42);
  Tensor y = Tensor::empty(x.shape(), DType::F64), dx = Tensor::empty(x.shape(), DType::F64);
  cpu::rope_forward(x, d, 64, f, 8000, y, Stream::cpu());
  cpu::rope_backward(r, d, 64, f, 8000, dx, Stream::cpu());
  double lhs = 0, rhs = 0;
  for (int64_t k = 0; k < x.numel(); ++k) {
    lhs += y.data<double>()[k] * r.data<double>()[k];
    rhs += x.data<double>()[k] * dx.data<double>()[k];
  }
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs));
  // And the inverse: backward of forward gives x back (f32 too, in place).
  Tensor x32 = convert<float, double>(x);
  cpu::rope_forward(x32, d, 64, f, 30000, x32, Stream::cpu());
  cpu::rope_backward(x32, d, 64, f, 30000, x32, Stream::cpu());
  double err = 0;
  for (int64_t k = 0; k < x.numel(); ++k)
    err = std::max(err, std::abs(double(x32.data<float>()[k]) - x.data<double>()[k]));
  EXPECT_LT(err, 1e-5);
}

TEST(RopeScaling, RejectsBadParameters) {
  const AttentionDims d = dims(2, 1, 2, 1, 8);
  Tensor x = Tensor::zeros({2, 1, d.qkv_width()}, DType::F32);
  RopeFreqs f = llama32();
  f.factor = 0;
  EXPECT_THROW(cpu::rope_forward(x, d, 8, f, 0, x, Stream::cpu()), mcpp::Error);
  f = llama32();
  f.low_freq_factor = 4;  // low == high: the blend would divide by zero
  EXPECT_THROW(cpu::rope_forward(x, d, 8, f, 0, x, Stream::cpu()), mcpp::Error);
  f.scaled = false;  // unused when off
  EXPECT_NO_THROW(cpu::rope_forward(x, d, 8, f, 0, x, Stream::cpu()));
}

// ---- linear position interpolation (--rotary-seq-len-interpolation-factor, HF "linear")

TEST(RopeInterpolation, UnsetFactorIsBitForBitPlain) {
  RopeFreqs f = llama32();
  f.interpolation = 1;
  RopeFreqs plain = llama32();
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(mcpp::ops::rope_inv_freq(f, i, 64), mcpp::ops::rope_inv_freq(plain, i, 64));
    EXPECT_EQ(mcpp::ops::rope_inv_freq(RopeFreqs(10000.0), i, 64),
              std::pow(10000.0, -2.0 * double(i) / 64.0));
  }
  // Divides every frequency of both kinds (the Llama 3.x regions are decided before).
  f.interpolation = 4;
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_NEAR(mcpp::ops::rope_inv_freq(f, i, 64), ref_inv_freq(plain, i, 64) / 4,
                1e-14 * ref_inv_freq(plain, i, 64));
}

TEST(RopeInterpolation, CpuOpsRotateAtPositionOverFactor) {
  // Megatron's get_freqs_non_repeated: positions *= 1 / N. The reference rotates row s at the
  // position (s + off) / N with the frequencies of no interpolation, in fp64.
  for (const bool scaled : {false, true})
    for (const double N : {4.0, 2.5}) {  // Megatron's integer flag; a Hugging Face factor
      SCOPED_TRACE(::testing::Message() << "scaled " << scaled << " N " << N);
      RopeFreqs ref = scaled ? llama32() : RopeFreqs(500000.0);
      RopeFreqs f = ref;
      f.interpolation = N;
      const AttentionDims d = dims(7, 2, 4, 2, 64);
      const Tensor x = randn<double>({d.S, d.B, d.qkv_width()}, 43);
      const int64_t off = 20001;
      Tensor y = Tensor::empty(x.shape(), DType::F64);
      cpu::rope_forward(x, d, 64, f, off, y, Stream::cpu());
      auto at = [&](int64_t s, int64_t) { return double(s + off) / N; };
      EXPECT_LT(max_err(y, x, d, 64, ref, at), 1e-10);
      // Not the uninterpolated rotation.
      EXPECT_GT(max_err(y, x, d, 64, ref, [&](int64_t s, int64_t) { return double(s + off); }),
                0.1);
      // Per-token positions (--reset-position-ids) and a decode step's positions.
      Tensor pos = Tensor::empty({d.S, d.B}, DType::I64);
      for (int64_t k = 0; k < d.S * d.B; ++k) pos.data<int64_t>()[k] = 9001 + 37 * k;
      cpu::rope_positions(x, d, 64, f, pos, false, y, Stream::cpu());
      EXPECT_LT(
          max_err(y, x, d, 64, ref,
                  [&](int64_t s, int64_t b) { return double(9001 + 37 * (s * d.B + b)) / N; }),
          1e-10);
      AttentionDims d1 = d;
      d1.S = 1;
      const Tensor x1 = x.narrow(0, 1).clone();
      Tensor p1 = Tensor::empty({d.B}, DType::I64), y1 = Tensor::empty(x1.shape(), DType::F64);
      for (int64_t b = 0; b < d.B; ++b) p1.data<int64_t>()[b] = 12345 + 1001 * b;
      cpu::rope_decode(x1, d1, 64, f, p1, y1, Stream::cpu());
      EXPECT_LT(max_err(y1, x1, d1, 64, ref,
                        [&](int64_t, int64_t b) { return double(12345 + 1001 * b) / N; }),
                1e-10);
      // Backward undoes forward.
      Tensor back = Tensor::empty(x.shape(), DType::F64);
      cpu::rope_forward(x, d, 64, f, off, y, Stream::cpu());
      cpu::rope_backward(y, d, 64, f, off, back, Stream::cpu());
      double err = 0;
      for (int64_t k = 0; k < x.numel(); ++k)
        err = std::max(err, std::abs(back.data<double>()[k] - x.data<double>()[k]));
      EXPECT_LT(err, 1e-12);
    }
}

TEST(RopeInterpolation, RejectsNonPositiveFactor) {
  const AttentionDims d = dims(2, 1, 2, 1, 8);
  Tensor x = Tensor::zeros({2, 1, d.qkv_width()}, DType::F32);
  for (const double bad : {0.0, -2.0, double(NAN)}) {
    RopeFreqs f(10000.0);
    f.interpolation = bad;
    EXPECT_THROW(cpu::rope_forward(x, d, 8, f, 0, x, Stream::cpu()), mcpp::Error) << bad;
  }
}

}  // namespace rope_scaling_test
