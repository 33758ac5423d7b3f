// Hugging Face's sliding-window attention <-> megatron.cpp's (--window-size L,0 and
// --window-attn-skip-freq; model::TransformerConfig::window_left / window_pattern).
// Hugging Face's query i sees key j iff 0 <= i - j < sliding_window, so L = sliding_window - 1.
// Where the classes slide:
//  * Mistral: every layer, by sliding_window (MistralConfig's default 4096 when absent);
//  * Mixtral: every layer, by sliding_window (absent: none);
//  * Qwen2 / Qwen3: only with use_sliding_window, in the layers layer_types calls
//    "sliding_attention" (without layer_types: layers >= max_window_layers, default 28), by
//    sliding_window (default 4096);
//  * Qwen3-MoE: with use_sliding_window, the layers of layer_types (absent: every layer).
// A window at least max_position_embeddings long never applies and is read as none.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace mcpp::checkpoint {

// config.json's window fields into c (whose num_layers and max_position_embeddings are
// read); malformed fields are errors naming them.
void window_from_hf(const nlohmann::json& j, const std::string& type, model::TransformerConfig& c);

// c's window into the config.json `j` of model_type `type` (mistral, mixtral, qwen2, qwen3,
// qwen3_moe): sliding_window null without window layers. A pattern the class cannot
// express (Mistral and Mixtral slide in every layer) is an error.
void window_to_hf(const model::TransformerConfig& c, const std::string& type, nlohmann::json& j);

}  // namespace mcpp::checkpoint
