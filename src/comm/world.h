// The world: every process of the job, and the factory of process groups.
//
//   auto world = comm::init({.timeout = std::chrono::minutes(args.distributed_timeout_minutes)});
//   Communicator& all = world->world();
//   auto tp = world->split(layout.groups(GroupKind::TP), "tp");   // every rank calls it
//
// init() looks at the environment: under mpirun (OMPI_COMM_WORLD_SIZE), a PMIx or
// PMI launcher (PMIX_RANK, PMI_SIZE: srun --mpi=pmix/pmi2, hydra) or an srun step
// (SLURM_STEP_NUM_TASKS + SLURM_PROCID) it starts MPI; under torchrun or any launcher
// that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT without MPI it joins the job over TCP
// (src/comm/tcp: a rendezvous at MASTER_ADDR, then one connection per pair of ranks);
// otherwise it runs as one process with the local backend. Only src/comm/mpi/*.cpp
// includes <mpi.h>. Backend::Fake (--fake-process-group) is one process playing rank RANK
// of a job of WORLD_SIZE ranks, its collectives exchanging nothing (src/comm/fake).
//
// GPU runs (InitOptions::device = CUDA) under a launcher: init() gives each rank its own
// GPU (its rank among the ranks on its host), and every group of several ranks that
// split()/new_group() create is an NCCL communicator (src/comm/nccl) for device tensors,
// which keeps the group's MPI (or TCP) communicator for host tensors and receives its
// NCCL unique id through it. The world communicator itself stays on MPI or TCP (it
// carries host data: strings, barriers).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/nccl_config.h"

namespace mcpp::comm {

enum class Backend { Auto, Local, MPI, Tcp, Fake };

struct LaunchInfo {
  std::string launcher;  // "mpirun", "pmix", "pmi", "srun", "torchrun"; empty: not launched
  int size = 1;          // world size the launcher announced (-1: unknown)
  int rank = 0;          // this process's rank (-1: unknown)
  // torchrun-style launches (WORLD_SIZE > 1): where rank 0 holds the rendezvous.
  std::string master_addr;  // MASTER_ADDR
  int master_port = -1;     // MASTER_PORT
  // The port rank 0 listens on: MCPP_RENDEZVOUS_PORT when set; MASTER_PORT + 1 when
  // torchrun's agent already serves its own store on MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True); MASTER_PORT otherwise.
  int rendezvous_port = -1;
  int local_rank = -1;  // LOCAL_RANK (informational: GPUs are chosen by hostname)
  bool launched() const { return !launcher.empty(); }
};
// Pure function of the environment (getenv is injectable for tests). A torchrun-style
// environment (RANK, WORLD_SIZE, LOCAL_RANK or TORCHELASTIC_RUN_ID set, no MPI launcher)
// is checked here: a missing or inconsistent variable is an error naming it, so a
// process never mistakes itself for a whole job of one.
LaunchInfo detect_launch(const std::function<const char*(const char*)>& getenv_fn = {});

struct InitOptions {
  Backend backend = Backend::Auto;
  // --distributed-timeout-minutes (Megatron's default is 10); tests use seconds.
  Communicator::Duration timeout = std::chrono::minutes(10);
  // Ask MPI for MPI_THREAD_MULTIPLE (else SERIALIZED, every MPI call under a lock).
  // false: ask for SERIALIZED only (tests exercise that path with it).
  bool mpi_thread_multiple = true;
  // Where the run's tensors live: CUDA under a launcher selects the GPU and makes groups
  // NCCL communicators (an error when the build has no NCCL).
  Device device = Device::CPU;
  // Per-group NCCL settings (--nccl-communicator-config-path), by group name.
  NcclConfigs nccl_configs;
};

class World {
 public:
  virtual ~World() = default;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return world_->world_rank(); }
  int size() const { return world_->size(); }
  Communicator& world() { return *world_; }  // name "world", group rank == world rank
  virtual std::string_view backend() const = 0;
  // How MPI runs threads ("MULTIPLE", "SERIALIZED"; "none" for the local backend).
  virtual std::string_view thread_level() const = 0;
  // The device of the run (InitOptions::device); CUDA: groups of several ranks use NCCL.
  Device device() const { return device_; }

  // Timeout of the world communicator and of every group created afterwards.
  Communicator::Duration timeout() const { return timeout_; }
  void set_timeout(Communicator::Duration t) {
    timeout_ = t;
    world_->set_timeout(t);
  }

  // Collective over the whole world (every rank calls it with the same `groups`):
  // returns this rank's communicator for the group that holds it, with group ranks
  // in list order, or nullptr when no group holds it. Groups must be disjoint.
  // Groups of one get a LocalCommunicator. Preceded by a timed world barrier, so a
  // rank that never arrives aborts the job instead of hanging it.
  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups,
                                      const std::string& name);
  // Collective over the members of `ranks` only; the caller must be one of them.
  std::unique_ptr<Communicator> new_group(std::span<const int> ranks, const std::string& name);

 protected:
  World(Communicator::Duration timeout) : timeout_(timeout) {}
  // Backend hooks. color: index of this rank's group (>= 0) or -1 when in none;
  // members: that group's world ranks (size >= 2 when color >= 0).
  virtual std::unique_ptr<Communicator> split_impl(int color, const std::vector<int>& members,
                                                   const std::string& name) = 0;
  virtual std::unique_ptr<Communicator> create_group_impl(const std::vector<int>& members,
                                                          const std::string& name) = 0;
  // Ends the whole job (used by groups of one under MPI).
  virtual std::function<void()> aborter() const = 0;

  // Groups of several ranks: the backend's communicator, wrapped for NCCL on GPU runs.
  std::unique_ptr<Communicator> for_device(std::unique_ptr<Communicator> c);

  std::unique_ptr<Communicator> world_;
  Communicator::Duration timeout_;
  Device device_ = Device::CPU;
  NcclConfigs nccl_configs_;
  friend std::unique_ptr<World> init(const InitOptions& opts);
};

// Starts the world. One World per process (MPI cannot start twice); destroy every
// Communicator made from it before the World (which finalises MPI).
std::unique_ptr<World> init(const InitOptions& opts = {});

}  // namespace mcpp::comm
