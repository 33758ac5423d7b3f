// Word and position embeddings: [B, S] ids to [S, B, H] rows, vocab slicing (two TP
// halves summed equal the whole table), gradient checks with repeated ids and +=.
#include "op_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace embedding_test {

template <typename I>
Tensor ids_tensor(int64_t B, int64_t S_, int64_t V, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<I> v(size_t(B * S_));
  for (auto& x : v) x = I(gen() % uint64_t(V));
  v[1] = v[0];  // a repeated id, so backward must accumulate
  return Tensor::from(v, {B, S_});
}


TEST(Embedding, ForwardLayoutAndVocabSlices) {
  const int64_t B = 3, S_ = 5, V = 10, H = 6;
  Tensor ids = ids_tensor<int64_t>(B, S_, V, 1), table = randn({V, H}, 2);
  Tensor y = Tensor::empty({S_, B, H}, DType::F64);
  cpu::embedding_forward(ids, table, 0, y, S());
  for (int64_t s = 0; s < S_; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(y.data<double>()[(s * B + b) * H + h],
                  table.data<double>()[ids.data<int64_t>()[b * S_ + s] * H + h]);
  // TP=2: each rank holds half the rows; the all-reduce (a sum) gives the whole lookup.
  Tensor lo = table.narrow(0, V / 2).clone(), hi = table.narrow(V / 2, V / 2).clone();
  Tensor ylo = Tensor::empty(y.shape(), DType::F64), yhi = Tensor::empty(y.shape(), DType::F64);
  cpu::embedding_forward(ids, lo, 0, ylo, S());
  cpu::embedding_forward(ids, hi, V / 2, yhi, S());
  EXPECT_EQ(max_abs_diff(plus(ylo, yhi), y), 0.0);
  // i32 ids give the same result.
  Tensor ids32 = Tensor::empty(ids.shape(), DType::I32), y32 = Tensor::empty(y.shape(), DType::F64);
  cpu::copy(ids, ids32, S());
  cpu::embedding_forward(ids32, table, 0, y32, S());
  EXPECT_EQ(max_abs_diff(y32, y), 0.0);
  Tensor ybad = Tensor::empty({B, S_, H}, DType::F64);
  EXPECT_THROW(cpu::embedding_forward(ids, table, 0, ybad, S()), Error);
  Tensor fids = Tensor::empty({B, S_}, DType::F32);
  EXPECT_THROW(cpu::embedding_forward(fids, table, 0, y, S()), Error);
}

TEST(Embedding, BackwardMatchesFiniteDifferencesPerSlice) {
  const int64_t B = 2, S_ = 4, V = 8, H = 5;
  Tensor ids = ids_tensor<int32_t>(B, S_, V, 3), r = randn({S_, B, H}, 4);
  for (int64_t start : {int64_t(0), V / 2}) {
    Tensor table = randn({V / 2, H}, 5 + start), y = Tensor::empty({S_, B, H}, DType::F64);
    auto L = [&] {
      cpu::embedding_forward(ids, table, start, y, S());
      return dot(r, y);
    };
    Tensor d0 = randn(table.shape(), 6), dt = d0.clone();
    cpu::embedding_backward(r, ids, start, dt, S());
    EXPECT_LT(rel_err(dt, plus(d0, numeric_grad(table, L))), kGradTol) << start;
  }
}

TEST(Embedding, BackwardLargeIsDeterministicAndF32MatchesF64) {
  const int64_t B = 4, S_ = 64, V = 50, H = 100;  // many repeats, multi-threaded
  Tensor ids = ids_tensor<int64_t>(B, S_, V, 7), dy = randn({S_, B, H}, 8);
  Tensor d64 = Tensor::zeros({V, H}, DType::F64), d32 = Tensor::zeros({V, H}, DType::F32);
  cpu::embedding_backward(dy, ids, 0, d64, S());
  cpu::embedding_backward(as(dy, DType::F32), ids, 0, d32, S());
  EXPECT_LT(rel_err(d32, d64), 1e-6);
  // Serial reference.
  Tensor ref = Tensor::zeros({V, H}, DType::F64);
  for (int64_t s = 0; s < S_; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        ref.data<double>()[ids.data<int64_t>()[b * S_ + s] * H + h] +=
            dy.data<double>()[(s * B + b) * H + h];
  EXPECT_LT(max_abs_diff(d64, ref), 1e-12);
}

TEST(PositionEmbedding, ForwardAddsAndBackwardMatchesFiniteDifferences) {
  const int64_t S_ = 3, B = 2, H = 4, P = 8, off = 2;
  Tensor pos = randn({P, H}, 1), y0 = randn({S_, B, H}, 2), r = randn({S_, B, H}, 3);
  Tensor y = y0.clone();
  cpu::position_embedding_forward(pos, off, y, S());
  EXPECT_EQ(y.data<double>()[(2 * B + 1) * H + 3],
            y0.data<double>()[(2 * B + 1) * H + 3] + pos.data<double>()[(2 + off) * H + 3]);
  auto L = [&] {
    Tensor t = y0.clone();
    cpu::position_embedding_forward(pos, off, t, S());
    return dot(r, t);
  };
  Tensor d0 = randn({P, H}, 4), dpos = d0.clone();
  cpu::position_embedding_backward(r, off, dpos, S());
  EXPECT_LT(rel_err(dpos, plus(d0, numeric_grad(pos, L))), kGradTol);
  EXPECT_THROW(cpu::position_embedding_forward(pos, P - 1, y, S()), Error);
  Tensor posbad = randn({P, H + 1}, 5);
  EXPECT_THROW(cpu::position_embedding_backward(r, 0, posbad, S()), Error);
}

}  // namespace embedding_test
