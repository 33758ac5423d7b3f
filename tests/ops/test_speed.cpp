// Rough speed of the CPU ops on training-sized problems, compared with the sgemm
// ceiling. Disabled: speed is measured, never asserted (ARCHITECTURE.md). Run with
//   OMP_NUM_THREADS=2 build/tests/test_ops --gtest_also_run_disabled_tests \
//     --gtest_filter='*Speed*'
#include <chrono>
#include <cstdio>

#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

TEST(DISABLED_Speed, CrossEntropyNormsAndGemm) {
  const DType F = DType::F32;
  {
    const int64_t n = 2048;
    Tensor a = randn({n, n}, 1, 1.0, F), b = randn({n, n}, 2, 1.0, F), c = Tensor::empty({n, n}, F);
    cpu::gemm(false, false, 1, a, b, 0, c, S());
    double t = best_seconds(3, [&] { cpu::gemm(false, false, 1, a, b, 0, c, S()); });
    std::printf("sgemm %ld^3: %.1f ms, %.1f GFLOP/s\n", long(n), t * 1e3,
                2.0 * n * n * n / t / 1e9);
  }
  {
    const int64_t T = 2048, V = 50304;
    Tensor logits = randn({T, V}, 3, 2.0, F);
    std::vector<int64_t> tg(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = (t * 7919) % V;
    Tensor targets = Tensor::from(tg, {T});
    Tensor mx = Tensor::empty({T}, F), se = Tensor::empty({T}, F), tl = Tensor::empty({T}, F);
    Tensor loss = Tensor::empty({T}, F), dloss = Tensor::empty({T}, F);
    cpu::fill(dloss, 1.0 / double(T), S());
    Tensor work = logits.clone();
    double tfwd = best_seconds(3, [&] {
      cpu::ce_row_max(logits, mx, S());
      cpu::ce_sum_exp_target(logits, mx, targets, 0, se, tl, S());
      cpu::ce_loss(mx, se, tl, loss, S());
    });
    double tmax = best_seconds(3, [&] { cpu::ce_row_max(logits, mx, S()); });
    double tse =
        best_seconds(3, [&] { cpu::ce_sum_exp_target(logits, mx, targets, 0, se, tl, S()); });
    std::printf("CE row_max %.1f ms, sum_exp_target %.1f ms\n", tmax * 1e3, tse * 1e3);
    double tbwd =
        best_seconds(3, [&] { cpu::ce_backward(logits, mx, se, targets, 0, dloss, work, S()); });
    const double gb = double(T) * double(V) * 4 / 1e9;
    std::printf(
        "CE [%ld, %ld] f32: forward %.1f ms (%.1f GB/s over 2 reads), backward %.1f ms "
        "(%.1f GB/s read+write)\n",
        long(T), long(V), tfwd * 1e3, 2 * gb / tfwd, tbwd * 1e3, 2 * gb / tbwd);
  }
  for (int64_t H : {int64_t(256), int64_t(2048)}) {
    const int64_t T = 2048;
    Tensor x = randn({T, H}, 4, 1.0, F), w = randn({H}, 5, 1.0, F), b = randn({H}, 6, 1.0, F);
    Tensor y = Tensor::empty({T, H}, F), mu = Tensor::empty({T}, F), rs = Tensor::empty({T}, F);
    Tensor dx = Tensor::empty({T, H}, F), dw = Tensor::zeros({H}, F), db = Tensor::zeros({H}, F);
    double lf = best_seconds(5, [&] { cpu::layernorm_forward(x, w, b, 1e-5, y, mu, rs, S()); });
    double lb =
        best_seconds(5, [&] { cpu::layernorm_backward(y, x, w, mu, rs, dx, false, dw, db, S()); });
    double rf = best_seconds(5, [&] { cpu::rmsnorm_forward(x, w, 1e-5, y, rs, S()); });
    double rb = best_seconds(5, [&] { cpu::rmsnorm_backward(y, x, w, rs, dx, false, dw, S()); });
    Tensor g = Tensor::empty({T, H}, F);
    double gf = best_seconds(5, [&] { cpu::gelu_forward(x, g, S()); });
    Tensor g3 = g.view({T, 1, H});
    double dr = best_seconds(5, [&] {
      cpu::dropout_add_forward(x.view({T, 1, H}), y.view({T, 1, H}), 0.1, {1, 2},
                               ops::GlobalIndex3::whole(T, 1, H), g3, S());
    });
    std::printf(
        "[%ld, %ld] f32: layernorm fwd %.3f ms bwd %.3f ms, rmsnorm fwd %.3f ms bwd "
        "%.3f ms, gelu fwd %.3f ms, dropout_add %.3f ms\n",
        long(T), long(H), lf * 1e3, lb * 1e3, rf * 1e3, rb * 1e3, gf * 1e3, dr * 1e3);
  }
}
