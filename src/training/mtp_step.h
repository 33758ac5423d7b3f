// Once per global batch: the MTP depths' losses for the log line (model/mtp.h), Megatron's
// "mtp_k loss": per depth the mean over this rank's micro-batches of L_k / n_k, averaged
// over DP. Collective over PP and DP; every rank calls it every step (no-op without MTP).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_model.h"
#include "parallel/parallel_state.h"

namespace mcpp::training {

std::vector<std::pair<std::string, double>> mtp_finish_global_batch(
    model::GPTModel& m, const parallel::ParallelState& ps);

}  // namespace mcpp::training
