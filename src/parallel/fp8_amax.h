// The once-per-step part of delayed FP8 scaling (model/fp8/fp8_linear.h): this step's
// amaxes of every FP8 tensor, recorded by each rank over its micro-batches, are max-reduced
// over TP x DP x CP (Megatron's amax reduction group: Transformer Engine reduces over the
// model-parallel-and-data-parallel group of each pipeline stage; a run that reduced over a
// smaller group diverged, Megatron-LM PR #442), then every scale is updated from its
// history. Afterwards every rank of a stage holds the same scales, equal to the serial
// run's: the max over all micro-batches of the global batch and over the TP shards of a
// split tensor. The routed experts' GEMMs (model/moe/experts.h) are reduced apart, each
// over the ranks that hold that expert (its ETP group x its expert-data-parallel group), so
// that no expert's amax mixes with another's (stricter than Megatron, which reduces one
// buffer over the whole amax group). Call after the step's last backward, before the next
// forward.
#pragma once
#include "model/gpt_model.h"
#include "parallel/parallel_state.h"

namespace mcpp::parallel {

void fp8_reduce_amaxes_and_update_scales(model::GPTModel& model, const ParallelState& ps,
                                         Stream& s);

}  // namespace mcpp::parallel
