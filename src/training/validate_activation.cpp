// The MLP activation's flags: --quick-geglu, --glu-linear-offset and
// --activation-func-clamp-value (gpt-oss's MLP), as Megatron's core_transformer_config_from_args
// and TransformerConfig.__post_init__ take them. The structural rules (one activation; the
// offset and clamp on a gated unit only; a clamped SwiGLU: finite and positive, MoE only, no
// offset) are model::TransformerConfig::check_activation's, shared with checkpoint imports;
// here Megatron's rule that depends on its bias-activation fusion comes first.
#include "base/error.h"
#include "model/config.h"
#include "training/arguments.h"

namespace mcpp::training {

// Megatron's MLP (mlp.py): under the bias_gelu fusion (--no-bias-gelu-fusion not given, and
// biases: Megatron switches the fusion off with --disable-bias-linear) GELU is the fused
// kernel's tanh form; without it, torch's F.gelu, the exact x Phi(x). --openai-gelu is the tanh
// form by its definition (Megatron's legacy model; its core models no longer read the flag).
bool gelu_is_exact(const Args& a) {
  const bool gelu = !a.swiglu && !a.squared_relu && !a.quick_geglu;
  return gelu && !a.openai_gelu && !(a.bias_gelu_fusion && a.add_bias_linear);
}

void validate_activation(const Args& a) {
  // Megatron's bias_activation_fusion: --swiglu's from --no-bias-swiglu-fusion, every other
  // activation's from --no-bias-gelu-fusion, which Megatron switches off without biases. For
  // GELU it decides the form (gelu_is_exact); for the others, as in Megatron, only whether a
  // non-zero offset is accepted for an activation other than quick_gelu.
  const bool fusion = a.swiglu ? !a.was_given("bias_swiglu_fusion")
                               : a.add_bias_linear && a.bias_gelu_fusion;
  MCPP_CHECK_HINT(a.glu_linear_offset == 0 || a.quick_geglu || !fusion,
                    a.swiglu ? "add --no-bias-swiglu-fusion (the unfused SwiGLU takes the offset), "
                               "or drop --glu-linear-offset"
                             : "use --quick-geglu, or drop --glu-linear-offset",
                    "--glu-linear-offset {} under the bias-activation fusion ({}): Megatron-LM "
                    "requires the activation to be quick_gelu then",
                    a.glu_linear_offset,
                    a.swiglu ? "--swiglu without --no-bias-swiglu-fusion"
                             : "biases without --no-bias-gelu-fusion");
  model::TransformerConfig c;
  c.swiglu = a.swiglu, c.squared_relu = a.squared_relu, c.quick_geglu = a.quick_geglu;
  c.gelu_erf = gelu_is_exact(a);
  c.glu_linear_offset = a.glu_linear_offset;
  c.activation_func_clamp_value = a.activation_func_clamp_value;
  c.moe.num_experts = a.num_experts.value_or(0);
  c.check_activation();
}

}  // namespace mcpp::training
