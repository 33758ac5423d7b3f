#include "checkpoint/weights.h"

#include "base/error.h"
#include "model/stage.h"
#include "ops/ops.h"

namespace mcpp::checkpoint {

namespace {

void add_parameters(const model::TransformerConfig& c, model::ParamStore& ps) {
  const model::PipelinePart whole = model::normalized_part(c, {});
  for (auto& p : model::Stage::parameters(c, whole)) ps.add(std::move(p));
  for (auto& b : model::Stage::buffers(c, whole)) ps.add_buffer(std::move(b));  // MoE expert bias
}

}  // namespace

ModelWeights load_model_weights(const std::string& dir, std::optional<int64_t> iteration,
                                const WeightsOptions& opts) {
  MCPP_CHECK(opts.tp_size >= 1 && opts.tp_rank >= 0 && opts.tp_rank < opts.tp_size,
             "load_model_weights: TP rank {} of {}", opts.tp_rank, opts.tp_size);
  ModelWeights w;
  w.metadata = read_metadata(dir, iteration);
  model::TransformerConfig c = model_config_from_metadata(w.metadata);
  c.tp_size = opts.tp_size, c.tp_rank = opts.tp_rank;
  c.sequence_parallel = false;
  c.dtype = DType::F32, c.device = Device::CPU;  // as stored
  MCPP_CHECK_HINT(c.num_attention_heads % c.tp_size == 0 && c.num_query_groups % c.tp_size == 0 &&
                      c.ffn_hidden_size % c.tp_size == 0 && c.padded_vocab_size % c.tp_size == 0,
                  "choose a --tensor-model-parallel-size that divides the heads, query groups, "
                  "FFN size and padded vocabulary",
                  "{}: the model ({} heads, {} query groups, FFN {}, vocab {}) does not split "
                  "over {} TP ranks",
                  dir, c.num_attention_heads, c.num_query_groups, c.ffn_hidden_size,
                  c.padded_vocab_size, c.tp_size);
  c.validate();

  // Read on the host in f32 (the checkpoint's own values), then to the device/dtype.
  model::ParamStore host;
  add_parameters(c, host);
  host.allocate_weights(DType::F32, Device::CPU, c.tp_rank, c.tp_size, c.param_align);
  LoadOptions lo;
  lo.model = c;
  lo.load_rng = false;
  lo.verify_checksums = opts.verify_checksums;
  const std::string iter_dir = w.metadata.value("__iter_dir", dir);
  w.state = load_checkpoint(iter_dir, std::nullopt, host, nullptr, lo);

  c.dtype = opts.dtype, c.device = opts.device;
  if (c.dtype == DType::F32 && c.device == Device::CPU) {
    w.params = std::move(host);
  } else {
    add_parameters(c, w.params);
    w.params.allocate_weights(c.dtype, c.device, c.tp_rank, c.tp_size, c.param_align);
    MCPP_CHECK(w.params.total_numel() == host.total_numel(),
               "load_model_weights: layouts differ ({} vs {} elements)", w.params.total_numel(),
               host.total_numel());
    // A host-to-device copy from pageable memory returns once the source is read, so
    // `host` may go when this returns.
    ops::copy(host.flat_params(), w.params.flat_params(), ops::default_stream(c.device));
    for (size_t i = 0; i < host.buffer_infos().size(); ++i) {
      Tensor dst = w.params.buffer(i);
      ops::copy(host.buffer(i), dst, ops::default_stream(c.device));
    }
  }
  w.config = c;
  return w;
}

}  // namespace mcpp::checkpoint
