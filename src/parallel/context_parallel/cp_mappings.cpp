#include "parallel/context_parallel/cp_mappings.h"

namespace mcpp::parallel::context_parallel {

void sum_over_cp(Tensor& x, comm::Communicator& cp, Stream& s) {
  if (cp.size() > 1) cp.all_reduce(x, comm::ReduceOp::Sum, s);
}

}  // namespace mcpp::parallel::context_parallel
