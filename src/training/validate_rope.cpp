// Validation of the RoPE flags beyond the base and the rotary share: Llama 3.x scaling
// (--use-rope-scaling, --rope-scaling-factor), linear position interpolation
// (--rotary-seq-len-interpolation-factor) and --rope-type. Both frequency changes act on
// RoPE only: Megatron ignores them silently without it; here that is an error, never a flag
// accepted and ignored. They combine as in Megatron (ops/rope_math.h).
#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_rope(const Args& a) {
  const bool rope = a.position_embedding_type == "rope";
  // Megatron asserts nothing of the scaling factor; it divides by it.
  if (a.use_rope_scaling) {
    MCPP_CHECK_HINT(rope,
                    "add --position-embedding-type rope (Llama 3.x), or drop --use-rope-scaling",
                    "--use-rope-scaling rescales RoPE's frequencies, but "
                    "--position-embedding-type is {}",
                    a.position_embedding_type);
    MCPP_CHECK_HINT(a.rope_scaling_factor > 0,
                    "give --rope-scaling-factor > 0 (Llama 3.1 and 3.3 use 8, Llama 3.2 32)",
                    "--rope-scaling-factor {} is not positive",
                    python_float(a.rope_scaling_factor));
  }
  // Megatron's RotaryEmbedding multiplies the positions by 1 / factor and asserts nothing; a
  // factor of 0 would put every token at one position, a negative one reverse them.
  if (const auto& f = a.rotary_seq_len_interpolation_factor) {
    MCPP_CHECK_HINT(rope,
                    "add --position-embedding-type rope, or drop "
                    "--rotary-seq-len-interpolation-factor",
                    "--rotary-seq-len-interpolation-factor divides RoPE's positions, but "
                    "--position-embedding-type is {}",
                    a.position_embedding_type);
    MCPP_CHECK_HINT(*f > 0,
                    "give --rotary-seq-len-interpolation-factor N >= 1: position p then rotates "
                    "as p / N did (N = 4 stretches a model trained at 4K tokens to 16K); 1 or "
                    "no flag is plain RoPE",
                    "--rotary-seq-len-interpolation-factor {} must be a positive integer",
                    a.given.count("rotary_seq_len_interpolation_factor")
                        ? a.given.at("rotary_seq_len_interpolation_factor")
                        : python_float(*f));
  }
  // --rotary-interleaved rotates the pairs (2i, 2i + 1) of standard attention's RoPE; Megatron
  // ignores it without RoPE, and multi-latent attention's RoPE is its own (de-interleaved
  // by definition; Megatron's YaRN asserts against the flag).
  if (a.rotary_interleaved) {
    MCPP_CHECK_HINT(rope, "add --position-embedding-type rope, or drop --rotary-interleaved",
                    "--rotary-interleaved changes RoPE's pairs, but --position-embedding-type "
                    "is {}",
                    a.position_embedding_type);
    MCPP_CHECK_HINT(!a.multi_latent_attention, "drop --rotary-interleaved",
                    "--rotary-interleaved with --multi-latent-attention: MLA's RoPE takes its "
                    "own (de-interleaved) pairs, and Megatron-LM's YaRN refuses the flag");
  }
  // Megatron's --rope-type picks the RoPE of multi-latent attention (rope or yarn, yarn when
  // not given); for standard attention it asserts rope_type == "rope".
  if (a.rope_type && !a.multi_latent_attention) {
    MCPP_CHECK_HINT(*a.rope_type == "rope",
                    "drop --rope-type, or add --multi-latent-attention (YaRN is MLA's RoPE)",
                    "--rope-type {}: Megatron-LM's standard attention takes only --rope-type "
                    "rope; YaRN belongs to multi-latent attention (--multi-latent-attention)",
                    *a.rope_type);
  }
}

}  // namespace mcpp::training
