// A group of one: every collective is a copy (or nothing), no MPI. Used for the
// world when the binary is not launched by mpirun/srun, and for every group of
// size 1 under MPI (TP=1, PP=1, ...), which then costs nothing.
#pragma once
#include <deque>
#include <functional>

#include "comm/communicator.h"

namespace mcpp::comm {

class LocalCommunicator final : public Communicator {
 public:
  // world_rank: this process's rank in the world; abort: how to end the job
  // (MPI_Abort under mpirun), std::abort when empty.
  LocalCommunicator(std::string name, int world_rank, Duration timeout,
                    std::function<void()> abort = {});
  std::string_view backend() const override { return "local"; }

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
  bool can_access(Device d) const override { return true; }  // copies go through ops::copy

 private:
  struct Pending;  // a send or recv to oneself waiting for its partner
  std::deque<std::shared_ptr<Pending>> sends_, recvs_;
  std::function<void()> abort_;
};

}  // namespace mcpp::comm
