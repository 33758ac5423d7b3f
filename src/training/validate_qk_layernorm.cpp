// --qk-layernorm (model/qk_norm.h): Megatron's RMSNorm of every query and key head before
// RoPE, implemented here for RMSNorm models at TP 1 on the CPU. Everything else it could
// combine with is a start-up error naming the flag (never a flag accepted and ignored).
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
  // Each TP rank normalises its own heads with the shared [HD] weights: their gradients
  // would have to be summed over TP, which no reduction does yet.
  MCPP_CHECK_HINT(a.tensor_model_parallel_size == 1, "train with --tensor-model-parallel-size 1",
                  "--qk-layernorm with --tensor-model-parallel-size {} is not implemented yet",
                  a.tensor_model_parallel_size);
  MCPP_CHECK_HINT(a.device != "cuda" && !a.bf16 && !a.fp16, "run on the CPU (--device cpu, f32)",
                  "--qk-layernorm has no CUDA kernel yet (--device {}{}{})", a.device,
                  a.bf16 ? ", --bf16" : "", a.fp16 ? ", --fp16" : "");
}

}  // namespace mcpp::training
