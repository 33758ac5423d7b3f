// NCCL backend driver, launched by mpirun with one GPU per rank (ctest label gpu;multigpu).
//
//   nccl_driver collectives   every collective and point-to-point call on device tensors
//                             (NCCL) against the same call on host tensors (the group's MPI
//                             path), all dtypes, sync and async, on the world-sized TP
//                             group and on a group built by new_group; exact comparison
//                             (inputs are small integers, exact in every dtype and sum)
//   nccl_driver kill S        the last rank SIGKILLs itself before its 6th all_reduce; the
//                             others must end with the communicator's timeout message
//                             within S seconds (run under mpirun --enable-recovery, so
//                             the launcher does not end them first)
// Exit status 0 when every check passed; "all checks passed" on stdout.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "base/log.h"
#include "comm/world.h"
#include "ops/cuda/device.h"
#include "ops/ops.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
using namespace mcpp::comm;

namespace {

int g_failures = 0, g_rank = 0;

void fail(const std::string& what) {
  if (g_failures++ < 30) std::fprintf(stderr, "[rank %d] FAIL %s\n", g_rank, what.c_str());
}

// A small integer, exact in every dtype, also summed over 8 ranks.
double value(int rank, int64_t i, int salt) { return double((rank * 7 + i * 3 + salt) % 11 - 5); }

Tensor host_tensor(const Shape& shape, DType dt, int rank, int salt) {
  Tensor t = Tensor::empty(shape, dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = value(rank, i, salt);
    if (dt == DType::I32) t.data<int32_t>()[i] = int32_t(v);
    else if (dt == DType::I64) t.data<int64_t>()[i] = int64_t(v);
    else set_float(t, i, v);
  }
  return t;
}

Tensor to_device(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), Device::CUDA);
  ops::copy(h, d, ops::default_stream(Device::CUDA));
  return d;
}

// Device result == host result, byte for byte.
void same(const Tensor& dev, const Tensor& host, const std::string& what) {
  Tensor back = Tensor::empty(dev.shape(), dev.dtype());
  ops::copy(dev, back, ops::default_stream(Device::CUDA));  // synchronises
  if (back.nbytes() != host.nbytes() || std::memcmp(back.raw(), host.raw(), host.nbytes()) != 0)
    fail(what + ": NCCL result differs from MPI's");
}

void collectives(Communicator& g, const std::string& gname) {
  Stream& gs = ops::default_stream(Device::CUDA);
  Stream& cs = Stream::cpu();
  const int n = g.size(), r = g.rank();
  if (g.backend() != "nccl") fail(gname + ": backend is '" + std::string(g.backend()) + "'");
  const DType all[] = {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64};
  int salt = 0;
  for (DType dt : all) {
    const std::string t = gname + " " + std::string(dtype_name(dt));
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      Tensor h = host_tensor({3, 37}, dt, r, ++salt), d = to_device(h);
      g.all_reduce(h, op, cs);
      g.all_reduce(d, op, gs);
      same(d, h, t + " all_reduce " + std::string(reduce_op_name(op)));
      Tensor hin = host_tensor({n * 5, 3}, dt, r, ++salt), din = to_device(hin);
      Tensor hout = Tensor::empty({5, 3}, dt), dout = Tensor::empty({5, 3}, dt, Device::CUDA);
      g.reduce_scatter(hin, hout, cs, op);
      g.reduce_scatter(din, dout, gs, op);
      same(dout, hout, t + " reduce_scatter " + std::string(reduce_op_name(op)));
    }
    {
      Tensor hin = host_tensor({4, 9}, dt, r, ++salt), din = to_device(hin);
      Tensor hout = Tensor::empty({4 * n, 9}, dt), dout = Tensor::empty({4 * n, 9}, dt, Device::CUDA);
      g.all_gather(hin, hout, cs);
      g.all_gather(din, dout, gs);
      same(dout, hout, t + " all_gather");
    }
    {
      Tensor h = host_tensor({17}, dt, r, ++salt), d = to_device(h);
      g.broadcast(h, n - 1, cs);
      g.broadcast(d, n - 1, gs);
      same(d, h, t + " broadcast");
      Tensor want = host_tensor({17}, dt, n - 1, salt);
      if (std::memcmp(want.raw(), h.raw(), h.nbytes()) != 0) fail(t + " broadcast: not the root's");
    }
    {
      Tensor hin = host_tensor({2 * n, 6}, dt, r, ++salt), din = to_device(hin);
      Tensor hout = Tensor::empty({2 * n, 6}, dt), dout = Tensor::empty({2 * n, 6}, dt, Device::CUDA);
      g.all_to_all(hin, hout, cs);
      g.all_to_all(din, dout, gs);
      same(dout, hout, t + " all_to_all");
    }
    {
      std::vector<int64_t> send(n), recv(n);
      for (int j = 0; j < n; ++j) send[j] = (r + j) % 3 + 1, recv[j] = (j + r) % 3 + 1;
      const int64_t S = std::accumulate(send.begin(), send.end(), int64_t(0));
      const int64_t R = std::accumulate(recv.begin(), recv.end(), int64_t(0));
      Tensor hin = host_tensor({S, 5}, dt, r, ++salt), din = to_device(hin);
      Tensor hout = Tensor::empty({R, 5}, dt), dout = Tensor::empty({R, 5}, dt, Device::CUDA);
      g.all_to_allv(hin, send, hout, recv, cs);
      g.all_to_allv(din, send, dout, recv, gs);
      same(dout, hout, t + " all_to_allv");
    }
  }
  // Point to point around the ring, three messages in a row (order without tags), sync
  // forms; then the async forms with the receive posted first.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int k = 0; k < 3; ++k) {
    Tensor hs = host_tensor({8, 4}, DType::BF16, r, 100 + k), ds = to_device(hs);
    Tensor hr = Tensor::empty({8, 4}, DType::BF16), dr = Tensor::empty({8, 4}, DType::BF16, Device::CUDA);
    // Even ranks send first, odd ranks receive first: no rank waits on itself.
    if (r % 2 == 0) {
      g.send(hs, next, cs), g.recv(hr, prev, cs);
      g.send(ds, next, gs), g.recv(dr, prev, gs);
    } else {
      g.recv(hr, prev, cs), g.send(hs, next, cs);
      g.recv(dr, prev, gs), g.send(ds, next, gs);
    }
    same(dr, hr, gname + " send/recv #" + std::to_string(k));
    Tensor want = host_tensor({8, 4}, DType::BF16, prev, 100 + k);
    if (std::memcmp(want.raw(), hr.raw(), hr.nbytes()) != 0) fail(gname + " recv: not the sender's");
  }
  {
    // Each NCCL call is its own launch on the communicator's stream: the two ranks post
    // the pair in complementary orders (recv-then-send on both would wait forever).
    Tensor ds = to_device(host_tensor({1 << 16}, DType::F32, r, 200));
    Tensor dr = Tensor::empty({1 << 16}, DType::F32, Device::CUDA);
    Work ws, wr;
    if (r % 2 == 0) ws = g.send_async(ds, next, gs), wr = g.recv_async(dr, prev, gs);
    else wr = g.recv_async(dr, prev, gs), ws = g.send_async(ds, next, gs);
    ws.wait(), wr.wait();
    same(dr, host_tensor({1 << 16}, DType::F32, prev, 200), gname + " async send/recv");
  }
  // An asynchronous all-reduce overlapping other work on the compute stream, then test/wait.
  {
    Tensor h = host_tensor({1 << 20}, DType::F32, r, 300), d = to_device(h);
    Tensor other = to_device(host_tensor({1 << 20}, DType::F32, r, 301));
    Work w = g.all_reduce_async(d, ReduceOp::Sum, gs);
    ops::scale(other, 2.0, gs);  // compute while the reduction runs
    while (!w.test()) {
    }
    w.wait();
    g.all_reduce(h, ReduceOp::Sum, cs);
    same(d, h, gname + " async all_reduce");
  }
  g.barrier(gs);
  g.barrier(cs);
}

int run_collectives(World& w) {
  parallel::ParallelSizes sz;
  sz.tp = w.size();
  parallel::ParallelState ps(w, sz);
  collectives(ps.tp(), "tp");
  // A group made by new_group: every rank, reversed (group rank order != world order).
  std::vector<int> rev(w.size());
  for (int i = 0; i < w.size(); ++i) rev[i] = w.size() - 1 - i;
  auto g = w.new_group(rev, "reversed");
  collectives(*g, "reversed");
  // DP-sized groups of one are the local backend and still take device tensors.
  Tensor one = to_device(host_tensor({4}, DType::F32, 0, 1));
  ps.dp().all_reduce(one, ReduceOp::Sum, ops::default_stream(Device::CUDA));
  same(one, host_tensor({4}, DType::F32, 0, 1), "dp group of one");
  std::printf("[rank %d] %s\n", w.rank(), g_failures ? "FAILED" : "all checks passed");
  return g_failures ? 1 : 0;
}

int run_kill(World& w) {
  parallel::ParallelSizes sz;
  sz.tp = w.size();
  parallel::ParallelState ps(w, sz);
  Stream& gs = ops::default_stream(Device::CUDA);
  Tensor x = to_device(host_tensor({1024}, DType::F32, w.rank(), 0));
  for (int it = 0;; ++it) {
    if (it == 5 && w.rank() == w.size() - 1) {
      std::fprintf(stderr, "[rank %d] killing myself before all_reduce %d\n", w.rank(), it);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
    ps.tp().all_reduce(x, ReduceOp::Max, gs);
    ops::cuda::synchronize(gs);  // a rank waiting for the dead one blocks here
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  InitOptions opts;
  opts.device = Device::CUDA;
  if (mode == "kill")
    opts.timeout = std::chrono::milliseconds(int(1000 * std::atof(argc > 2 ? argv[2] : "5")));
  try {
    auto w = init(opts);
    g_rank = w->rank();
    if (w->size() < 2) {
      std::fprintf(stderr, "FAIL: run under mpirun with 2 or more ranks (one GPU each)\n");
      return 1;
    }
    if (mode == "collectives") return run_collectives(*w);
    if (mode == "kill") return run_kill(*w);
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, e.what());
    return 1;
  }
}
