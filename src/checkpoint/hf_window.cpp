// Hugging Face sliding-window fields (hf_window.h).
#include "checkpoint/hf_window.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "base/log.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

void window_from_hf(const json& j, const std::string& type, model::TransformerConfig& c) {
  const int64_t layers = c.num_layers, max_pos = c.max_position_embeddings;
  const bool every = type == "mistral" || type == "mixtral";
  // gpt-oss: layer_types alone says which layers slide (no use_sliding_window field).
  const bool by_types = type == "gpt_oss";
  const json use = j.value("use_sliding_window", json(by_types));
  MCPP_CHECK_HINT(every || use.is_boolean(), "check config.json",
                  "Hugging Face config.json ({}): use_sliding_window {} is not true or false", type,
                  use.dump());
  const json absent = type == "mixtral" ? json() : json(4096);
  const json w = j.contains("sliding_window") ? j["sliding_window"] : absent;
  std::vector<int64_t> pattern(size_t(layers), every ? 1 : 0);
  if (!every) {
    const json types = j.value("layer_types", json());
    if (!types.is_null()) {
      MCPP_CHECK_HINT(types.is_array() && int64_t(types.size()) == layers, "check config.json",
                      "Hugging Face config.json ({}): layer_types {} is not a list of {} layer "
                      "types",
                      type, types.dump(), layers);
      for (size_t l = 0; l < types.size(); ++l) {
        const json& t = types[l];
        MCPP_CHECK_HINT(t == "full_attention" || t == "sliding_attention",
                        "megatron.cpp's layers are full or sliding-window (causal) attention",
                        "Hugging Face config.json ({}): layer_types holds {}", type, t.dump());
        pattern[l] = t == "sliding_attention" ? 1 : 0;
      }
    } else if (type == "qwen3_moe") {
      std::fill(pattern.begin(), pattern.end(), 1);
    } else if (by_types) {  // GptOssConfig's default: sliding, full, sliding, ...
      for (int64_t l = 0; l < layers; ++l) pattern[size_t(l)] = l % 2 == 0 ? 1 : 0;
    } else {
      const json first = j.value("max_window_layers", json(28));
      MCPP_CHECK_HINT(first.is_number_integer() && first.get<int64_t>() >= 0, "check config.json",
                      "Hugging Face config.json ({}): max_window_layers {} is not an integer >= 0",
                      type, first.dump());
      for (int64_t l = first.get<int64_t>(); l < layers; ++l) pattern[size_t(l)] = 1;
    }
    if (!use.get<bool>()) std::fill(pattern.begin(), pattern.end(), 0);
  }
  c.window_left = -1, c.window_pattern.clear();
  if (w.is_null() || std::count(pattern.begin(), pattern.end(), 1) == 0) return;
  MCPP_CHECK_HINT(w.is_number_integer() && w.get<int64_t>() >= 1, "check config.json",
                  "Hugging Face config.json ({}): sliding_window {} is not a positive integer",
                  type, w.dump());
  if (w.get<int64_t>() >= max_pos) return;  // never applies within the model's positions
  c.window_left = w.get<int64_t>() - 1, c.window_pattern = pattern;
}

void window_to_hf(const model::TransformerConfig& c, const std::string& type, json& j) {
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen3_moe";
  if (!c.has_window_layers()) {
    j["sliding_window"] = nullptr;  // full attention in every layer
    if (qwen) j["use_sliding_window"] = false;
    if (type == "qwen2" || type == "qwen3") j["max_window_layers"] = c.num_layers;
    return;
  }
  int64_t n = 0, first = c.num_layers;  // window layers; the first of them
  bool suffix = true;                   // the window layers are the last ones
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool win = c.is_window_layer(l);
    n += win ? 1 : 0;
    if (win) first = std::min(first, l);
    if (!win && first < l) suffix = false;
  }
  MCPP_CHECK_HINT(type == "qwen2" || type == "qwen3" || n == c.num_layers,
                  "give every layer the window (drop --window-attn-skip-freq), or keep the "
                  "checkpoint in megatron.cpp's format",
                  "Hugging Face model_type '{}' slides in every layer; this model has {} window "
                  "layers of {} (--window-attn-skip-freq)",
                  type, n, c.num_layers);
  MCPP_CHECK_HINT(type == "mistral" || type == "mixtral" || qwen,
                  "keep the checkpoint in megatron.cpp's format",
                  "Hugging Face model_type '{}' has no sliding-window attention (--window-size)",
                  type);
  j["sliding_window"] = c.window_left + 1;  // HF: i - j < sliding_window
  if (!qwen) return;
  j["use_sliding_window"] = true;
  if (type == "qwen3_moe") return;
  json types = json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    types.push_back(c.is_window_layer(l) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["max_window_layers"] = first;  // what readers without layer_types go by
  if (!suffix)
    log::warn(
        "Hugging Face export ({}): the window layers are not the last ones, which "
        "max_window_layers cannot say; layer_types says it (transformers versions that "
        "do not read layer_types would slide in layers >= {})",
        type, first);
}

}  // namespace mcpp::checkpoint
