// Entry to the MPI backend without <mpi.h>: the rest of the system sees only this.
#pragma once
#include <memory>

#include "comm/world.h"

namespace mcpp::comm {

// Throws mcpp::Error when the build has no MPI.
std::unique_ptr<World> make_mpi_world(const InitOptions& opts);

}  // namespace mcpp::comm
