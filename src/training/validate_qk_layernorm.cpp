// --qk-layernorm (ops::qk_norm_forward): Megatron's RMSNorm of every query and key head before
// RoPE, on the CPU and CUDA, at any TP (the norm weights' gradients are summed over TP) and CP
// (the norm is per token). The LayerNorm form is a start-up error naming the flag (never a
// flag accepted and ignored).
#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_qk_layernorm(const Args& a) {
  if (!a.qk_layernorm) return;
  MCPP_CHECK_HINT(a.normalization == "RMSNorm",
                  "add --normalization RMSNorm (Qwen3's q_norm / k_norm are RMSNorm)",
                  "--qk-layernorm with --normalization {}: the LayerNorm form (with a bias) is "
                  "not implemented yet",
                  a.normalization);
}

}  // namespace mcpp::training
