// Tensor-parallel generation (under mpirun -np 2): each rank runs the Generator on its
// TP shard of the parameters (the model's column/row-parallel modules, vocab-parallel
// embedding and logits gathered over TP) and must give the serial Generator's logits
// (f64, 1e-10 relative) and greedy tokens, prefill (all positions) and decode steps, for
// both model families. Prints "all checks passed" on success.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/world.h"
#include "inference/generator.h"
#include "inference_test_util.h"
#include "ops/ops.h"

using namespace mcpp;

namespace {

int g_fail = 0;

// Moves every parameter by a function of its GLOBAL element index, so the serial model
// and each TP shard move alike (the norms start at 1 and 0 and would not matter).
void perturb(model::ParamStore& ps) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    Tensor t = ps.param(i);
    const int64_t rows = p.local_shape[0], cols = p.local_shape.size() > 1 ? p.local_shape[1] : 1;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        t.data<double>()[r * cols + c] +=
            0.2 * Philox::normal(5, hash_name(p.name), uint64_t(ps.global_index(p, r, c)));
  }
}

void compare(const Tensor& want, const Tensor& got, const char* what, int step, int rank) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    worst = std::max(worst, std::abs(want.data<double>()[i] - got.data<double>()[i]));
    scale = std::max(scale, std::abs(want.data<double>()[i]));
  }
  if (want.shape() != got.shape() || worst > 1e-10 * scale) {
    ++g_fail;
    std::printf("[rank %d] FAIL: %s step %d: max difference %.3e (scale %.3e)\n", rank, what, step,
                worst, scale);
  }
}

}  // namespace

int main() {
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  comm::Communicator& tp = world->world();
  const int R = tp.size(), rank = tp.rank();
  const int64_t B = 2, P = 5, steps = 6;
  for (bool llama : {false, true}) {
    const char* fam = llama ? "llama" : "gpt";
    model::TransformerConfig c1 = test::tiny_config(llama, DType::F64);
    model::TransformerConfig c2 = c1;
    c2.tp_size = R, c2.tp_rank = rank;
    model::GPTModel serial(c1), shard(c2);  // the same global weights (parallel-invariant init)
    perturb(serial.params()), perturb(shard.params());
    inference::Generator g1(serial.params(), c1), g2(shard.params(), c2, &tp);
    inference::KVCache k1(c1, 32, B), k2(c2, 32, B);
    Tensor tokens = Tensor::empty({B, P}, DType::I64);
    for (int64_t i = 0; i < B * P; ++i)
      tokens.data<int64_t>()[i] = int64_t(Philox::u32(3, 1, uint64_t(i)) % 64);
    compare(g1.forward(tokens, k1, true), g2.forward(tokens, k2, true), fam, 0, rank);
    Tensor one = Tensor::empty({B, 1}, DType::I64);
    // Decode: greedy tokens of the serial run fed to both.
    k1.reset(), k2.reset();
    const Tensor* want = &g1.forward(tokens, k1);
    const Tensor* got = &g2.forward(tokens, k2);
    for (int step = 1; step <= steps; ++step) {
      compare(*want, *got, fam, step, rank);
      const int64_t V = want->size(-1);
      for (int64_t b = 0; b < B; ++b) {
        const double* row = want->data<double>() + b * V;
        const double* row2 = got->data<double>() + b * V;
        const int64_t id = std::max_element(row, row + V) - row;
        if (id != std::max_element(row2, row2 + V) - row2) {
          ++g_fail;
          std::printf("[rank %d] FAIL: %s step %d seq %lld: greedy tokens differ\n", rank, fam,
                      step, (long long)b);
        }
        one.data<int64_t>()[b] = id;
      }
      want = &g1.forward(one, k1);
      got = &g2.forward(one, k2);
    }
  }
  Tensor f = Tensor::empty({1}, DType::F64);
  f.data<double>()[0] = g_fail;
  tp.all_reduce(f, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
  if (rank == 0) {
    if (f.data<double>()[0] == 0)
      std::printf("all checks passed (TP %d)\n", R);
    else
      std::printf("FAIL: %g failed checks\n", f.data<double>()[0]);
  }
  return f.data<double>()[0] == 0 ? 0 : 1;
}
