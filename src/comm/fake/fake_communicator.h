// --fake-process-group (Megatron's flag of that name): one process plays one rank of a
// larger job -- WORLD_SIZE and RANK say which -- so that a rank's memory and compute can
// be measured on one GPU (or CPU) before the job is launched. Every group keeps its real
// size and this rank's place in it, so the model, the optimizer shards, the pipeline
// stage and the data the rank reads are those of the real job; no byte is exchanged.
//
// What a collective leaves behind: every other member of a group is taken to hold exactly
// this rank's data and to make the same call, which keeps every size that a collective
// decides (all-to-all split counts, gathered lengths) consistent:
//   all_reduce        Sum of integers: t * size (the sum of `size` equal counts); Sum of
//                     floating-point values and Max: t unchanged (activations and gradients
//                     keep their scale, as Megatron's fake group leaves them)
//   all_gather        every block of out = in
//   reduce_scatter    out = this rank's block of in (integers: * size)
//   all_to_all(v)     every block of out = the block this rank sends to itself
//   broadcast         t unchanged (the root holds the same data)
//   send              nothing;  recv: zeros (what another stage or ring neighbour sends is
//                     not known)
//   barrier           nothing
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/world.h"

namespace mcpp::comm {

class FakeCommunicator final : public Communicator {
 public:
  // world_ranks: the group's members (world ranks, by group rank); rank: this process's
  // index among them.
  FakeCommunicator(std::string name, std::vector<int> world_ranks, int rank, Duration timeout);
  std::string_view backend() const override { return "fake"; }

 protected:
  Work start_all_reduce(Tensor& t, ReduceOp op, const OpDesc& d, Stream& s) override;
  Work start_all_gather(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) override;
  Work start_reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const OpDesc& d,
                            Stream& s) override;
  Work start_all_to_all(const Tensor& in, Tensor& out, const OpDesc& d, Stream& s) override;
  Work start_all_to_allv(const Tensor& in, std::vector<int64_t> send_counts,
                         std::vector<int64_t> send_displs, Tensor& out,
                         std::vector<int64_t> recv_counts, std::vector<int64_t> recv_displs,
                         const OpDesc& d, Stream& s) override;
  Work start_broadcast(Tensor& t, int root, const OpDesc& d, Stream& s) override;
  Work start_send(const Tensor& t, int peer, const OpDesc& d, Stream& s) override;
  Work start_recv(Tensor& t, int peer, const OpDesc& d, Stream& s) override;
  Work start_barrier(const OpDesc& d, Stream& s) override;
  [[noreturn]] void abort_job() const override;
  bool can_access(Device) const override { return true; }  // through ops::copy / ops::fill
};

// The rank a --fake-process-group run plays: WORLD_SIZE and RANK from the environment
// (getenv injectable for tests), as Megatron reads them, and LOCAL_RANK when set (its GPU
// on a CUDA run). Errors name the variable; a launch by mpirun/srun of several processes
// is an error (one process plays one rank).
LaunchInfo fake_launch(const std::function<const char*(const char*)>& getenv_fn = {});

// The world of a --fake-process-group run: size li.size, this process rank li.rank.
std::unique_ptr<World> make_fake_world(const LaunchInfo& li, Communicator::Duration timeout);

}  // namespace mcpp::comm
