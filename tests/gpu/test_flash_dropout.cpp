// Attention dropout in the own flash kernel (src/ops/cuda/flash_attention.cu).
//
// Masks, bit for bit: with Q = 0 every probability of row q is 1/(q+1), and with one-hot
// K and V (K[k, d] = V[k, d] = [d == k], S <= HD) each kernel's result exposes its mask:
//   forward   out[q, k]  = z(q, k) / (q+1)                           (fa_fwd_kernel)
//   dO = e_q  dV[k, q]   = z(q, k) / (q+1)                           (fa_bwd_dkv_kernel)
//   dO = 1    dQ[q, k]   = s / (q+1) * (z(q, k) - delta_q)           (fa_bwd_dq_kernel)
// with z = 0 or DropoutMask::keep_scale(p). Each extracted mask must equal keep =
// DropoutMask::uniform(seed, stream, global (b, h, q, k) index) >= p (base/philox.h),
// which is the CPU op's mask (checked here on the CPU op's forward too), on the aligned
// path (S a multiple of 8) and the per-element one, whether the backward draws the mask,
// gets it from the dK/dV kernel or reads the bits the forward wrote; a TP2 split of the
// heads (h_offset) and a DP split of the batch (b_offset) must draw the full run's masks. Values: random inputs, GQA, S not a multiple of 64, head
// dims 64 and 128, bf16 and f16, forward and backward against the CPU op (f32 on the
// same rounded inputs); ops::attention_* with dropout must give the flash kernel's bits.
// The backward's dQ from the dS tiles the dK/dV kernel hands over (the default) and from
// the dQ kernel's own recomputation: both against the CPU op, the masks of both.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "ops/attention_backend.h"
#include "ops/cuda/flash_attention.h"

namespace mcpp::test {
namespace flash_dropout_test {

constexpr double kP = 0.3;
const ops::DropoutKey kKey{2024, 17};

cudaStream_t cs() { return static_cast<cudaStream_t>(GS().handle); }

// Q = 0, K[k, d] = V[k, d] = [d == k] for every (sequence, group).
Tensor structured_qkv(const ops::AttentionDims& d) {
  EXPECT_LE(d.S, d.HD) << "one-hot K and V need S <= HD";  // else K's ones land in V
  Tensor t = Tensor::empty({d.S, d.B, d.qkv_width()}, DType::F32);
  float* x = static_cast<float*>(t.raw());
  std::memset(x, 0, size_t(t.numel()) * sizeof(float));
  const int64_t G = d.NH / d.NG, W = d.qkv_width();
  for (int64_t s = 0; s < d.S; ++s)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t g = 0; g < d.NG; ++g) {
        float* kv = x + (s * d.B + b) * W + (g * (G + 2) + G) * d.HD;
        kv[s] = 1.f;          // K
        kv[d.HD + s] = 1.f;   // V
      }
  return t;
}

// Masks as [B, NH, S, S] bytes (1 kept), entries with k > q left 0.
using Mask = std::vector<uint8_t>;
size_t mi(const ops::AttentionDims& d, int64_t b, int64_t h, int64_t q, int64_t k) {
  return size_t(((b * d.NH + h) * d.S + q) * d.S + k);
}

Mask philox_mask(const ops::AttentionDims& d) {
  Mask m(size_t(d.B * d.NH * d.S * d.S), 0);
  const int64_t NHg = d.NH_global ? d.NH_global : d.NH, Sg = d.S_global ? d.S_global : d.S;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.NH; ++h)
      for (int64_t q = 0; q < d.S; ++q)
        for (int64_t k = 0; k <= q; ++k) {
          const uint64_t i = uint64_t(
              (((b + d.b_offset) * NHg + h + d.h_offset) * Sg + q + d.q_offset) * Sg + k +
              d.k_offset);
          m[mi(d, b, h, q, k)] = DropoutMask::uniform(kKey.seed, kKey.stream, i) >= kP;
        }
  return m;
}

struct Masks {
  Mask fwd, dkv, dq;
};

// Where the backward's kernels get the mask: Handoff, the dQ kernel reads the keep bits the
// dK/dV kernel drew and wrote (the dispatched op's path without saved bits); Draw, both
// draw it; Forward, the forward writes the bits it draws into a buffer and both backward
// kernels read them (the model's layers: AttentionDims::keep_bits).
enum class MaskFrom { Handoff, Draw, Forward };

// Runs the flash kernel directly (so no other kernel can stand in) on the structured
// input and reads the three masks back.
// ds: the backward hands dS from the dK/dV kernel to the dQ kernel (a buffer of garbage
// first, one sequence a chunk), so the dQ kernel's mask is the one the dK/dV kernel applied.
Masks flash_masks(const ops::AttentionDims& d, DType dt, MaskFrom from = MaskFrom::Handoff,
                  bool ds = false) {
  const int64_t S = d.S, B = d.B, NH = d.NH, HD = d.HD, G = d.NH / d.NG, W = d.qkv_width();
  const double scale = 1.0 / std::sqrt(double(HD)), z = DropoutMask::keep_scale(kP);
  Tensor gqkv = to_gpu(structured_qkv(d), dt);
  const gpu::FlashArgs fa{gqkv.raw(), d, dt, scale, kP, kKey};
  Tensor gout = gpu_nan({S, B, NH * HD}, dt), glse = gpu_nan({B, NH, S}, DType::F32);
  // Garbage first: every byte a kernel reads must have been written.
  auto garbage_buffer = [&]() {
    const int64_t mb = gpu::flash_attention_mask_bytes(fa);
    Tensor ws;
    if (mb > 0) {
      ws = Tensor::empty({(mb + 7) / 8}, DType::I64, Device::CUDA);
      CUDA_CHECK(cudaMemsetAsync(ws.raw(), 0xA5, size_t(mb), cs()));
    }
    return ws;
  };
  const Tensor saved = from == MaskFrom::Forward ? garbage_buffer() : Tensor();
  if (from == MaskFrom::Forward) EXPECT_TRUE(saved.defined() || d.S % 8 != 0);
  gpu::flash_attention_forward(fa, gout.raw(), static_cast<float*>(glse.raw()), cs(),
                               saved.defined() ? saved.raw() : nullptr);
  Tensor out = to_cpu(gout);
  const float* o = static_cast<const float*>(out.raw());
  Masks m;
  m.fwd.assign(size_t(B * NH * S * S), 0), m.dkv = m.fwd, m.dq = m.fwd;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t q = 0; q < S; ++q)
        for (int64_t k = 0; k <= q; ++k) m.fwd[mi(d, b, h, q, k)] = o[(q * B + b) * NH * HD + h * HD + k] != 0.f;

  // delta = rowsum(dO * O) as the op computes it (attention.cu), from the same out.
  auto delta_of = [&](const Tensor& dout_c) {
    Tensor delta = Tensor::empty({B, NH, S}, DType::F32);
    const float* dd = static_cast<const float*>(dout_c.raw());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t q = 0; q < S; ++q) {
          double acc = 0;
          for (int64_t e = 0; e < HD; ++e) {
            const int64_t i = (q * B + b) * NH * HD + h * HD + e;
            acc += double(dd[i]) * double(o[i]);
          }
          static_cast<float*>(delta.raw())[(b * NH + h) * S + q] = float(acc);
        }
    return delta;
  };
  auto backward = [&](const Tensor& dout_c) {
    Tensor delta = delta_of(dout_c);
    Tensor gdout = to_gpu(dout_c, dt), gdelta = to_gpu(delta, DType::F32);
    Tensor gdqkv = gpu_nan(gqkv.shape(), dt);
    const Tensor ws = from == MaskFrom::Handoff ? garbage_buffer() : saved;
    Tensor dsbuf;
    if (ds) {
      dsbuf = Tensor::empty({ops::flash_ds_bytes(1, NH, S) / 2}, dt, Device::CUDA);
      CUDA_CHECK(cudaMemsetAsync(dsbuf.raw(), 0xFF, size_t(dsbuf.numel()) * 2, cs()));
    }
    gpu::flash_attention_backward(fa, gdout.raw(), static_cast<const float*>(glse.raw()),
                                  static_cast<const float*>(gdelta.raw()), gdqkv.raw(), cs(),
                                  ws.defined() ? ws.raw() : nullptr, from == MaskFrom::Forward,
                                  ds ? dsbuf.raw() : nullptr, ds ? 1 : 0);
    return std::make_pair(to_cpu(gdqkv), delta);
  };
  // dO[q, h, :] = e_q: dV[k, q] = sum over the group's heads of Pd[q, k] (one head a group).
  Tensor dout = Tensor::empty({S, B, NH * HD}, DType::F32);
  float* dp = static_cast<float*>(dout.raw());
  std::memset(dp, 0, size_t(dout.numel()) * sizeof(float));
  for (int64_t q = 0; q < S; ++q)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h) dp[(q * B + b) * NH * HD + h * HD + q] = 1.f;
  {
    auto [dqkv, delta] = backward(dout);
    const float* g = static_cast<const float*>(dqkv.raw());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t q = 0; q < S; ++q)
          for (int64_t k = 0; k <= q; ++k)
            m.dkv[mi(d, b, h, q, k)] = g[(k * B + b) * W + (h * 3 + 2) * HD + q] != 0.f;
  }
  // dO = 1: dQ[q, k] = s/(q+1) (z_qk - delta_q); kept iff above the midpoint s/(q+1)(z/2 - delta).
  for (int64_t i = 0; i < dout.numel(); ++i) dp[i] = 1.f;
  {
    auto [dqkv, delta] = backward(dout);
    const float* g = static_cast<const float*>(dqkv.raw());
    const float* dl = static_cast<const float*>(delta.raw());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t q = 0; q < S; ++q)
          for (int64_t k = 0; k <= q; ++k) {
            const double v = g[(q * B + b) * W + (h * 3) * HD + k] * double(q + 1) / scale;
            m.dq[mi(d, b, h, q, k)] = v + dl[(b * NH + h) * S + q] > z / 2;
          }
  }
  (void)G;
  return m;
}

int64_t mismatches(const Mask& a, const Mask& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

ops::AttentionDims dims(int64_t S, int64_t B, int64_t NH, int64_t HD) {
  ops::AttentionDims d;
  d.S = S, d.B = B, d.NH = NH, d.NG = NH, d.HD = HD;
  return d;
}

class GpuFlashDropout : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

TEST_P(GpuFlashDropout, MasksAreThePhiloxMaskOfTheCpuOp) {
  // S = 64 / 128: the aligned path (one Philox block per eight keys, bits shuffled between
  // lanes); 127, 66 and 100 (a multiple of 4, not of 8): per-element draws; 104: aligned,
  // S not a multiple of 64. (The structured input needs S <= HD.)
  for (auto [S, HD] : {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {127, 128}, {66, 128},
                       {100, 128}, {104, 128}}) {
    SCOPED_TRACE(::testing::Message() << "S=" << S << " HD=" << HD << " " << dtype_name(dt()));
    const ops::AttentionDims d = dims(S, 2, 3, HD);
    const Mask want = philox_mask(d);
    int64_t kept = 0, total = 0;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.NH; ++h)
        for (int64_t q = 0; q < S; ++q)
          for (int64_t k = 0; k <= q; ++k) kept += want[mi(d, b, h, q, k)], ++total;
    // The oracle must drop some and keep most, or the comparison proves nothing.
    ASSERT_GT(kept, total / 2);
    ASSERT_LT(kept, total);
    const Masks m = flash_masks(d, dt());
    EXPECT_EQ(mismatches(m.fwd, want), 0) << "forward mask";
    EXPECT_EQ(mismatches(m.dkv, want), 0) << "dK/dV kernel mask";
    EXPECT_EQ(mismatches(m.dq, want), 0) << "dQ kernel mask (handed over from dK/dV)";
    EXPECT_EQ(mismatches(flash_masks(d, dt(), MaskFrom::Draw).dq, want), 0)
        << "dQ kernel mask (drawn)";
    const Masks saved = flash_masks(d, dt(), MaskFrom::Forward);
    EXPECT_EQ(mismatches(saved.fwd, want), 0) << "forward mask (writing its bits)";
    EXPECT_EQ(mismatches(saved.dkv, want), 0) << "dK/dV kernel mask (the forward's bits)";
    EXPECT_EQ(mismatches(saved.dq, want), 0) << "dQ kernel mask (the forward's bits)";
    for (MaskFrom from : {MaskFrom::Draw, MaskFrom::Forward}) {
      const Masks viads = flash_masks(d, dt(), from, true);
      const char* how = from == MaskFrom::Draw ? "drawn" : "the forward's bits";
      EXPECT_EQ(mismatches(viads.dkv, want), 0) << "dK/dV kernel mask writing dS, " << how;
      EXPECT_EQ(mismatches(viads.dq, want), 0) << "dQ from the dS tiles, " << how;
    }
  }
  // The CPU op's own mask, read the same way from its forward.
  const ops::AttentionDims d = dims(64, 2, 3, 64);
  Tensor out = Tensor::empty({d.S, d.B, d.NH * d.HD}, DType::F32);
  Tensor lse = Tensor::empty({d.B, d.NH, d.S}, DType::F32);
  cpu::attention_forward(structured_qkv(d), d, 0.125, kP, kKey, out, lse, CS());
  Mask cpu_mask(size_t(d.B * d.NH * d.S * d.S), 0);
  const float* o = static_cast<const float*>(out.raw());
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.NH; ++h)
      for (int64_t q = 0; q < d.S; ++q)
        for (int64_t k = 0; k <= q; ++k)
          cpu_mask[mi(d, b, h, q, k)] = o[(q * d.B + b) * d.NH * d.HD + h * d.HD + k] != 0.f;
  EXPECT_EQ(mismatches(cpu_mask, philox_mask(d)), 0) << "the CPU op's mask";
  EXPECT_EQ(mismatches(flash_masks(d, dt()).fwd, cpu_mask), 0) << "flash vs CPU op";
}

// TP2: each rank holds half the heads (h_offset, NH_global); DP2: each rank one of the
// two sequences (b_offset). Every kernel of every rank draws the full run's mask.
TEST_P(GpuFlashDropout, SplitsOfHeadsAndBatchDrawTheFullRunsMask) {
  for (int64_t S : {128, 120, 126}) {
    SCOPED_TRACE(::testing::Message() << "S=" << S << " " << dtype_name(dt()));
    const ops::AttentionDims full = dims(S, 2, 4, 128);
    const Masks fm = flash_masks(full, dt());
    ASSERT_EQ(mismatches(fm.fwd, philox_mask(full)), 0);
    for (int tp = 0; tp < 2; ++tp) {
      ops::AttentionDims d = dims(S, 2, 2, 128);
      d.h_offset = 2 * tp, d.NH_global = 4;
      const Masks m = flash_masks(d, dt(), tp == 0 ? MaskFrom::Forward : MaskFrom::Handoff);
      int64_t bad[3] = {0, 0, 0};
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t q = 0; q < S; ++q)
            for (int64_t k = 0; k <= q; ++k) {
              const uint8_t w = fm.fwd[mi(full, b, h + 2 * tp, q, k)];
              bad[0] += m.fwd[mi(d, b, h, q, k)] != w;
              bad[1] += m.dkv[mi(d, b, h, q, k)] != w;
              bad[2] += m.dq[mi(d, b, h, q, k)] != w;
            }
      EXPECT_EQ(bad[0] + bad[1] + bad[2], 0)
          << "TP rank " << tp << ": fwd " << bad[0] << " dkv " << bad[1] << " dq " << bad[2];
    }
    ops::AttentionDims d = dims(S, 1, 4, 128);
    d.b_offset = 1;
    const Masks m = flash_masks(d, dt());
    int64_t bad = 0;
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t q = 0; q < S; ++q)
        for (int64_t k = 0; k <= q; ++k) {
          const uint8_t w = fm.fwd[mi(full, 1, h, q, k)];
          bad += (m.fwd[mi(d, 0, h, q, k)] != w) + (m.dkv[mi(d, 0, h, q, k)] != w) +
                 (m.dq[mi(d, 0, h, q, k)] != w);
        }
    EXPECT_EQ(bad, 0) << "DP rank 1";
  }
}

// Random inputs: the dispatched op (which must run the flash kernel: bitwise its result)
// against the CPU op, forward and backward, GQA, S not a multiple of 64 or of 4.
TEST_P(GpuFlashDropout, ValuesMatchTheCpuOp) {
  struct C {
    int64_t S, B, NH, NG, HD;
  };
  for (C c : {C{200, 2, 4, 2, 64}, C{130, 2, 6, 2, 64}, C{192, 1, 4, 1, 128}, C{77, 2, 2, 2, 128}}) {
    ops::AttentionDims d;
    d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
    // As the model does under TP2 (rank 1 of 2): global coordinates offset.
    d.h_offset = c.NH, d.NH_global = 2 * c.NH, d.b_offset = 3;
    const double scale = 1.0 / std::sqrt(double(c.HD));
    SCOPED_TRACE(::testing::Message() << "S=" << c.S << " B=" << c.B << " NH=" << c.NH
                                      << " NG=" << c.NG << " HD=" << c.HD << " "
                                      << dtype_name(dt()));
    Tensor qkv = rand_in({c.S, c.B, d.qkv_width()}, 500 + c.S, dt(), -2.f, 2.f);
    Tensor out = Tensor::empty({c.S, c.B, c.NH * c.HD}, DType::F32);
    Tensor lse = Tensor::empty({c.B, c.NH, c.S}, DType::F32);
    cpu::attention_forward(qkv, d, scale, 0.1, kKey, out, lse, CS());
    Tensor gqkv = to_gpu(qkv, dt());
    Tensor gout = gpu_nan(out.shape(), dt()), glse = gpu_nan(lse.shape(), DType::F32);
    gpu::attention_forward(gqkv, d, scale, 0.1, kKey, gout, glse, GS());
    EXPECT_CLOSE(gout, out, dt());
    EXPECT_CLOSE(glse, lse, DType::F32);
    const gpu::FlashArgs fa{gqkv.raw(), d, dt(), scale, 0.1, kKey};
    Tensor fout = gpu_nan(out.shape(), dt()), flse = gpu_nan(lse.shape(), DType::F32);
    gpu::flash_attention_forward(fa, fout.raw(), static_cast<float*>(flse.raw()), cs());
    Tensor a = to_cpu(gout), b = to_cpu(fout);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.numel()) * 4), 0)
        << "ops::attention_forward with dropout did not run the flash kernel";

    Tensor dout = rand_in(out.shape(), 600 + c.S, dt());
    Tensor out_r = rounded(out, dt());
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
    cpu::attention_backward(dout, qkv, out_r, lse, d, scale, 0.1, kKey, dqkv, CS());
    Tensor gdqkv = gpu_nan(qkv.shape(), dt());
    gpu::attention_backward(to_gpu(dout, dt()), gqkv, to_gpu(out_r, dt()), to_gpu(lse, DType::F32),
                            d, scale, 0.1, kKey, gdqkv, GS());
    EXPECT_CLOSE(gdqkv, dqkv, dt());
    // With the keep bits kept from forward to backward (the model's layers), the same bits
    // out of both, whatever the buffer held before.
    {
      ops::AttentionDims dk = d;
      const int64_t mb = ops::flash_dropout_mask_bytes(d.B, d.NH, d.S);
      dk.keep_bits = Tensor::empty({(mb + 7) / 8}, DType::I64, Device::CUDA);
      CUDA_CHECK(cudaMemsetAsync(dk.keep_bits.raw(), 0x5A, size_t(mb), cs()));
      Tensor kout = gpu_nan(out.shape(), dt()), klse = gpu_nan(lse.shape(), DType::F32);
      gpu::attention_forward(gqkv, dk, scale, 0.1, kKey, kout, klse, GS());
      Tensor ka = to_cpu(kout);
      EXPECT_EQ(std::memcmp(a.raw(), ka.raw(), size_t(a.numel()) * 4), 0) << "out, kept bits";
      Tensor kdqkv = gpu_nan(qkv.shape(), dt());
      gpu::attention_backward(to_gpu(dout, dt()), gqkv, to_gpu(out_r, dt()),
                              to_gpu(lse, DType::F32), dk, scale, 0.1, kKey, kdqkv, GS());
      Tensor x = to_cpu(gdqkv), y = to_cpu(kdqkv);
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), size_t(x.numel()) * 4), 0) << "dqkv, kept bits";
    }
    // Without dropout the same inputs give other values (the mask is really applied).
    Tensor nout = Tensor::empty(out.shape(), DType::F32), nlse = Tensor::empty(lse.shape(), DType::F32);
    cpu::attention_forward(qkv, d, scale, 0.0, kKey, nout, nlse, CS());
    EXPECT_GT(rel_err(to_cpu(gout), nout), 10 * tol(dt()));
  }
}

// The backward's two dQ paths (the dQ kernel recomputing dS, or reading the dS tiles the
// dK/dV kernel wrote, in one chunk or a sequence at a time), with and without dropout,
// against the CPU op: dK and dV the same bits on every path (the same kernel), dQ within
// tolerance of the CPU op on each, and the chunked dS path the bits of the unchunked one.
// The dS buffer holds garbage first (every tile the dQ kernel reads must be written).
TEST_P(GpuFlashDropout, BackwardDqPathsMatchTheCpuOp) {
  struct C {
    int64_t S, B, NH, NG, HD;
  };
  for (double p : {0.0, 0.1})
    for (C c : {C{200, 3, 4, 2, 64}, C{130, 2, 6, 6, 64}, C{192, 2, 4, 1, 128}, C{77, 2, 2, 2, 128}}) {
      ops::AttentionDims d;
      d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
      const double scale = 1.0 / std::sqrt(double(c.HD));
      SCOPED_TRACE(::testing::Message() << "p=" << p << " S=" << c.S << " B=" << c.B << " NH="
                                        << c.NH << " NG=" << c.NG << " HD=" << c.HD << " "
                                        << dtype_name(dt()));
      Tensor qkv = rand_in({c.S, c.B, d.qkv_width()}, 700 + c.S, dt(), -2.f, 2.f);
      Tensor out = Tensor::empty({c.S, c.B, c.NH * c.HD}, DType::F32);
      Tensor lse = Tensor::empty({c.B, c.NH, c.S}, DType::F32);
      cpu::attention_forward(qkv, d, scale, p, kKey, out, lse, CS());
      Tensor dout = rand_in(out.shape(), 800 + c.S, dt());
      Tensor out_r = rounded(out, dt());
      Tensor dqkv = Tensor::empty(qkv.shape(), DType::F32);
      cpu::attention_backward(dout, qkv, out_r, lse, d, scale, p, kKey, dqkv, CS());
      // delta = rowsum(dO * O) on the rounded inputs, as the op computes it.
      Tensor delta = Tensor::empty({c.B, c.NH, c.S}, DType::F32);
      {
        Tensor dr = rounded(dout, dt());
        const float* dd = static_cast<const float*>(dr.raw());
        const float* o = static_cast<const float*>(out_r.raw());
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.NH; ++h)
            for (int64_t q = 0; q < c.S; ++q) {
              double acc = 0;
              for (int64_t e = 0; e < c.HD; ++e) {
                const int64_t i = (q * c.B + b) * c.NH * c.HD + h * c.HD + e;
                acc += double(dd[i]) * double(o[i]);
              }
              static_cast<float*>(delta.raw())[(b * c.NH + h) * c.S + q] = float(acc);
            }
      }
      Tensor gqkv = to_gpu(qkv, dt()), gdout = to_gpu(dout, dt()),
             glse = to_gpu(lse, DType::F32), gdelta = to_gpu(delta, DType::F32);
      const gpu::FlashArgs fa{gqkv.raw(), d, dt(), scale, p, kKey};
      Tensor res[3];
      for (int path = 0; path < 3; ++path) {  // recompute; dS in one chunk; a sequence a chunk
        const int64_t chunk = path == 0 ? 0 : path == 1 ? c.B : 1;
        Tensor dsbuf, mask;
        if (chunk > 0) {
          dsbuf = Tensor::empty({ops::flash_ds_bytes(chunk, c.NH, c.S) / 2}, dt(), Device::CUDA);
          CUDA_CHECK(cudaMemsetAsync(dsbuf.raw(), 0xFF, size_t(dsbuf.numel()) * 2, cs()));
        } else if (const int64_t mb = gpu::flash_attention_mask_bytes(fa); mb > 0) {
          mask = Tensor::empty({(mb + 7) / 8}, DType::I64, Device::CUDA);
        }
        Tensor g = gpu_nan(qkv.shape(), dt());
        gpu::flash_attention_backward(fa, gdout.raw(), static_cast<const float*>(glse.raw()),
                                      static_cast<const float*>(gdelta.raw()), g.raw(), cs(),
                                      mask.defined() ? mask.raw() : nullptr, false,
                                      chunk > 0 ? dsbuf.raw() : nullptr, chunk);
        EXPECT_CLOSE(g, dqkv, dt()) << "path " << path;
        res[path] = to_cpu(g);
      }
      const int64_t G = c.NH / c.NG, W = d.qkv_width();
      int64_t kv_diff = 0, q_diff = 0, chunk_diff = 0;
      for (int64_t i = 0; i < res[0].numel(); ++i) {
        const float* r0 = static_cast<const float*>(res[0].raw());
        const float* r1 = static_cast<const float*>(res[1].raw());
        const float* r2 = static_cast<const float*>(res[2].raw());
        const bool is_q = (i % W) / c.HD % (G + 2) < G;
        (is_q ? q_diff : kv_diff) += r0[i] != r1[i];
        chunk_diff += std::memcmp(&r1[i], &r2[i], 4) != 0;
      }
      EXPECT_EQ(kv_diff, 0) << "dK/dV differ between the dQ paths";
      EXPECT_EQ(chunk_diff, 0) << "the chunked dS path differs from the unchunked one";
      (void)q_diff;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuFlashDropout, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// Which kernel family runs follows the device, the image and MCPP_FLASH_WGMMA, and the
// start-up line names it. (gpu-check runs this file twice: as built, and with
// MCPP_FLASH_WGMMA=0, when the mma.sync kernels must run.)
TEST(GpuFlashKernels, FamilyFollowsTheDeviceAndTheStartUpLineNamesIt) {
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  const char* env = std::getenv("MCPP_FLASH_WGMMA");
  const bool wg = ops::cuda::flash_attention_uses_wgmma();
  if (major != 9 || minor != 0 || (env && std::strcmp(env, "0") == 0)) EXPECT_FALSE(wg);
  const std::string line = ops::describe_attention_backend(Device::CUDA, DType::BF16, 64, 0.1, 12);
  EXPECT_NE(line.find("own flash kernel with dropout"), std::string::npos) << line;
  EXPECT_NE(line.find(wg ? "Hopper wgmma kernels" : "mma.sync kernels"), std::string::npos)
      << line;
}

}  // namespace flash_dropout_test
}  // namespace mcpp::test
