// mappings_driver: under mpirun (the whole world is the TP group), checks every region
// transition of parallel/tensor_parallel/mappings.h: its values on known data, and that
// the backward is the adjoint of the forward over the group,
//   sum_ranks <F(x), dy> == sum_ranks <x, B(dy)>,
// which is what "dual" means. Prints "all checks passed" or FAIL lines.
#include <cmath>
#include <cstdio>
#include <functional>

#include "comm/world.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

using namespace mcpp;
namespace P = mcpp::parallel;

static int g_fail = 0;
static void check(bool ok, const char* what, int rank) {
  if (!ok) {
    ++g_fail;
    std::printf("[rank %d] FAIL: %s\n", rank, what);
  }
}

int main() {
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  comm::Communicator& tp = world->world();
  Stream& st = ops::default_stream(Device::CPU);
  const int R = tp.size(), r = tp.rank();
  auto filled = [](Shape s, const std::function<float(int64_t)>& f) {
    Tensor t = Tensor::empty(s, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = f(i);
    return t;
  };
  auto dot = [&](const Tensor& a, const Tensor& b) {
    Tensor s = Tensor::empty({1}, DType::F64);
    s.data<double>()[0] = ops::dot(a, b, st);
    tp.all_reduce(s, comm::ReduceOp::Sum, st);
    return s.data<double>()[0];
  };
  auto rnd = [&](Shape s, int salt) {
    return filled(s, [&](int64_t i) {
      return float(std::sin(double(i * 7 + salt * 13 + r * 101)) * 0.5);
    });
  };
  const int64_t rows = 3, n = 2;

  // Values: gather/scatter along the last dim.
  Tensor x = filled({rows, n}, [&](int64_t i) { return float(100 * r + 10 * (i / n) + i % n); });
  Tensor y = Tensor::empty({rows, R * n}, DType::F32);
  P::gather_from_tp(x, y, tp, st);
  bool ok = true;
  for (int64_t i = 0; i < rows; ++i)
    for (int q = 0; q < R; ++q)
      for (int64_t j = 0; j < n; ++j)
        ok &= y.data<float>()[i * R * n + q * n + j] == float(100 * q + 10 * i + j);
  check(ok, "gather_from_tp values", r);
  Tensor back = Tensor::empty({rows, n}, DType::F32);
  P::scatter_to_tp(y, back, tp, st);
  ok = true;
  for (int64_t i = 0; i < x.numel(); ++i) ok &= back.data<float>()[i] == x.data<float>()[i];
  check(ok, "scatter_to_tp(gather_from_tp(x)) == x", r);

  // Values: sequence-parallel all-gather and reduce-scatter along dim 0.
  Tensor xs = filled({2, 3}, [&](int64_t i) { return float(10 * r + i); });
  Tensor ys = Tensor::empty({2 * R, 3}, DType::F32);
  P::gather_from_sp(xs, ys, tp, st);
  ok = true;
  for (int q = 0; q < R; ++q)
    for (int64_t i = 0; i < 6; ++i) ok &= ys.data<float>()[q * 6 + i] == float(10 * q + i);
  check(ok, "gather_from_sp values", r);
  Tensor zs = Tensor::empty({2, 3}, DType::F32);
  Tensor full = filled({2 * R, 3}, [&](int64_t i) { return float(i + r); });
  P::reduce_scatter_to_sp(full, zs, tp, st);
  ok = true;
  for (int64_t i = 0; i < 6; ++i) {
    float want = 0;
    for (int q = 0; q < R; ++q) want += float(r * 6 + i + q);
    ok &= zs.data<float>()[i] == want;
  }
  check(ok, "reduce_scatter_to_sp values", r);

  // Duality: sum_ranks <F(x), dy> == sum_ranks <x, B(dy)>.
  auto adjoint = [&](const char* name, Shape in, Shape out,
                     const std::function<void(const Tensor&, Tensor&)>& F,
                     const std::function<void(const Tensor&, Tensor&)>& B) {
    Tensor a = rnd(in, 1), dy = rnd(out, 2), fa = Tensor::empty(out, DType::F32),
           bdy = Tensor::empty(in, DType::F32);
    F(a, fa);
    B(dy, bdy);
    const double l = dot(fa, dy), rr = dot(a, bdy);
    check(std::fabs(l - rr) <= 1e-5 * (std::fabs(l) + 1), name, r);
  };
  // copy_to: F = identity on a replicated input (the same x on every rank), B = all-reduce.
  // As maps of the replicated x, <x, sum_r dy_r> == sum_r <x, dy_r>.
  {
    Tensor a = filled({4, 5}, [](int64_t i) { return float(std::cos(double(i))); });
    Tensor dy = rnd({4, 5}, 3), bdy = dy.clone();
    P::copy_to_tp_backward(bdy, tp, st);
    const double l = dot(a, dy), rr = ops::dot(a, bdy, st);
    check(std::fabs(l - rr) <= 1e-5 * (std::fabs(l) + 1), "copy_to_tp / its backward", r);
    // reduce_from: F = all-reduce of partials, B = identity on the replicated dy.
    Tensor dyr = filled({4, 5}, [](int64_t i) { return float(std::sin(double(i))); });
    Tensor fa = dy.clone();
    P::reduce_from_tp(fa, tp, st);
    const double l2 = ops::dot(fa, dyr, st), r2 = dot(dy, dyr);
    check(std::fabs(l2 - r2) <= 1e-5 * (std::fabs(l2) + 1), "reduce_from_tp / its backward", r);
  }
  adjoint("gather_from_sp / its backward", {2, 3}, {2 * R, 3},
          [&](const Tensor& a, Tensor& b) { P::gather_from_sp(a, b, tp, st); },
          [&](const Tensor& a, Tensor& b) { P::gather_from_sp_backward(a, b, tp, st); });
  adjoint("reduce_scatter_to_sp / its backward", {2 * R, 3}, {2, 3},
          [&](const Tensor& a, Tensor& b) { P::reduce_scatter_to_sp(a, b, tp, st); },
          [&](const Tensor& a, Tensor& b) { P::reduce_scatter_to_sp_backward(a, b, tp, st); });
  // gather/scatter along the last dim act on replicated full tensors on one side: the
  // adjoint identity holds per rank for scatter (a slice) and over the group for gather.
  {
    Tensor a = rnd({rows, n}, 4), dy = filled({rows, R * n}, [](int64_t i) {
      return float(std::cos(double(3 * i)));
    });
    Tensor fa = Tensor::empty({rows, R * n}, DType::F32), bdy = Tensor::empty({rows, n}, DType::F32);
    P::gather_from_tp(a, fa, tp, st);
    P::gather_from_tp_backward(dy, bdy, tp, st);
    const double l = ops::dot(fa, dy, st), rr = dot(a, bdy);
    check(std::fabs(l - rr) <= 1e-5 * (std::fabs(l) + 1), "gather_from_tp / its backward", r);
    Tensor sa = Tensor::empty({rows, n}, DType::F32), sb = Tensor::empty({rows, R * n}, DType::F32);
    Tensor dys = rnd({rows, n}, 5);
    P::scatter_to_tp(dy, sa, tp, st);
    P::scatter_to_tp_backward(dys, sb, tp, st);
    const double l3 = dot(sa, dys), r3 = ops::dot(dy, sb, st);
    check(std::fabs(l3 - r3) <= 1e-5 * (std::fabs(l3) + 1), "scatter_to_tp / its backward", r);
  }
  Tensor flag = Tensor::empty({1}, DType::I64);
  flag.data<int64_t>()[0] = g_fail;
  tp.all_reduce(flag, comm::ReduceOp::Sum, st);
  if (r == 0) std::printf(flag.data<int64_t>()[0] ? "FAIL: %lld checks failed\n" : "all checks passed\n",
                          (long long)flag.data<int64_t>()[0]);
  return flag.data<int64_t>()[0] ? 1 : 0;
}
