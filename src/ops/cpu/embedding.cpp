// Word and learned position embeddings on the CPU; one float dtype per call, f32/f64.
//   ids[B, S] (i32/i64, the data loader's layout), table/dtable[Vl, H] holding vocab rows
//   [vocab_start, vocab_start + Vl) (VocabParallelEmbedding's slice), y/dy[S, B, H].
//   embedding_forward: y[s, b] = table[ids[b, s] - vocab_start], 0 outside the slice (=);
//     with TP the caller all-reduces y, so each token row comes from exactly one rank.
//   embedding_backward: dtable[ids[b, s] - vocab_start] += dy[s, b] (+=).
//   position_embedding_forward: y[s, b] += pos[s + s_offset]  (+=; pos[P, H], P >= S + off)
//   position_embedding_backward: dpos[s + s_offset] += sum_b dy[s, b]  (+=).
#include <algorithm>
#include <cstring>

#include "ops/cpu/cpu_common.h"

namespace mcpp::ops::cpu {

namespace {

struct EmbDims {
  int64_t B, S, H;
};

EmbDims check_embedding(const Check& c, const Tensor& ids, const Tensor& table, const Tensor& y,
                        const char* tname, const char* yname) {
  c.index(ids, "ids");
  MCPP_CHECK(ids.dim() == 2, "{}: ids has shape {}, expected [B, S]", c.op, shape_str(ids.shape()));
  MCPP_CHECK(table.dim() == 2, "{}: {} has shape {}, expected [Vl, H]", c.op, tname,
             shape_str(table.shape()));
  const int64_t B = ids.size(0), S = ids.size(1), H = table.size(1);
  c.shape(y, yname, {S, B, H});
  return {B, S, H};
}

}  // namespace

// ---- Word embedding --------------------------------------------------------------------

void embedding_forward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& y,
                       Stream& s) {
  const Check c{"embedding_forward"};
  c.stream(s);
  const DType dt = c.floating(table, "table");
  c.dtype(y, "y", dt);
  const auto [B, S, H] = check_embedding(c, ids, table, y, "table", "y");
  const int64_t V = table.size(0);
  dispatch_float(dt, [&, B = B, S = S, H = H](auto tag) {
    using R = decltype(tag);
    dispatch_index(ids.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const I* ID = ids.data<I>();
      const R* TB = table.data<R>();
      R* Y = y.data<R>();
#pragma omp parallel for schedule(static) if (S * B * H > kParallelGrain)
      for (int64_t r = 0; r < S * B; ++r) {  // r = s * B + b, the output row
        const int64_t sidx = r / B, b = r % B;
        const int64_t v = int64_t(ID[b * S + sidx]) - vocab_start;
        R* yr = Y + r * H;
        if (v >= 0 && v < V)
          std::memcpy(yr, TB + v * H, size_t(H) * sizeof(R));
        else
          std::fill(yr, yr + H, R(0));
      }
    });
  });
}

// Race-free and deterministic without atomics: each thread owns a slice of the hidden
// dimension and walks every token in order, so repeated ids add up in the same order
// for any thread count.
void embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab_start, Tensor& dtable,
                        Stream& s) {
  const Check c{"embedding_backward"};
  c.stream(s);
  const DType dt = c.floating(dtable, "dtable");
  c.dtype(dy, "dy", dt);
  const auto [B, S, H] = check_embedding(c, ids, dtable, dy, "dtable", "dy");
  const int64_t V = dtable.size(0);
  dispatch_float(dt, [&, B = B, S = S, H = H](auto tag) {
    using R = decltype(tag);
    dispatch_index(ids.dtype(), [&](auto itag) {
      using I = decltype(itag);
      const I* ID = ids.data<I>();
      const R* DY = dy.data<R>();
      R* DT = dtable.data<R>();
#pragma omp parallel if (S * B * H > kParallelGrain)
      {
        // This thread's columns [h0, h1), rounded to 16 elements (a cache line of f32).
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t per = (H + nt - 1) / nt, step = (per + 15) / 16 * 16;
        const int64_t h0 = std::min(H, tid * step), h1 = std::min(H, h0 + step);
        if (h0 < h1) {
          for (int64_t r = 0; r < S * B; ++r) {
            const int64_t sidx = r / B, b = r % B;
            const int64_t v = int64_t(ID[b * S + sidx]) - vocab_start;
            if (v < 0 || v >= V) continue;
            R* dst = DT + v * H;
            const R* src = DY + r * H;
#pragma omp simd
            for (int64_t h = h0; h < h1; ++h) dst[h] += src[h];
          }
        }
      }
    });
  });
}

// ---- Learned absolute position embedding -----------------------------------------------

namespace {

struct PosDims {
  int64_t S, B, H;
};

PosDims check_position(const Check& c, const Tensor& pos, const char* pname, int64_t s_offset,
                       const Tensor& y, const char* yname) {
  MCPP_CHECK(y.dim() == 3, "{}: {} has shape {}, expected [S, B, H]", c.op, yname,
             shape_str(y.shape()));
  const int64_t S = y.size(0), B = y.size(1), H = y.size(2);
  MCPP_CHECK(pos.dim() == 2 && pos.size(1) == H,
             "{}: {} has shape {}, expected [max_positions, {}]", c.op, pname,
             shape_str(pos.shape()), H);
  MCPP_CHECK_HINT(s_offset >= 0 && s_offset + S <= pos.size(0),
                  "raise --max-position-embeddings to at least the sequence length",
                  "{}: positions [{}, {}) exceed the {} rows of {}", c.op, s_offset, s_offset + S,
                  pos.size(0), pname);
  return {S, B, H};
}

}  // namespace

void position_embedding_forward(const Tensor& pos, int64_t s_offset, Tensor& y, Stream& s) {
  const Check c{"position_embedding_forward"};
  c.stream(s);
  const DType dt = c.floating(pos, "pos");
  c.dtype(y, "y", dt);
  const auto [S, B, H] = check_position(c, pos, "pos", s_offset, y, "y");
  dispatch_float(dt, [&, S = S, B = B, H = H](auto tag) {
    using R = decltype(tag);
    const R* P = pos.data<R>();
    R* Y = y.data<R>();
#pragma omp parallel for schedule(static) if (S * B * H > kParallelGrain)
    for (int64_t r = 0; r < S * B; ++r) {
      const R* pr = P + (r / B + s_offset) * H;
      R* yr = Y + r * H;
#pragma omp simd
      for (int64_t h = 0; h < H; ++h) yr[h] += pr[h];
    }
  });
}

// Parallel over positions: each s owns its own dpos row, so no two threads collide.
void position_embedding_backward(const Tensor& dy, int64_t s_offset, Tensor& dpos, Stream& s) {
  const Check c{"position_embedding_backward"};
  c.stream(s);
  const DType dt = c.floating(dpos, "dpos");
  c.dtype(dy, "dy", dt);
  const auto [S, B, H] = check_position(c, dpos, "dpos", s_offset, dy, "dy");
  dispatch_float(dt, [&, S = S, B = B, H = H](auto tag) {
    using R = decltype(tag);
    const R* DY = dy.data<R>();
    R* DP = dpos.data<R>();
#pragma omp parallel for schedule(static) if (S * B * H > kParallelGrain)
    for (int64_t si = 0; si < S; ++si) {
      R* dr = DP + (si + s_offset) * H;
      for (int64_t b = 0; b < B; ++b) {
        const R* src = DY + (si * B + b) * H;
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) dr[h] += src[h];
      }
    }
  });
}

}  // namespace mcpp::ops::cpu
