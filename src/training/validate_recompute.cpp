// --recompute-modules: Megatron's names, the ones megatron.cpp implements, and what each
// needs of the model (validate_args.cpp calls it under selective recomputation).
#include <algorithm>
#include <set>
#include <string>

#include "base/error.h"
#include "training/arguments.h"
#include "training/validate_moe.h"

namespace mcpp::training {

// --recompute-modules under selective recomputation: Megatron's names and default
// (core_attn); the ones megatron.cpp implements are core_attn (the attention core's output
// and lse are recomputed in backward), layernorm (the outputs of input_layernorm and
// pre_mlp_layernorm are recomputed from the kept residual stream), shared_experts (the
// MoE shared experts' fc1 output and activation are recomputed from their input), mlp
// (the same for the dense MLPs; Megatron's "mlp" skips MoE layers too), moe (the MoE
// layers whole: their forward re-run in backward) and mla_up_proj (multi-latent attention's
// up projections and packed q/k/v, rebuilt from the kept latents).
void validate_recompute_modules(Args& a) {
  if (a.recompute_modules.empty()) a.recompute_modules = {"core_attn"};
  static const std::set<std::string> megatron = {
      "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
      "gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"};
  for (const std::string& m : a.recompute_modules) {
    MCPP_CHECK_HINT(megatron.count(m) > 0,
                    "choose from core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
                    "shared_experts, gdn_norm_out, gdp_in_proj, gdp_qkv, mhc",
                    "--recompute-modules: '{}' is not a module Megatron can recompute", m);
    MCPP_CHECK_HINT(m == "core_attn" || m == "layernorm" || m == "shared_experts" || m == "mlp" ||
                        m == "moe_act" || m == "moe" || m == "mla_up_proj",
                    "use core_attn, layernorm, mla_up_proj, mlp, moe, moe_act and/or "
                    "shared_experts, or --recompute-granularity full",
                    "--recompute-modules {} is not implemented yet by megatron.cpp (it "
                    "recomputes core_attn, layernorm, mla_up_proj, mlp, moe, moe_act and "
                    "shared_experts)",
                    m);
    if (m == "mla_up_proj")
      MCPP_CHECK_HINT(a.multi_latent_attention,
                      "drop mla_up_proj from --recompute-modules, or add "
                      "--multi-latent-attention",
                      "--recompute-modules mla_up_proj recomputes multi-latent attention's up "
                      "projections, and this model has none");
    if (m == "moe") {
      MCPP_CHECK_HINT(a.num_experts.value_or(0) > 0,
                      "drop moe from --recompute-modules, or add --num-experts",
                      "--recompute-modules moe: this model has no MoE layers");
      MCPP_CHECK_HINT(!a.fp8, "drop moe from --recompute-modules, or train without --fp8-format",
                      "--recompute-modules moe with --fp8-format is not implemented by "
                      "megatron.cpp (a recomputed FP8 GEMM would update its scaling state "
                      "twice)");
      MCPP_CHECK_HINT(a.keep_mlp_activations == 0,
                      "drop --keep-mlp-activations, or moe from --recompute-modules",
                      "--recompute-modules moe recomputes what --keep-mlp-activations {} asks "
                      "to keep",
                      a.keep_mlp_activations);
    }
    if (m == "moe_act") {
      // The MoE layers recompute their activation (fc2's input) in backward unless
      // --keep-mlp-activations keeps it: what moe_act asks for, always (docs/moe.md).
      MCPP_CHECK_HINT(a.num_experts.value_or(0) > 0,
                      "drop moe_act from --recompute-modules, or add --num-experts",
                      "--recompute-modules moe_act: this model has no MoE layers");
      MCPP_CHECK_HINT(a.moe_grouped_gemm, "add --moe-grouped-gemm",
                      "--recompute-modules moe_act needs --moe-grouped-gemm (as in Megatron)");
      MCPP_CHECK_HINT(a.keep_mlp_activations == 0,
                      "drop --keep-mlp-activations, or moe_act from --recompute-modules",
                      "--recompute-modules moe_act recomputes what --keep-mlp-activations {} "
                      "asks to keep",
                      a.keep_mlp_activations);
    }
    if (m == "mlp") {
      const bool dense = [&] {
        if (!a.num_experts.value_or(0)) return true;
        const auto pat = parse_moe_layer_freq(a.moe_layer_freq, a.num_layers);
        return std::find(pat.begin(), pat.end(), 0) != pat.end();
      }();
      MCPP_CHECK_HINT(dense,
                      "drop mlp from --recompute-modules (it recomputes dense MLPs; MoE layers "
                      "are not affected, as in Megatron)",
                      "--recompute-modules mlp: every layer of this model is a MoE layer");
      MCPP_CHECK_HINT(!a.fp8,
                      "drop mlp from --recompute-modules, or train without --fp8-format",
                      "--recompute-modules mlp with --fp8-format is not implemented by "
                      "megatron.cpp (a recomputed FP8 GEMM would update its scaling state "
                      "twice)");
      MCPP_CHECK_HINT(a.keep_mlp_activations == 0,
                      "drop --keep-mlp-activations, or mlp from --recompute-modules",
                      "--recompute-modules mlp recomputes what --keep-mlp-activations {} asks "
                      "to keep",
                      a.keep_mlp_activations);
    }
    const bool shared = a.num_experts.value_or(0) > 0 &&
                        a.moe_shared_expert_intermediate_size.value_or(0) > 0;
    MCPP_CHECK_HINT(m != "shared_experts" || shared,
                    "drop shared_experts from --recompute-modules, or give the MoE layers shared "
                    "experts (--num-experts with --moe-shared-expert-intermediate-size)",
                    "--recompute-modules shared_experts: this model has no shared experts");
    MCPP_CHECK_HINT(m != "shared_experts" || !a.fp8,
                    "drop shared_experts from --recompute-modules, or train without --fp8-format",
                    "--recompute-modules shared_experts with --fp8-format is not implemented by "
                    "megatron.cpp (a recomputed FP8 GEMM would update its scaling state twice)");
    MCPP_CHECK_HINT(m != "layernorm" || !a.fp8,
                    "drop layernorm from --recompute-modules, or train without --fp8-format",
                    "--recompute-modules layernorm with --fp8-format is not implemented by "
                    "megatron.cpp (the FP8 GEMMs keep their own copy of the norm's output; "
                    "Megatron refuses it with delayed scaling)");
  }
}

}  // namespace mcpp::training
