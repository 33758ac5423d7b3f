// LayerNorm and RMSNorm over the last dimension on the CPU.
//   x, y, dy, dx: [..., H] (T rows of H), w, b, dw, db: [H], mean, rstd: T elements
//   (shape [T] or x's shape without H); one dtype, f32 or f64, statistics included.
//   Forward: y, mean, rstd overwritten. Backward: dx overwritten, or += with
//   accumulate_dx (the residual stream); dw, db += (parameter gradients).
// Rows are split across OpenMP threads; a row (H <= ~16K) stays in L1/L2 for the few
// passes over it. Parameter gradients sum over rows, so each thread accumulates its
// own [H] partials, reduced once at the end (deterministic for a given thread count).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

struct NormDims {
  int64_t T, H;
};

// Checks x, w (and y or dy/dx alike) and returns T rows of H.
NormDims norm_dims(const Check& c, const Tensor& x, const Tensor& w) {
  c.min_dim(x, "x", 1);
  const int64_t H = x.size(-1);
  c.shape(w, "w", {H});
  return {H ? x.numel() / H : 0, H};
}

// Per-thread partial sums of `k` gradient vectors of H (zero-initialised, so threads
// that get no rows, or a serial region, leave zeros), added into `outs` at the end.
template <typename R>
struct Partials {
  int64_t H, k;
  std::vector<R> buf;
  Partials(int64_t H_, int64_t k_) : H(H_), k(k_), buf(size_t(omp_get_max_threads() * k_ * H_)) {}
  R* of_thread(int i) { return buf.data() + int64_t(omp_get_thread_num()) * k * H + i * H; }
  void reduce_into(R* const* outs) {
    const int nt = omp_get_max_threads();
    for (int64_t i = 0; i < k; ++i) {
      R* out = outs[i];
#pragma omp parallel for schedule(static) if (H * nt > kParallelGrain)
      for (int64_t h = 0; h < H; ++h) {
        R acc = 0;
        for (int t = 0; t < nt; ++t) acc += buf[(t * k + i) * H + h];
        out[h] += acc;
      }
    }
  }
};

}  // namespace

// ---- LayerNorm -------------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, Tensor& y,
                       Tensor& mean, Tensor& rstd, Stream& s) {
  const Check c{"layernorm_forward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(w, "w", dt), c.dtype(b, "b", dt), c.dtype(y, "y", dt);
  c.dtype(mean, "mean", dt), c.dtype(rstd, "rstd", dt);
  const auto [T, H] = norm_dims(c, x, w);
  c.shape(b, "b", {H});
  c.shape(y, "y", x.shape());
  c.rows(mean, "mean", T), c.rows(rstd, "rstd", T);
  dispatch_float(dt, [&, T = T, H = H](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *W = w.data<R>(), *B = b.data<R>();
    R *Y = y.data<R>(), *MU = mean.data<R>(), *RS = rstd.data<R>();
    const R inv_h = R(1) / R(H), e = R(eps);
#pragma omp parallel for schedule(static) if (T * H > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      const R* xr = X + t * H;
      R* yr = Y + t * H;
      R sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t h = 0; h < H; ++h) sum += xr[h];
      const R mu = sum * inv_h;
      // Two passes (mean, then squared deviations) avoid E[x^2] - E[x]^2 cancellation.
      R var = 0;
#pragma omp simd reduction(+ : var)
      for (int64_t h = 0; h < H; ++h) var += (xr[h] - mu) * (xr[h] - mu);
      const R rs = R(1) / std::sqrt(var * inv_h + e);
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) yr[h] = (xr[h] - mu) * rs * W[h] + B[h];
      MU[t] = mu, RS[t] = rs;
    }
  });
}

// With xhat = (x - mean) rstd and g = dy w:
//   dx = rstd (g - mean_h(g) - xhat mean_h(g xhat)),  dw += sum_t dy xhat,  db += sum_t dy.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, bool accumulate_dx, Tensor& dw, Tensor& db,
                        Stream& s) {
  const Check c{"layernorm_backward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(w, "w", dt), c.dtype(mean, "mean", dt);
  c.dtype(rstd, "rstd", dt), c.dtype(dx, "dx", dt), c.dtype(dw, "dw", dt), c.dtype(db, "db", dt);
  const auto [T, H] = norm_dims(c, x, w);
  c.shape(dy, "dy", x.shape()), c.shape(dx, "dx", x.shape());
  c.shape(dw, "dw", {H}), c.shape(db, "db", {H});
  c.rows(mean, "mean", T), c.rows(rstd, "rstd", T);
  dispatch_float(dt, [&, T = T, H = H](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>(), *W = w.data<R>();
    const R *MU = mean.data<R>(), *RS = rstd.data<R>();
    R* DX = dx.data<R>();
    const R inv_h = R(1) / R(H);
    Partials<R> part(H, 2);
#pragma omp parallel if (T * H > kParallelGrain)
    {
      R* pdw = part.of_thread(0);
      R* pdb = part.of_thread(1);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        const R *xr = X + t * H, *dyr = DY + t * H;
        R* dxr = DX + t * H;
        const R mu = MU[t], rs = RS[t];
        R sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t h = 0; h < H; ++h) {
          const R xhat = (xr[h] - mu) * rs, g = dyr[h] * W[h];
          sg += g, sgx += g * xhat;
          pdw[h] += dyr[h] * xhat, pdb[h] += dyr[h];
        }
        const R mg = sg * inv_h, mgx = sgx * inv_h;
        if (accumulate_dx) {
#pragma omp simd
          for (int64_t h = 0; h < H; ++h)
            dxr[h] += rs * (dyr[h] * W[h] - mg - (xr[h] - mu) * rs * mgx);
        } else {
#pragma omp simd
          for (int64_t h = 0; h < H; ++h)
            dxr[h] = rs * (dyr[h] * W[h] - mg - (xr[h] - mu) * rs * mgx);
        }
      }
    }
    R* outs[2] = {dw.data<R>(), db.data<R>()};
    part.reduce_into(outs);
  });
}

// ---- RMSNorm ---------------------------------------------------------------------------

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
                     Stream& s) {
  const Check c{"rmsnorm_forward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(w, "w", dt), c.dtype(y, "y", dt), c.dtype(rstd, "rstd", dt);
  const auto [T, H] = norm_dims(c, x, w);
  c.shape(y, "y", x.shape());
  c.rows(rstd, "rstd", T);
  dispatch_float(dt, [&, T = T, H = H](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *W = w.data<R>();
    R *Y = y.data<R>(), *RS = rstd.data<R>();
    const R inv_h = R(1) / R(H), e = R(eps);
#pragma omp parallel for schedule(static) if (T * H > kParallelGrain)
    for (int64_t t = 0; t < T; ++t) {
      const R* xr = X + t * H;
      R* yr = Y + t * H;
      R ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t h = 0; h < H; ++h) ss += xr[h] * xr[h];
      const R rs = R(1) / std::sqrt(ss * inv_h + e);
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) yr[h] = xr[h] * rs * W[h];
      RS[t] = rs;
    }
  });
}

// With xhat = x rstd and g = dy w:  dx = rstd (g - xhat mean_h(g xhat)),  dw += sum_t dy xhat.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      Tensor& dx, bool accumulate_dx, Tensor& dw, Stream& s) {
  const Check c{"rmsnorm_backward"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(dy, "dy", dt), c.dtype(w, "w", dt), c.dtype(rstd, "rstd", dt);
  c.dtype(dx, "dx", dt), c.dtype(dw, "dw", dt);
  const auto [T, H] = norm_dims(c, x, w);
  c.shape(dy, "dy", x.shape()), c.shape(dx, "dx", x.shape()), c.shape(dw, "dw", {H});
  c.rows(rstd, "rstd", T);
  dispatch_float(dt, [&, T = T, H = H](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *DY = dy.data<R>(), *W = w.data<R>(), *RS = rstd.data<R>();
    R* DX = dx.data<R>();
    const R inv_h = R(1) / R(H);
    Partials<R> part(H, 1);
#pragma omp parallel if (T * H > kParallelGrain)
    {
      R* pdw = part.of_thread(0);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        const R *xr = X + t * H, *dyr = DY + t * H;
        R* dxr = DX + t * H;
        const R rs = RS[t];
        R sgx = 0;
#pragma omp simd reduction(+ : sgx)
        for (int64_t h = 0; h < H; ++h) {
          const R xhat = xr[h] * rs;
          sgx += dyr[h] * W[h] * xhat;
          pdw[h] += dyr[h] * xhat;
        }
        const R k = sgx * inv_h * rs;  // xhat mean(g xhat) = x k
        if (accumulate_dx) {
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) dxr[h] += rs * (dyr[h] * W[h] - xr[h] * k);
        } else {
#pragma omp simd
          for (int64_t h = 0; h < H; ++h) dxr[h] = rs * (dyr[h] * W[h] - xr[h] * k);
        }
      }
    }
    R* outs[1] = {dw.data<R>()};
    part.reduce_into(outs);
  });
}

}  // namespace mcpp::ops::cpu
