// Elementwise ops on the CPU.
//   fill:          x = value; x of f32 f64 bf16 f16 i32 i64.
//   copy:          dst = convert(src), same numel, any pair of f32 f64 bf16 f16 i32 i64
//                  (bf16/f16 round to nearest even via tensor/dtype.h; f64 -> bf16/f16
//                  goes through f32). CPU tensors only: host <-> device is the CUDA backend.
//   add:           out = a + b (out may alias a or b); axpy: y += alpha x; scale: x *= alpha.
//   sum_squares:   sum of x^2 accumulated in f64;  has_nonfinite: any NaN or Inf.
//   dot:           sum of x*y accumulated in f64 (f32 or f64, one dtype), in index order.
//   transpose:     y[C, R] = x[R, C]^T for any dtype (the batch's [B, S] -> [S, B]).
// add/axpy/scale/sum_squares/has_nonfinite take f32 or f64, one dtype per call.
#include <cstring>
#include <type_traits>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

// Storage types with their conversions to and from a plain arithmetic value.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};
inline float load(Bf16 v) { return bf16_to_float(v.bits); }
inline float load(F16 v) { return f16_to_float(v.bits); }
template <typename V>
inline V load(V v) {
  return v;
}
template <typename D, typename V>
inline D store(V v) {
  if constexpr (std::is_same_v<D, Bf16>)
    return Bf16{float_to_bf16(float(v))};
  else if constexpr (std::is_same_v<D, F16>)
    return F16{float_to_f16(float(v))};
  else
    return static_cast<D>(v);
}

// Calls f(E{}) with E the storage type of dt.
template <class F>
void dispatch_storage(const Check& c, const Tensor& t, const char* name, F&& f) {
  switch (t.dtype()) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    case DType::BF16:
      return f(Bf16{});
    case DType::F16:
      return f(F16{});
    case DType::I32:
      return f(int32_t{});
    case DType::I64:
      return f(int64_t{});
    default:
      MCPP_FAIL("{}: tensor '{}' is {}; supported: f32 f64 bf16 f16 i32 i64", c.op, name, t.str());
  }
}

}  // namespace

void fill(Tensor& x, double value, Stream& s) {
  const Check c{"fill"};
  c.stream(s);
  c.defined(x, "x");
  dispatch_storage(c, x, "x", [&](auto tag) {
    using E = decltype(tag);
    E* X = static_cast<E*>(x.raw());
    const E v = store<E>(value);
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) X[i] = v;
  });
}

void copy(const Tensor& src, Tensor& dst, Stream& s) {
  const Check c{"copy"};
  c.stream(s);
  c.defined(src, "src");
  c.defined(dst, "dst");
  c.numel(dst, "dst", src.numel());
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    if (src.raw() != dst.raw()) std::memmove(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  dispatch_storage(c, src, "src", [&](auto stag) {
    using S = decltype(stag);
    dispatch_storage(c, dst, "dst", [&](auto dtag) {
      using D = decltype(dtag);
      const S* in = static_cast<const S*>(src.raw());
      D* out = static_cast<D*>(dst.raw());
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) out[i] = store<D>(load(in[i]));
    });
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out, Stream& s) {
  const Check c{"add"};
  c.stream(s);
  const DType dt = c.floating(a, "a");
  c.dtype(b, "b", dt), c.dtype(out, "out", dt);
  c.shape(b, "b", a.shape()), c.shape(out, "out", a.shape());
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *A = a.data<R>(), *B = b.data<R>();
    R* O = out.data<R>();
    const int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) O[i] = A[i] + B[i];
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y, Stream& s) {
  const Check c{"axpy"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.shape(y, "y", x.shape());
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    R* Y = y.data<R>();
    const R al = R(alpha);
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) Y[i] += al * X[i];
  });
}

void scale(Tensor& x, double alpha, Stream& s) {
  const Check c{"scale"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    R* X = x.data<R>();
    const R al = R(alpha);
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) X[i] *= al;
  });
}

double sum_squares(const Tensor& x, Stream& s) {
  const Check c{"sum_squares"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  return dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    const int64_t n = x.numel();
    double acc = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) acc += double(X[i]) * double(X[i]);
    return acc;
  });
}

std::vector<double> sum_squares_each(const std::vector<Tensor>& xs, Stream& s) {
  std::vector<double> r;
  r.reserve(xs.size());
  for (const Tensor& x : xs) r.push_back(sum_squares(x, s));
  return r;
}

bool has_nonfinite(const Tensor& x, Stream& s) {
  const Check c{"has_nonfinite"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  return dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R* X = x.data<R>();
    const int64_t n = x.numel();
    // x - x is 0 for finite x and NaN for NaN or +-Inf; no early exit, so it vectorises.
    int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) bad |= (X[i] - X[i]) != R(0);
    return bad != 0;
  });
}

double dot(const Tensor& x, const Tensor& y, Stream& s) {
  const Check c{"dot"};
  c.stream(s);
  const DType dt = c.floating(x, "x");
  c.dtype(y, "y", dt);
  c.numel(y, "y", x.numel());
  return dispatch_float(dt, [&](auto tag) {
    using R = decltype(tag);
    const R *X = x.data<R>(), *Y = y.data<R>();
    double acc = 0;  // serial: the same sum on every run and thread count
    for (int64_t i = 0, n = x.numel(); i < n; ++i) acc += double(X[i]) * double(Y[i]);
    return acc;
  });
}

// The CPU has nothing to overlap: the sum itself, kept in a one-element partial.
void dot_begin(const Tensor& x, const Tensor& y, Tensor& partial, Stream& s) {
  if (!partial.defined() || partial.numel() != 1 || partial.dtype() != DType::F64 ||
      partial.device() != Device::CPU)
    partial = Tensor::empty({1}, DType::F64);
  partial.data<double>()[0] = dot(x, y, s);
}

double dot_end(const Tensor& partial, Stream& s) {
  const Check c{"dot_end"};
  c.stream(s);
  MCPP_CHECK(partial.defined() && partial.numel() == 1 && partial.dtype() == DType::F64,
             "dot_end: partial {} is not dot_begin's", partial.str());
  return partial.data<double>()[0];
}

void transpose(const Tensor& x, Tensor& y, Stream& s) {
  const Check c{"transpose"};
  c.stream(s);
  c.defined(x, "x");
  c.dtype(y, "y", x.dtype());
  MCPP_CHECK(x.dim() == 2, "transpose: x is {}, expected 2-D", x.str());
  const int64_t R = x.size(0), C = x.size(1);
  c.shape(y, "y", {C, R});
  const size_t es = dtype_size(x.dtype());
  const auto* in = static_cast<const unsigned char*>(x.raw());
  auto* out = static_cast<unsigned char*>(y.raw());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < C; ++k) std::memcpy(out + (k * R + r) * es, in + (r * C + k) * es, es);
}

}  // namespace mcpp::ops::cpu
