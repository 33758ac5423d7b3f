// Sliding-window attention's flags (docs/model.md): --window-size and
// --window-attn-skip-freq, read as Megatron reads them (tuple_type, moe_freq_type and
// megatron/core/transformer/utils.py's is_layer_window_attention).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcpp::training {

struct Args;

// --window-size "L,R" or "(L,R)": two integers. Throws mcpp::Error naming the flag.
struct WindowSize {
  int64_t left = -1, right = 0;
};
WindowSize parse_window_size(const std::string& spec);

// Megatron's is_layer_window_attention: no window -> false; no frequency -> every layer;
// an integer N -> layer_number % N != 0; a list -> its entry layer_number - 1 is non-zero.
// layer_number is 1-based and global (pipeline stages and virtual stages offset it).
// The frequency is --window-attn-skip-freq's text (checked: N >= 1, one entry per layer).
bool is_layer_window_attention(const std::optional<WindowSize>& window,
                               const std::optional<std::string>& skip_freq, int64_t layer_number,
                               int64_t num_layers);

// The per-layer pattern (1: a window layer), one entry per layer, for the two flags.
std::vector<int64_t> window_layer_pattern(const std::optional<WindowSize>& window,
                                          const std::optional<std::string>& skip_freq,
                                          int64_t num_layers);

// Checks the two flags and sets a.window_left (-1: no window) and a.window_layer_pattern.
// R other than 0 is a warning (the causal mask makes the window (L, 0), as TransformerEngine
// does); L below -1, a malformed value, a frequency list of the wrong length, and what is not
// implemented with a window (multi-token prediction) are errors.
void validate_window(Args& a);

}  // namespace mcpp::training
