// Entry to the NCCL backend without <nccl.h> or CUDA headers: world.cpp sees only this.
// Compiled only when CMake found NCCL (MCPP_HAVE_NCCL); see nccl_backend.cpp.
#pragma once
#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "comm/nccl_config.h"

namespace mcpp::comm {

// Picks this process's GPU, `local_rank` of the `local_size` ranks on its host (one GPU
// per rank: local_rank modulo the visible devices must not repeat), and starts the CUDA
// backend on it. Throws mcpp::Error when a host has more ranks than GPUs.
void select_cuda_device(int local_rank, int local_size);

// An NCCL communicator for the members of `host`, a group's MPI communicator (or TCP one,
// under torchrun: then no MPI is involved at all), which it keeps: the NCCL unique id
// travels over it, and host (CPU) tensors keep going through it,
// so a group serves both the device tensors of the model and the host scalars of the
// trainer (token counts, norms). Collective over the group's members. `abort` ends the
// job (MPI_Abort, or closing the TCP connections and exiting) when a call times out.
// `config`: the group's --nccl-communicator-config-path settings (ncclConfig_t).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     std::function<void()> abort,
                                                     const NcclGroupConfig& config = {});

}  // namespace mcpp::comm
