// A MoE model's routing and expert shape in checkpoint metadata (the "moe" object of the
// "model" field, present only for MoE models, so dense checkpoints are unchanged): what
// any later loader (ckpt comparison, generation, conversion) needs to rebuild the model.
// Expert tensors are keyed by their GLOBAL expert index (mlp.experts.linear_fc1.weight{e}),
// so a checkpoint loads under any TP layout (and any EP size once EP lands).
#pragma once
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace mcpp::checkpoint {

nlohmann::json moe_config_json(const model::TransformerConfig::Moe& m);
// Throws nlohmann::json::exception on a malformed object (the caller names the file).
model::TransformerConfig::Moe moe_config_from_json(const nlohmann::json& j);

}  // namespace mcpp::checkpoint
