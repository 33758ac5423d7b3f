// Communication test driver: every collective against a serial reference, on the world
// and on the groups of a ParallelState, under mpirun (MPI backend) or a torchrun-style
// launch (tests/comm/tcp_launch.sh: TCP backend). Each rank computes the expected result of every
// member itself (inputs are a function of group rank and index), so no rank needs
// another's data to check. Exit status: 0 when every check passed.
//
//   comm_driver collectives TP PP     all ops, all dtypes, sync and async
//   comm_driver timeout-collective S  the last world rank skips an all_reduce on 'dp';
//                                     the others must abort within S seconds
//   comm_driver timeout-recv S        rank 0 waits for a message rank 1 never sends
//   comm_driver crash S               the last rank dies before a collective
// MCPP_TEST_MPI_SERIALIZED=1 asks MPI for SERIALIZED instead of MULTIPLE.
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/log.h"
#include "comm/world.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
using namespace mcpp::comm;
using namespace mcpp::parallel;

namespace {

int g_failures = 0;
int g_rank = 0;

#define CHECK_EQ_V(got, want, ...)                                                             \
  do {                                                                                         \
    if ((got) != (want)) {                                                                     \
      if (g_failures++ < 20)                                                                   \
        std::fprintf(stderr, "[rank %d] FAIL line %d: %s: got %g want %g\n", g_rank, __LINE__, \
                     fmt::format(__VA_ARGS__).c_str(), double(got), double(want));             \
    }                                                                                          \
  } while (0)

// Value stored after a round trip through the dtype (what an exact transfer keeps).
double stored(DType t, double v) {
  switch (t) {
    case DType::F32:
      return float(v);
    case DType::BF16:
      return bf16_to_float(float_to_bf16(float(v)));
    case DType::F16:
      return f16_to_float(float_to_f16(float(v)));
    case DType::I32:
      return double(int32_t(v));
    case DType::I64:
      return double(int64_t(v));
    default:
      return v;
  }
}

double get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32:
      return t.data<float>()[i];
    case DType::F64:
      return t.data<double>()[i];
    case DType::I32:
      return t.data<int32_t>()[i];
    case DType::I64:
      return double(t.data<int64_t>()[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::F16:
      return f16_to_float(static_cast<const uint16_t*>(t.raw())[i]);
    default:
      std::abort();
  }
}

void set(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32:
      t.data<float>()[i] = float(v);
      break;
    case DType::F64:
      t.data<double>()[i] = v;
      break;
    case DType::I32:
      t.data<int32_t>()[i] = int32_t(v);
      break;
    case DType::I64:
      t.data<int64_t>()[i] = int64_t(v);
      break;
    case DType::BF16:
      static_cast<uint16_t*>(t.raw())[i] = float_to_bf16(float(v));
      break;
    case DType::F16:
      static_cast<uint16_t*>(t.raw())[i] = float_to_f16(float(v));
      break;
    default:
      std::abort();
  }
}

template <typename F>
Tensor filled(const Shape& shape, DType dt, F f) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, f(i));
  return t;
}

// Movement payload of group rank j, element k; reduction payload (small: exact in bf16).
double mv(int j, int64_t k) { return j * 16 + k % 16 + 0.5 * (k % 2); }
double rd(int j, int64_t k) { return j + k % 3 + 1; }

constexpr DType kDtypes[] = {DType::F32, DType::F64,  DType::I32,
                             DType::I64, DType::BF16, DType::F16};

void check_group(Communicator& c, bool async) {
  Stream& s = Stream::cpu();
  const int n = c.size(), me = c.rank();
  const std::string who = fmt::format("{}{}", c.name(), async ? " async" : "");
  auto done = [&](Work w) {
    if (async) {
      while (!w.test()) std::this_thread::yield();
    }
    w.wait();
  };
  for (DType dt : kDtypes) {
    const auto dn = dtype_name(dt);
    // all_reduce sum and max, in place.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      Tensor t = filled({3, 2}, dt, [&](int64_t k) { return rd(me, k); });
      if (async)
        done(c.all_reduce_async(t, op, s));
      else
        c.all_reduce(t, op, s);
      for (int64_t k = 0; k < t.numel(); ++k) {
        double want = 0;
        for (int j = 0; j < n; ++j)
          want = op == ReduceOp::Sum ? want + rd(j, k) : std::max(want, rd(j, k));
        CHECK_EQ_V(get(t, k), want, "{} all_reduce {} {} k={}", who, reduce_op_name(op), dn, k);
      }
    }
    // all_gather along dim 0, from a separate input and in place (the input is this
    // rank's block of the output).
    for (bool in_place : {false, true}) {
      Tensor out = Tensor::zeros({2 * n, 3}, dt);
      Tensor in = in_place ? out.narrow(2 * me, 2) : Tensor::zeros({2, 3}, dt);
      for (int64_t k = 0; k < 6; ++k) set(in, k, mv(me, k));
      if (async)
        done(c.all_gather_async(in, out, s));
      else
        c.all_gather(in, out, s);
      for (int j = 0; j < n; ++j)
        for (int64_t k = 0; k < 6; ++k)
          CHECK_EQ_V(get(out, j * 6 + k), stored(dt, mv(j, k)), "{} all_gather{} {}", who,
                     in_place ? " in place" : "", dn);
    }
    // reduce_scatter (sum) along dim 0.
    {
      Tensor in = filled({2 * n, 3}, dt, [&](int64_t k) { return rd(me, k); });
      Tensor out = Tensor::zeros({2, 3}, dt);
      if (async)
        done(c.reduce_scatter_async(in, out, s));
      else
        c.reduce_scatter(in, out, s);
      for (int64_t k = 0; k < 6; ++k) {
        double want = 0;
        for (int j = 0; j < n; ++j) want += rd(j, me * 6 + k);
        CHECK_EQ_V(get(out, k), want, "{} reduce_scatter {} k={}", who, dn, k);
      }
    }
    // all_to_all, equal splits: block b of rank j's input lands in block j of rank b.
    {
      Tensor in = filled({2 * n, 2}, dt, [&](int64_t k) { return mv(me, k); });
      Tensor out = Tensor::zeros({2 * n, 2}, dt);
      if (async)
        done(c.all_to_all_async(in, out, s));
      else
        c.all_to_all(in, out, s);
      for (int j = 0; j < n; ++j)
        for (int64_t e = 0; e < 4; ++e)
          CHECK_EQ_V(get(out, j * 4 + e), stored(dt, mv(j, me * 4 + e)), "{} all_to_all {}", who,
                     dn);
    }
    // all_to_allv: rank j sends (j + d) % 3 rows (width 2) to rank d.
    {
      auto rows = [](int src, int dst) { return int64_t((src + dst) % 3); };
      std::vector<int64_t> sr(n), rr(n);
      int64_t srows = 0, rrows = 0;
      for (int d = 0; d < n; ++d) sr[d] = rows(me, d), srows += sr[d];
      for (int j = 0; j < n; ++j) rr[j] = rows(j, me), rrows += rr[j];
      Tensor in = filled({srows, 2}, dt, [&](int64_t k) { return mv(me, k); });
      Tensor out = Tensor::zeros({rrows, 2}, dt);
      if (async)
        done(c.all_to_allv_async(in, sr, out, rr, s));
      else
        c.all_to_allv(in, sr, out, rr, s);
      int64_t o = 0;
      for (int j = 0; j < n; ++j) {
        int64_t off = 0;  // where rank j's rows for me start in j's input
        for (int d = 0; d < me; ++d) off += rows(j, d);
        for (int64_t q = 0; q < rr[j] * 2; ++q, ++o)
          CHECK_EQ_V(get(out, o), stored(dt, mv(j, off * 2 + q)), "{} all_to_allv {} from {}", who,
                     dn, j);
      }
    }
    // broadcast from the last group rank.
    {
      Tensor t = filled({5}, dt, [&](int64_t k) { return mv(me, k); });
      if (async)
        done(c.broadcast_async(t, n - 1, s));
      else
        c.broadcast(t, n - 1, s);
      for (int64_t k = 0; k < 5; ++k)
        CHECK_EQ_V(get(t, k), stored(dt, mv(n - 1, k)), "{} broadcast {}", who, dn);
    }
    // send/recv around the ring (nonblocking send first, so it cannot deadlock).
    {
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      Tensor out = filled({4}, dt, [&](int64_t k) { return mv(me, k); });
      Tensor in = Tensor::zeros({4}, dt);
      Work ws = c.send_async(out, next, s);
      if (async) {
        Work wr = c.recv_async(in, prev, s);
        done(wr);
      } else {
        c.recv(in, prev, s);
      }
      ws.wait();
      for (int64_t k = 0; k < 4; ++k)
        CHECK_EQ_V(get(in, k), stored(dt, mv(prev, k)), "{} send/recv {}", who, dn);
    }
  }
  if (async)
    done(c.barrier_async(s));
  else
    c.barrier(s);
}

// Several reductions in flight at once, completed out of order.
void check_overlap(Communicator& c) {
  Stream& s = Stream::cpu();
  const int n = c.size(), me = c.rank();
  std::vector<Tensor> ts;
  std::vector<Work> ws;
  for (int b = 0; b < 4; ++b) {
    ts.push_back(filled({7}, DType::F32, [&](int64_t k) { return rd(me, k + b); }));
    ws.push_back(c.all_reduce_async(ts.back(), ReduceOp::Sum, s));
  }
  Tensor g_in = filled({1}, DType::I32, [&](int64_t) { return c.world_rank(); });
  Tensor g_out = Tensor::zeros({n}, DType::I32);
  Work wg = c.all_gather_async(g_in, g_out, s);
  for (int b = 3; b >= 0; --b) ws[b].wait();
  wg.wait();
  for (int b = 0; b < 4; ++b)
    for (int64_t k = 0; k < 7; ++k) {
      double want = 0;
      for (int j = 0; j < n; ++j) want += rd(j, k + b);
      CHECK_EQ_V(get(ts[b], k), want, "{} overlapped all_reduce {}", c.name(), b);
    }
  // The group's members, as gathered, are the world ranks it claims.
  for (int j = 0; j < n; ++j) CHECK_EQ_V(get(g_out, j), c.ranks()[j], "{} member {}", c.name(), j);
}

// batch_isend_irecv around the ring with every receive posted before its send, and a
// two-way exchange with one peer: the pipeline's patterns, which deadlock a backend whose
// receive blocks before the batch's sends go out.
void check_batch_ring(Communicator& c) {
  Stream& s = Stream::cpu();
  const int n = c.size(), me = c.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  Tensor from_prev = Tensor::zeros({5}, DType::F32), from_next = Tensor::zeros({3}, DType::F32);
  std::vector<P2POp> ops{
      {false, from_prev, prev},
      {false, from_next, next},
      {true, filled({5}, DType::F32, [&](int64_t k) { return mv(me, k); }), next},
      {true, filled({3}, DType::F32, [&](int64_t k) { return mv(me, k + 7); }), prev}};
  for (Work& w : c.batch_isend_irecv(ops, s)) w.wait();
  for (int64_t k = 0; k < 5; ++k)
    CHECK_EQ_V(get(from_prev, k), mv(prev, k), "{} batched ring from prev", c.name());
  for (int64_t k = 0; k < 3; ++k)
    CHECK_EQ_V(get(from_next, k), mv(next, k + 7), "{} batched ring from next", c.name());
}

// The TCP backend reduces in group-rank order, ((x0 + x1) + x2) + ..., on every member:
// values whose float sum depends on the order (1e8 + 1 - 1e8 ...) must come out as that
// left fold, the same bits everywhere.
void check_rank_order(Communicator& c) {
  const int n = c.size(), me = c.rank();
  auto x = [](int j, int64_t k) {
    static const float kV[] = {1e8f, 1.0f, -1e8f, 3.0f, 0.1f, -7e7f, 2.5e-3f, 5e7f};
    return kV[(j + k) % 8] * (1.0f + 0.01f * float(k));
  };
  Tensor t = filled({8}, DType::F32, [&](int64_t k) { return x(me, k); });
  c.all_reduce(t, ReduceOp::Sum, Stream::cpu());
  for (int64_t k = 0; k < 8; ++k) {
    float want = x(0, k);
    for (int j = 1; j < n; ++j) want = want + x(j, k);
    CHECK_EQ_V(double(t.data<float>()[k]), double(want), "{} rank-order sum k={}", c.name(), k);
  }
}

// bf16 SUM in a group of two rounds the exact sum of the two bf16 inputs once, to
// nearest even (the data-parallel reduction of --grad-reduce-in-bf16 relies on it). The
// small-integer payloads above sum exactly; these do not. The rounding is written out
// here on the bits, independently of tensor/dtype.h.
float rne_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xFFFF0000u);
}
// Group rank j's element k: ties first (1 + 2^-8 rounds down to even 1, 1 + 2^-7 + 2^-8
// up to even 1 + 2^-6), then values with full bf16 mantissas over several binades.
float rounding_payload(int j, int64_t k) {
  static const float kTies[][2] = {
      {1.0f, 0.00390625f}, {1.0078125f, 0.00390625f}, {1.0f, 0.005859375f}, {-1.5f, 1.0078125f}};
  if (k < 4) return kTies[k][j];
  return rne_bf16(float(std::ldexp(std::sin(0.37 * double(k) + 1.9 * j), int(k % 5) - 2)));
}

void check_bf16_rounding(Communicator& c) {
  Stream& s = Stream::cpu();
  const int me = c.rank();
  const int64_t m = 12;
  auto want = [](int64_t k) { return rne_bf16(rounding_payload(0, k) + rounding_payload(1, k)); };
  int64_t rounded = 0;  // elements whose exact sum is not a bf16 value
  for (int64_t k = 0; k < 2 * m; ++k)
    rounded += want(k) != rounding_payload(0, k) + rounding_payload(1, k);
  CHECK_EQ_V(double(4 * rounded >= 2 * m), 1.0, "{} bf16 rounding payload: only {} sums round",
             c.name(), rounded);
  Tensor t = filled({2 * m}, DType::BF16, [&](int64_t k) { return rounding_payload(me, k); });
  c.all_reduce(t, ReduceOp::Sum, s);
  for (int64_t k = 0; k < 2 * m; ++k)
    CHECK_EQ_V(get(t, k), want(k), "{} bf16 all_reduce rounding k={}", c.name(), k);
  Tensor in = filled({2 * m}, DType::BF16, [&](int64_t k) { return rounding_payload(me, k); });
  Tensor out = Tensor::zeros({m}, DType::BF16);
  c.reduce_scatter(in, out, s);
  for (int64_t k = 0; k < m; ++k)
    CHECK_EQ_V(get(out, k), want(me * m + k), "{} bf16 reduce_scatter rounding k={}", c.name(), k);
}

int run_collectives(World& w, int tp, int pp) {
  const auto t0 = std::chrono::steady_clock::now();
  check_group(w.world(), false);
  check_group(w.world(), true);
  check_overlap(w.world());
  check_batch_ring(w.world());
  if (w.backend() == "tcp") check_rank_order(w.world());
  if (w.size() == 2) check_bf16_rounding(w.world());
  // Groups made by new_group: every rank reversed (group order != world order), then two
  // groups with the same members made by the members alone, used interleaved: their
  // messages must not meet.
  if (w.size() > 1) {
    std::vector<int> rev;
    for (int r = w.size() - 1; r >= 0; --r) rev.push_back(r);
    auto g = w.new_group(rev, "reversed");
    CHECK_EQ_V(g->rank(), w.size() - 1 - w.rank(), "reversed group rank");
    check_group(*g, false);
    const std::vector<int> ends{0, w.size() - 1};
    if (w.rank() == 0 || w.rank() == w.size() - 1) {
      auto a = w.new_group(ends, "ends_a");
      auto b = w.new_group(ends, "ends_b");
      Tensor ta = filled({3}, DType::F32, [&](int64_t k) { return rd(a->rank(), k); });
      Tensor tb = filled({3}, DType::F32, [&](int64_t k) { return 100 * rd(b->rank(), k); });
      Work wa = a->all_reduce_async(ta, ReduceOp::Sum, Stream::cpu());
      b->all_reduce(tb, ReduceOp::Sum, Stream::cpu());
      wa.wait();
      for (int64_t k = 0; k < 3; ++k) {
        CHECK_EQ_V(get(ta, k), rd(0, k) + rd(1, k), "ends_a all_reduce k={}", k);
        CHECK_EQ_V(get(tb, k), 100 * (rd(0, k) + rd(1, k)), "ends_b all_reduce k={}", k);
      }
      check_batch_ring(*b);
    }
  }
  ParallelSizes sz;
  sz.tp = tp, sz.pp = pp;
  ParallelState ps(w, sz);
  for (int g = 0; g < kNumGroups; ++g) {
    Group grp = Group(g);
    auto want = ps.layout().group_of(grp, w.rank());
    if (!ps.has(grp)) {
      CHECK_EQ_V(double(want.size()), 0.0, "rank has no '{}' group", group_name(grp));
      continue;
    }
    Communicator& c = ps.group(grp);
    if (c.ranks() != want) {
      ++g_failures;
      std::fprintf(stderr, "[rank %d] FAIL group %s: wrong members\n", g_rank, c.name().c_str());
    }
  }
  // The groups a TP x DP x PP model uses; others are the same code on other lists.
  for (Group grp : {Group::TP, Group::DP, Group::PP, Group::MP, Group::TP_DP}) {
    check_group(ps.group(grp), false);
    check_overlap(ps.group(grp));
    check_batch_ring(ps.group(grp));
    if (ps.group(grp).backend() == "tcp") check_rank_order(ps.group(grp));
    if (ps.group(grp).size() == 2) check_bf16_rounding(ps.group(grp));
  }
  if (ps.has(Group::Embedding)) check_group(ps.embedding(), true);
  // Sequence numbers: every member issued the same number of collectives.
  Tensor seq = filled({1}, DType::I64, [&](int64_t) { return double(ps.dp().sequence()); });
  Tensor seq_max = seq.clone();
  ps.dp().all_reduce(seq_max, ReduceOp::Max, Stream::cpu());
  CHECK_EQ_V(get(seq, 0), get(seq_max, 0), "dp sequence numbers agree");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Everybody's failures, so rank 0's verdict covers the job.
  Tensor f = filled({1}, DType::I32, [&](int64_t) { return g_failures; });
  w.world().all_reduce(f, ReduceOp::Sum, Stream::cpu());
  if (w.rank() == 0)
    std::printf(
        "comm_driver collectives: %d ranks (%s, thread level %s), TP %d PP %d DP %d: "
        "%s (%.2f s)\n",
        w.size(), std::string(w.backend()).c_str(), std::string(w.thread_level()).c_str(), tp, pp,
        ps.layout().dp(), get(f, 0) == 0 ? "all checks passed" : "FAILED", secs);
  return get(f, 0) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  InitOptions opts;
  if (const char* v = std::getenv("MCPP_TEST_MPI_SERIALIZED"); v && *v == '1')
    opts.mpi_thread_multiple = false;
  if (mode.rfind("timeout", 0) == 0 || mode == "crash")
    opts.timeout = std::chrono::milliseconds(int(1000 * std::atof(argc > 2 ? argv[2] : "2")));
  try {
    auto w = init(opts);
    g_rank = w->rank();
    if (mode == "collectives")
      return run_collectives(*w, argc > 2 ? std::atoi(argv[2]) : 1,
                             argc > 3 ? std::atoi(argv[3]) : 1);
    if (mode == "timeout-collective") {
      ParallelSizes sz;
      sz.tp = 2;
      ParallelState ps(*w, sz);
      Tensor t = Tensor::zeros({16}, DType::F32);
      ps.dp().all_reduce(t, ReduceOp::Sum, Stream::cpu());  // seq 0: everybody
      ps.tp().barrier(Stream::cpu());
      if (w->rank() != w->size() - 1) ps.dp().all_reduce(t, ReduceOp::Sum, Stream::cpu());
      std::fprintf(stderr, "[rank %d] passed the collective\n", w->rank());
      // The skipping rank and the complete groups wait here for the abort.
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "timeout-recv") {
      Tensor t = Tensor::zeros({3, 4}, DType::F32);
      if (w->rank() == 0) w->world().recv(t, 1, Stream::cpu());
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "crash") {
      Tensor t = Tensor::zeros({4}, DType::F32);
      if (w->rank() == w->size() - 1) {
        std::fprintf(stderr, "[rank %d] dying\n", w->rank());
        std::_Exit(3);
      }
      w->world().all_reduce(t, ReduceOp::Sum, Stream::cpu());
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] ERROR: %s\n", g_rank, e.what());
    return 1;
  }
}
