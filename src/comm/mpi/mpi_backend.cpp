// The MPI backend: host memory, OpenMPI (any MPI-3 library).
//
// Timeouts by nonblocking calls, not a watchdog thread: every operation is started
// with its MPI_I* form and completed by polling MPI_Test with backoff against a
// deadline (poll_until). Reasons: (1) it needs no MPI_THREAD_MULTIPLE — only the
// calling thread ever enters MPI, so it works at SERIALIZED as well; (2) a
// watchdog could not interrupt a blocking MPI call anyway, only abort around it,
// while polling knows exactly which call is late and its sequence number; (3) the
// async forms (overlapped gradient reduction) come for free: the Work holds the
// request. The cost is that an outstanding nonblocking collective progresses only
// when some MPI call runs (test/wait or the next call), as usual for MPI on host
// memory; the NCCL backend progresses on its own.
#include "comm/mpi/mpi_backend.h"

#ifndef MCPP_HAVE_MPI

namespace mcpp::comm {
std::unique_ptr<World> make_mpi_world(const InitOptions&) {
  MCPP_FAIL(
      "the MPI backend was requested, but this build has no MPI (install "
      "libopenmpi-dev and rebuild)");
}
}  // namespace mcpp::comm

#else

#include <mpi.h>

#include <climits>
#include <cstdio>
#include <mutex>
#include <optional>

#include "base/log.h"

namespace mcpp::comm {
namespace {

// Below MPI_THREAD_MULTIPLE every MPI call takes this lock.
std::mutex g_mpi_mutex;
bool g_need_lock = true;

struct MpiLock {
  std::optional<std::lock_guard<std::mutex> > g;
  MpiLock() {
    if (g_need_lock) g.emplace(g_mpi_mutex);
  }
};

#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) [[unlikely]] {                                             \
      char msg_[MPI_MAX_ERROR_STRING];                                                 \
      int len_ = 0;                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                              \
      ::mcpp::fail_at(__FILE__, __LINE__,                                              \
                      ::fmt::format("{} failed: {}", #call, std::string(msg_, len_))); \
    }                                                                                  \
  } while (0)

// bf16/f16 reductions: MPI has no such types, so a user op on 16-bit words that
// adds (or maxes) through fp32 and rounds to nearest even.
template <bool kBf16, bool kMax>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = kBf16 ? bf16_to_float(a[i]) : f16_to_float(a[i]);
    float y = kBf16 ? bf16_to_float(b[i]) : f16_to_float(b[i]);
    float r = kMax ? (x > y || x != x ? x : y) : x + y;
    b[i] = kBf16 ? float_to_bf16(r) : float_to_f16(r);
  }
}
MPI_Op g_half_ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};

// Element type for data movement: an unsigned word of the element's size.
MPI_Datatype move_type(DType t) {
  switch (dtype_size(t)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
  }
  MCPP_FAIL("MPI backend: no transfer type for {}", dtype_name(t));
}

struct ReduceType {
  MPI_Datatype type;
  MPI_Op op;
};
ReduceType reduce_type(DType t, ReduceOp op) {
  const bool mx = op == ReduceOp::Max;
  switch (t) {
    case DType::F32:
      return {MPI_FLOAT, mx ? MPI_MAX : MPI_SUM};
    case DType::F64:
      return {MPI_DOUBLE, mx ? MPI_MAX : MPI_SUM};
    case DType::I32:
      return {MPI_INT32_T, mx ? MPI_MAX : MPI_SUM};
    case DType::I64:
      return {MPI_INT64_T, mx ? MPI_MAX : MPI_SUM};
    case DType::BF16:
      return {MPI_UINT16_T, g_half_ops[0][mx]};
    case DType::F16:
      return {MPI_UINT16_T, g_half_ops[1][mx]};
    default:
      break;
  }
  MCPP_FAIL("MPI backend cannot reduce {}", dtype_name(t));
}

int count_of(int64_t n, const char* what) {
  MCPP_CHECK_HINT(n <= INT_MAX, "split the tensor into buckets below 2^31 elements",
                  "MPI backend: {} of {} elements exceeds MPI's int count", what, n);
  return int(n);
}

// One in-flight MPI request and everything it needs alive until it completes.
class MpiWork final : public WorkImpl {
 public:
  MpiWork(const Communicator& c, OpDesc d)
      : comm_(c), desc_(std::move(d)), deadline_(std::chrono::steady_clock::now() + c.timeout()) {}
  ~MpiWork() override {
    if (!done_) wait();
  }
  bool test() override {
    if (done_ || poll()) return true;
    if (std::chrono::steady_clock::now() >= deadline_) fail();
    return false;
  }
  void wait() override {
    if (done_) return;
    if (!poll_until([this] { return poll(); }, deadline_)) fail();
  }

  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<Tensor> keep;    // buffers, alive until completion
  std::vector<int> counts[4];  // all_to_allv arrays
  int expect_recv = -1;        // recv: elements expected
  MPI_Datatype recv_type = MPI_DATATYPE_NULL;

 private:
  bool poll();
  [[noreturn]] void fail();
  const Communicator& comm_;
  OpDesc desc_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::string name, std::vector<int> ranks, int rank, Duration timeout,
                  MPI_Comm comm)
      : Communicator(std::move(name), std::move(ranks), rank, timeout), comm_(comm) {}
  ~MpiCommunicator() override {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && comm_ != MPI_COMM_NULL) {
      MpiLock l;
      MPI_Comm_free(&comm_);
    }
  }
  std::string_view backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }
  [[noreturn]] void abort_job() const override { MPI_Abort(MPI_COMM_WORLD, 1), std::abort(); }

 protected:
  std::shared_ptr<MpiWork> work(const OpDesc& d) { return std::make_shared<MpiWork>(*this, d); }

  Work start_all_reduce(Tensor& t, ReduceOp op, const OpDesc& d, Stream&) override {
    auto w = work(d);
    auto rt = reduce_type(t.dtype(), op);
    w->keep = {t};
    MpiLock l;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), count_of(t.numel(), "all_reduce"), rt.type,
                             rt.op, comm_, &w->req));
    return Work(w);
  }
  Work start_all_gather(const Tensor& in, Tensor& out, const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {in, out};
    const int n = count_of(in.numel(), "all_gather");
    // MPI forbids aliased buffers: an in-place call says so with MPI_IN_PLACE.
    const bool in_place = gathers_in_place(in, out);
    MpiLock l;
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.raw(), in_place ? 0 : n,
                             in_place ? MPI_DATATYPE_NULL : move_type(in.dtype()), out.raw(), n,
                             move_type(out.dtype()), comm_, &w->req));
    return Work(w);
  }
  Work start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const OpDesc& d,
                            Stream&) override {
    auto w = work(d);
    auto rt = reduce_type(in.dtype(), op);
    w->keep = {in, out};
    MpiLock l;
    MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), out.raw(),
                                        count_of(out.numel(), "reduce_scatter"), rt.type, rt.op,
                                        comm_, &w->req));
    return Work(w);
  }
  Work start_all_to_all(const Tensor& in, Tensor& out, const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {in, out};
    const int n = count_of(in.numel() / size(), "all_to_all");
    MpiLock l;
    MPI_CHECK(MPI_Ialltoall(in.raw(), n, move_type(in.dtype()), out.raw(), n,
                            move_type(out.dtype()), comm_, &w->req));
    return Work(w);
  }
  Work start_all_to_allv(const Tensor& in, std::vector<int64_t> sc, std::vector<int64_t> sd,
                         Tensor& out, std::vector<int64_t> rc, std::vector<int64_t> rd,
                         const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {in, out};
    const std::vector<int64_t>* src[4] = {&sc, &sd, &rc, &rd};
    for (int k = 0; k < 4; ++k)
      for (int64_t v : *src[k]) w->counts[k].push_back(count_of(v, "all_to_allv"));
    MpiLock l;
    MPI_CHECK(MPI_Ialltoallv(in.raw(), w->counts[0].data(), w->counts[1].data(),
                             move_type(in.dtype()), out.raw(), w->counts[2].data(),
                             w->counts[3].data(), move_type(out.dtype()), comm_, &w->req));
    return Work(w);
  }
  Work start_broadcast(Tensor& t, int root, const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {t};
    MpiLock l;
    MPI_CHECK(MPI_Ibcast(t.raw(), count_of(t.numel(), "broadcast"), move_type(t.dtype()), root,
                         comm_, &w->req));
    return Work(w);
  }
  Work start_send(const Tensor& t, int peer, const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {t};
    MpiLock l;
    MPI_CHECK(MPI_Isend(t.raw(), count_of(t.numel(), "send"), move_type(t.dtype()), peer, kTag,
                        comm_, &w->req));
    return Work(w);
  }
  Work start_recv(Tensor& t, int peer, const OpDesc& d, Stream&) override {
    auto w = work(d);
    w->keep = {t};
    w->expect_recv = count_of(t.numel(), "recv");
    w->recv_type = move_type(t.dtype());
    MpiLock l;
    MPI_CHECK(MPI_Irecv(t.raw(), w->expect_recv, move_type(t.dtype()), peer, kTag, comm_, &w->req));
    return Work(w);
  }
  Work start_barrier(const OpDesc& d, Stream&) override {
    auto w = work(d);
    MpiLock l;
    MPI_CHECK(MPI_Ibarrier(comm_, &w->req));
    return Work(w);
  }

 private:
  // One tag: MPI keeps messages between two ranks of one communicator in order, so
  // send #k always meets recv #k.
  static constexpr int kTag = 7;
  MPI_Comm comm_;
};

bool MpiWork::poll() {
  int flag = 0;
  MPI_Status st;
  {
    MpiLock l;
    MPI_CHECK(MPI_Test(&req, &flag, &st));
  }
  if (!flag) return false;
  done_ = true;
  keep.clear();
  if (expect_recv >= 0) {
    int got = 0;
    MPI_Get_count(&st, recv_type, &got);
    MCPP_CHECK(got == expect_recv, "recv #{} on {}: expected {} elements ({}), the peer sent {}",
               desc_.seq, comm_.describe(), expect_recv, desc_.detail, got);
  }
  return true;
}

void MpiWork::fail() {
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  comm_.abort_on_timeout(desc_, waited);
}

const char* level_name(int provided) {
  switch (provided) {
    case MPI_THREAD_SINGLE:
      return "SINGLE";
    case MPI_THREAD_FUNNELED:
      return "FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "SERIALIZED";
    default:
      return "MULTIPLE";
  }
}

class MpiWorld final : public World {
 public:
  explicit MpiWorld(const InitOptions& opts) : World(opts.timeout) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    MCPP_CHECK(!inited && !fin, "MPI is already initialised (or finalised) in this process");
    MPI_CHECK(MPI_Init_thread(
        nullptr, nullptr, opts.mpi_thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED,
        &provided_));
    MCPP_CHECK_HINT(provided_ >= MPI_THREAD_SERIALIZED,
                    "use an MPI library built with thread support (Debian's OpenMPI is)",
                    "MPI provides only thread level {}; megatron.cpp needs SERIALIZED",
                    level_name(provided_));
    g_need_lock = provided_ < MPI_THREAD_MULTIPLE;
    for (int b = 0; b < 2; ++b)
      for (int m = 0; m < 2; ++m) {
        MPI_User_function* f = b == 0 ? (m ? half_op<true, true> : half_op<true, false>)
                                      : (m ? half_op<false, true> : half_op<false, false>);
        MPI_CHECK(MPI_Op_create(f, 1, &g_half_ops[b][m]));
      }
    MPI_Comm comm;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    std::vector<int> all(size_t(size), 0);
    for (int i = 0; i < size; ++i) all[size_t(i)] = i;
    world_ = std::make_unique<MpiCommunicator>("world", std::move(all), rank, opts.timeout, comm);
    log::set_rank(rank, size);
    if (g_need_lock)
      log::info(
          "MPI: thread level {} (MULTIPLE not available): MPI calls are serialised by a "
          "lock",
          level_name(provided_));
    else
      log::debug("MPI: thread level MULTIPLE, {} ranks", size);
  }
  ~MpiWorld() override {
    world_.reset();
    for (auto& row : g_half_ops)
      for (auto& op : row)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
    MPI_Finalize();
  }
  std::string_view backend() const override { return "mpi"; }
  std::string_view thread_level() const override { return level_name(provided_); }

 protected:
  MPI_Comm world_handle() const { return static_cast<MpiCommunicator&>(*world_).handle(); }

  std::unique_ptr<Communicator> split_impl(int color, const std::vector<int>& members,
                                           const std::string& name) override {
    int key = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank()) key = int(i);
    MPI_Comm c = MPI_COMM_NULL;
    {
      MpiLock l;
      MPI_CHECK(MPI_Comm_split(world_handle(), color >= 0 ? color : MPI_UNDEFINED, key, &c));
    }
    if (color < 0) return nullptr;
    return wrap(c, members, name);
  }
  std::unique_ptr<Communicator> create_group_impl(const std::vector<int>& members,
                                                  const std::string& name) override {
    MPI_Group wg, g;
    MPI_Comm c = MPI_COMM_NULL;
    {
      MpiLock l;
      MPI_CHECK(MPI_Comm_group(world_handle(), &wg));
      MPI_CHECK(MPI_Group_incl(wg, int(members.size()), members.data(), &g));
      MPI_CHECK(MPI_Comm_create_group(world_handle(), g, 0, &c));
      MPI_Group_free(&g);
      MPI_Group_free(&wg);
    }
    return wrap(c, members, name);
  }
  std::function<void()> aborter() const override {
    return [] { MPI_Abort(MPI_COMM_WORLD, 1); };
  }

 private:
  std::unique_ptr<Communicator> wrap(MPI_Comm c, const std::vector<int>& members,
                                     const std::string& name) {
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    int r = 0;
    MPI_Comm_rank(c, &r);
    MCPP_CHECK(members[size_t(r)] == rank(), "internal: group '{}' rank order mismatch", name);
    return std::make_unique<MpiCommunicator>(name, members, r, timeout_, c);
  }
  int provided_ = 0;
};

}  // namespace

std::unique_ptr<World> make_mpi_world(const InitOptions& opts) {
  return std::make_unique<MpiWorld>(opts);
}

}  // namespace mcpp::comm

#endif  // MCPP_HAVE_MPI
