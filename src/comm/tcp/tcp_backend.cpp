#include "comm/tcp/tcp_backend.h"

namespace mcpp::comm {

std::unique_ptr<World> make_tcp_world(const InitOptions&, const LaunchInfo& li) {
  MCPP_FAIL(
      "launched by torchrun (or RANK/WORLD_SIZE set) as rank {} of {}, but this build cannot "
      "join such a job yet.\n  HINT: launch with mpirun -np {} or srun (docs/launch.md); a rank "
      "must never train alone while its peers do the same",
      li.rank, li.size, li.size);
}

}  // namespace mcpp::comm
