// Once per global batch, after the last backward and before the optimizer step, what the
// MoE layers of this rank's model chunks did (Megatron: finalize_model_grads's
// _update_router_expert_bias, and the aux-loss tracker that training_log reports):
//   * the aux-loss-free expert bias: token counts summed over DP (every TP rank of a
//     dispatch group counted the group's tokens already; CP is 1), then
//     b_e += rate * sign(mean_e(c) - c_e), and the counts restart;
//   * the log values: per MoE layer, L / coeff averaged over the micro-batches, summed over
//     pipeline stages (each holds its own layers) and CP, averaged over DP (global_aux_loss:
//     summed over DP, each rank's being its tokens' share); reported as the mean over MoE
//     layers under Megatron's names, one per enabled type: load_balancing_loss,
//     seq_load_balancing_loss, global_load_balancing_loss, then z_loss (and per layer with
//     --moe-per-layer-logging);
//   * global_aux_loss's running counts restart (Megatron's reset_model_temporary_tensors).
// Collective over DP and PP: every rank calls it every step (no-op for a dense model).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_model.h"
#include "parallel/parallel_state.h"

namespace mcpp::training {

std::vector<std::pair<std::string, double>> moe_finish_global_batch(
    model::GPTModel& m, const parallel::ParallelState& ps, bool per_layer_logging);

}  // namespace mcpp::training
