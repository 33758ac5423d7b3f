// Entry to the TCP backend: the world of a torchrun-style launch (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT set, no MPI). world.cpp sees only this.
#pragma once
#include <memory>

#include "comm/world.h"

namespace mcpp::comm {

// Meets the other ranks at li.master_addr:li.rendezvous_port (rank 0 listens there), then
// connects every pair of ranks. Collective over the job; an error naming the ranks and
// addresses when a peer does not arrive within opts.timeout.
std::unique_ptr<World> make_tcp_world(const InitOptions& opts, const LaunchInfo& li);

}  // namespace mcpp::comm
