// Dropout fused with the residual add, on the CPU; one dtype per call, f32 or f64.
//   x, residual, out, dout, dx: [d0, d1, d2], a block of a global [G0, G1, G2] tensor
//   (GlobalIndex3). out = residual + mask x / (1 - p)  (=; out may alias residual);
//   dx = mask dout / (1 - p)  (=; dx may alias dout).
// The mask is never stored: element (i0, i1, i2) is kept iff its 16-bit uniform
// DropoutMask::u16(seed, stream, global index) >= DropoutMask::threshold(p) (base/philox.h),
// so any partition of the global tensor (SP, CP, DP, TP) and the backward pass draw the
// same mask; kept values are scaled by DropoutMask::keep_scale(p).
#include <algorithm>
#include <cmath>

#include "base/philox.h"
#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

constexpr int64_t kChunk = 1024;  // elements of a row whose random bits are drawn at once

// Validates shapes, p and the global index map; returns the keep threshold on u16.
uint32_t check_dropout(const Check& c, const Tensor& x, double p, const GlobalIndex3& g) {
  MCPP_CHECK(x.dim() == 3, "{}: expected a 3-D [d0, d1, d2] tensor, found {}", c.op,
             shape_str(x.shape()));
  MCPP_CHECK(p >= 0 && p <= 1, "{}: dropout probability {} is outside [0, 1]", c.op, p);
  if (p > 0) {
    MCPP_CHECK(x.size(0) == 0 || (g.row0(0) >= 0 && g.row0(x.size(0) - 1) < g.global[0]),
               "{}: local rows of {} (offset {}, split at {} jumping {}) leave the global "
               "length {}",
               c.op, shape_str(x.shape()), g.offset[0], g.split0, g.jump0, g.global[0]);
    for (int d = g.split0 == INT64_MAX ? 0 : 1; d < 3; ++d)
      MCPP_CHECK_HINT(g.offset[d] >= 0 && g.offset[d] + x.size(d) <= g.global[d],
                      "pass GlobalIndex3::whole(d0, d1, d2) for an unpartitioned tensor",
                      "{}: local block {} at offset ({}, {}, {}) does not fit the global "
                      "shape [{}, {}, {}] (dim {})",
                      c.op, shape_str(x.shape()), g.offset[0], g.offset[1], g.offset[2],
                      g.global[0], g.global[1], g.global[2], d);
  }
  return DropoutMask::threshold(p);
}

// keep[i] = DropoutMask::u16(key, first + i) >= threshold for i < n (n <= kChunk). Eight
// consecutive indices share one Philox block, so a block is computed once per eight.
// The rounds are DropoutMask::block written out on scalars so that GCC vectorises them
// across blocks (DropoutMask::block itself is the scalar reference the tests compare to).
void draw_keep(DropoutKey key, uint64_t first, int64_t n, uint32_t threshold, uint8_t* keep) {
  constexpr int64_t kBlocks = kChunk / 8 + 2;
  uint32_t words[4 * kBlocks];
  const uint64_t j0 = first >> 3;
  const int64_t nb = int64_t(((first + uint64_t(n) - 1) >> 3) - j0 + 1);
  const uint32_t k0 = uint32_t(key.seed), k1 = uint32_t(key.seed >> 32);
  const uint32_t s0 = uint32_t(key.stream), s1 = uint32_t(key.stream >> 32);
#pragma omp simd
  for (int64_t j = 0; j < nb; ++j) {
    const uint64_t q = j0 + uint64_t(j);
    uint32_t c0 = uint32_t(q), c1 = uint32_t(q >> 32), c2 = s0, c3 = s1, a = k0, b = k1;
#pragma GCC unroll 7
    for (int r = 0; r < DropoutMask::kRounds; ++r) {
      const uint64_t p0 = uint64_t(Philox::kM0) * c0, p1 = uint64_t(Philox::kM1) * c2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ a, n2 = uint32_t(p0 >> 32) ^ c3 ^ b;
      c0 = n0, c1 = uint32_t(p1), c2 = n2, c3 = uint32_t(p0);
      a += Philox::kW0, b += Philox::kW1;
    }
    words[4 * j] = c0, words[4 * j + 1] = c1, words[4 * j + 2] = c2, words[4 * j + 3] = c3;
  }
  // Element e of the blocks from j0 on: half e & 1 of word e >> 1 (DropoutMask::pick).
  const int64_t skip = int64_t(first & 7);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = skip + i;
    keep[i] = ((words[e >> 1] >> (16 * (e & 1))) & 0xFFFFu) >= threshold;
  }
}

// Calls body(row, global_index_of_element_0) for each of the d0*d1 rows, in parallel.
template <class F>
void for_rows(const Tensor& x, const GlobalIndex3& g, F&& body) {
  const int64_t d0 = x.size(0), d1 = x.size(1);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
  for (int64_t r = 0; r < d0 * d1; ++r) {
    const int64_t i0 = r / d1, i1 = r % d1;
    body(r, uint64_t((g.row0(i0) * g.global[1] + (i1 + g.offset[1])) * g.global[2] +
                     g.offset[2]));
  }
}

}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& residual, double p, DropoutKey key,
                         const GlobalIndex3& g, Tensor& out, Stream& s) {
  const Check c{"dropout_add_forward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(out, "out", dt);
  c.shape(out, "out", x.shape());
  const bool has_res = residual.defined();
  if (has_res) c.dtype(residual, "residual", dt), c.shape(residual, "residual", x.shape());
  const uint32_t threshold = check_dropout(c, x, p, g);
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *RES = has_res ? residual.data<R>() : nullptr;
    R* O = out.data<R>();
    const int64_t H = x.size(2);
    if (p == 0) {  // no mask to draw: plain add or copy
      const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) O[i] = (has_res ? RES[i] : R(0)) + X[i];
      return;
    }
    const R sc = R(DropoutMask::keep_scale(p));
    for_rows(x, g, [&](int64_t r, uint64_t gi) {
      uint8_t keep[kChunk];
      for (int64_t h0 = 0; h0 < H; h0 += kChunk) {
        const int64_t n = std::min(kChunk, H - h0), o = r * H + h0;
        draw_keep(key, gi + uint64_t(h0), n, threshold, keep);
        if (has_res) {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) O[o + i] = RES[o + i] + (keep[i] ? X[o + i] * sc : R(0));
        } else {
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) O[o + i] = keep[i] ? X[o + i] * sc : R(0);
        }
      }
    });
  });
}

void dropout_backward(const Tensor& dout, double p, DropoutKey key, const GlobalIndex3& g,
                      Tensor& dx, Stream& s) {
  const Check c{"dropout_backward"};
  c.stream(s);
  const DType dt = c.floating(dout, "dout");
  c.dtype(dx, "dx", dt);
  c.shape(dx, "dx", dout.shape());
  const uint32_t threshold = check_dropout(c, dout, p, g);
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* DO = dout.data<R>();
    R* DX = dx.data<R>();
    const int64_t H = dout.size(2);
    if (p == 0) {
      if (DX != DO) std::copy(DO, DO + dout.numel(), DX);
      return;
    }
    const R sc = R(DropoutMask::keep_scale(p));
    for_rows(dout, g, [&](int64_t r, uint64_t gi) {
      uint8_t keep[kChunk];
      for (int64_t h0 = 0; h0 < H; h0 += kChunk) {
        const int64_t n = std::min(kChunk, H - h0), o = r * H + h0;
        draw_keep(key, gi + uint64_t(h0), n, threshold, keep);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) DX[o + i] = keep[i] ? DO[o + i] * sc : R(0);
      }
    });
  });
}

void random_normal(DropoutKey key, const GlobalIndex3& g, Tensor& y, Stream& s) {
  const Check c{"random_normal"};
  c.stream(s);
  const DType dt = c.floating(y, "y");
  check_dropout(c, y, 1.0, g);  // the block fits the global tensor
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    R* Y = y.data<R>();
    const int64_t H = y.size(2);
    for_rows(y, g, [&](int64_t r, uint64_t gi) {
      for (int64_t h = 0; h < H; ++h)
        Y[r * H + h] = R(Philox::normal(key.seed, key.stream, gi + uint64_t(h)));
    });
  });
}

void uniform_scale(const Tensor& x, double lo, double hi, DropoutKey key, const GlobalIndex3& g,
                   Tensor& y, Stream& s) {
  const Check c{"uniform_scale"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.shape(y, "y", x.shape());
  check_dropout(c, x, 1.0, g);  // the block fits the global tensor
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    R* Y = y.data<R>();
    const int64_t H = x.size(2);
    for_rows(x, g, [&](int64_t r, uint64_t gi) {
      for (int64_t h = 0; h < H; ++h) {
        const double u = Philox::uniform(key.seed, key.stream, gi + uint64_t(h));
        Y[r * H + h] = R(double(X[r * H + h]) * (lo + (hi - lo) * u));
      }
    });
  });
}

}  // namespace mcpp::ops::cpu
