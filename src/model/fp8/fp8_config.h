// What FP8 training does (Megatron's --fp8-* flags through Transformer Engine, docs/fp8.md):
// the format of each GEMM operand, how scaling factors are found, and which layers run in
// FP8. Set from the flags by training/validate_fp8.cpp; read by the linear layers
// (model/linear.cpp) and the per-step scale update (model/fp8/fp8_state.h).
#pragma once
#include <cstdint>

namespace mcpp::model {

struct Fp8Config {
  enum class Format : uint8_t { None, E4M3, Hybrid };   // --fp8-format
  // --fp8-recipe; Blockwise: 1x128 / 128x128 block scales (fp8_linear.h, docs/fp8.md)
  enum class Recipe : uint8_t { Delayed, Tensorwise, Blockwise };
  Format format = Format::None;
  Recipe recipe = Recipe::Delayed;
  int64_t amax_history_len = 1;  // --fp8-amax-history-len (delayed)
  bool amax_max = false;         // --fp8-amax-compute-algo max (else most_recent)
  int64_t margin = 0;            // --fp8-margin: scale = fp8_max / amax / 2^margin (delayed)
  bool wgrad = true;             // !--no-fp8-wgrad: the weight-gradient GEMM in FP8 too
  // --first-last-layers-bf16: the first `bf16_start` and last `bf16_end` transformer layers
  // keep their GEMMs in the model's dtype (0 and 0 without the flag).
  int64_t bf16_start = 0, bf16_end = 0;

  bool enabled() const { return format != Format::None; }
  bool delayed() const { return enabled() && recipe == Recipe::Delayed; }
  bool blockwise() const { return enabled() && recipe == Recipe::Blockwise; }
  // Gradients are E5M2 under hybrid (more range), E4M3 under e4m3.
  bool grads_e5m2() const { return format == Format::Hybrid; }
  // Multi-token prediction's layer ids start here (TransformerConfig::kMtpLayerBase).
  static constexpr int64_t kMtpLayerBase = int64_t(1) << 16;
  // Whether global layer `layer` of `num_layers` runs its GEMMs in FP8. The MTP layers
  // always do under FP8: Megatron runs them in one global FP8 context, whatever
  // --first-last-layers-bf16 keeps out of it.
  bool layer_in_fp8(int64_t layer, int64_t num_layers) const {
    if (layer >= kMtpLayerBase) return enabled();
    return enabled() && layer >= bf16_start && layer < num_layers - bf16_end;
  }
};

}  // namespace mcpp::model
