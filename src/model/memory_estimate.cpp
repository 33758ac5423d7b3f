#include "model/memory_estimate.h"

#include "model/stage.h"

namespace mcpp::model {

std::vector<ParamInfo> parameter_registry(const TransformerConfig& cfg, const PipelinePart& part) {
  return Stage::parameters(cfg, part);
}

int64_t saved_activation_bytes(const TransformerConfig& cfg, const PipelinePart& part_in, int chunk,
                               int64_t B, int64_t S) {
  const PipelinePart part = normalized_part(cfg, part_in);
  MCPP_CHECK(chunk >= 0 && size_t(chunk) < part.chunks.size(), "no model chunk {}", chunk);
  const Stage stage(cfg, part, nullptr);
  const Dims d = make_dims(cfg, S, B);
  StageSaved s;
  return predicted_bytes([&](const TensorVisitor& v) {
    stage.saved_specs(chunk, d, /*copy_batch=*/cfg.device != Device::CPU, s, v);
  });
}

int64_t scratch_activation_bytes(const TransformerConfig& cfg, const PipelinePart& part_in,
                                 int64_t B, int64_t S) {
  const Stage stage(cfg, normalized_part(cfg, part_in), nullptr);
  const Dims d = make_dims(cfg, S, B);
  Workspace ws;
  return predicted_bytes([&](const TensorVisitor& v) { stage.scratch_specs(d, ws, v); });
}

}  // namespace mcpp::model
