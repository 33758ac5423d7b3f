// Checkpoint -> model weights for inference and conversion: the one loader shared by
// `megatron generate` and `megatron convert --to-hf`. Only the parameters are allocated
// (model::ParamStore::allocate_weights: no gradient buffer, no optimizer state), laid
// out as a GPTModel's so model::Stage / inference::Generator run on them directly.
//
//   auto w = checkpoint::load_model_weights(dir, step, {.tp_rank = r, .tp_size = 2});
//   inference::Generator gen(w.params, w.config, &tp_group);
//
// The checkpoint may have been written under any TP/PP layout: the loader reshards
// (checkpoint.h), reading on the host in f32 (checkpoints hold fp32 values), then moves
// the weights to `device` in `dtype`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/config.h"
#include "model/params.h"

namespace mcpp::checkpoint {

struct WeightsOptions {
  int64_t tp_rank = 0, tp_size = 1;  // the shard to load
  DType dtype = DType::F32;          // the weights' dtype on `device`
  Device device = Device::CPU;
  bool verify_checksums = true;
};

struct ModelWeights {
  model::TransformerConfig config;  // from the checkpoint's metadata (dropout as recorded;
                                    // inference applies none), the options' TP coordinates,
                                    // dtype and device
  model::ParamStore params;         // weights only (no gradients)
  TrainingState state;              // iteration, the recorded training config
  nlohmann::json metadata;          // the iteration's metadata.json
};

// dir: a --save directory or an iter_* directory; iteration: default the latest.
// Errors (no checkpoint, a shape that does not split over tp_size, bad shards) are
// mcpp::Error naming the directory and tensor.
ModelWeights load_model_weights(const std::string& dir, std::optional<int64_t> iteration,
                                const WeightsOptions& opts = {});

}  // namespace mcpp::checkpoint
