// FP8 flags -> checks and model::Fp8Config (validate_fp8.h). Megatron's defaults: recipe
// delayed, amax history 1, most_recent, margin 0, FP8 wgrad on, 1 + 1 layers in bf16 with
// --first-last-layers-bf16. A flag that would change nothing in the chosen setting is an
// error, never accepted and ignored.
#include "training/validate_fp8.h"

#include <fmt/format.h>

#include "base/error.h"

#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_block.h"
#endif

namespace mcpp::training {

void validate_fp8(const Args& a) {
  const char* const tuning[] = {"fp8_recipe",
                                "fp8_margin",
                                "fp8_amax_history_len",
                                "fp8_amax_compute_algo",
                                "fp8_wgrad",
                                "first_last_layers_bf16",
                                "num_layers_at_start_in_bf16",
                                "num_layers_at_end_in_bf16",
                                "fp8_param_gather"};
  if (!a.fp8) {
    for (const char* f : tuning)
      MCPP_CHECK_HINT(!a.was_given(f), "add --fp8-format e4m3 or hybrid, or drop the flag",
                      "{} acts on FP8 training only, and --fp8-format was not given", flag_name(f));
    return;
  }
  MCPP_CHECK_HINT(*a.fp8 == "e4m3" || *a.fp8 == "hybrid",
                  "use --fp8-format e4m3 (every GEMM operand E4M3) or hybrid (gradients E5M2)",
                  "--fp8-format {} is not a format", *a.fp8);
  MCPP_CHECK_HINT(!a.fp16, "use --bf16 with --fp8-format (as Megatron with Transformer Engine)",
                  "--fp8-format with --fp16: FP8 training keeps bf16 parameters and activations");
  const std::string& r = a.fp8_recipe;
  MCPP_CHECK_HINT(r != "mxfp8", "use --fp8-recipe tensorwise, delayed or blockwise",
                  "--fp8-recipe mxfp8 needs MX block scaling (E8M0 scales per 32 values), which "
                  "only Blackwell GPUs' tensor cores have; megatron.cpp targets Hopper");
  MCPP_CHECK_HINT(r != "custom", "use --fp8-recipe tensorwise, delayed or blockwise",
                  "--fp8-recipe custom loads a Python quantizer factory "
                  "(--fp8-quantizer-factory); megatron.cpp has no Python");
  MCPP_CHECK_HINT(r == "tensorwise" || r == "delayed" || r == "blockwise",
                  "use --fp8-recipe tensorwise, delayed or blockwise",
                  "--fp8-recipe {} is not a recipe", r);
  if (r != "delayed")
    for (const char* f : {"fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo"})
      MCPP_CHECK_HINT(!a.was_given(f), "drop it, or use --fp8-recipe delayed",
                      "{} sets delayed scaling; --fp8-recipe {} scales {} by its own amax",
                      flag_name(f), r, r == "tensorwise" ? "each tensor" : "each block");
  MCPP_CHECK_HINT(a.fp8_amax_history_len >= 1 && a.fp8_amax_history_len <= 65536,
                  "give --fp8-amax-history-len a value in [1, 65536] (Megatron's default: 1)",
                  "--fp8-amax-history-len {} is out of range", a.fp8_amax_history_len);
  MCPP_CHECK_HINT(a.fp8_amax_compute_algo == "most_recent" || a.fp8_amax_compute_algo == "max",
                  "use --fp8-amax-compute-algo most_recent or max",
                  "--fp8-amax-compute-algo {} is not an algorithm", a.fp8_amax_compute_algo);
  MCPP_CHECK_HINT(a.fp8_margin >= 0 && a.fp8_margin <= 64,
                  "give --fp8-margin a value in [0, 64] (Megatron's default: 0)",
                  "--fp8-margin {}: scales are divided by 2^margin", a.fp8_margin);
  if (!a.first_last_layers_bf16)
    for (const char* f : {"num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"})
      MCPP_CHECK_HINT(!a.was_given(f), "add --first-last-layers-bf16, or drop the flag",
                      "{} acts only with --first-last-layers-bf16", flag_name(f));
  if (a.first_last_layers_bf16) {
    const int64_t s = a.num_layers_at_start_in_bf16, e = a.num_layers_at_end_in_bf16;
    MCPP_CHECK_HINT(s >= 0 && e >= 0, "give the layer counts values >= 0",
                    "--num-layers-at-start-in-bf16 {} / --num-layers-at-end-in-bf16 {} must "
                    "not be negative",
                    s, e);
    MCPP_CHECK_HINT(s + e < a.num_layers, "keep at least one layer in FP8, or drop --fp8-format",
                    "--num-layers-at-start-in-bf16 {} + --num-layers-at-end-in-bf16 {} leave "
                    "none of the {} layers in FP8",
                    s, e, a.num_layers);
  }
  // ---- --fp8-param-gather (optim/fp8_param_gather.h): Megatron's constraints, and ours.
  if (a.fp8_param_gather) {
    MCPP_CHECK_HINT(a.use_distributed_optimizer, "add --use-distributed-optimizer",
                    "--fp8-param-gather all-gathers FP8 parameters in the distributed "
                    "optimizer's parameter gather (Megatron: distributed optimizer or FSDP only)");
    MCPP_CHECK_HINT(r == "delayed" || r == "tensorwise",
                    "use --fp8-recipe delayed or tensorwise, or drop --fp8-param-gather",
                    "--fp8-param-gather with --fp8-recipe {} is not implemented by megatron.cpp",
                    r);
    // The routed experts' weights live in the expert-data-parallel shards of the optimizer,
    // outside the FP8 parameter gather (optim/fp8_param_gather.h), and their GEMMs cast
    // their own weights: a half-applied flag, so refused.
    MCPP_CHECK_HINT(!a.num_experts,
                    "drop --fp8-param-gather for a MoE model (its FP8 expert "
                    "GEMMs cast their own weights)",
                    "--fp8-param-gather with --num-experts: the FP8 parameter gather of the "
                    "routed experts' weights is not implemented by megatron.cpp");
    MCPP_CHECK_HINT(!a.log_params_norm, "drop --log-params-norm, or drop --fp8-param-gather",
                    "--log-params-norm with --fp8-param-gather: the norm reads the model's own "
                    "copy of the weights, which --fp8-param-gather keeps current only in each "
                    "rank's shard");
    MCPP_CHECK_HINT(!a.check_weight_hash_across_dp_replicas_interval,
                    "drop --check-weight-hash-across-dp-replicas-interval, or drop "
                    "--fp8-param-gather",
                    "--check-weight-hash-across-dp-replicas-interval with --fp8-param-gather is "
                    "not implemented by megatron.cpp: the check hashes the model's own copy of "
                    "the weights, which --fp8-param-gather keeps current only in each rank's "
                    "shard (the layers read the gathered FP8 bytes)");
  }
}

model::Fp8Config fp8_config(const Args& a) {
  model::Fp8Config c;
  if (!a.fp8) return c;
  using F = model::Fp8Config;
  c.format = *a.fp8 == "hybrid" ? F::Format::Hybrid : F::Format::E4M3;
  c.recipe = a.fp8_recipe == "tensorwise"  ? F::Recipe::Tensorwise
             : a.fp8_recipe == "blockwise" ? F::Recipe::Blockwise
                                           : F::Recipe::Delayed;
  c.amax_history_len = a.fp8_amax_history_len;
  c.amax_max = a.fp8_amax_compute_algo == "max";
  c.margin = a.fp8_margin;
  c.wgrad = a.fp8_wgrad;
  if (a.first_last_layers_bf16)
    c.bf16_start = a.num_layers_at_start_in_bf16, c.bf16_end = a.num_layers_at_end_in_bf16;
  return c;
}

void check_fp8_device(const Args& a, Device dev, bool query_gpu) {
  if (!a.fp8 || dev == Device::CPU) return;  // the CPU backend emulates FP8 (docs/fp8.md)
  MCPP_CHECK_HINT(a.bf16, "add --bf16",
                  "--fp8-format on a GPU needs --bf16 (bf16 parameters and activations around "
                  "the FP8 GEMMs)");
#ifdef MCPP_HAVE_CUDA
  if (!query_gpu) return;
  std::string why;
  MCPP_CHECK_HINT(ops::cuda::fp8_gemm_supported(&why),
                  "train without --fp8-format on this GPU, or on a Hopper (H100/H200) or newer",
                  "--fp8-format: {}", why);
  // ---- FP8 blockwise: cuBLASLt's block-scaled FP8 GEMMs (cuBLAS >= 12.9, Hopper)
  if (a.fp8_recipe == "blockwise")
    MCPP_CHECK_HINT(ops::cuda::fp8_block_gemm_supported(&why),
                    "use --fp8-recipe tensorwise or delayed on this GPU",
                    "--fp8-recipe blockwise: {}", why);
#endif
}

}  // namespace mcpp::training
