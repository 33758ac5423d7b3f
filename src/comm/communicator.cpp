// Argument checks, numbering and the timeout message: the part of every call that
// does not depend on the backend, so MPI, local and NCCL agree on them.
#include "comm/communicator.h"

#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/log.h"
#include "ops/nvtx.h"

namespace mcpp::comm {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

std::string_view op_name(OpKind k) {
  static constexpr std::string_view names[kNumOpKinds] = {
      "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_allv",
      "broadcast",  "send",       "recv",           "barrier"};
  return names[int(k)];
}

Communicator::Communicator(std::string name, std::vector<int> world_ranks, int rank,
                           Duration timeout)
    : name_(std::move(name)),
      ranks_(std::move(world_ranks)),
      rank_(rank),
      timeout_(timeout),
      sent_(ranks_.size(), 0),
      received_(ranks_.size(), 0) {
  MCPP_CHECK(!ranks_.empty() && rank_ >= 0 && rank_ < int(ranks_.size()),
             "communicator '{}': rank {} outside a group of {}", name_, rank_, ranks_.size());
}

std::string Communicator::describe() const {
  return fmt::format("group '{}' (world ranks [{}])", name_, fmt::join(ranks_, ", "));
}

bool Communicator::can_reduce(DType t) const {
  switch (t) {
    case DType::F32:
    case DType::F64:
    case DType::I32:
    case DType::I64:
    case DType::BF16:
    case DType::F16:
      return true;
    default:
      return false;
  }
}

namespace {

// A Work whose first wait() is added to its communicator's blocked time.
class TimedWork final : public WorkImpl {
 public:
  TimedWork(std::shared_ptr<WorkImpl> inner, double* seconds)
      : inner_(std::move(inner)), seconds_(seconds) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    if (done_) return inner_->wait();
    const auto t0 = std::chrono::steady_clock::now();
    inner_->wait();
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done_ = true;
  }

 private:
  std::shared_ptr<WorkImpl> inner_;
  double* seconds_;
  bool done_ = false;
};

}  // namespace

Work Communicator::timed(OpKind k, std::chrono::steady_clock::time_point t0, Work w) {
  if (ops::nvtx_enabled()) {  // a mark on Nsight's timeline where the call was issued
    ops::nvtx_range_push(fmt::format("{} {}", name_, op_name(k)));
    ops::nvtx_range_pop();
  }
  if (!host_time_is_communication()) return w;
  double& sec = stats_.blocked_seconds[int(k)];
  sec += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!w.impl()) return w;
  return Work(std::make_shared<TimedWork>(w.impl(), &sec));
}

OpDesc Communicator::next_collective(OpKind k, size_t bytes, std::string detail) {
  OpDesc d;
  d.kind = k, d.seq = seq_++, d.bytes = bytes, d.detail = std::move(detail);
  stats_.calls[int(k)]++, stats_.bytes[int(k)] += bytes;
  return d;
}

void Communicator::check_tensor(const Tensor& t, const char* what, OpKind k,
                                const Stream& s) const {
  MCPP_CHECK(t.defined(), "{} on {}: {} tensor is undefined", op_name(k), describe(), what);
  MCPP_CHECK_HINT(can_access(t.device()) && t.device() == s.device,
                  "the MPI backend moves host memory; use the NCCL backend for device tensors",
                  "{} on {}: {} tensor {} on a {} stream: backend '{}' cannot use it", op_name(k),
                  describe(), what, t.str(), s.device == Device::CPU ? "CPU" : "CUDA", backend());
}

void Communicator::check_peer(int peer, OpKind k) const {
  MCPP_CHECK(peer >= 0 && peer < size(), "{} on {}: peer {} is not a group rank (0..{})",
             op_name(k), describe(), peer, size() - 1);
}

static bool same_rows(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim() || a.dim() == 0) return false;
  for (int64_t i = 1; i < a.dim(); ++i)
    if (a.size(i) != b.size(i)) return false;
  return true;
}

Work Communicator::all_reduce_async(Tensor& t, ReduceOp op, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(t, "the", OpKind::AllReduce, s);
  MCPP_CHECK(can_reduce(t.dtype()), "all_reduce on {}: backend '{}' cannot reduce {}", describe(),
             backend(), dtype_name(t.dtype()));
  OpDesc d = next_collective(OpKind::AllReduce, t.nbytes(),
                             fmt::format("{} {}", reduce_op_name(op), t.str()));
  return timed(OpKind::AllReduce, t0, start_all_reduce(t, op, d, s));
}

Work Communicator::all_gather_async(const Tensor& in, Tensor& out, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(in, "input", OpKind::AllGather, s);
  check_tensor(out, "output", OpKind::AllGather, s);
  MCPP_CHECK(in.dtype() == out.dtype() && same_rows(in, out) && out.size(0) == in.size(0) * size(),
             "all_gather on {}: output {} must be input {} with dim 0 times {}", describe(),
             out.str(), in.str(), size());
  const auto* ib = static_cast<const char*>(in.raw());
  const auto* ob = static_cast<const char*>(out.raw());
  const bool overlap = ib < ob + out.nbytes() && ob < ib + in.nbytes();
  MCPP_CHECK_HINT(!overlap || gathers_in_place(in, out),
                  "pass this rank's block of the output (in place) or a separate input",
                  "all_gather on {}: input {} overlaps output {} other than as block {} of it",
                  describe(), in.str(), out.str(), rank());
  OpDesc d = next_collective(OpKind::AllGather, out.nbytes(), in.str());
  return timed(OpKind::AllGather, t0, start_all_gather(in, out, d, s));
}

Work Communicator::reduce_scatter_async(const Tensor& in, Tensor& out, Stream& s, ReduceOp op) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(in, "input", OpKind::ReduceScatter, s);
  check_tensor(out, "output", OpKind::ReduceScatter, s);
  MCPP_CHECK(in.dtype() == out.dtype() && same_rows(in, out) && in.size(0) == out.size(0) * size(),
             "reduce_scatter on {}: input {} must be output {} with dim 0 times {}", describe(),
             in.str(), out.str(), size());
  MCPP_CHECK(can_reduce(in.dtype()), "reduce_scatter on {}: backend '{}' cannot reduce {}",
             describe(), backend(), dtype_name(in.dtype()));
  OpDesc d = next_collective(OpKind::ReduceScatter, in.nbytes(),
                             fmt::format("{} {}", reduce_op_name(op), in.str()));
  return timed(OpKind::ReduceScatter, t0, start_reduce_scatter(in, out, op, d, s));
}

Work Communicator::all_to_all_async(const Tensor& in, Tensor& out, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(in, "input", OpKind::AllToAll, s);
  check_tensor(out, "output", OpKind::AllToAll, s);
  MCPP_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() && in.dim() > 0 &&
                 in.size(0) % size() == 0,
             "all_to_all on {}: input {} and output {} must have the same dtype and size, "
             "dim 0 divisible by {}",
             describe(), in.str(), out.str(), size());
  OpDesc d = next_collective(OpKind::AllToAll, in.nbytes(), in.str());
  return timed(OpKind::AllToAll, t0, start_all_to_all(in, out, d, s));
}

Work Communicator::all_to_allv_async(const Tensor& in, std::span<const int64_t> send_rows,
                                     Tensor& out, std::span<const int64_t> recv_rows, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(in, "input", OpKind::AllToAllV, s);
  check_tensor(out, "output", OpKind::AllToAllV, s);
  MCPP_CHECK(in.dtype() == out.dtype() && same_rows(in, out),
             "all_to_allv on {}: input {} and output {} must agree in dtype and all dims but 0",
             describe(), in.str(), out.str());
  MCPP_CHECK(int(send_rows.size()) == size() && int(recv_rows.size()) == size(),
             "all_to_allv on {}: {} send and {} receive counts for a group of {}", describe(),
             send_rows.size(), recv_rows.size(), size());
  const int64_t width = shape_numel(Shape(in.shape().begin() + 1, in.shape().end()));
  std::vector<int64_t> sc(size()), sd(size()), rc(size()), rd(size());
  int64_t so = 0, ro = 0;
  for (int j = 0; j < size(); ++j) {
    MCPP_CHECK(send_rows[j] >= 0 && recv_rows[j] >= 0, "all_to_allv on {}: negative count",
               describe());
    sc[j] = send_rows[j] * width, sd[j] = so * width, so += send_rows[j];
    rc[j] = recv_rows[j] * width, rd[j] = ro * width, ro += recv_rows[j];
  }
  MCPP_CHECK(so == in.size(0) && ro == out.size(0),
             "all_to_allv on {}: counts sum to {} send / {} receive rows, tensors have {} / {}",
             describe(), so, ro, in.size(0), out.size(0));
  OpDesc d =
      next_collective(OpKind::AllToAllV, in.nbytes(), fmt::format("{} -> {}", in.str(), out.str()));
  return timed(OpKind::AllToAllV, t0, start_all_to_allv(in, std::move(sc), std::move(sd), out, std::move(rc), std::move(rd), d,
                           s));
}

Work Communicator::broadcast_async(Tensor& t, int root, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(t, "the", OpKind::Broadcast, s);
  check_peer(root, OpKind::Broadcast);
  OpDesc d = next_collective(OpKind::Broadcast, t.nbytes(),
                             fmt::format("{} from group rank {}", t.str(), root));
  d.peer = root;
  return timed(OpKind::Broadcast, t0, start_broadcast(t, root, d, s));
}

Work Communicator::send_async(const Tensor& t, int peer, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(t, "the", OpKind::Send, s);
  check_peer(peer, OpKind::Send);
  OpDesc d;
  d.kind = OpKind::Send, d.seq = sent_[size_t(peer)]++, d.bytes = t.nbytes(), d.peer = peer;
  d.detail = fmt::format("{} to group rank {} (world rank {})", t.str(), peer, ranks_[peer]);
  stats_.calls[int(d.kind)]++, stats_.bytes[int(d.kind)] += d.bytes;
  return timed(OpKind::Send, t0, start_send(t, peer, d, s));
}

Work Communicator::recv_async(Tensor& t, int peer, Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  check_tensor(t, "the", OpKind::Recv, s);
  check_peer(peer, OpKind::Recv);
  OpDesc d;
  d.kind = OpKind::Recv, d.seq = received_[size_t(peer)]++, d.bytes = t.nbytes(), d.peer = peer;
  d.detail = fmt::format("{} from group rank {} (world rank {})", t.str(), peer, ranks_[peer]);
  stats_.calls[int(d.kind)]++, stats_.bytes[int(d.kind)] += d.bytes;
  return timed(OpKind::Recv, t0, start_recv(t, peer, d, s));
}

std::vector<Work> Communicator::batch_isend_irecv(std::span<P2POp> ops, Stream& s) {
  std::vector<OpDesc> descs;
  for (P2POp& op : ops) {
    const OpKind k = op.send ? OpKind::Send : OpKind::Recv;
    check_tensor(op.t, "the", k, s);
    check_peer(op.peer, k);
    OpDesc d;
    d.kind = k, d.bytes = op.t.nbytes(), d.peer = op.peer;
    d.seq = op.send ? sent_[size_t(op.peer)]++ : received_[size_t(op.peer)]++;
    d.detail = fmt::format("{} {} group rank {} (world rank {}), batched", op.t.str(),
                           op.send ? "to" : "from", op.peer, ranks_[size_t(op.peer)]);
    stats_.calls[int(k)]++, stats_.bytes[int(k)] += d.bytes;
    descs.push_back(std::move(d));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Work> w = start_p2p_batch(ops, descs, s);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = timed(ops[i].send ? OpKind::Send : OpKind::Recv, i == 0 ? t0 : std::chrono::steady_clock::now(), std::move(w[i]));
  return w;
}

std::vector<Work> Communicator::start_p2p_batch(std::span<P2POp> ops, std::span<const OpDesc> d,
                                                Stream& s) {
  std::vector<Work> out;
  for (size_t i = 0; i < ops.size(); ++i)
    out.push_back(ops[i].send ? start_send(ops[i].t, ops[i].peer, d[i], s)
                              : start_recv(ops[i].t, ops[i].peer, d[i], s));
  return out;
}

Work Communicator::barrier_async(Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  OpDesc d = next_collective(OpKind::Barrier, 0, "");
  return timed(OpKind::Barrier, t0, start_barrier(d, s));
}

std::string Communicator::timeout_message(const OpDesc& op, double waited_s) const {
  const bool p2p = op.kind == OpKind::Send || op.kind == OpKind::Recv;
  return fmt::format(
      "communication timeout on world rank {}: {} {} {} {}{}{} ({} bytes) did not complete "
      "within {:.1f} s (group rank {} of {}, backend {}).\n"
      "  HINT: {} Raise --distributed-timeout-minutes only if the step is legitimately slow.",
      world_rank(), describe(), op_name(op.kind), p2p ? "number" : "sequence number", op.seq,
      op.detail.empty() ? "" : ": ", op.detail, op.bytes, waited_s, rank(), size(), backend(),
      p2p ? "the peer did not post the matching call (crashed, hung, or sent a different size)."
          : "another member of this group did not reach this collective (crashed, hung, or "
            "issued a different one: compare sequence numbers across ranks).");
}

void Communicator::abort_on_timeout(const OpDesc& op, double waited_s) const {
  std::string msg = timeout_message(op, waited_s);
  std::fprintf(stderr, "[rank %d] ERROR: %s\n", world_rank(), msg.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  abort_job();
  std::abort();  // abort_job does not return; this tells the compiler
}

bool poll_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline) {
  using clock = std::chrono::steady_clock;
  // Spin briefly (small messages finish in microseconds), then back off so that
  // oversubscribed ranks leave the cores to the peers they are waiting for.
  for (int i = 0; i < 64; ++i)
    if (done()) return true;
  auto nap = std::chrono::microseconds(10);
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (clock::now() >= deadline) return done();
    if (i < 16) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace mcpp::comm
