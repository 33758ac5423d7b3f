#include "comm/world.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string_view>

#include "base/log.h"
#include "comm/fake/fake_communicator.h"
#include "comm/local/local_communicator.h"
#include "comm/mpi/mpi_backend.h"
#include "comm/tcp/tcp_backend.h"
#ifdef MCPP_HAVE_NCCL
#include "comm/nccl/nccl_backend.h"
#endif

namespace mcpp::comm {
namespace {

int env_int(const std::function<const char*(const char*)>& get, const char* name) {
  const char* v = get(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end && *end == '\0' && x >= 0 && x <= INT_MAX) ? int(x) : -1;
}

// The world without MPI: one process.
class LocalWorld final : public World {
 public:
  explicit LocalWorld(Communicator::Duration timeout) : World(timeout) {
    world_ = std::make_unique<LocalCommunicator>("world", 0, timeout);
  }
  std::string_view backend() const override { return "local"; }
  std::string_view thread_level() const override { return "none"; }

 protected:
  std::unique_ptr<Communicator> split_impl(int, const std::vector<int>&,
                                           const std::string&) override {
    MCPP_FAIL("internal: a group of more than one rank in a world of one");
  }
  std::unique_ptr<Communicator> create_group_impl(const std::vector<int>&,
                                                  const std::string&) override {
    MCPP_FAIL("internal: a group of more than one rank in a world of one");
  }
  std::function<void()> aborter() const override { return {}; }
};

void check_members(const std::vector<int>& g, int world_size, const std::string& name) {
  MCPP_CHECK(!g.empty(), "group '{}': an empty rank list", name);
  std::set<int> seen;
  for (int r : g) {
    MCPP_CHECK(r >= 0 && r < world_size, "group '{}': rank {} outside the world of {} ranks", name,
               r, world_size);
    MCPP_CHECK(seen.insert(r).second, "group '{}': rank {} listed twice in [{}]", name, r,
               fmt::join(g, ", "));
  }
}

// This rank's place among the ranks on its host (hostnames gathered over the world):
// {local rank, ranks on this host}.
[[maybe_unused]] std::pair<int, int> host_local_rank(Communicator& world) {
  constexpr int64_t kLen = 256;
  Tensor mine = Tensor::zeros({kLen}, DType::U8);
  MCPP_CHECK(gethostname(static_cast<char*>(mine.raw()), kLen - 1) == 0, "gethostname failed: {}",
             std::strerror(errno));
  Tensor all = Tensor::empty({kLen * world.size()}, DType::U8);
  world.all_gather(mine, all, Stream::cpu());
  int local = 0, count = 0;
  for (int r = 0; r < world.size(); ++r)
    if (std::memcmp(all.data<uint8_t>() + r * kLen, mine.raw(), kLen) == 0) {
      if (r < world.rank()) ++local;
      ++count;
    }
  return {local, count};
}

using GetEnv = std::function<const char*(const char*)>;

bool set_any(const GetEnv& get, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = get(n); v && *v) return true;
  return false;
}

constexpr const char* kTorchrunHint =
    "torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process; under "
    "another launcher set them all (see docs/launch.md), or unset RANK, WORLD_SIZE, LOCAL_RANK "
    "and TORCHELASTIC_RUN_ID to run a single process";

// A required non-negative integer variable of a torchrun-style launch.
int torchrun_int(const GetEnv& get, const char* name, const char* why) {
  const char* v = get(name);
  MCPP_CHECK_HINT(v && *v, kTorchrunHint,
                  "torchrun-style launch (RANK/WORLD_SIZE/LOCAL_RANK/TORCHELASTIC_RUN_ID set, no "
                  "MPI launcher): environment variable {} is not set; it is needed {}",
                  name, why);
  int x = env_int(get, name);
  MCPP_CHECK_HINT(x >= 0, kTorchrunHint,
                  "torchrun-style launch: environment variable {}='{}' is not a non-negative "
                  "integer",
                  name, v);
  return x;
}

LaunchInfo torchrun_launch(const GetEnv& get) {
  LaunchInfo li;
  li.launcher = "torchrun";
  li.size = torchrun_int(get, "WORLD_SIZE", "for the number of processes in the job");
  li.rank = torchrun_int(get, "RANK", "for this process's rank in the job");
  MCPP_CHECK_HINT(li.size >= 1, kTorchrunHint, "torchrun-style launch: WORLD_SIZE=0");
  MCPP_CHECK_HINT(li.rank < li.size, kTorchrunHint,
                  "torchrun-style launch: RANK={} is not below WORLD_SIZE={}", li.rank, li.size);
  if (const char* v = get("LOCAL_RANK"); v && *v)
    li.local_rank = torchrun_int(get, "LOCAL_RANK", "");
  if (li.size == 1) return li;  // a job of one: nothing to meet
  const char* addr = get("MASTER_ADDR");
  MCPP_CHECK_HINT(addr && *addr, kTorchrunHint,
                  "torchrun-style launch of {} processes: environment variable MASTER_ADDR is not "
                  "set; it is needed for the host of rank 0, where the ranks meet",
                  li.size);
  li.master_addr = addr;
  li.master_port = torchrun_int(get, "MASTER_PORT", "for the port where the ranks meet");
  MCPP_CHECK_HINT(li.master_port >= 1 && li.master_port <= 65535, kTorchrunHint,
                  "torchrun-style launch: MASTER_PORT={} is not a TCP port (1..65535)",
                  li.master_port);
  li.rendezvous_port = li.master_port;
  if (const char* v = get("TORCHELASTIC_USE_AGENT_STORE");
      v && (std::string_view(v) == "True" || std::string_view(v) == "1"))
    // torchrun's agent already listens on MASTER_PORT (its own key-value store).
    li.rendezvous_port = li.master_port == 65535 ? 65534 : li.master_port + 1;
  if (const char* v = get("MCPP_RENDEZVOUS_PORT"); v && *v) {
    li.rendezvous_port = torchrun_int(get, "MCPP_RENDEZVOUS_PORT", "");
    MCPP_CHECK(li.rendezvous_port >= 1 && li.rendezvous_port <= 65535,
               "MCPP_RENDEZVOUS_PORT={} is not a TCP port (1..65535)", li.rendezvous_port);
  }
  return li;
}

}  // namespace

LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv_fn) {
  auto get = getenv_fn ? getenv_fn : [](const char* n) -> const char* { return std::getenv(n); };
  LaunchInfo li;
  auto set = [&](const char* launcher, const char* size, const char* rank) {
    li.launcher = launcher, li.size = size ? env_int(get, size) : -1;
    li.rank = rank ? env_int(get, rank) : -1;
  };
  // A torchrun worker inherits the variables of whatever started torchrun (srun's step,
  // PMIx), but is no MPI rank: torchrun's own marker decides.
  if (const char* v = get("TORCHELASTIC_RUN_ID"); v && *v) return torchrun_launch(get);
  if (get("OMPI_COMM_WORLD_SIZE"))
    set("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
  else if (get("PMIX_RANK"))
    set("pmix", nullptr, "PMIX_RANK");
  else if (get("PMI_SIZE"))
    set("pmi", "PMI_SIZE", "PMI_RANK");
  else if (get("SLURM_STEP_NUM_TASKS") && get("SLURM_PROCID"))
    // Inside an srun step. A batch script alone (SLURM_NTASKS without a step) is not
    // a launch: the script runs once and should call srun.
    set("srun", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID");
  else if (set_any(get, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"}))
    li = torchrun_launch(get);
  return li;
}

std::unique_ptr<World> init(const InitOptions& opts) {
  static bool started = false;
  MCPP_CHECK(!started, "comm::init called twice: one World per process (MPI starts only once)");
  if (opts.backend == Backend::Fake) {  // one process, one rank of WORLD_SIZE, no launcher
    const LaunchInfo li = fake_launch();
    auto w = make_fake_world(li, opts.timeout);
    log::set_rank(0, 1);  // the only process prints what the rank it plays would
#ifdef MCPP_HAVE_NCCL
    // Several fake processes on one host (torchrun): each on GPU LOCAL_RANK, as Megatron.
    if (opts.device == Device::CUDA && li.local_rank >= 0) select_cuda_device(li.local_rank, 1);
#endif
    return w;
  }
  Backend b = opts.backend;
  LaunchInfo li = detect_launch();
  if (b == Backend::Auto && li.launcher == "torchrun") {
    b = li.size > 1 ? Backend::Tcp : Backend::Local;
  } else if (b == Backend::Auto) {
#ifdef MCPP_HAVE_MPI
    b = li.launched() ? Backend::MPI : Backend::Local;
#else
    MCPP_CHECK_HINT(
        !li.launched() || li.size == 1, "install libopenmpi-dev and rebuild, or run without mpirun",
        "launched by {} with {} ranks, but this build has no MPI", li.launcher, li.size);
    b = Backend::Local;
#endif
  }
  std::unique_ptr<World> w;
  if (b == Backend::MPI) {
    w = make_mpi_world(opts);
    started = true;  // MPI cannot be started again after MPI_Finalize
  } else if (b == Backend::Tcp) {
    MCPP_CHECK_HINT(li.launcher == "torchrun" && li.size > 1,
                    "start the processes with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and "
                    "MASTER_PORT (docs/launch.md)",
                    "the TCP backend needs a torchrun-style launch of several processes{}",
                    li.launched() ? fmt::format(" (this one: {}, {} ranks)", li.launcher, li.size)
                                  : std::string(" (none found)"));
    w = make_tcp_world(opts, li);
  } else {
    w = std::make_unique<LocalWorld>(opts.timeout);
  }
  log::set_rank(w->rank(), w->size());
  if (opts.device == Device::CUDA && w->size() > 1) {
#ifdef MCPP_HAVE_NCCL
    auto [local, local_size] = host_local_rank(w->world());
    select_cuda_device(local, local_size);
    w->device_ = Device::CUDA;
    w->nccl_configs_ = opts.nccl_configs;
#else
    MCPP_CHECK_HINT(false,
                    "rebuild where CMake finds NCCL (it prints 'megatron.cpp: NCCL: yes'; pass "
                    "-DMCPP_NCCL_ROOT=...), or train with --device cpu",
                    "--device cuda with {} ranks needs the NCCL backend, which this build lacks",
                    w->size());
#endif
  }
  return w;
}

std::unique_ptr<Communicator> World::for_device(std::unique_ptr<Communicator> c) {
#ifdef MCPP_HAVE_NCCL
  if (device_ == Device::CUDA && c) {
    const NcclGroupConfig* cfg = find_nccl_config(nccl_configs_, c->name());
    return make_nccl_communicator(std::move(c), aborter(), cfg ? *cfg : NcclGroupConfig{});
  }
#endif
  return c;
}

std::unique_ptr<Communicator> World::split(const std::vector<std::vector<int>>& groups,
                                           const std::string& name) {
  std::set<int> seen;
  int color = -1;
  for (size_t i = 0; i < groups.size(); ++i) {
    check_members(groups[i], size(), name);
    for (int r : groups[i]) {
      MCPP_CHECK(seen.insert(r).second, "groups '{}': rank {} is in more than one group", name, r);
      if (r == rank()) color = int(i);
    }
  }
  // Everybody arrives (or the job aborts with this barrier's sequence number) before
  // the untimed MPI_Comm_split.
  if (size() > 1) world_->barrier(Stream::cpu());
  std::vector<int> members = color >= 0 ? groups[size_t(color)] : std::vector<int>{};
  const bool mine_is_big = members.size() > 1;
  std::unique_ptr<Communicator> c;
  if (size() > 1) c = split_impl(mine_is_big ? color : -1, members, name);
  if (color < 0) return nullptr;
  if (!mine_is_big) return std::make_unique<LocalCommunicator>(name, rank(), timeout_, aborter());
  return for_device(std::move(c));
}

std::unique_ptr<Communicator> World::new_group(std::span<const int> ranks,
                                               const std::string& name) {
  std::vector<int> members(ranks.begin(), ranks.end());
  check_members(members, size(), name);
  MCPP_CHECK(std::find(members.begin(), members.end(), rank()) != members.end(),
             "new_group '{}': world rank {} is not in [{}]; only members call new_group", name,
             rank(), fmt::join(members, ", "));
  if (members.size() == 1)
    return std::make_unique<LocalCommunicator>(name, rank(), timeout_, aborter());
  return for_device(create_group_impl(members, name));
}

}  // namespace mcpp::comm
