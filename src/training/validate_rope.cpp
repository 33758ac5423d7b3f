// Validation of the RoPE flags beyond the base and the rotary share: Llama 3.x scaling
// (--use-rope-scaling, --rope-scaling-factor), linear position interpolation
// (--rotary-seq-len-interpolation-factor), --rope-type and standard attention's YaRN
// (--position-embedding-type yarn). Both frequency changes act on
// RoPE only: Megatron ignores them silently without it; here that is an error, never a flag
// accepted and ignored. They combine as in Megatron (ops/rope_math.h).
#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "base/error.h"
#include "training/arguments.h"
#include "training/layer_freq.h"

namespace mcpp::training {

// YaRN's factor and concentration coefficients, shared by both YaRNs: Megatron divides by the
// factor and takes its logarithm.
void validate_yarn_factor_flags(const Args& a) {
  MCPP_CHECK_HINT(std::isfinite(a.rotary_scaling_factor) && a.rotary_scaling_factor > 0,
                  "give --rotary-scaling-factor > 0, the context's stretch (DeepSeek-V3 uses "
                  "40, Qwen2.5 4; 1 is no scaling)",
                  "--rotary-scaling-factor {} is not positive",
                  python_float(a.rotary_scaling_factor));
  MCPP_CHECK_HINT(std::isfinite(a.mscale) && std::isfinite(a.mscale_all_dim),
                  "give finite --mscale and --mscale-all-dim",
                  "--mscale {} / --mscale-all-dim {} must be finite numbers",
                  python_float(a.mscale), python_float(a.mscale_all_dim));
}

namespace {

// --position-embedding-type yarn: Megatron's YarnRotaryEmbedding on standard attention. Its
// flags without it are errors (Megatron reads them only for it); with it, what Megatron
// ignores or asserts against is refused, and what it would divide by or take a logarithm
// of must be positive.
void validate_yarn(const Args& a) {
  const char* const flags[][2] = {
      {"yarn_original_max_position_embeddings", "--yarn-original-max-position-embeddings"},
      {"yarn_beta_fast", "--yarn-beta-fast"},
      {"yarn_beta_slow", "--yarn-beta-slow"},
      {"yarn_correction_range_round_to_int", "--[no-]yarn-correction-range-round-to-int"}};
  if (a.position_embedding_type != "yarn") {
    for (const auto& f : flags)
      MCPP_CHECK_HINT(!a.was_given(f[0]),
                      fmt::format("add --position-embedding-type yarn, or drop {}", f[1]),
                      "{} configures YaRN, but --position-embedding-type is {}", f[1],
                      a.position_embedding_type);
    return;
  }
  MCPP_CHECK_HINT(!a.multi_latent_attention,
                  "drop --position-embedding-type yarn: multi-latent attention's RoPE is YaRN "
                  "by default (--rope-type yarn)",
                  "--position-embedding-type yarn with --multi-latent-attention");
  MCPP_CHECK_HINT(a.rotary_percent == 1.0, "drop --rotary-percent with yarn",
                  "--rotary-percent {} with --position-embedding-type yarn: YaRN rotates the "
                  "whole head (Megatron's YarnRotaryEmbedding builds its frequencies over "
                  "kv_channels whatever the percentage)",
                  python_float(a.rotary_percent));
  MCPP_CHECK_HINT(a.rotary_base > 1, "give --rotary-base > 1",
                  "--rotary-base {} with yarn: YaRN divides by ln(base)", a.rotary_base);
  validate_yarn_factor_flags(a);
  MCPP_CHECK_HINT(a.yarn_original_max_position_embeddings.value_or(4096) > 0,
                  "give --yarn-original-max-position-embeddings, the context the model was "
                  "trained for (Megatron's default 4096)",
                  "--yarn-original-max-position-embeddings {} is not positive",
                  *a.yarn_original_max_position_embeddings);
  for (const auto& [v, flag] : {std::pair{a.yarn_beta_fast, "--yarn-beta-fast"},
                                std::pair{a.yarn_beta_slow, "--yarn-beta-slow"}})
    MCPP_CHECK_HINT(!v || (std::isfinite(*v) && *v > 0),
                    fmt::format("give {} > 0 (Megatron's defaults: 32 fast, 1 slow)", flag),
                    "{} {} is not positive", flag, python_float(v.value_or(0)));
}

}  // namespace

void validate_rope(const Args& a) {
  validate_yarn(a);
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
                    "drop --rope-type, or add --multi-latent-attention; standard "
                    "attention's YaRN is --position-embedding-type yarn",
                    "--rope-type {}: Megatron-LM's standard attention takes only --rope-type "
                    "rope; --rope-type yarn is multi-latent attention's",
                    *a.rope_type);
  }
}

void validate_no_rope(Args& a) {
  a.no_rope_pattern.clear();
  if (!a.no_rope_freq) return;
  const char* hint =
      "give --no-rope-freq N (every N-th layer without RoPE; N divides --num-layers) or a "
      "list with one entry per layer, 1 for a layer without RoPE, e.g. \"([0]*3+[1])*2\"";
  const LayerFreq f = parse_layer_freq("--no-rope-freq", *a.no_rope_freq, hint);
  if (f.every && *f.every == 0) return;  // Megatron's `if no_rope_freq:`: 0 is off
  const std::string& pos = a.position_embedding_type;
  MCPP_CHECK_HINT(pos == "rope" || pos == "yarn",
                  "add --position-embedding-type rope, or drop --no-rope-freq",
                  "--no-rope-freq takes RoPE off some layers, but --position-embedding-type is "
                  "{}",
                  pos);
  MCPP_CHECK_HINT(!a.multi_latent_attention, "drop --no-rope-freq",
                  "--no-rope-freq with --multi-latent-attention: Megatron's MLA applies its "
                  "RoPE in every layer (its forward does not read the flag)");
  std::vector<int64_t> p(size_t(a.num_layers), 0);
  if (f.every) {
    const int64_t n = *f.every;
    MCPP_CHECK_HINT(n >= 1 && a.num_layers % n == 0, hint,
                    "--no-rope-freq {} should divide --num-layers {}", n, a.num_layers);
    for (int64_t l = 0; l < a.num_layers; ++l) p[size_t(l)] = (l + 1) % n == 0 ? 1 : 0;
  } else {
    MCPP_CHECK_HINT(int64_t(f.list.size()) == a.num_layers, hint,
                    "--no-rope-freq '{}' has {} entries but --num-layers is {}", *a.no_rope_freq,
                    f.list.size(), a.num_layers);
    for (int64_t l = 0; l < a.num_layers; ++l) p[size_t(l)] = f.list[size_t(l)] != 0 ? 1 : 0;
  }
  // MTP depth k's layer has Megatron's layer number k + 1: it follows decoder layer k.
  MCPP_CHECK_HINT(a.mtp_num_layers.value_or(0) <= a.num_layers,
                  "give at most --num-layers multi-token prediction depths with --no-rope-freq",
                  "--mtp-num-layers {} with --no-rope-freq: depth k follows decoder layer k "
                  "(Megatron's layer number k + 1), and there are {} decoder layers",
                  a.mtp_num_layers.value_or(0), a.num_layers);
  a.no_rope_pattern = p;
}

}  // namespace mcpp::training
