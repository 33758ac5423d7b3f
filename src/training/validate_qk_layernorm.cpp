// --qk-layernorm: Megatron's norm of every query and key head before RoPE, of the form
// --normalization gives it (RMSNorm: ops::qk_norm_forward; LayerNorm with a bias:
// ops::qk_layernorm_forward), on the CPU and CUDA, at any TP (the norms' gradients are summed
// over TP) and CP (the norm is per token). Under --multi-latent-attention it norms the latents
// instead (RMSNorm only: validate_mla). --apply-wd-to-qk-layernorm (Megatron's
// get_standard_config_overrides) gives the q/k norm weights and biases weight decay, where
// every other norm weight and bias has none.
#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_qk_layernorm(Args& a) {
  if (a.no_weight_decay_cond_type) {
    // Megatron's deprecated spelling; argparse's choices admit only this value.
    log::warn("--no-weight-decay-cond-type is deprecated in Megatron-LM: use "
              "--apply-wd-to-qk-layernorm instead");
    a.apply_wd_to_qk_layernorm = true;
  }
  // --qk-l2-norm: Megatron's L2Norm takes the q/k norms' place (weightless), which MLA does
  // not have (Megatron asserts).
  if (a.qk_l2_norm) {
    MCPP_CHECK_HINT(!a.multi_latent_attention, "drop --qk-l2-norm",
                    "--qk-l2-norm with --multi-latent-attention: Megatron does not support it "
                    "with MLA (it asserts)");
    MCPP_CHECK_HINT(!a.qk_layernorm, "drop --qk-layernorm: --qk-l2-norm takes its place",
                    "--qk-layernorm with --qk-l2-norm: Megatron builds the weightless L2Norm "
                    "then, and --qk-layernorm would change nothing");
  }
  MCPP_CHECK_HINT(!a.apply_wd_to_qk_layernorm || a.qk_layernorm,
                  "add --qk-layernorm, or drop --apply-wd-to-qk-layernorm",
                  "--apply-wd-to-qk-layernorm without --qk-layernorm: the model has no q/k "
                  "layernorm weights to decay");
}

}  // namespace mcpp::training
