// Multi-latent attention flags (--multi-latent-attention; model/mla_attention.h), checked as
// Megatron's validate_args and MLATransformerConfig do, plus what this implementation needs:
//   - the MLA shape flags without --multi-latent-attention are errors (Megatron reads them
//     only for MLA; a flag that would change nothing is never accepted here);
//   - MLA excludes grouped-query attention (Megatron asserts it);
//   - the value heads are padded to the query/key head width inside the attention core, so
//     --v-head-dim may not exceed --qk-head-dim + --qk-pos-emb-head-dim;
//   - MLA's RoPE is its own (plain or YaRN over the position dims, whole): the standard
//     RoPE's --rotary-percent, Llama 3.x scaling and interpolation do not reach it, so they
//     are refused with it rather than ignored.
#include <fmt/format.h>

#include <cmath>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_yarn_factor_flags(const Args& a);  // validate_rope.cpp

void validate_mla(Args& a) {
  const char* const shape_flags[][2] = {{"q_lora_rank", "--q-lora-rank"},
                                        {"kv_lora_rank", "--kv-lora-rank"},
                                        {"qk_head_dim", "--qk-head-dim"},
                                        {"qk_pos_emb_head_dim", "--qk-pos-emb-head-dim"},
                                        {"v_head_dim", "--v-head-dim"}};
  const char* const yarn_flags[][2] = {{"rotary_scaling_factor", "--rotary-scaling-factor"},
                                       {"mscale", "--mscale"},
                                       {"mscale_all_dim", "--mscale-all-dim"}};
  if (!a.multi_latent_attention) {
    for (const auto& f : shape_flags)
      MCPP_CHECK_HINT(!a.was_given(f[0]),
                      fmt::format("add --multi-latent-attention, or drop {}", f[1]),
                      "{} configures multi-latent attention, which is off", f[1]);
    // Standard attention's YaRN takes these too (validate_rope.cpp checks them there).
    if (a.position_embedding_type == "yarn") return;
    for (const auto& f : yarn_flags)
      MCPP_CHECK_HINT(!a.was_given(f[0]),
                      fmt::format("add --multi-latent-attention or --position-embedding-type "
                                  "yarn, or drop {}",
                                  f[1]),
                      "{} configures YaRN, which neither multi-latent attention (off) nor "
                      "--position-embedding-type {} uses",
                      f[1], a.position_embedding_type);
    return;
  }
  MCPP_CHECK_HINT(!a.group_query_attention,
                  "drop --group-query-attention / --num-query-groups: MLA's keys and values "
                  "come from one shared latent already",
                  "--multi-latent-attention with --group-query-attention: Megatron-LM refuses "
                  "the two together");
  auto positive = [](int64_t v, const char* flag) {
    MCPP_CHECK_HINT(v > 0, fmt::format("give {} > 0", flag), "{} {} is not positive", flag, v);
  };
  if (a.q_lora_rank) positive(*a.q_lora_rank, "--q-lora-rank");
  positive(a.kv_lora_rank, "--kv-lora-rank");
  positive(a.qk_head_dim, "--qk-head-dim");
  positive(a.qk_pos_emb_head_dim, "--qk-pos-emb-head-dim");
  positive(a.v_head_dim, "--v-head-dim");
  MCPP_CHECK_HINT(a.qk_pos_emb_head_dim % 2 == 0,
                  "give an even --qk-pos-emb-head-dim (DeepSeek-V2/V3 use 64)",
                  "--qk-pos-emb-head-dim {} is odd: RoPE rotates pairs of dims",
                  a.qk_pos_emb_head_dim);
  const int64_t dq = a.qk_head_dim + a.qk_pos_emb_head_dim;
  MCPP_CHECK_HINT(a.v_head_dim <= dq,
                  fmt::format("give --v-head-dim at most {} (--qk-head-dim + "
                              "--qk-pos-emb-head-dim)",
                              dq),
                  "--v-head-dim {} is wider than the query/key heads ({} + {}): the attention "
                  "core pads the value heads to the query/key width",
                  a.v_head_dim, a.qk_head_dim, a.qk_pos_emb_head_dim);
  validate_yarn_factor_flags(a);
  MCPP_CHECK_HINT(a.rotary_percent == 1.0,
                  "drop --rotary-percent: MLA rotates its --qk-pos-emb-head-dim dims whole",
                  "--rotary-percent {} with --multi-latent-attention is not implemented",
                  python_float(a.rotary_percent));
  MCPP_CHECK_HINT(!a.use_rope_scaling && !a.rotary_seq_len_interpolation_factor,
                  "drop --use-rope-scaling / --rotary-seq-len-interpolation-factor; MLA's "
                  "long-context scaling is YaRN (--rope-type yarn, --rotary-scaling-factor)",
                  "Llama 3.x RoPE scaling and position interpolation act on the standard "
                  "attention's RoPE, which multi-latent attention does not use");
  MCPP_CHECK_HINT(!a.qk_layernorm || a.q_lora_rank,
                  "add --q-lora-rank, or drop --qk-layernorm",
                  "--qk-layernorm with --multi-latent-attention and no --q-lora-rank (a norm of "
                  "the hidden state inside linear_q_proj, as in DeepSeek-V2-Lite) is not "
                  "implemented yet");
  MCPP_CHECK_HINT(!a.qk_layernorm || a.normalization == "RMSNorm",
                  "add --normalization RMSNorm (DeepSeek-V2/V3's latent norms), or drop "
                  "--qk-layernorm",
                  "--qk-layernorm with --multi-latent-attention and --normalization {}: the "
                  "latents' LayerNorm (with a bias) is not implemented yet",
                  a.normalization);
  MCPP_CHECK_HINT(!a.qk_layernorm || !a.layernorm_zero_centered_gamma,
                  "drop --apply-layernorm-1p, or --qk-layernorm",
                  "--apply-layernorm-1p with --multi-latent-attention's latent norms "
                  "(--qk-layernorm) is not implemented yet");
  MCPP_CHECK_HINT(!a.apply_wd_to_qk_layernorm,
                  "drop --apply-wd-to-qk-layernorm with --multi-latent-attention",
                  "--apply-wd-to-qk-layernorm decays per-head q/k norm weights; under MLA "
                  "--qk-layernorm normalises the latents instead (whether Megatron decays "
                  "them depends on its module names), which is not implemented");
}

}  // namespace mcpp::training
