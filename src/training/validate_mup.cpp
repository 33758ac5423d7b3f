// muP's flags (Megatron's TransformerConfig.__post_init__ and get_mup_config_overrides;
// model/config.h Mup, docs/model.md "muP"). The width multiplier is derived from
// --mup-base-hidden-size (default: this hidden size, width 1), as Megatron derives it; the
// other flags only act with --use-mup, and each given without it is an error (Megatron
// ignores them).
#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_mup(Args& a) {
  MCPP_CHECK_HINT(!a.was_given("mup_width_mult"),
                  "give --mup-base-hidden-size (the proxy model's hidden size) instead",
                  "--mup-width-mult {}: the width multiplier is derived as --hidden-size / "
                  "--mup-base-hidden-size (Megatron overwrites a given value)",
                  a.mup_width_mult);
  if (!a.use_mup) {
    for (const char* f : {"mup_base_hidden_size", "mup_embedding_mult", "mup_output_mult",
                          "mup_base_head_dim", "mup_attn_scale_power"})
      MCPP_CHECK_HINT(!a.was_given(f), "add --use-mup, or drop the flag",
                      "{} acts only with --use-mup", flag_name(f));
    return;
  }
  const int64_t base = a.mup_base_hidden_size.value_or(a.hidden_size);
  MCPP_CHECK_HINT(base > 0, "give the proxy model's hidden size, e.g. 256",
                  "--mup-base-hidden-size {} must be positive", base);
  a.mup_width_mult = double(a.hidden_size) / double(base);
  if (a.mup_base_head_dim)
    MCPP_CHECK_HINT(*a.mup_base_head_dim > 0, "give the base model's head dim, e.g. 64",
                    "--mup-base-head-dim {} must be positive", *a.mup_base_head_dim);
  for (const auto& [f, v] : {std::pair{"mup_embedding_mult", a.mup_embedding_mult},
                             std::pair{"mup_output_mult", a.mup_output_mult}})
    MCPP_CHECK_HINT(v > 0, "give a positive multiplier", "{} {} must be positive",
                    flag_name(f), v);
  if (a.multi_latent_attention)
    for (const auto& [f, set] :
         {std::pair{"mup_base_head_dim", a.mup_base_head_dim.has_value()},
          std::pair{"mup_attn_scale_power", a.mup_attn_scale_power != 1.0}})
      MCPP_CHECK_HINT(!set, "drop the flag: MLA's softmax scale is its own",
                      "{} with --multi-latent-attention: Megatron's MLA keeps its own softmax "
                      "scale (YaRN's mscale over sqrt(q head dim)), so the flag would change "
                      "nothing",
                      flag_name(f));
  if (a.init_method_xavier_uniform)
    log::warn("--use-mup with --init-method-xavier-uniform: the weights are drawn Xavier "
             "uniform, without muP's width scaling (as Megatron, which warns that this may "
             "break muP's initialisation assumptions); the learning rates, multipliers and "
             "attention scale are muP's");
}

}  // namespace mcpp::training
