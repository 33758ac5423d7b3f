#include "comm/fake/fake_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <numeric>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::comm {
namespace {

// A sum over `n` members that all hold t. Integer tensors (counts, lengths: what sizes are
// made of) become t * n, so that they agree with gathered copies of this rank's data.
// Floating-point ones (activations, gradients, losses) stay this rank's, as Megatron's fake
// group leaves them: multiplied by the tensor-parallel size at every row-parallel layer the
// residual stream would grow geometrically and overflow 16-bit activations.
void replicated_sum(Tensor& t, int n, Stream& s) {
  if (n == 1 || t.numel() == 0) return;
  const DType dt = t.dtype();
  if (dt != DType::I32 && dt != DType::I64) return;
  if (t.device() == Device::CPU) {
    auto times = [&](auto* p) {
      for (int64_t i = 0; i < t.numel(); ++i) p[i] *= n;
    };
    if (dt == DType::I32) times(t.data<int32_t>());
    if (dt == DType::I64) times(t.data<int64_t>());
    return;
  }
  Tensor h = Tensor::empty(t.shape(), dt);  // device counts are small: through the host
  ops::copy(t, h, s);                       // (a device-to-host copy returns with the data)
  replicated_sum(h, n, s);
  ops::copy(h, t, s);
}

// Elements [start, start + n) of t, flat.
Tensor span_of(const Tensor& t, int64_t start, int64_t n) { return t.flat().narrow(start, n); }

int env_count(const std::function<const char*(const char*)>& get, const char* name,
              const char* what) {
  constexpr const char* kHint =
      "set WORLD_SIZE to the job's number of ranks and RANK to the rank to play, e.g. "
      "WORLD_SIZE=64 RANK=0 megatron train --fake-process-group ... (docs/launch.md)";
  const char* v = get(name);
  MCPP_CHECK_HINT(v && *v, kHint, "--fake-process-group: environment variable {} is not set; it "
                  "is needed for {}", name, what);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  MCPP_CHECK_HINT(end && *end == '\0' && x >= 0 && x <= INT_MAX, kHint,
                  "--fake-process-group: {}='{}' is not a non-negative integer", name, v);
  return int(x);
}

class FakeWorld final : public World {
 public:
  FakeWorld(int size, int rank, Communicator::Duration timeout) : World(timeout) {
    std::vector<int> all(static_cast<size_t>(size));
    std::iota(all.begin(), all.end(), 0);
    world_ = std::make_unique<FakeCommunicator>("world", std::move(all), rank, timeout);
  }
  std::string_view backend() const override { return "fake"; }
  std::string_view thread_level() const override { return "none"; }

 protected:
  std::unique_ptr<Communicator> split_impl(int color, const std::vector<int>& members,
                                           const std::string& name) override {
    if (color < 0) return nullptr;
    return create_group_impl(members, name);
  }
  std::unique_ptr<Communicator> create_group_impl(const std::vector<int>& members,
                                                  const std::string& name) override {
    const auto it = std::find(members.begin(), members.end(), rank());
    MCPP_CHECK(it != members.end(), "internal: fake group '{}' without this rank", name);
    return std::make_unique<FakeCommunicator>(name, members, int(it - members.begin()),
                                              timeout_);
  }
  std::function<void()> aborter() const override { return {}; }
};

}  // namespace

FakeCommunicator::FakeCommunicator(std::string name, std::vector<int> world_ranks, int rank,
                                   Duration timeout)
    : Communicator(std::move(name), std::move(world_ranks), rank, timeout) {}

Work FakeCommunicator::start_all_reduce(Tensor& t, ReduceOp op, const OpDesc&, Stream& s) {
  if (op == ReduceOp::Sum) replicated_sum(t, size(), s);
  return {};
}

Work FakeCommunicator::start_all_gather(const Tensor& in, Tensor& out, const OpDesc&,
                                        Stream& s) {
  const int64_t n = in.numel();
  const bool in_place = gathers_in_place(in, out);
  for (int b = 0; b < size(); ++b) {
    if (in_place && b == rank()) continue;
    Tensor dst = span_of(out, b * n, n);
    ops::copy(in, dst, s);
  }
  return {};
}

Work FakeCommunicator::start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                                            const OpDesc&, Stream& s) {
  ops::copy(span_of(in, rank() * out.numel(), out.numel()), out, s);
  if (op == ReduceOp::Sum) replicated_sum(out, size(), s);
  return {};
}

Work FakeCommunicator::start_all_to_all(const Tensor& in, Tensor& out, const OpDesc&,
                                        Stream& s) {
  const int64_t n = in.numel() / size();
  const Tensor self = span_of(in, rank() * n, n);  // what this rank sends to itself
  for (int b = 0; b < size(); ++b) {
    Tensor dst = span_of(out, b * n, n);
    ops::copy(self, dst, s);
  }
  return {};
}

Work FakeCommunicator::start_all_to_allv(const Tensor& in, std::vector<int64_t> send_counts,
                                         std::vector<int64_t> send_displs, Tensor& out,
                                         std::vector<int64_t> recv_counts,
                                         std::vector<int64_t> recv_displs, const OpDesc&,
                                         Stream& s) {
  const size_t me = size_t(rank());
  const Tensor self = span_of(in, send_displs[me], send_counts[me]);
  for (size_t b = 0; b < recv_counts.size(); ++b) {
    if (recv_counts[b] == 0) continue;
    Tensor dst = span_of(out, recv_displs[b], recv_counts[b]);
    // Counts from this group's all_to_all agree with the self block; any other count
    // cannot be filled from this rank's data.
    if (recv_counts[b] == send_counts[me])
      ops::copy(self, dst, s);
    else
      ops::fill(dst, 0.0, s);
  }
  return {};
}

Work FakeCommunicator::start_broadcast(Tensor&, int, const OpDesc&, Stream&) { return {}; }
Work FakeCommunicator::start_send(const Tensor&, int, const OpDesc&, Stream&) { return {}; }
Work FakeCommunicator::start_recv(Tensor& t, int, const OpDesc&, Stream& s) {
  ops::fill(t, 0.0, s);
  return {};
}
Work FakeCommunicator::start_barrier(const OpDesc&, Stream&) { return {}; }

void FakeCommunicator::abort_job() const { std::abort(); }

LaunchInfo fake_launch(const std::function<const char*(const char*)>& getenv_fn) {
  auto get = getenv_fn ? getenv_fn : [](const char* n) -> const char* { return std::getenv(n); };
  // A launcher of several processes: each would play a rank alone, not the job it thinks.
  const LaunchInfo real = [&] {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
      if (const char* x = get(v); x && *x && std::string_view(x) != "1")
      {
        LaunchInfo l;
        l.launcher = v, l.size = std::atoi(x);
        return l;
      }
    return LaunchInfo{};
  }();
  MCPP_CHECK_HINT(!real.launched(),
                  "start one process (no mpirun/srun): it plays the rank that RANK names",
                  "--fake-process-group runs one process that plays one rank of the job, but "
                  "this one was launched with {}={}",
                  real.launcher, real.size);
  LaunchInfo li;
  li.launcher = "fake";
  li.size = env_count(get, "WORLD_SIZE", "the number of ranks of the job to play");
  li.rank = env_count(get, "RANK", "the rank this process plays");
  if (const char* v = get("LOCAL_RANK"); v && *v)
    li.local_rank = env_count(get, "LOCAL_RANK", "the GPU this process runs on");
  MCPP_CHECK_HINT(li.size >= 1, "WORLD_SIZE is the job's number of ranks (at least 1)",
                  "--fake-process-group: WORLD_SIZE=0");
  MCPP_CHECK_HINT(li.rank < li.size, "RANK counts from 0 to WORLD_SIZE - 1",
                  "--fake-process-group: RANK={} is not below WORLD_SIZE={}", li.rank, li.size);
  return li;
}

std::unique_ptr<World> make_fake_world(const LaunchInfo& li, Communicator::Duration timeout) {
  return std::make_unique<FakeWorld>(li.size, li.rank, timeout);
}

}  // namespace mcpp::comm
