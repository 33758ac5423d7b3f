// The NCCL backend: device tensors between GPUs, one communicator per process group.
//
// Streams. Every communicator owns a communication stream (high priority). A call on the
// caller's stream s (the compute stream) records an event on s, makes the communication
// stream wait for it, enqueues the NCCL call there and records a completion event. The
// returned Work's wait() makes s wait for that event: compute -> communication ->
// compute handoffs are events, never host synchronisation, so an --overlap-grad-reduce
// bucket reduces while the backward pass keeps computing. The synchronous forms are
// async + wait: they return at once, and later work on s sees the result.
//
// Memory. The Work holds the call's tensors until it is destroyed, after s waits for the
// completion event. The CUDA allocator frees in the order of its allocation stream (the
// compute stream), so memory is reused only after the collective is done with it.
//
// Timeouts. NCCL kernels wait on the GPU, where no host call times out: a watchdog thread
// polls the completion events of every call in flight, and one still pending past the
// communicator's deadline prints the same message as the MPI backend (rank, group,
// operation, sequence number, bytes) and ends the job (MPI_Abort). It also reports
// asynchronous NCCL errors. A rank that dies in the middle of a step thus takes the
// others down within --distributed-timeout-minutes, naming the call that never completed.
//
// Host tensors (CPU stream) go to the group's MPI communicator, which this one keeps.
#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "ops/cuda/device.h"

#define NCCL_CHECK(expr)                                                                   \
  do {                                                                                     \
    ncclResult_t mcpp_nr_ = (expr);                                                        \
    if (mcpp_nr_ != ncclSuccess) [[unlikely]]                                              \
      ::mcpp::fail_at(__FILE__, __LINE__,                                                  \
                      ::fmt::format("NCCL call failed: {} -> {} ({}){}", #expr,           \
                                    ncclGetErrorString(mcpp_nr_), int(mcpp_nr_),          \
                                    ::mcpp::comm::nccl_last_error()),                      \
                      "NCCL_DEBUG=WARN shows NCCL's own reason; check that every rank has " \
                      "its own GPU and that all ranks issue the same collectives");        \
  } while (0)

namespace mcpp::comm {
namespace {

std::string nccl_last_error() {
  const char* e = ncclGetLastError(nullptr);
  return e && *e ? fmt::format(": {}", e) : "";
}

using Clock = std::chrono::steady_clock;

cudaStream_t stream_of(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

ncclDataType_t reduce_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default: break;
  }
  MCPP_FAIL("NCCL backend cannot reduce {}", dtype_name(t));
}

ncclRedOp_t reduce_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

class NcclCommunicator;

// One enqueued NCCL call: what the watchdog needs to time it.
struct InFlight {
  const NcclCommunicator* comm = nullptr;
  OpDesc desc;
  cudaEvent_t done = nullptr;
  Clock::time_point start, deadline;
  ~InFlight() {
    if (done) (void)cudaEventDestroy(done);
  }
};

// Polls every call in flight (see the file comment). One per process, alive while any
// NCCL communicator is.
class Watchdog {
 public:
  static std::shared_ptr<Watchdog> get() {
    static std::mutex m;
    static std::weak_ptr<Watchdog> w;
    std::lock_guard<std::mutex> lk(m);
    auto p = w.lock();
    if (!p) p = std::shared_ptr<Watchdog>(new Watchdog), w = p;
    return p;
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(std::shared_ptr<InFlight> op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  // Before a communicator goes away (its calls are complete by then).
  void forget(const NcclCommunicator* c) {
    std::lock_guard<std::mutex> lk(mu_);
    std::erase_if(ops_, [&](const auto& o) { return o->comm == c; });
  }

 private:
  Watchdog() : thread_([this] { run(); }) {}
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<InFlight>> ops_;
  bool stop_ = false;
  std::thread thread_;
};

// The caller's side of one call: joins the caller's stream to the completion event.
class NcclWork final : public WorkImpl {
 public:
  NcclWork(std::shared_ptr<InFlight> op, cudaStream_t caller, std::vector<Tensor> keep)
      : op_(std::move(op)), caller_(caller), keep_(std::move(keep)) {}
  ~NcclWork() override {
    if (!joined_ && cudaStreamWaitEvent(caller_, op_->done) != cudaSuccess)
      (void)cudaGetLastError();  // destructors do not throw; the watchdog reports hangs
  }
  bool test() override;
  void wait() override;

 private:
  std::shared_ptr<InFlight> op_;
  cudaStream_t caller_;
  std::vector<Tensor> keep_;  // released after the caller's stream waits
  bool joined_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, std::function<void()> abort,
                   const NcclGroupConfig& config)
      : Communicator(host->name(), host->ranks(), host->rank(), host->timeout()),
        host_(std::move(host)),
        abort_(std::move(abort)),
        watchdog_(Watchdog::get()) {
    ops::cuda::init_device();  // the device select_cuda_device chose
    ncclUniqueId id;
    Tensor idt = Tensor::zeros({int64_t(sizeof id)}, DType::U8);
    if (rank() == 0) {
      NCCL_CHECK(ncclGetUniqueId(&id));
      std::memcpy(idt.raw(), &id, sizeof id);
    }
    host_->broadcast(idt, 0, Stream::cpu());
    std::memcpy(&id, idt.raw(), sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    if (config.cga_cluster_size >= 0) cfg.cgaClusterSize = config.cga_cluster_size;
    if (config.max_ctas >= 0) cfg.maxCTAs = config.max_ctas;
    if (config.min_ctas >= 0) cfg.minCTAs = config.min_ctas;
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, size(), id, rank(), &cfg));
    if (config.max_ctas >= 0 || config.min_ctas >= 0 || config.cga_cluster_size >= 0)
      log::debug("NCCL communicator '{}': max_ctas {}, min_ctas {}, cga_cluster_size {}", name(),
                 config.max_ctas, config.min_ctas, config.cga_cluster_size);
    int lo = 0, hi = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    scratch_ = Tensor::empty({1}, DType::I32, Device::CUDA);
    CUDA_CHECK(cudaMemsetAsync(scratch_.raw(), 0, scratch_.nbytes(),
                               stream_of(ops::cuda::default_stream())));
    log::debug("NCCL communicator for {}: {} ranks", describe(), size());
  }
  ~NcclCommunicator() override {
    // Calls still in flight finish first (the watchdog ends the job if one never does).
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    watchdog_->forget(this);
    for (const Stall& st : stalls_) (void)cudaEventDestroy(st.before), (void)cudaEventDestroy(st.after);
    scratch_ = Tensor();
    (void)ncclCommDestroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }
  std::string_view backend() const override { return "nccl"; }
  bool host_time_is_communication() const override { return false; }
  // A pair of timing events around the caller's wait for a call (NcclWork::wait): their
  // distance is how long the caller's stream stalled, i.e. the exposed communication.
  void add_stall(OpKind k, cudaEvent_t before, cudaEvent_t after) const {
    std::lock_guard<std::mutex> lk(stall_mu_);
    stalls_.push_back({k, before, after});
  }
  void collect_timing() override {
    std::lock_guard<std::mutex> lk(stall_mu_);
    std::vector<Stall> left;
    for (const Stall& st : stalls_) {
      float ms = 0;
      if (cudaEventQuery(st.after) != cudaSuccess) {  // not reached yet: keep for later
        (void)cudaGetLastError();
        left.push_back(st);
        continue;
      }
      CUDA_CHECK(cudaEventElapsedTime(&ms, st.before, st.after));
      add_blocked_seconds(st.kind, double(ms) / 1e3);
      (void)cudaEventDestroy(st.before), (void)cudaEventDestroy(st.after);
    }
    stalls_ = std::move(left);
  }
  ncclComm_t handle() const { return comm_; }

 protected:
  Work start_all_reduce(Tensor& t, ReduceOp op, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->all_reduce_async(t, op, s);
    return enqueue(d, s, {t}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), reduce_type(t.dtype()),
                               reduce_op(op), comm_, cs));
    });
  }
  Work start_all_gather(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->all_gather_async(in, out, s);
    // In place (in = out's block rank()) is NCCL's own in-place form: nothing to do here.
    return enqueue(d, s, {in, out}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, cs));
    });
  }
  Work start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const OpDesc& d,
                            Stream& s) override {
    if (s.device == Device::CPU) return host_->reduce_scatter_async(in, out, s, op);
    return enqueue(d, s, {in, out}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()),
                                   reduce_type(in.dtype()), reduce_op(op), comm_, cs));
    });
  }
  Work start_all_to_all(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->all_to_all_async(in, out, s);
    const size_t block = in.nbytes() / size_t(size());
    return enqueue(d, s, {in, out}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclGroupStart());
      for (int j = 0; j < size(); ++j) {
        NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + j * block, block, ncclUint8, j,
                            comm_, cs));
        NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + j * block, block, ncclUint8, j,
                            comm_, cs));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }
  Work start_all_to_allv(const Tensor& in, std::vector<int64_t> sc, std::vector<int64_t> sd,
                         Tensor& out, std::vector<int64_t> rc, std::vector<int64_t> rd,
                         const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) {
      // Back to rows for the public form: counts are rows times the row width.
      const int64_t width = shape_numel(Shape(in.shape().begin() + 1, in.shape().end()));
      std::vector<int64_t> srows(sc.size()), rrows(rc.size());
      for (size_t j = 0; j < sc.size(); ++j)
        srows[j] = width ? sc[j] / width : 0, rrows[j] = width ? rc[j] / width : 0;
      return host_->all_to_allv_async(in, srows, out, rrows, s);
    }
    const size_t es = dtype_size(in.dtype());
    return enqueue(d, s, {in, out}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclGroupStart());
      for (int j = 0; j < size(); ++j) {
        if (sc[j] > 0)
          NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + sd[j] * es, size_t(sc[j]) * es,
                              ncclUint8, j, comm_, cs));
        if (rc[j] > 0)
          NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + rd[j] * es, size_t(rc[j]) * es,
                              ncclUint8, j, comm_, cs));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }
  Work start_broadcast(Tensor& t, int root, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->broadcast_async(t, root, s);
    return enqueue(d, s, {t}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, cs));
    });
  }
  // Point to point: NCCL keeps the calls between two ranks of one communicator in order,
  // so send #k meets recv #k without tags (pipeline parallelism uses one communicator for
  // activations and another for gradients). A batch is one NCCL group: its sends and
  // receives progress together (a send to and a receive from the same peer, or a ring of
  // neighbours, cannot deadlock); every op's Work waits for the whole group.
  std::vector<Work> start_p2p_batch(std::span<P2POp> ops, std::span<const OpDesc> d,
                                    Stream& s) override {
    if (s.device == Device::CPU) return Communicator::start_p2p_batch(ops, d, s);
    std::vector<Tensor> keep;
    for (const P2POp& op : ops) keep.push_back(op.t);
    OpDesc gd = d.empty() ? OpDesc{} : d[0];
    if (ops.size() > 1) {
      size_t bytes = 0;
      for (const auto& x : d) bytes += x.bytes;
      gd.bytes = bytes;
      gd.detail = fmt::format("a batch of {} sends/receives, the first: {}", ops.size(),
                              d[0].detail);
    }
    Work w = enqueue(gd, s, std::move(keep), [&](cudaStream_t cs) {
      NCCL_CHECK(ncclGroupStart());
      for (P2POp& op : ops) {
        if (op.send)
          NCCL_CHECK(ncclSend(op.t.raw(), op.t.nbytes(), ncclUint8, op.peer, comm_, cs));
        else
          NCCL_CHECK(ncclRecv(op.t.raw(), op.t.nbytes(), ncclUint8, op.peer, comm_, cs));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
    return std::vector<Work>(ops.size(), w);
  }
  Work start_send(const Tensor& t, int peer, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->send_async(t, peer, s);
    return enqueue(d, s, {t}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclSend(t.raw(), t.nbytes(), ncclUint8, peer, comm_, cs));
    });
  }
  Work start_recv(Tensor& t, int peer, const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->recv_async(t, peer, s);
    return enqueue(d, s, {t}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclRecv(t.raw(), t.nbytes(), ncclUint8, peer, comm_, cs));
    });
  }
  // On a CUDA stream: a one-element all-reduce that later work on s waits for; on the CPU
  // stream: MPI's barrier (the hosts meet).
  Work start_barrier(const OpDesc& d, Stream& s) override {
    if (s.device == Device::CPU) return host_->barrier_async(s);
    return enqueue(d, s, {scratch_}, [&](cudaStream_t cs) {
      NCCL_CHECK(ncclAllReduce(scratch_.raw(), scratch_.raw(), 1, ncclInt32, ncclSum, comm_, cs));
    });
  }
  [[noreturn]] void abort_job() const override {
    if (abort_) abort_();
    std::abort();
  }
  bool can_access(Device) const override { return true; }

 private:
  template <typename Issue>
  Work enqueue(const OpDesc& d, Stream& s, std::vector<Tensor> keep, Issue&& issue) {
    const cudaStream_t caller = stream_of(s);
    cudaEvent_t ready;
    CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ready, caller));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready));
    CUDA_CHECK(cudaEventDestroy(ready));  // the wait above already captured it
    issue(stream_);
    auto op = std::make_shared<InFlight>();
    op->comm = this, op->desc = d;
    op->start = Clock::now(), op->deadline = op->start + timeout();
    CUDA_CHECK(cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(op->done, stream_));
    watchdog_->add(op);
    return Work(std::make_shared<NcclWork>(std::move(op), caller, std::move(keep)));
  }

  struct Stall {
    OpKind kind;
    cudaEvent_t before, after;
  };
  mutable std::mutex stall_mu_;
  mutable std::vector<Stall> stalls_;
  std::unique_ptr<Communicator> host_;
  std::function<void()> abort_;
  std::shared_ptr<Watchdog> watchdog_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Tensor scratch_;  // barrier's one element
};

void timed_out(const InFlight& op) {
  const double waited = std::chrono::duration<double>(Clock::now() - op.start).count();
  op.comm->abort_on_timeout(op.desc, waited);
}

void NcclWork::wait() {
  if (joined_) return;
  const NcclCommunicator* c = op_->comm;
  if (c && c->exposed_timing()) {
    cudaEvent_t before, after;
    CUDA_CHECK(cudaEventCreate(&before));
    CUDA_CHECK(cudaEventCreate(&after));
    CUDA_CHECK(cudaEventRecord(before, caller_));
    CUDA_CHECK(cudaStreamWaitEvent(caller_, op_->done));
    CUDA_CHECK(cudaEventRecord(after, caller_));
    c->add_stall(op_->desc.kind, before, after);
  } else {
    CUDA_CHECK(cudaStreamWaitEvent(caller_, op_->done));
  }
  joined_ = true;
}

bool NcclWork::test() {
  const cudaError_t e = cudaEventQuery(op_->done);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) CUDA_CHECK(e);
  if (Clock::now() >= op_->deadline) timed_out(*op_);
  return false;
}

void Watchdog::run() {
  try {
    ops::cuda::init_device();  // this thread on the process's device
  } catch (const std::exception& e) {
    log::error("NCCL watchdog cannot start: {}", e.what());
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (ops_.empty()) {
      cv_.wait(lk, [&] { return stop_ || !ops_.empty(); });
      continue;
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < ops_.size();) {
      const InFlight& op = *ops_[i];
      const cudaError_t e = cudaEventQuery(op.done);
      if (e == cudaSuccess) {
        ops_[i] = std::move(ops_.back());
        ops_.pop_back();
        continue;
      }
      if (e != cudaErrorNotReady) {
        std::fprintf(stderr, "[rank %d] ERROR: CUDA error while waiting for %s %s: %s\n",
                     op.comm->world_rank(), std::string(op_name(op.desc.kind)).c_str(),
                     op.comm->describe().c_str(), cudaGetErrorString(e));
        timed_out(op);
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(op.comm->handle(), &async) == ncclSuccess &&
          async != ncclSuccess && async != ncclInProgress) {
        std::fprintf(stderr, "[rank %d] ERROR: NCCL error on %s during %s sequence number %llu: %s%s\n",
                     op.comm->world_rank(), op.comm->describe().c_str(),
                     std::string(op_name(op.desc.kind)).c_str(),
                     static_cast<unsigned long long>(op.desc.seq), ncclGetErrorString(async),
                     nccl_last_error().c_str());
        timed_out(op);
      }
      if (now >= op.deadline) timed_out(op);  // prints the timeout message, ends the job
      ++i;
    }
    cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
}

}  // namespace

void select_cuda_device(int local_rank, int local_size) {
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  MCPP_CHECK_HINT(n > 0, "run on a machine with NVIDIA GPUs, or train with --device cpu",
                  "--device cuda under a launcher, but no CUDA device is visible");
  MCPP_CHECK_HINT(local_size <= n,
                  fmt::format("launch at most {} ranks per host (one GPU each), or check "
                              "CUDA_VISIBLE_DEVICES",
                              n),
                  "{} ranks on this host share {} visible GPU{}: NCCL needs one GPU per rank",
                  local_size, n, n == 1 ? "" : "s");
  ops::cuda::init_device(local_rank % n);
  int dev = -1;
  CUDA_CHECK(cudaGetDevice(&dev));
  MCPP_CHECK(dev == local_rank % n,
             "internal: the CUDA backend started on device {} before the launcher's rank chose "
             "device {}",
             dev, local_rank % n);
  // NVLink multicast (NVLS) can take a shared host's GPUs down; keep it off unless the
  // user decides otherwise (docs/cuda-backend.md).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
}

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     std::function<void()> abort,
                                                     const NcclGroupConfig& config) {
  return std::make_unique<NcclCommunicator>(std::move(host), std::move(abort), config);
}

}  // namespace mcpp::comm
