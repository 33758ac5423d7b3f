#include "parallel/context_parallel/cp_attention.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel::context_parallel {
namespace {

void check_args(const char* op, const CpAttention& a, const Tensor& qkv,
                const comm::Communicator& cp) {
  MCPP_CHECK(a.ad.S % 2 == 0 && a.ad.S > 0, "{}: {} rows per rank is not two equal chunks", op,
             a.ad.S);
  MCPP_CHECK(qkv.numel() == a.ad.S * a.ad.B * a.ad.qkv_width(),
             "{}: qkv {} does not hold the rank's {} rows x {} x {}", op, qkv.str(), a.ad.S,
             a.ad.B, a.ad.qkv_width());
  MCPP_CHECK(cp.size() > 1, "{}: a context-parallel group of one", op);
}

// The document starts are small i64 tensors ([B, 2C] a rank): on the GPU they are
// reshuffled on the host and sent back (one synchronising copy each way).
Tensor to_host(const Tensor& t, Stream& s) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, s);
  return h;
}
Tensor to_device(const Tensor& h, Device dev, Stream& s) {
  if (dev == Device::CPU) return h;
  Tensor d = Tensor::empty(h.shape(), h.dtype(), dev);
  ops::copy(h, d, s);
  return d;
}

}  // namespace

bool fused_steps_enabled() {
  const char* e = std::getenv("MCPP_CP_FUSED_STEPS");
  return !(e && std::string(e) == "0");
}

// ---- Megatron's step shapes (cp_attention.h) --------------------------------------------
RingStep ring_step(int64_t r, int64_t j) {
  if (j == r) return {0, 2, 0, 2, true};
  if (j < r) return {0, 2, 0, 1, false};
  return {1, 1, 0, 2, false};
}

ops::AttentionDims ring_step_dims(const ops::AttentionDims& local, int64_t P, int64_t r,
                                  int64_t j) {
  const RingStep st = ring_step(r, j);
  const int64_t C = local.S / 2;
  auto chunk = [&](int64_t rank, int k) { return k == 0 ? rank : 2 * P - 1 - rank; };
  ops::AttentionDims d = local;
  d.S = st.nx * C, d.S_kv = st.ny * C, d.lse_ld = 2 * C;
  d.S_global = 2 * P * C;
  // (Positions matter to dropout and the document mask only, neither of which fuses.)
  d.q_offset = chunk(r, st.x0) * C, d.k_offset = chunk(j, st.y0) * C;
  return d;
}

// ---- one rank's blocks (RingRank) ----------------------------------------------------------

namespace {
// Whether every step shape runs as one block (MCPP_CP_FUSED_STEPS=0: never).
bool fuse_steps(const CpAttention& a, int64_t P, DType dt, Stream& s) {
  if (a.type == CommType::A2A || a.ad.key_start.defined() || a.dropout_p > 0 ||
      !fused_steps_enabled())
    return false;
  // The three shapes: the diagonal, against an earlier rank, against a later one (a rank
  // meets one or both of the last two; every rank asks about all three, so all decide alike).
  for (const auto& [r, j] : {std::pair<int64_t, int64_t>{1, 1}, {1, 0}, {0, 1}})
    if (!ops::attention_block_rect_supported(dt, ring_step_dims(a.ad, P, r, j),
                                             ring_step(r, j).causal, a.dropout_p, s))
      return false;
  return true;
}
}  // namespace

RingRank::RingRank(const CpAttention& a_, int64_t cp_size, int64_t rank, DType dt, Stream& s)
    : a(a_), P(cp_size), r(rank), C(a_.ad.S / 2), B(a_.ad.B), W(a_.ad.qkv_width()),
      O(a_.ad.NH * a_.ad.HD) {
  if (a.ad.key_start.defined() && a.type != CommType::A2A) {
    const Tensor h = to_host(a.ad.key_start, s);
    for (int x = 0; x < 2; ++x) {  // local chunk x's [B, C] of the rank's [B, 2C] starts
      Tensor out = Tensor::empty({B, C}, DType::I64);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < C; ++i)
          out.data<int64_t>()[b * C + i] = h.data<int64_t>()[b * 2 * C + x * C + i];
      ks[x] = to_device(out, a.ad.key_start.device(), s);
    }
  }
  fused = a.type != CommType::A2A && fuse_steps(a, P, dt, s);
}

Tensor RingRank::chunk_rows(const Tensor& t, int x0, int n) const {
  return t.narrow(x0 * rows(), n * rows());
}

ops::AttentionDims RingRank::block_dims(int x, int64_t qa, int64_t kc) const {
  ops::AttentionDims d = a.ad;
  d.S = C;
  d.S_global = 2 * P * C;
  d.q_offset = qa * C, d.k_offset = kc * C;
  if (a.ad.key_start.defined()) d.key_start = ks[x];
  return d;
}

// Local chunk k's lse, [B, NH, C] (the chunk-block layout [2][B, NH, C]).
static Tensor lse_of(const Tensor& lse, int k) {
  const int64_t n = lse.numel() / 2;
  return lse.flat().narrow(k * n, n);
}
// A fused step's view of an lse in the layout [B, NH, 2C].
static Tensor step_lse(const Tensor& lse, const RingStep& st, const ops::AttentionDims& d) {
  return lse.flat().narrow(st.x0 * (d.lse_ld / 2), d.lse_span());
}

template <class F>
void RingRank::for_each_block(int64_t j, F&& f) const {
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 2; ++y) {
      const int64_t qa = chunk(r, x), kc = chunk(j, y);
      if (kc <= qa) f(x, y, qa, kc, kc == qa);
    }
}

void RingRank::start_forward(Tensor& out, Tensor& lse, Stream& s) {
  if (!fused) {  // fused steps start with the diagonal, which writes every row (=)
    ops::fill(out, 0.0, s);
    ops::fill(lse, -std::numeric_limits<double>::infinity(), s);
  }
  const int64_t n = fused ? 2 : 1;
  o_i = Tensor::empty({n * rows(), O}, out.dtype(), out.device());
  lse_i = Tensor::empty({B, a.ad.NH, n * C}, lse.dtype(), lse.device());
}

void RingRank::forward_step(const Tensor& qkv, const Tensor& kv, int64_t j, Tensor& out,
                            Tensor& lse, Stream& s) {
  if (fused) {
    const RingStep st = ring_step(r, j);
    const ops::AttentionDims d = ring_step_dims(a.ad, P, r, j);
    const Tensor q = chunk_rows(qkv, st.x0, st.nx), k = chunk_rows(kv, st.y0, st.ny);
    Tensor o = chunk_rows(out, st.x0, st.nx), l = step_lse(lse, st, d);
    if (j == r) {  // the diagonal covers every row: merged into (0, -inf) it is itself
      ops::attention_block_forward(q, k, d, true, a.scale, a.dropout_p, a.key, o, l, s);
      return;
    }
    Tensor oi = o_i.narrow(0, st.nx * rows()), li = step_lse(lse_i, st, d);
    ops::attention_block_forward(q, k, d, st.causal, a.scale, a.dropout_p, a.key, oi, li, s);
    ops::attention_lse_merge(oi, li, d, o, l, s);
    return;
  }
  for_each_block(j, [&](int x, int y, int64_t qa, int64_t kc, bool causal) {
    const ops::AttentionDims d = block_dims(x, qa, kc);
    ops::attention_block_forward(chunk_rows(qkv, x, 1), chunk_rows(kv, y, 1), d, causal,
                                 a.scale, a.dropout_p, a.key, o_i, lse_i, s);
    Tensor o = chunk_rows(out, x, 1), l = lse_of(lse, x);
    ops::attention_lse_merge(o_i, lse_i, d, o, l, s);
  });
}

void RingRank::backward_step(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, const Tensor& kv, int64_t j, Tensor& dqkv,
                             Tensor& dkv, Stream& s) const {
  if (fused) {
    const RingStep st = ring_step(r, j);
    const ops::AttentionDims d = ring_step_dims(a.ad, P, r, j);
    Tensor dq = chunk_rows(dqkv, st.x0, st.nx), dk = chunk_rows(dkv, st.y0, st.ny);
    ops::attention_block_backward(chunk_rows(dout, st.x0, st.nx), chunk_rows(qkv, st.x0, st.nx),
                                  chunk_rows(kv, st.y0, st.ny), chunk_rows(out, st.x0, st.nx),
                                  step_lse(lse, st, d), d, st.causal, a.scale, a.dropout_p,
                                  a.key, dq, dk, s);
    return;
  }
  for_each_block(j, [&](int x, int y, int64_t qa, int64_t kc, bool causal) {
    const ops::AttentionDims d = block_dims(x, qa, kc);
    Tensor dq = chunk_rows(dqkv, x, 1), dk = chunk_rows(dkv, y, 1);
    ops::attention_block_backward(chunk_rows(dout, x, 1), chunk_rows(qkv, x, 1),
                                  chunk_rows(kv, y, 1), chunk_rows(out, x, 1), lse_of(lse, x), d,
                                  causal, a.scale, a.dropout_p, a.key, dq, dk, s);
  });
}

void RingRank::backward_diagonal(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, Tensor& dqkv, Stream& s) const {
  if (fused) {  // the diagonal step is causal self-attention over the rank's 2C rows
    const ops::AttentionDims d = ring_step_dims(a.ad, P, r, r);
    ops::attention_backward(dout, qkv, out, lse, d, a.scale, a.dropout_p, a.key, dqkv, s);
    return;
  }
  ops::fill(dqkv, 0.0, s);
  backward_step(dout, qkv, out, lse, qkv, r, dqkv, dqkv, s);
}

void RingRank::apply_sink(Tensor& out, Tensor& lse, Stream& s) const {
  if (fused) return ops::attention_sink_forward(out, lse, a.sink, 0, a.ad, s);
  for (int x = 0; x < 2; ++x) {  // the chunk-block layout [2][B, NH, C]
    ops::AttentionDims d = a.ad;
    d.S = C;
    Tensor o = chunk_rows(out, x, 1), l = lse_of(lse, x);
    ops::attention_sink_forward(o, l, a.sink, 0, d, s);
  }
}

void RingRank::sink_backward(const Tensor& dout, const Tensor& out, const Tensor& lse,
                             Stream& s) const {
  Tensor dsink = a.dsink;
  if (fused) return ops::attention_sink_backward(dout, out, lse, a.sink, 0, a.ad, dsink, s);
  for (int x = 0; x < 2; ++x) {
    ops::AttentionDims d = a.ad;
    d.S = C;
    ops::attention_sink_backward(chunk_rows(dout, x, 1), chunk_rows(out, x, 1), lse_of(lse, x),
                                 a.sink, 0, d, dsink, s);
  }
}

namespace {

// ---- p2p: the ring -----------------------------------------------------------------------

// Posts send(t -> r+1) and recv(into -> from r-1) together (no ordering deadlock).
std::vector<comm::Work> ring_shift(comm::Communicator& cp, const RingRank& g,
                                   std::initializer_list<std::pair<Tensor, Tensor>> pairs,
                                   Stream& s) {
  std::vector<comm::P2POp> ops;
  const int next = int((g.r + 1) % g.P), prev = int((g.r + g.P - 1) % g.P);
  for (const auto& [send, recv] : pairs) {
    ops.push_back({true, send, next});
    ops.push_back({false, recv, prev});
  }
  return cp.batch_isend_irecv(ops, s);
}

void ring_forward(const CpAttention& a, RingRank& g, const Tensor& qkv, comm::Communicator& cp,
                  Tensor& out, Tensor& lse, Stream& s) {
  g.start_forward(out, lse, s);
  const Device dev = qkv.device();
  Tensor buf[2] = {Tensor::empty(qkv.shape(), qkv.dtype(), dev),
                   Tensor::empty(qkv.shape(), qkv.dtype(), dev)};
  Tensor cur = qkv;
  for (int64_t i = 0; i < g.P; ++i) {
    // The next step's K/V travel while this step's blocks run.
    std::vector<comm::Work> w;
    Tensor& next = buf[i % 2];
    if (i + 1 < g.P) w = ring_shift(cp, g, {{cur, next}}, s);
    g.forward_step(qkv, cur, (g.r - i + g.P) % g.P, out, lse, s);
    for (auto& x : w) x.wait();
    cur = next;
  }
}

void ring_backward(const CpAttention& a, const RingRank& g, const Tensor& dout, const Tensor& qkv,
                   const Tensor& out, const Tensor& lse, comm::Communicator& cp, Tensor& dqkv,
                   Stream& s) {
  auto make = [&] { return Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device()); };
  Tensor kv_buf[2] = {make(), make()}, dkv_buf[2] = {make(), make()};
  // Step 0, the rank's own K/V: dQ and its own dK/dV straight into dqkv (=), while the next
  // K/V travel. Its dK/dV are home already, so they never go round.
  std::vector<comm::Work> w = ring_shift(cp, g, {{qkv, kv_buf[0]}}, s);
  g.backward_diagonal(dout, qkv, out, lse, dqkv, s);
  for (auto& x : w) x.wait();
  Tensor cur = kv_buf[0], dcur = dkv_buf[0];
  // From step 1 each K/V carries its dK/dV from the ranks after its owner: rank r starts
  // rank r-1's, which leave r-1 last and arrive home after CP-1 shifts.
  ops::fill(dcur, 0.0, s);
  for (int64_t i = 1; i < g.P; ++i) {
    w.clear();
    Tensor& next = kv_buf[i % 2];
    if (i + 1 < g.P) w = ring_shift(cp, g, {{cur, next}}, s);
    g.backward_step(dout, qkv, out, lse, cur, (g.r - i + g.P) % g.P, dqkv, dcur, s);
    Tensor& dnext = dkv_buf[i % 2];
    for (auto& x : ring_shift(cp, g, {{dcur, dnext}}, s)) x.wait();
    for (auto& x : w) x.wait();
    cur = next, dcur = dnext;
  }
  // Only the key/value slots of dcur are non-zero: this rank's dK, dV from the others' queries.
  ops::axpy(1.0, dcur, dqkv, s);
}

// ---- all_gather --------------------------------------------------------------------------

void gather_forward(const CpAttention& a, RingRank& g, const Tensor& qkv, comm::Communicator& cp,
                    Tensor& out, Tensor& lse, Stream& s) {
  g.start_forward(out, lse, s);
  Tensor all = Tensor::empty({g.P * qkv.size(0), qkv.size(1)}, qkv.dtype(), qkv.device());
  cp.all_gather(qkv, all, s);
  for (int64_t i = 0; i < g.P; ++i) {  // the ring's order, so both merge alike
    const int64_t j = (g.r - i + g.P) % g.P;
    g.forward_step(qkv, all.narrow(j * qkv.size(0), qkv.size(0)), j, out, lse, s);
  }
}

void gather_backward(const CpAttention& a, const RingRank& g, const Tensor& dout, const Tensor& qkv,
                     const Tensor& out, const Tensor& lse, comm::Communicator& cp, Tensor& dqkv,
                     Stream& s) {
  const int64_t n = qkv.size(0);
  Tensor all = Tensor::empty({g.P * n, qkv.size(1)}, qkv.dtype(), qkv.device());
  cp.all_gather(qkv, all, s);
  Tensor dall = Tensor::empty(all.shape(), qkv.dtype(), qkv.device());
  ops::fill(dall, 0.0, s);  // this rank's own slice stays zero: the diagonal writes dqkv
  g.backward_diagonal(dout, qkv, out, lse, dqkv, s);
  for (int64_t i = 1; i < g.P; ++i) {
    const int64_t j = (g.r - i + g.P) % g.P;
    Tensor dj = dall.narrow(j * n, n);
    g.backward_step(dout, qkv, out, lse, all.narrow(j * n, n), j, dqkv, dj, s);
  }
  Tensor mine = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
  cp.reduce_scatter(dall, mine, s);
  ops::axpy(1.0, mine, dqkv, s);
}

// ---- a2a (Ulysses) -----------------------------------------------------------------------

// The reshuffles move whole rows of w elements, so each side is one row gather
// (ops::gather_rows, y[n] = x[src[n]], on the tensors' device) around the all-to-all; the
// index is built on the host.
void gather_rows_at(const Tensor& x, const std::vector<int64_t>& src, Tensor& y, Stream& s) {
  Tensor idx = Tensor::from(src, {int64_t(src.size())});
  if (x.device() != Device::CPU) {
    Tensor d = Tensor::empty(idx.shape(), DType::I64, x.device());
    ops::copy(idx, d, s);
    idx = d;
  }
  ops::gather_rows(x, idx, y, s);
}

// An all-to-all level: P ranks (this one r), each holding two chunks of C x B rows, its
// level-local chunks r and 2P-1-r. For a2a the level is the whole CP group and the
// gathered sequence is the global one. For a2a+p2p it is a group of P consecutive CP
// ranks p*P + r, whose chunks gathered in this order are the ring's two "super-chunks" p
// and 2Q-1-p (Q ring ranks, P*C rows each): global chunks [pP, pP + P) and
// [2PQ - (p+1)P, 2PQ - pP), both ascending (TransformerEngine's chunk reordering).
struct A2aLevel {
  int64_t P, r, C, B;
  int64_t rows() const { return C * B; }
  int64_t chunk(int64_t j, int k) const { return k == 0 ? j : 2 * P - 1 - j; }
};

// Row m of the gathered sequence [2PC*B, w] sits in the all-to-all's block of rank j at
// local chunk k (block j*2 + k): the order of the ranks' (j, 2P-1-j) pairs.
std::vector<int64_t> chunk_order(const A2aLevel& g) {
  const int64_t rows = g.rows(), n = 2 * g.P * rows;
  std::vector<int64_t> at(static_cast<size_t>(n));
  for (int64_t j = 0; j < g.P; ++j)
    for (int k = 0; k < 2; ++k)
      for (int64_t i = 0; i < rows; ++i)
        at[size_t(g.chunk(j, k) * rows + i)] = (j * 2 + k) * rows + i;
  return at;
}

// local [2C*B, P*w] (this rank's rows, all column slices) -> full [2PC*B, w] (every rank's
// rows in the level's sequence order, column slice r), over an all-to-all.
void seq_to_heads(const A2aLevel& g, const Tensor& local, Tensor& full, comm::Communicator& c,
                  Stream& s) {
  const int64_t R = 2 * g.rows(), w = full.size(1);
  Tensor send = Tensor::empty({g.P * R, w}, local.dtype(), local.device());
  Tensor recv = Tensor::empty(send.shape(), local.dtype(), local.device());
  std::vector<int64_t> src(static_cast<size_t>(g.P * R));
  for (int64_t p = 0; p < g.P; ++p)  // block p: column slice p of every row
    for (int64_t t = 0; t < R; ++t) src[size_t(p * R + t)] = t * g.P + p;
  gather_rows_at(local.view({R * g.P, w}), src, send, s);
  c.all_to_all(send, recv, s);
  gather_rows_at(recv, chunk_order(g), full, s);
}

// The inverse: full [2PC*B, w] (slice r of every row) -> local [2C*B, P*w].
void heads_to_seq(const A2aLevel& g, const Tensor& full, Tensor& local, comm::Communicator& c,
                  Stream& s) {
  const int64_t R = 2 * g.rows(), w = full.size(1);
  Tensor send = Tensor::empty({g.P * R, w}, full.dtype(), full.device());
  Tensor recv = Tensor::empty(send.shape(), full.dtype(), full.device());
  // send block (j, k) = the gathered rows of chunk(j, k): chunk_order inverted.
  const std::vector<int64_t> at = chunk_order(g);
  std::vector<int64_t> src(at.size());
  for (size_t m = 0; m < at.size(); ++m) src[size_t(at[m])] = int64_t(m);
  gather_rows_at(full, src, send, s);
  c.all_to_all(send, recv, s);
  std::vector<int64_t> back(static_cast<size_t>(g.P * R));
  for (int64_t p = 0; p < g.P; ++p)
    for (int64_t t = 0; t < R; ++t) back[size_t(t * g.P + p)] = p * R + t;
  Tensor out = local.view({R * g.P, w});
  gather_rows_at(recv, back, out, s);
}

// The gathered attention's dims: the level's sequence (2PC rows), this rank's slice of the
// heads; with document masking the gathered rows' key starts (global positions), from
// every rank's chunks of the level.
ops::AttentionDims a2a_dims(const CpAttention& a, const A2aLevel& g, comm::Communicator& c,
                            Stream& s) {
  ops::AttentionDims d = a.ad;
  d.S = 2 * g.P * g.C, d.q_offset = d.k_offset = 0;
  d.NH = a.ad.NH / g.P, d.NG = a.ad.NG / g.P;
  d.h_offset = a.ad.h_offset + g.r * d.NH;
  if (a.ad.key_start.defined()) {
    Tensor all = Tensor::empty({g.P * g.B, 2 * g.C}, DType::I64, a.ad.key_start.device());
    c.all_gather(a.ad.key_start, all, s);
    all = to_host(all, s);
    d.key_start = Tensor::empty({g.B, d.S}, DType::I64);
    for (int64_t j = 0; j < g.P; ++j)
      for (int k = 0; k < 2; ++k)
        for (int64_t b = 0; b < g.B; ++b)
          for (int64_t i = 0; i < g.C; ++i)
            d.key_start.data<int64_t>()[b * d.S + g.chunk(j, k) * g.C + i] =
                all.data<int64_t>()[(j * g.B + b) * 2 * g.C + k * g.C + i];
    d.key_start = to_device(d.key_start, a.ad.key_start.device(), s);
  }
  return d;
}

void a2a_check(const CpAttention& a, int64_t P, const char* flag) {
  MCPP_CHECK_HINT(a.ad.NG % P == 0 && a.ad.NH % P == 0,
                  "use --cp-comm-type p2p, or an all-to-all group size dividing the heads",
                  "--cp-comm-type {}: {} heads in {} query groups per tensor-parallel rank do "
                  "not split over {} ranks",
                  flag, a.ad.NH, a.ad.NG, P);
}

A2aLevel level_of(const CpAttention& a, const comm::Communicator& c) {
  return {c.size(), c.rank(), a.ad.S / 2, a.ad.B};
}

void a2a_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp, Tensor& out,
                 Tensor& lse, Stream& s) {
  a2a_check(a, cp.size(), "a2a");
  const A2aLevel g = level_of(a, cp);
  const int64_t W = a.ad.qkv_width(), O = a.ad.NH * a.ad.HD;
  const ops::AttentionDims d = a2a_dims(a, g, cp, s);
  Tensor full = Tensor::empty({d.S * d.B, W / g.P}, qkv.dtype(), qkv.device());
  seq_to_heads(g, qkv, full, cp, s);
  Tensor ctx = Tensor::empty({d.S * d.B, O / g.P}, qkv.dtype(), qkv.device());
  Tensor l = lse.view({d.B, d.NH, d.S});
  ops::attention_forward(full, d, a.scale, a.dropout_p, a.key, ctx, l, s);
  if (a.sink.defined()) ops::attention_sink_forward(ctx, l, a.sink, g.r * d.NH, d, s);
  heads_to_seq(g, ctx, out, cp, s);
}

void a2a_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                  const Tensor& lse, comm::Communicator& cp, Tensor& dqkv, Stream& s) {
  a2a_check(a, cp.size(), "a2a");
  const A2aLevel g = level_of(a, cp);
  const int64_t W = a.ad.qkv_width(), O = a.ad.NH * a.ad.HD;
  const ops::AttentionDims d = a2a_dims(a, g, cp, s);
  const int64_t T = d.S * d.B;
  const Device dev = qkv.device();
  Tensor full = Tensor::empty({T, W / g.P}, qkv.dtype(), dev);
  Tensor ctx = Tensor::empty({T, O / g.P}, qkv.dtype(), dev);
  Tensor dctx = Tensor::empty(ctx.shape(), qkv.dtype(), dev);
  seq_to_heads(g, qkv, full, cp, s);
  seq_to_heads(g, out, ctx, cp, s);
  seq_to_heads(g, dout, dctx, cp, s);
  Tensor dfull = Tensor::empty(full.shape(), qkv.dtype(), dev);
  if (a.sink.defined()) {
    Tensor dsink = a.dsink;
    ops::attention_sink_backward(dctx, ctx, lse.view({d.B, d.NH, d.S}), a.sink, g.r * d.NH, d,
                                 dsink, s);
  }
  ops::attention_backward(dctx, full, ctx, lse.view({d.B, d.NH, d.S}), d, a.scale, a.dropout_p,
                          a.key, dfull, s);
  heads_to_seq(g, dfull, dqkv, cp, s);
}

// ---- a2a+p2p (hierarchical) ----------------------------------------------------------------

// The all-to-all over level 0 turns this rank's two chunks on all its heads into the
// level's 2PC rows on heads / P: the ring rank's two super-chunks (A2aLevel), on which the
// ring of level 1 runs as p2p does, with the same global positions (dropout, documents).
struct Hierarchy {
  comm::Communicator& a2a;
  comm::Communicator& p2p;
  A2aLevel lv;
  CpAttention ring;  // the ring's attention on the gathered rows
};

Hierarchy hierarchy_of(const CpAttention& a, comm::Communicator& cp, Stream& s) {
  MCPP_CHECK(a.a2a && a.p2p,
             "--cp-comm-type a2a+p2p: the hierarchical context-parallel groups are not set");
  MCPP_CHECK(a.a2a->size() * a.p2p->size() == cp.size() &&
                 cp.rank() == a.p2p->rank() * a.a2a->size() + a.a2a->rank(),
             "--cp-comm-type a2a+p2p: groups of {} x {} ranks (at {}, {}) do not lay out the "
             "context-parallel group of {} (rank {})",
             a.a2a->size(), a.p2p->size(), a.a2a->rank(), a.p2p->rank(), cp.size(), cp.rank());
  a2a_check(a, a.a2a->size(), "a2a+p2p");
  Hierarchy h{*a.a2a, *a.p2p, level_of(a, *a.a2a), a};
  h.ring.type = CommType::P2P;
  const int64_t S_global = a.ad.S * cp.size();
  h.ring.ad = a2a_dims(a, h.lv, h.a2a, s);
  h.ring.ad.S_global = S_global;
  // The sinks of the ring's heads (this level-0 rank's share, as a2a's g.r * NH offset):
  // views, so their gradients land in the whole parameter's.
  if (a.sink.defined()) {
    const int64_t nh = h.ring.ad.NH, h0 = h.lv.r * nh;
    h.ring.sink = a.sink.narrow(h0, nh);
    if (a.dsink.defined()) h.ring.dsink = a.dsink.narrow(h0, nh);
  }
  return h;
}

void hier_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp, Tensor& out,
                  Tensor& lse, Stream& s) {
  Hierarchy h = hierarchy_of(a, cp, s);
  const int64_t P = h.lv.P, T = h.ring.ad.S * h.ring.ad.B;
  const int64_t W = a.ad.qkv_width(), O = a.ad.NH * a.ad.HD;
  Tensor full = Tensor::empty({T, W / P}, qkv.dtype(), qkv.device());
  seq_to_heads(h.lv, qkv, full, h.a2a, s);
  Tensor ctx = Tensor::empty({T, O / P}, qkv.dtype(), qkv.device());
  RingRank g(h.ring, h.p2p.size(), h.p2p.rank(), qkv.dtype(), s);
  ring_forward(h.ring, g, full, h.p2p, ctx, lse, s);
  if (h.ring.sink.defined()) g.apply_sink(ctx, lse, s);
  heads_to_seq(h.lv, ctx, out, h.a2a, s);
}

void hier_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, comm::Communicator& cp, Tensor& dqkv, Stream& s) {
  Hierarchy h = hierarchy_of(a, cp, s);
  const int64_t P = h.lv.P, T = h.ring.ad.S * h.ring.ad.B;
  const int64_t W = a.ad.qkv_width(), O = a.ad.NH * a.ad.HD;
  const Device dev = qkv.device();
  Tensor full = Tensor::empty({T, W / P}, qkv.dtype(), dev);
  Tensor ctx = Tensor::empty({T, O / P}, qkv.dtype(), dev);
  Tensor dctx = Tensor::empty(ctx.shape(), qkv.dtype(), dev);
  seq_to_heads(h.lv, qkv, full, h.a2a, s);
  seq_to_heads(h.lv, out, ctx, h.a2a, s);
  seq_to_heads(h.lv, dout, dctx, h.a2a, s);
  Tensor dfull = Tensor::empty(full.shape(), qkv.dtype(), dev);
  const RingRank g(h.ring, h.p2p.size(), h.p2p.rank(), qkv.dtype(), s);
  if (h.ring.sink.defined()) g.sink_backward(dctx, ctx, lse, s);
  ring_backward(h.ring, g, dctx, full, ctx, lse, h.p2p, dfull, s);
  heads_to_seq(h.lv, dfull, dqkv, h.a2a, s);
}

// a2a+p2p with a level of one is the other level's exchange over the whole CP group.
CommType effective_type(const CpAttention& a) {
  if (a.type != CommType::A2AP2P || !a.a2a || !a.p2p) return a.type;
  if (a.a2a->size() == 1) return CommType::P2P;
  if (a.p2p->size() == 1) return CommType::A2A;
  return a.type;
}

}  // namespace

void attention_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp,
                       Tensor& out, Tensor& lse, Stream& s) {
  check_args("context-parallel attention_forward", a, qkv, cp);
  const CommType t = effective_type(a);
  if (t == CommType::A2A) return a2a_forward(a, qkv, cp, out, lse, s);
  if (t == CommType::A2AP2P) return hier_forward(a, qkv, cp, out, lse, s);
  CpAttention b = a;
  b.type = t;
  RingRank g(b, cp.size(), cp.rank(), qkv.dtype(), s);
  if (t == CommType::AllGather)
    gather_forward(b, g, qkv, cp, out, lse, s);
  else
    ring_forward(b, g, qkv, cp, out, lse, s);
  if (a.sink.defined()) g.apply_sink(out, lse, s);
}

void attention_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, comm::Communicator& cp,
                        Tensor& dqkv, Stream& s) {
  check_args("context-parallel attention_backward", a, qkv, cp);
  const CommType t = effective_type(a);
  if (t == CommType::A2A) return a2a_backward(a, dout, qkv, out, lse, cp, dqkv, s);
  if (t == CommType::A2AP2P) return hier_backward(a, dout, qkv, out, lse, cp, dqkv, s);
  CpAttention b = a;
  b.type = t;
  const RingRank g(b, cp.size(), cp.rank(), qkv.dtype(), s);
  if (a.sink.defined()) g.sink_backward(dout, out, lse, s);
  if (t == CommType::AllGather) return gather_backward(b, g, dout, qkv, out, lse, cp, dqkv, s);
  ring_backward(b, g, dout, qkv, out, lse, cp, dqkv, s);
}

}  // namespace mcpp::parallel::context_parallel
