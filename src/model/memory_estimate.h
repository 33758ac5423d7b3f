// Activation memory predicted from the shapes, before anything is allocated: the sum of
// the modules' own saved_specs / scratch_specs (module.h), so the prediction is the
// allocation. One source of truth for `megatron plan`, the trainer's start-up
// "Theoretical memory footprints" line and the GPU fit check (training/memory_plan).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/module.h"
#include "model/params.h"

namespace mcpp::model {

// The part's parameters in registry order (names, shapes, TP split, ...).
std::vector<ParamInfo> parameter_registry(const TransformerConfig& cfg, const PipelinePart& part);
// The bytes one micro-batch of B x S tokens keeps for model chunk `chunk` of a model built
// with (cfg, part) (GPTModel::saved_bytes_per_microbatch): batches arrive on the host.
int64_t saved_activation_bytes(const TransformerConfig& cfg, const PipelinePart& part, int chunk,
                               int64_t B, int64_t S);
// The shared workspace once a forward and a backward have run (GPTModel::scratch_bytes).
int64_t scratch_activation_bytes(const TransformerConfig& cfg, const PipelinePart& part, int64_t B,
                                 int64_t S);

}  // namespace mcpp::model
