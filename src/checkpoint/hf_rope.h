// The RoPE fields of a Hugging Face config.json (Llama, Mixtral, Qwen3-MoE), both ways.
//
// transformers 4.x writes the base as rope_theta and any scaling as rope_scaling
// {"rope_type" (older files: "type"), "factor", ...}; 5.x writes rope_parameters
// {"rope_type", "rope_theta", ...}, either one object or one per layer type
// ({"full_attention": {...}}). megatron.cpp has plain RoPE (rope_type "default"), Llama
// 3.x scaling (rope_type "llama3": factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings; TransformerConfig's rope_scaling fields), linear
// position interpolation (rope_type "linear": factor, transformers' inv_freq / factor, which
// is TransformerConfig::seq_len_interpolation_factor, any positive number) and YaRN
// (rope_type "yarn": TransformerConfig::yarn, read by transformers' rules: factor required;
// original_max_position_embeddings, else max_position_embeddings; beta_fast and beta_slow,
// absent or 0 meaning 32 and 1; truncate, our round_to_int; the attention factor, our
// ops::yarn_concentration, from attention_factor, else from mscale and mscale_all_dim where
// both are non-zero, else from the factor alone). Any other rope type (dynamic, longrope,
// ...) is an error naming the field and the value.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace mcpp::checkpoint::hf_rope {

// c.rotary_base and the RoPE scaling of c from config.json j of model_type `type`; `dflt`
// is the base when no field names one (Llama 1e4, Mixtral 1e6: each class's default).
// Every field that says something must agree with the others. YaRN reads
// c.max_position_embeddings (set before the call), as transformers reads the config's.
void rope_from_hf(const nlohmann::json& j, const std::string& type, double dflt,
                  model::TransformerConfig& c);

// c's RoPE into config.json j: rope_theta always; with scaling, rope_scaling and
// rope_parameters of rope_type "llama3" with the four values; with interpolation, both of
// rope_type "linear" with its factor; with YaRN, both of rope_type "yarn" with factor,
// original_max_position_embeddings, beta_fast, beta_slow, truncate and attention_factor (the
// concentration factor), plus mscale and mscale_all_dim where transformers' own rule gives
// that attention factor from them too; without any, rope_scaling null and, where
// `parameters` asks for it (the MoE classes, written for 5.x as well), rope_parameters of
// rope_type "default". A model with two (Megatron applies Llama 3.x scaling and
// interpolation both) has no config.json: an error naming the two flags.
void rope_to_hf(const model::TransformerConfig& c, bool parameters, nlohmann::json& j);

}  // namespace mcpp::checkpoint::hf_rope
