// The TCP backend: host memory over a TcpMesh, for jobs started without MPI (torchrun or
// any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
//
// Simple and correct before fast: every collective is one exchange in which each member
// sends its data straight to the members that need it, then reads what it needs.
//   all_reduce      everybody sends the whole tensor to everybody; each member folds the
//                   contributions in group-rank order: ((x0 op x1) op x2) ..., so every
//                   member gets the same bits, and for two ranks the bits MPI gives (the
//                   sum of two values does not depend on the order).
//   reduce_scatter  block j of every member goes to member j, folded in group-rank order.
//   all_gather, all_to_all(v), broadcast, barrier: the blocks go where they belong.
// Sends happen when the call starts (the peer's reader thread takes them at once, so
// a send never waits for the peer's program); the Work's wait() reads and finishes. Hence
// the async forms really overlap, and batched send/recv rings cannot deadlock.
//
// Matching: a communicator has a channel (a hash of its world ranks and how many groups
// with those ranks came before), a collective is tagged by its sequence number and a
// point-to-point call by its per-peer number, so messages of different groups and calls
// never meet. A deadline (the communicator's timeout) bounds every wait; a peer whose
// connection closes fails the waiting call at once, naming the peer's rank and address.
// Either way the message is printed and the process exits with status 1, closing its
// connections, so the rest of the job follows within moments (as MPI_Abort would).
#include "comm/tcp/tcp_backend.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <type_traits>

#include "base/log.h"
#include "comm/tcp/tcp_mesh.h"

namespace mcpp::comm {
namespace {

using Clock = TcpMesh::Clock;
using Bytes = std::vector<char>;
constexpr uint64_t kP2P = uint64_t(1) << 63;

template <class T>
void fold(T* acc, const T* x, int64_t n, bool mx) {
  for (int64_t i = 0; i < n; ++i) {
    if (mx) {
      acc[i] = (x[i] > acc[i] || x[i] != x[i]) ? x[i] : acc[i];
    } else if constexpr (std::is_integral_v<T>) {  // wraps like MPI's integer sum
      using U = std::make_unsigned_t<T>;
      acc[i] = T(U(acc[i]) + U(x[i]));
    } else {
      acc[i] = acc[i] + x[i];
    }
  }
}

// acc = x op acc, elementwise; bf16/f16 through fp32, rounded once per step (as MPI's).
void reduce_into(DType t, ReduceOp op, char* acc, const char* x, int64_t n) {
  const bool mx = op == ReduceOp::Max;
  switch (t) {
    case DType::F32:
      return fold(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(x), n, mx);
    case DType::F64:
      return fold(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(x), n, mx);
    case DType::I32:
      return fold(reinterpret_cast<int32_t*>(acc), reinterpret_cast<const int32_t*>(x), n, mx);
    case DType::I64:
      return fold(reinterpret_cast<int64_t*>(acc), reinterpret_cast<const int64_t*>(x), n, mx);
    case DType::BF16:
    case DType::F16: {
      const bool bf = t == DType::BF16;
      auto* a = reinterpret_cast<uint16_t*>(acc);
      auto* b = reinterpret_cast<const uint16_t*>(x);
      for (int64_t i = 0; i < n; ++i) {
        float u = bf ? bf16_to_float(b[i]) : f16_to_float(b[i]);
        float v = bf ? bf16_to_float(a[i]) : f16_to_float(a[i]);
        float r = mx ? (u > v || u != u ? u : v) : u + v;
        a[i] = bf ? float_to_bf16(r) : float_to_f16(r);
      }
      return;
    }
    default:
      MCPP_FAIL("TCP backend cannot reduce {}", dtype_name(t));
  }
}

uint64_t channel_of(const std::vector<int>& ranks, int occurrence) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  for (int r : ranks) mix(uint64_t(r));
  mix(uint64_t(occurrence) | (uint64_t(1) << 40));
  return h & ~kP2P;
}

class TcpCommunicator;

// A call whose sends are out: reads one message from each of `from` (group ranks), then
// runs `finish` on them (in the order of `from`).
class TcpWork final : public WorkImpl {
 public:
  using Finish = std::function<void(std::vector<Bytes>&)>;
  TcpWork(const TcpCommunicator& c, OpDesc d, uint64_t tag, std::vector<int> from,
          std::vector<size_t> expect, Finish finish, std::vector<Tensor> keep);
  ~TcpWork() override {
    if (!done_) wait();
  }
  bool test() override;
  void wait() override;

 private:
  bool step(Clock::time_point until);
  const TcpCommunicator& comm_;
  OpDesc desc_;
  uint64_t tag_;
  std::vector<int> from_;
  std::vector<size_t> expect_;  // bytes from each
  std::vector<Bytes> got_;
  std::vector<bool> have_;
  Finish finish_;
  std::vector<Tensor> keep_;
  Clock::time_point start_ = Clock::now(), deadline_;
  bool done_ = false;
};

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(std::string name, std::vector<int> ranks, int rank, Duration timeout,
                  std::shared_ptr<TcpMesh> mesh, uint64_t channel)
      : Communicator(std::move(name), std::move(ranks), rank, timeout),
        mesh_(std::move(mesh)),
        channel_(channel) {}
  std::string_view backend() const override { return "tcp"; }
  [[noreturn]] void abort_job() const override { mesh_->abort_process(); }

  TcpMesh& mesh() const { return *mesh_; }
  uint64_t channel() const { return channel_; }

  // The peer's connection closed during `d`: say who and where, then end the job.
  [[noreturn]] void fail_lost(const OpDesc& d, int peer) const {
    const int w = ranks()[size_t(peer)];
    std::fprintf(stderr,
                 "[rank %d] ERROR: communication failure on world rank %d: %s %s %s %llu%s%s: "
                 "lost the connection to group rank %d (world rank %d at %s): %s.\n"
                 "  HINT: that process exited or crashed; its own output says why.\n",
                 world_rank(), world_rank(), describe().c_str(),
                 std::string(op_name(d.kind)).c_str(),
                 d.kind == OpKind::Send || d.kind == OpKind::Recv ? "number" : "sequence number",
                 (unsigned long long)d.seq, d.detail.empty() ? "" : ": ", d.detail.c_str(), peer, w,
                 mesh_->address(w).c_str(), mesh_->lost_reason(w).c_str());
    abort_job();
  }

 protected:
  Clock::time_point deadline() const { return Clock::now() + timeout(); }
  void put(const OpDesc& d, uint64_t tag, int peer, const void* p, size_t n) {
    switch (mesh_->send(ranks()[size_t(peer)], channel_, tag, p, n, deadline())) {
      case TcpMesh::Status::Ok:
        return;
      case TcpMesh::Status::Lost:
        fail_lost(d, peer);
      case TcpMesh::Status::Timeout:
        abort_on_timeout(d, double(timeout().count()) / 1000.0);
    }
  }
  std::vector<int> everyone() const {
    std::vector<int> v(static_cast<size_t>(size()));
    for (int i = 0; i < size(); ++i) v[size_t(i)] = i;
    return v;
  }
  Work make(const OpDesc& d, uint64_t tag, std::vector<int> from, std::vector<size_t> expect,
            TcpWork::Finish f, std::vector<Tensor> keep) {
    return Work(std::make_shared<TcpWork>(*this, d, tag, std::move(from), std::move(expect),
                                          std::move(f), std::move(keep)));
  }
  Work reduce_from_all(const OpDesc& d, DType t, ReduceOp op, char* out, size_t bytes,
                       std::vector<Tensor> keep) {
    const int64_t n = int64_t(bytes / dtype_size(t));
    return make(
        d, d.seq, everyone(), std::vector<size_t>(size_t(size()), bytes),
        [t, op, out, bytes, n](std::vector<Bytes>& got) {
          for (size_t r = 1; r < got.size(); ++r)
            reduce_into(t, op, got[0].data(), got[r].data(), n);
          std::memcpy(out, got[0].data(), bytes);
        },
        std::move(keep));
  }

  Work start_all_reduce(Tensor& t, ReduceOp op, const OpDesc& d, Stream&) override {
    for (int j = 0; j < size(); ++j) put(d, d.seq, j, t.raw(), t.nbytes());
    return reduce_from_all(d, t.dtype(), op, static_cast<char*>(t.raw()), t.nbytes(), {t});
  }
  Work start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const OpDesc& d,
                            Stream&) override {
    const size_t b = out.nbytes();
    for (int j = 0; j < size(); ++j)
      put(d, d.seq, j, static_cast<const char*>(in.raw()) + size_t(j) * b, b);
    return reduce_from_all(d, in.dtype(), op, static_cast<char*>(out.raw()), b, {in, out});
  }
  Work start_all_gather(const Tensor& in, Tensor& out, const OpDesc& d, Stream&) override {
    const size_t b = in.nbytes();
    for (int j = 0; j < size(); ++j) put(d, d.seq, j, in.raw(), b);
    char* o = static_cast<char*>(out.raw());
    return make(d, d.seq, everyone(), std::vector<size_t>(size_t(size()), b),
                [o, b](std::vector<Bytes>& got) {
                  for (size_t r = 0; r < got.size(); ++r) std::memcpy(o + r * b, got[r].data(), b);
                },
                {in, out});
  }
  Work start_all_to_all(const Tensor& in, Tensor& out, const OpDesc& d, Stream&) override {
    const size_t b = in.nbytes() / size_t(size());
    for (int j = 0; j < size(); ++j)
      put(d, d.seq, j, static_cast<const char*>(in.raw()) + size_t(j) * b, b);
    char* o = static_cast<char*>(out.raw());
    return make(d, d.seq, everyone(), std::vector<size_t>(size_t(size()), b),
                [o, b](std::vector<Bytes>& got) {
                  for (size_t r = 0; r < got.size(); ++r) std::memcpy(o + r * b, got[r].data(), b);
                },
                {in, out});
  }
  Work start_all_to_allv(const Tensor& in, std::vector<int64_t> sc, std::vector<int64_t> sd,
                         Tensor& out, std::vector<int64_t> rc, std::vector<int64_t> rd,
                         const OpDesc& d, Stream&) override {
    const size_t e = dtype_size(in.dtype());
    for (int j = 0; j < size(); ++j)
      put(d, d.seq, j, static_cast<const char*>(in.raw()) + size_t(sd[size_t(j)]) * e,
          size_t(sc[size_t(j)]) * e);
    std::vector<size_t> expect;
    for (int64_t c : rc) expect.push_back(size_t(c) * e);
    char* o = static_cast<char*>(out.raw());
    return make(d, d.seq, everyone(), std::move(expect),
                [o, e, rd](std::vector<Bytes>& got) {
                  for (size_t r = 0; r < got.size(); ++r)
                    std::memcpy(o + size_t(rd[r]) * e, got[r].data(), got[r].size());
                },
                {in, out});
  }
  Work start_broadcast(Tensor& t, int root, const OpDesc& d, Stream&) override {
    if (rank() == root) {
      for (int j = 0; j < size(); ++j)
        if (j != root) put(d, d.seq, j, t.raw(), t.nbytes());
      return Work();
    }
    char* o = static_cast<char*>(t.raw());
    return make(d, d.seq, {root}, {t.nbytes()},
                [o](std::vector<Bytes>& got) { std::memcpy(o, got[0].data(), got[0].size()); },
                {t});
  }
  Work start_send(const Tensor& t, int peer, const OpDesc& d, Stream&) override {
    // To another rank the bytes are in the kernel or the peer's mailbox on return; to
    // oneself they are copied into the mailbox. Either way the tensor is free again.
    put(d, kP2P | d.seq, peer, t.raw(), t.nbytes());
    return Work();
  }
  Work start_recv(Tensor& t, int peer, const OpDesc& d, Stream&) override {
    char* o = static_cast<char*>(t.raw());
    return make(d, kP2P | d.seq, {peer}, {t.nbytes()},
                [o](std::vector<Bytes>& got) { std::memcpy(o, got[0].data(), got[0].size()); },
                {t});
  }
  Work start_barrier(const OpDesc& d, Stream&) override {
    for (int j = 0; j < size(); ++j) put(d, d.seq, j, nullptr, 0);
    return make(d, d.seq, everyone(), std::vector<size_t>(size_t(size()), 0),
                [](std::vector<Bytes>&) {}, {});
  }

 private:
  std::shared_ptr<TcpMesh> mesh_;
  uint64_t channel_;
};

TcpWork::TcpWork(const TcpCommunicator& c, OpDesc d, uint64_t tag, std::vector<int> from,
                 std::vector<size_t> expect, Finish finish, std::vector<Tensor> keep)
    : comm_(c),
      desc_(std::move(d)),
      tag_(tag),
      from_(std::move(from)),
      expect_(std::move(expect)),
      got_(from_.size()),
      have_(from_.size(), false),
      finish_(std::move(finish)),
      keep_(std::move(keep)),
      deadline_(start_ + c.timeout()) {}

bool TcpWork::step(Clock::time_point until) {
  if (done_) return true;
  for (size_t i = 0; i < from_.size(); ++i) {
    if (have_[i]) continue;
    const int w = comm_.ranks()[size_t(from_[i])];
    switch (comm_.mesh().take(w, comm_.channel(), tag_, got_[i], until)) {
      case TcpMesh::Status::Ok:
        have_[i] = true;
        MCPP_CHECK(got_[i].size() == expect_[i],
                   "{} #{} on {}: expected {} bytes ({}) from group rank {}, it sent {}",
                   op_name(desc_.kind), desc_.seq, comm_.describe(), expect_[i], desc_.detail,
                   from_[i], got_[i].size());
        break;
      case TcpMesh::Status::Lost:
        comm_.fail_lost(desc_, from_[i]);
      case TcpMesh::Status::Timeout:
        return false;
    }
  }
  done_ = true;
  finish_(got_);
  got_.clear();
  keep_.clear();
  return true;
}

bool TcpWork::test() {
  if (step(Clock::now())) return true;
  if (Clock::now() >= deadline_)
    comm_.abort_on_timeout(desc_, std::chrono::duration<double>(Clock::now() - start_).count());
  return false;
}

void TcpWork::wait() {
  if (!step(deadline_))
    comm_.abort_on_timeout(desc_, std::chrono::duration<double>(Clock::now() - start_).count());
}

class TcpWorld final : public World {
 public:
  TcpWorld(const InitOptions& opts, const LaunchInfo& li) : World(opts.timeout) {
    mesh_ = TcpMesh::connect({.master_addr = li.master_addr,
                              .port = li.rendezvous_port,
                              .rank = li.rank,
                              .size = li.size,
                              .timeout = opts.timeout});
    std::vector<int> all(size_t(li.size));
    for (int i = 0; i < li.size; ++i) all[size_t(i)] = i;
    world_ = make(all, "world", li.rank);
    log::debug("TCP backend: rank {} of {}, rendezvous at {}:{}", li.rank, li.size, li.master_addr,
               li.rendezvous_port);
  }
  ~TcpWorld() override { world_.reset(); }
  std::string_view backend() const override { return "tcp"; }
  std::string_view thread_level() const override { return "none"; }

 protected:
  std::unique_ptr<Communicator> split_impl(int color, const std::vector<int>& members,
                                           const std::string& name) override {
    if (color < 0) return nullptr;
    return create_group_impl(members, name);
  }
  std::unique_ptr<Communicator> create_group_impl(const std::vector<int>& members,
                                                  const std::string& name) override {
    int me = -1;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == rank()) me = int(i);
    MCPP_CHECK(me >= 0, "internal: group '{}' without world rank {}", name, rank());
    return make(members, name, me);
  }
  std::function<void()> aborter() const override {
    return [m = mesh_] { m->abort_process(); };
  }

 private:
  // Members of a group create it in the same order, so the k-th group with the same
  // ranks gets the same channel on every member.
  std::unique_ptr<Communicator> make(const std::vector<int>& members, const std::string& name,
                                     int me) {
    const uint64_t ch = channel_of(members, created_[members]++);
    return std::make_unique<TcpCommunicator>(name, members, me, timeout_, mesh_, ch);
  }
  std::shared_ptr<TcpMesh> mesh_;
  std::map<std::vector<int>, int> created_;
};

}  // namespace

std::unique_ptr<World> make_tcp_world(const InitOptions& opts, const LaunchInfo& li) {
  return std::make_unique<TcpWorld>(opts, li);
}

}  // namespace mcpp::comm
