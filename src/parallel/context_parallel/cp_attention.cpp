#include "parallel/context_parallel/cp_attention.h"

#include <cstring>
#include <limits>
#include <vector>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel::context_parallel {
namespace {

// The sequence geometry of one rank.
struct Geo {
  int64_t P, r, C, B, W, O;  // CP size and rank, chunk rows, batch, qkv and out widths
  Tensor ks[2];  // document masking (p2p, all_gather): local chunk k's [B, C] key starts
  explicit Geo(const ops::AttentionDims& d, const comm::Communicator& cp)
      : P(cp.size()), r(cp.rank()), C(d.S / 2), B(d.B), W(d.qkv_width()), O(d.NH * d.HD) {}
  // Global chunk of local chunk k (0, 1) of rank j.
  int64_t chunk(int64_t j, int k) const { return k == 0 ? j : 2 * P - 1 - j; }
  int64_t rows() const { return C * B; }  // rows of one chunk in a [S*B, width] tensor
};

Tensor rows_of(const Tensor& t, const Geo& g, int k) { return t.narrow(k * g.rows(), g.rows()); }
// Local chunk k's lse, [B, NH, C] (the p2p / all_gather layout [2][B, NH, C]).
Tensor lse_of(const Tensor& lse, int k) {
  const int64_t n = lse.numel() / 2;
  return lse.flat().narrow(k * n, n);
}

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

// Document masking: local chunk x's [B, C] of this rank's [B, 2C] key starts (global).
Tensor key_start_chunk(const Tensor& ks, const Geo& g, int x, Stream& s) {
  const Tensor h = to_host(ks, s);
  Tensor out = Tensor::empty({g.B, g.C}, DType::I64);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.C; ++i)
      out.data<int64_t>()[b * g.C + i] = h.data<int64_t>()[b * 2 * g.C + x * g.C + i];
  return to_device(out, ks.device(), s);
}

Geo geometry(const CpAttention& a, const comm::Communicator& cp, Stream& s) {
  Geo g(a.ad, cp);
  if (a.ad.key_start.defined() && a.type != CommType::A2A)
    for (int k = 0; k < 2; ++k) g.ks[k] = key_start_chunk(a.ad.key_start, g, k, s);
  return g;
}

// The dims of block (local query chunk x = global chunk qa, key global chunk kc): offsets
// for dropout and the document mask.
ops::AttentionDims block_dims(const CpAttention& a, const Geo& g, int x, int64_t qa, int64_t kc) {
  ops::AttentionDims d = a.ad;
  d.S = g.C;
  d.S_global = 2 * g.P * g.C;
  d.q_offset = qa * g.C, d.k_offset = kc * g.C;
  if (a.ad.key_start.defined()) d.key_start = g.ks[x];
  return d;
}

// Calls f(x, y, causal): the visible (local query chunk x, key chunk y of rank j) blocks.
template <class F>
void for_each_block(const Geo& g, int64_t j, F&& f) {
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 2; ++y) {
      const int64_t qa = g.chunk(g.r, x), kc = g.chunk(j, y);
      if (kc <= qa) f(x, y, qa, kc, kc == qa);
    }
}

// ---- the blocks against one rank's keys/values -------------------------------------------

struct Acc {  // forward: the running merge
  Tensor o_i, lse_i;
};

void forward_blocks(const CpAttention& a, const Geo& g, const Tensor& qkv, const Tensor& kv,
                    int64_t j, Acc& t, Tensor& out, Tensor& lse, Stream& s) {
  for_each_block(g, j, [&](int x, int y, int64_t qa, int64_t kc, bool causal) {
    const ops::AttentionDims d = block_dims(a, g, x, qa, kc);
    ops::attention_block_forward(rows_of(qkv, g, x), rows_of(kv, g, y), d, causal, a.scale,
                                 a.dropout_p, a.key, t.o_i, t.lse_i, s);
    Tensor o = rows_of(out, g, x), l = lse_of(lse, x);
    ops::attention_lse_merge(t.o_i, t.lse_i, d, o, l, s);
  });
}

void backward_blocks(const CpAttention& a, const Geo& g, const Tensor& dout, const Tensor& qkv,
                     const Tensor& out, const Tensor& lse, const Tensor& kv, int64_t j,
                     Tensor& dqkv, Tensor& dkv, Stream& s) {
  for_each_block(g, j, [&](int x, int y, int64_t qa, int64_t kc, bool causal) {
    const ops::AttentionDims d = block_dims(a, g, x, qa, kc);
    Tensor dq = rows_of(dqkv, g, x), dk = rows_of(dkv, g, y);
    ops::attention_block_backward(rows_of(dout, g, x), rows_of(qkv, g, x), rows_of(kv, g, y),
                                  rows_of(out, g, x), lse_of(lse, x), d, causal, a.scale,
                                  a.dropout_p, a.key, dq, dk, s);
  });
}

void start_merge(const Geo& g, const CpAttention& a, Tensor& out, Tensor& lse, Acc& t,
                 Stream& s) {
  ops::fill(out, 0.0, s);
  ops::fill(lse, -std::numeric_limits<double>::infinity(), s);
  t.o_i = Tensor::empty({g.rows(), g.O}, out.dtype(), out.device());
  t.lse_i = Tensor::empty({a.ad.B, a.ad.NH, g.C}, lse.dtype(), lse.device());
}

// ---- p2p: the ring -----------------------------------------------------------------------

// Posts send(t -> r+1) and recv(into -> from r-1) together (no ordering deadlock).
std::vector<comm::Work> ring_shift(comm::Communicator& cp, const Geo& g,
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

void ring_forward(const CpAttention& a, const Geo& g, const Tensor& qkv, comm::Communicator& cp,
                  Tensor& out, Tensor& lse, Stream& s) {
  Acc t;
  start_merge(g, a, out, lse, t, s);
  const Device dev = qkv.device();
  Tensor buf[2] = {Tensor::empty(qkv.shape(), qkv.dtype(), dev),
                   Tensor::empty(qkv.shape(), qkv.dtype(), dev)};
  Tensor cur = qkv;
  for (int64_t i = 0; i < g.P; ++i) {
    // The next step's K/V travel while this step's blocks run.
    std::vector<comm::Work> w;
    Tensor& next = buf[i % 2];
    if (i + 1 < g.P) w = ring_shift(cp, g, {{cur, next}}, s);
    forward_blocks(a, g, qkv, cur, (g.r - i + g.P) % g.P, t, out, lse, s);
    for (auto& x : w) x.wait();
    cur = next;
  }
}

void ring_backward(const CpAttention& a, const Geo& g, const Tensor& dout, const Tensor& qkv,
                   const Tensor& out, const Tensor& lse, comm::Communicator& cp, Tensor& dqkv,
                   Stream& s) {
  ops::fill(dqkv, 0.0, s);
  auto make = [&] { return Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device()); };
  Tensor kv_buf[2] = {make(), make()}, dkv_buf[2] = {make(), make()};
  Tensor cur = qkv, dcur = make();
  ops::fill(dcur, 0.0, s);
  for (int64_t i = 0; i < g.P; ++i) {
    std::vector<comm::Work> w;
    Tensor& next = kv_buf[i % 2];
    if (i + 1 < g.P) w = ring_shift(cp, g, {{cur, next}}, s);
    backward_blocks(a, g, dout, qkv, out, lse, cur, (g.r - i + g.P) % g.P, dqkv, dcur, s);
    // dK/dV of rank j move on with its K/V; after CP shifts they are home.
    Tensor& dnext = dkv_buf[i % 2];
    for (auto& x : ring_shift(cp, g, {{dcur, dnext}}, s)) x.wait();
    for (auto& x : w) x.wait();
    cur = next, dcur = dnext;
  }
  // Only the key/value slots of dcur are non-zero: this rank's dK, dV from every query.
  ops::axpy(1.0, dcur, dqkv, s);
}

// ---- all_gather --------------------------------------------------------------------------

void gather_forward(const CpAttention& a, const Geo& g, const Tensor& qkv, comm::Communicator& cp,
                    Tensor& out, Tensor& lse, Stream& s) {
  Acc t;
  start_merge(g, a, out, lse, t, s);
  Tensor all = Tensor::empty({g.P * qkv.size(0), qkv.size(1)}, qkv.dtype(), qkv.device());
  cp.all_gather(qkv, all, s);
  for (int64_t i = 0; i < g.P; ++i) {  // the ring's order, so both merge alike
    const int64_t j = (g.r - i + g.P) % g.P;
    forward_blocks(a, g, qkv, all.narrow(j * qkv.size(0), qkv.size(0)), j, t, out, lse, s);
  }
}

void gather_backward(const CpAttention& a, const Geo& g, const Tensor& dout, const Tensor& qkv,
                     const Tensor& out, const Tensor& lse, comm::Communicator& cp, Tensor& dqkv,
                     Stream& s) {
  const int64_t n = qkv.size(0);
  Tensor all = Tensor::empty({g.P * n, qkv.size(1)}, qkv.dtype(), qkv.device());
  cp.all_gather(qkv, all, s);
  Tensor dall = Tensor::empty(all.shape(), qkv.dtype(), qkv.device());
  ops::fill(dall, 0.0, s);
  ops::fill(dqkv, 0.0, s);
  for (int64_t i = 0; i < g.P; ++i) {
    const int64_t j = (g.r - i + g.P) % g.P;
    Tensor dj = dall.narrow(j * n, n);
    backward_blocks(a, g, dout, qkv, out, lse, all.narrow(j * n, n), j, dqkv, dj, s);
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

// Row m of the gathered sequence [2PC*B, w] sits in the all-to-all's block of rank j at
// local chunk k (block j*2 + k): the global chunk order from the ranks' (r, 2P-1-r) pairs.
std::vector<int64_t> chunk_order(const Geo& g) {
  const int64_t rows = g.rows(), n = 2 * g.P * rows;
  std::vector<int64_t> at(static_cast<size_t>(n));
  for (int64_t j = 0; j < g.P; ++j)
    for (int k = 0; k < 2; ++k)
      for (int64_t i = 0; i < rows; ++i)
        at[size_t(g.chunk(j, k) * rows + i)] = (j * 2 + k) * rows + i;
  return at;
}

// local [2C*B, P*w] (this rank's rows, all column slices) -> full [2PC*B, w] (every rank's
// rows in global sequence order, column slice r), over an all-to-all.
void seq_to_heads(const Geo& g, const Tensor& local, Tensor& full, comm::Communicator& cp,
                  Stream& s) {
  const int64_t R = 2 * g.rows(), w = full.size(1);
  Tensor send = Tensor::empty({g.P * R, w}, local.dtype(), local.device());
  Tensor recv = Tensor::empty(send.shape(), local.dtype(), local.device());
  std::vector<int64_t> src(static_cast<size_t>(g.P * R));
  for (int64_t p = 0; p < g.P; ++p)  // block p: column slice p of every row
    for (int64_t t = 0; t < R; ++t) src[size_t(p * R + t)] = t * g.P + p;
  gather_rows_at(local.view({R * g.P, w}), src, send, s);
  cp.all_to_all(send, recv, s);
  gather_rows_at(recv, chunk_order(g), full, s);
}

// The inverse: full [2PC*B, w] (slice r of every row) -> local [2C*B, P*w].
void heads_to_seq(const Geo& g, const Tensor& full, Tensor& local, comm::Communicator& cp,
                  Stream& s) {
  const int64_t R = 2 * g.rows(), w = full.size(1);
  Tensor send = Tensor::empty({g.P * R, w}, full.dtype(), full.device());
  Tensor recv = Tensor::empty(send.shape(), full.dtype(), full.device());
  // send block (j, k) = the gathered rows of global chunk chunk(j, k): chunk_order inverted.
  const std::vector<int64_t> at = chunk_order(g);
  std::vector<int64_t> src(at.size());
  for (size_t m = 0; m < at.size(); ++m) src[size_t(at[m])] = int64_t(m);
  gather_rows_at(full, src, send, s);
  cp.all_to_all(send, recv, s);
  std::vector<int64_t> back(static_cast<size_t>(g.P * R));
  for (int64_t p = 0; p < g.P; ++p)
    for (int64_t t = 0; t < R; ++t) back[size_t(t * g.P + p)] = p * R + t;
  Tensor out = local.view({R * g.P, w});
  gather_rows_at(recv, back, out, s);
}

// The gathered attention's dims: the whole sequence, this rank's slice of the heads; with
// document masking the whole sequence's key starts, gathered from every rank's chunks.
ops::AttentionDims a2a_dims(const CpAttention& a, const Geo& g, comm::Communicator& cp,
                            Stream& s) {
  ops::AttentionDims d = a.ad;
  d.S = 2 * g.P * g.C, d.S_global = d.S, d.q_offset = d.k_offset = 0;
  d.NH = a.ad.NH / g.P, d.NG = a.ad.NG / g.P;
  d.h_offset = a.ad.h_offset + g.r * d.NH;
  if (a.ad.key_start.defined()) {
    Tensor all = Tensor::empty({g.P * g.B, 2 * g.C}, DType::I64, a.ad.key_start.device());
    cp.all_gather(a.ad.key_start, all, s);
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

void a2a_check(const CpAttention& a, const Geo& g, const Tensor& qkv) {
  MCPP_CHECK_HINT(a.ad.NG % g.P == 0 && a.ad.NH % g.P == 0,
                  "use --cp-comm-type p2p, or a --context-parallel-size dividing the heads",
                  "--cp-comm-type a2a: {} heads in {} query groups per tensor-parallel rank do "
                  "not split over {} context-parallel ranks",
                  a.ad.NH, a.ad.NG, g.P);
}

void a2a_forward(const CpAttention& a, const Geo& g, const Tensor& qkv, comm::Communicator& cp,
                 Tensor& out, Tensor& lse, Stream& s) {
  a2a_check(a, g, qkv);
  const ops::AttentionDims d = a2a_dims(a, g, cp, s);
  Tensor full = Tensor::empty({d.S * d.B, g.W / g.P}, qkv.dtype());
  seq_to_heads(g, qkv, full, cp, s);
  Tensor ctx = Tensor::empty({d.S * d.B, g.O / g.P}, qkv.dtype());
  Tensor l = lse.view({d.B, d.NH, d.S});
  ops::attention_forward(full, d, a.scale, a.dropout_p, a.key, ctx, l, s);
  heads_to_seq(g, ctx, out, cp, s);
}

void a2a_backward(const CpAttention& a, const Geo& g, const Tensor& dout, const Tensor& qkv,
                  const Tensor& out, const Tensor& lse, comm::Communicator& cp, Tensor& dqkv,
                  Stream& s) {
  a2a_check(a, g, qkv);
  const ops::AttentionDims d = a2a_dims(a, g, cp, s);
  const int64_t T = d.S * d.B;
  Tensor full = Tensor::empty({T, g.W / g.P}, qkv.dtype());
  Tensor ctx = Tensor::empty({T, g.O / g.P}, qkv.dtype()), dctx = Tensor::empty(ctx.shape(), qkv.dtype());
  seq_to_heads(g, qkv, full, cp, s);
  seq_to_heads(g, out, ctx, cp, s);
  seq_to_heads(g, dout, dctx, cp, s);
  Tensor dfull = Tensor::empty(full.shape(), qkv.dtype());
  ops::attention_backward(dctx, full, ctx, lse.view({d.B, d.NH, d.S}), d, a.scale, a.dropout_p,
                          a.key, dfull, s);
  heads_to_seq(g, dfull, dqkv, cp, s);
}

}  // namespace

void attention_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp,
                       Tensor& out, Tensor& lse, Stream& s) {
  check_args("context-parallel attention_forward", a, qkv, cp);
  const Geo g = geometry(a, cp, s);
  switch (a.type) {
    case CommType::P2P: return ring_forward(a, g, qkv, cp, out, lse, s);
    case CommType::AllGather: return gather_forward(a, g, qkv, cp, out, lse, s);
    case CommType::A2A: return a2a_forward(a, g, qkv, cp, out, lse, s);
  }
}

void attention_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, comm::Communicator& cp,
                        Tensor& dqkv, Stream& s) {
  check_args("context-parallel attention_backward", a, qkv, cp);
  const Geo g = geometry(a, cp, s);
  switch (a.type) {
    case CommType::P2P: return ring_backward(a, g, dout, qkv, out, lse, cp, dqkv, s);
    case CommType::AllGather: return gather_backward(a, g, dout, qkv, out, lse, cp, dqkv, s);
    case CommType::A2A: return a2a_backward(a, g, dout, qkv, out, lse, cp, dqkv, s);
  }
}

}  // namespace mcpp::parallel::context_parallel
