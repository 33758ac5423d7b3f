#include "parallel/context_parallel/cp_mappings.h"

namespace mcpp::parallel::context_parallel {

void sum_over_cp(Tensor& x, comm::Communicator& cp, Stream& s) {
  if (cp.size() > 1) cp.all_reduce(x, comm::ReduceOp::Sum, s);
}

void sum_over_data_cp(Tensor& x, comm::Communicator& dp_cp, Stream& s) {
  if (dp_cp.size() > 1) dp_cp.all_reduce(x, comm::ReduceOp::Sum, s);
}

}  // namespace mcpp::parallel::context_parallel
