// --num-distributed-optimizer-instances (parallel_state's intra/inter instance groups,
// DataParallelGrads' cross-instance all-reduce): the start-up checks.
#include <fmt/format.h>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

// --num-distributed-optimizer-instances N (Megatron's partial distributed optimizer): what
// Megatron's initialize_model_parallel and DistributedDataParallel assert, after
// validate_moe (which fills in the expert tensor-parallel size).
void validate_distributed_optimizer_instances(const Args& a) {
  const int64_t n = a.num_distributed_optimizer_instances;
  const int64_t dp_cp = a.data_parallel_size * a.context_parallel_size;
  MCPP_CHECK_HINT(n >= 1,
                  "give 1 (the default: one instance) or a divisor of the data-parallel size",
                  "--num-distributed-optimizer-instances {} must be at least 1", n);
  if (n == 1) return;
  MCPP_CHECK_HINT(a.use_distributed_optimizer,
                  "add --use-distributed-optimizer, or drop --num-distributed-optimizer-instances",
                  "--num-distributed-optimizer-instances {} needs --use-distributed-optimizer "
                  "(Megatron: partial DistOpt cannot be used without DistOpt)",
                  n);
  MCPP_CHECK_HINT(dp_cp % n == 0,
                  fmt::format("choose a divisor of {} (each instance shards the state over "
                              "data-parallel x context-parallel size / N ranks)",
                              dp_cp),
                  "--num-distributed-optimizer-instances {} does not divide the data-parallel "
                  "size {} x --context-parallel-size {} = {}",
                  n, a.data_parallel_size, a.context_parallel_size, dp_cp);
  // Megatron splits the expert-data-parallel group the same way; not implemented here.
  const int64_t etp = a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size);
  MCPP_CHECK_HINT(a.expert_model_parallel_size == 1 && etp == a.tensor_model_parallel_size,
                  "drop --num-distributed-optimizer-instances (one instance), or train without "
                  "expert parallelism",
                  "--num-distributed-optimizer-instances {} with --expert-model-parallel-size {} "
                  "(--expert-tensor-parallel-size {}, --tensor-model-parallel-size {}) is not "
                  "implemented yet by megatron.cpp: expert gradients are reduced over their own "
                  "expert-data-parallel group, which is not split into instances",
                  n, a.expert_model_parallel_size, etp, a.tensor_model_parallel_size);
}

}  // namespace mcpp::training
