// Communicator: one process group. Every collective and point-to-point call of
// the system goes through this interface; backends (mpi/: host memory, local/: a
// group of one, later nccl/: device memory) implement only the `start_*` hooks.
//
// Semantics, shared by all backends:
//   * All sizes are along dim 0 (Megatron's *_along_first_dim): all_gather writes
//     out[size * n, ...] = concat over group ranks of in[n, ...]; reduce_scatter
//     gives group rank r the r-th block of the reduction of in[size * n, ...].
//   * `Stream& s` orders the call: on the CPU stream a synchronous call returns
//     with the result in place; on a CUDA stream (NCCL) it is enqueued and the
//     result is ready for later work on `s`. The `*_async` forms return a Work;
//     the buffers must stay untouched until Work::wait() (the Work keeps them
//     alive).
//   * Every collective gets the communicator's next sequence number (0, 1, 2,
//     ...): all members issue collectives in the same order, so the k-th
//     collective of every member is the same call. Point-to-point calls are
//     numbered per peer and direction (send #k to p matches recv #k from us).
//   * A call that does not complete within timeout() aborts the whole job with a
//     message naming this rank, the group and its ranks, the operation, the
//     sequence number and the byte size (see abort_on_timeout). Never a silent hang.
//   * A Communicator is used by one thread at a time, like an NCCL communicator.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mcpp::comm {

enum class ReduceOp { Sum, Max };
std::string_view reduce_op_name(ReduceOp op);

enum class OpKind : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllToAllV,
  Broadcast,
  Send,
  Recv,
  Barrier,
};
inline constexpr int kNumOpKinds = 9;
std::string_view op_name(OpKind k);

// What one call is, for timeout messages and statistics.
struct OpDesc {
  OpKind kind = OpKind::Barrier;
  uint64_t seq = 0;    // collective: communicator sequence number; p2p: per-peer count
  size_t bytes = 0;    // payload this rank contributes (all_gather: the gathered output)
  int peer = -1;       // p2p: group-local peer; broadcast: root
  std::string detail;  // "sum f32[4, 8]"
};

// The backend's side of an in-flight call.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual bool test() = 0;  // true once complete; aborts the job past the deadline
  virtual void wait() = 0;  // blocks until complete; aborts the job past the deadline
};

// Handle of an asynchronous call. Default-constructed = already complete. Copies
// share the same call. Destroying the last copy of an unfinished Work waits for it.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkImpl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
  }
  bool test() { return !impl_ || impl_->test(); }
  const std::shared_ptr<WorkImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<WorkImpl> impl_;
};

// Calls and bytes per operation kind since creation (the planner's volumes), and the
// host seconds the calling thread spent inside the calls and their Work::wait(): on the
// host backends (MPI, local) that is the communication time not hidden behind compute
// (training_log's exposed share); on NCCL only the enqueueing.
struct CommStats {
  std::array<uint64_t, kNumOpKinds> calls{};
  std::array<uint64_t, kNumOpKinds> bytes{};
  std::array<double, kNumOpKinds> blocked_seconds{};
};

// One transfer of a batch_isend_irecv().
struct P2POp {
  bool send = true;  // false: receive into t
  Tensor t;
  int peer = -1;     // group-local rank
};

class Communicator {
 public:
  using Duration = std::chrono::milliseconds;

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }  // rank inside this group
  int size() const { return int(ranks_.size()); }
  const std::string& name() const { return name_; }         // "tp", "dp", "world", ...
  const std::vector<int>& ranks() const { return ranks_; }  // world ranks, by group rank
  int world_rank() const { return ranks_[size_t(rank_)]; }
  virtual std::string_view backend() const = 0;  // "mpi", "local", "nccl"
  uint64_t sequence() const { return seq_; }     // collectives issued so far
  Duration timeout() const { return timeout_; }
  void set_timeout(Duration t) { timeout_ = t; }
  const CommStats& stats() const { return stats_; }
  // The exposed-communication measure of training_log: the host backends count the host
  // time a call blocks (always on); a device backend (NCCL) times, with CUDA events, how
  // long the caller's stream waits for each call once set_exposed_timing(true), and
  // collect_timing() (after the device is synchronised) adds the finished measurements to
  // stats().blocked_seconds.
  void set_exposed_timing(bool on) { exposed_timing_ = on; }
  bool exposed_timing() const { return exposed_timing_; }
  virtual void collect_timing() {}
  std::string describe() const;  // "group 'tp' (world ranks [2, 3])"

  // ---- synchronous (complete on `s` when they return) ------------------------------
  // t: any shape; in place. bf16/f16 reduce through fp32 (rounded once per partial sum).
  void all_reduce(Tensor& t, ReduceOp op, Stream& s) { all_reduce_async(t, op, s).wait(); }
  // in: [n, ...]; out: [size*n, ...] (rank r's block at rows r*n .. r*n+n-1). In place
  // when `in` is this rank's block of `out` (NCCL's in-place form; the distributed
  // optimizer's 16-bit parameter gather); any other overlap of the two is an error.
  void all_gather(const Tensor& in, Tensor& out, Stream& s) { all_gather_async(in, out, s).wait(); }
  // in: [size*n, ...]; out: [n, ...] = block `rank()` of the reduction over the group.
  void reduce_scatter(const Tensor& in, Tensor& out, Stream& s, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(in, out, s, op).wait();
  }
  // in, out: [size*n, ...]; block j of `in` goes to rank j, block j of `out` came from rank j.
  void all_to_all(const Tensor& in, Tensor& out, Stream& s) { all_to_all_async(in, out, s).wait(); }
  // Rows (dim 0) per peer: send_rows[j] rows of `in` (in order) go to rank j;
  // recv_rows[j] rows of `out` (in order) come from rank j. Row widths must agree.
  void all_to_allv(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                   std::span<const int64_t> recv_rows, Stream& s) {
    all_to_allv_async(in, send_rows, out, recv_rows, s).wait();
  }
  // root: group-local rank whose t every member ends with.
  void broadcast(Tensor& t, int root, Stream& s) { broadcast_async(t, root, s).wait(); }
  // peer: group-local rank. A send matches the peer's recv of the same byte size.
  void send(const Tensor& t, int peer, Stream& s) { send_async(t, peer, s).wait(); }
  void recv(Tensor& t, int peer, Stream& s) { recv_async(t, peer, s).wait(); }
  void barrier(Stream& s) { barrier_async(s).wait(); }

  // ---- asynchronous ---------------------------------------------------------------
  Work all_reduce_async(Tensor& t, ReduceOp op, Stream& s);
  Work all_gather_async(const Tensor& in, Tensor& out, Stream& s);
  Work reduce_scatter_async(const Tensor& in, Tensor& out, Stream& s, ReduceOp op = ReduceOp::Sum);
  Work all_to_all_async(const Tensor& in, Tensor& out, Stream& s);
  Work all_to_allv_async(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                         std::span<const int64_t> recv_rows, Stream& s);
  Work broadcast_async(Tensor& t, int root, Stream& s);
  Work send_async(const Tensor& t, int peer, Stream& s);
  Work recv_async(Tensor& t, int peer, Stream& s);
  // Point-to-point transfers posted together (torch's batch_isend_irecv, which Megatron's
  // pipeline uses): all of them may be in flight at once, so a rank may send to and
  // receive from the same peer, or form a ring with its neighbours, in any order without
  // deadlocking. Numbered like the single calls; one Work per op, in order. NCCL issues
  // them as one ncclGroupStart/End group; MPI's nonblocking calls need nothing more.
  std::vector<Work> batch_isend_irecv(std::span<P2POp> ops, Stream& s);
  Work barrier_async(Stream& s);

  // Prints the timeout message (see the file comment) on stderr and ends the job
  // through abort_job(). Backends call it from WorkImpl::test/wait.
  [[noreturn]] void abort_on_timeout(const OpDesc& op, double waited_s) const;
  std::string timeout_message(const OpDesc& op, double waited_s) const;

 protected:
  Communicator(std::string name, std::vector<int> world_ranks, int rank, Duration timeout);

  // Backend hooks: arguments are already validated (shapes, dtypes, devices, peers)
  // and the call is numbered in `op`. Counts are in elements of the tensors' dtype.
  virtual Work start_all_reduce(Tensor& t, ReduceOp op, const OpDesc& d, Stream& s) = 0;
  virtual Work start_all_gather(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) = 0;
  virtual Work start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const OpDesc& d,
                                    Stream& s) = 0;
  virtual Work start_all_to_all(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) = 0;
  virtual Work start_all_to_allv(const Tensor& in, std::vector<int64_t> send_counts,
                                 std::vector<int64_t> send_displs, Tensor& out,
                                 std::vector<int64_t> recv_counts, std::vector<int64_t> recv_displs,
                                 const OpDesc& d, Stream& s) = 0;
  virtual Work start_broadcast(Tensor& t, int root, const OpDesc& d, Stream& s) = 0;
  virtual Work start_send(const Tensor& t, int peer, const OpDesc& d, Stream& s) = 0;
  virtual Work start_recv(Tensor& t, int peer, const OpDesc& d, Stream& s) = 0;
  virtual Work start_barrier(const OpDesc& d, Stream& s) = 0;
  // A batch of point-to-point calls (already numbered in `d`); the default starts them one
  // by one, which is enough where each call is nonblocking on its own (MPI).
  virtual std::vector<Work> start_p2p_batch(std::span<P2POp> ops, std::span<const OpDesc> d,
                                            Stream& s);
  // Whether the host time of a call is its communication time (false for NCCL, whose calls
  // only enqueue; it adds device-measured time through add_blocked_seconds instead).
  virtual bool host_time_is_communication() const { return true; }
  void add_blocked_seconds(OpKind k, double sec) { stats_.blocked_seconds[size_t(k)] += sec; }
  // Ends every process of the job (MPI_Abort; std::abort for a lone process).
  [[noreturn]] virtual void abort_job() const = 0;
  // Whether the backend can reduce this dtype / move this device's memory.
  virtual bool can_reduce(DType t) const;
  virtual bool can_access(Device d) const { return d == Device::CPU; }
  // all_gather: whether `in` is this rank's block of `out` (an in-place call).
  bool gathers_in_place(const Tensor& in, const Tensor& out) const {
    return in.raw() == static_cast<const char*>(out.raw()) + size_t(rank_) * in.nbytes();
  }

 private:
  bool exposed_timing_ = false;
  OpDesc next_collective(OpKind k, size_t bytes, std::string detail);
  // Counts the host time from t0 (the call's start) into stats_.blocked_seconds and wraps
  // w so that its first wait() adds the time it blocks.
  Work timed(OpKind k, std::chrono::steady_clock::time_point t0, Work w);
  void check_tensor(const Tensor& t, const char* what, OpKind k, const Stream& s) const;
  void check_peer(int peer, OpKind k) const;

  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
  Duration timeout_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> sent_, received_;  // p2p counts per peer
  CommStats stats_;
};

// Polls `done()` with backoff (spin, then yield, then sleep up to 1 ms) until it
// returns true or the deadline passes; returns false on timeout. Shared by backends
// that complete by polling (MPI_Test), so none ever blocks without a deadline.
bool poll_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);

}  // namespace mcpp::comm
