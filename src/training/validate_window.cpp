// Sliding-window attention's flags (validate_window.h). A window layer's query at global
// position q sees the keys k with q - L <= k <= q (and, with --reset-attention-mask, k in
// q's document): model::TransformerConfig::window_left and window_pattern carry it.
#include "training/validate_window.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"
#include "training/layer_freq.h"

namespace mcpp::training {

namespace {
constexpr const char* kWindowSizeHint =
    "give --window-size L,R (or \"(L,R)\"): two integers, L the keys before the query it "
    "sees (-1: unbounded), R 0 (attention is causal)";
constexpr const char* kWindowFreqHint =
    "give --window-attn-skip-freq N (every N-th layer full attention, the others windowed) or "
    "a list with one entry per layer, 1 for a window layer, e.g. \"[1,1,1,0]*3\" for 12 layers";
}  // namespace

WindowSize parse_window_size(const std::string& spec) {
  // Megatron's tuple_type: strip '(' and ')' from both ends, split at ',', int() each part
  // (which allows surrounding spaces and a sign).
  size_t a = 0, b = spec.size();
  while (a < b && (spec[a] == '(' || spec[a] == ')')) ++a;
  while (b > a && (spec[b - 1] == '(' || spec[b - 1] == ')')) --b;
  std::vector<int64_t> v;
  size_t start = a;
  for (size_t i = a; i <= b; ++i) {
    if (i < b && spec[i] != ',') continue;
    std::string t = spec.substr(start, i - start);
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(0, 1);
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    size_t d = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? 1 : 0;
    bool ok = t.size() > d && t.size() - d <= 12;
    for (size_t k = d; ok && k < t.size(); ++k)
      ok = std::isdigit(static_cast<unsigned char>(t[k])) != 0;
    MCPP_CHECK_HINT(ok, kWindowSizeHint, "--window-size '{}': '{}' is not an integer", spec, t);
    v.push_back(std::stoll(t));
    start = i + 1;
  }
  MCPP_CHECK_HINT(v.size() == 2, kWindowSizeHint,
                  "--window-size '{}' has {} values, expected 2 (L,R)", spec, v.size());
  MCPP_CHECK_HINT(v[0] >= -1, kWindowSizeHint,
                  "--window-size '{}': L = {} must be -1 (unbounded) or >= 0", spec, v[0]);
  return {v[0], v[1]};
}

std::vector<int64_t> window_layer_pattern(const std::optional<WindowSize>& window,
                                          const std::optional<std::string>& skip_freq,
                                          int64_t num_layers) {
  std::vector<int64_t> pattern(size_t(std::max<int64_t>(num_layers, 0)), 0);
  if (!window) return pattern;
  if (!skip_freq) {
    std::fill(pattern.begin(), pattern.end(), 1);
    return pattern;
  }
  const LayerFreq f = parse_layer_freq("--window-attn-skip-freq", *skip_freq, kWindowFreqHint);
  if (f.every) {
    const int64_t n = *f.every;
    MCPP_CHECK_HINT(n >= 1, kWindowFreqHint, "--window-attn-skip-freq {} must be positive", n);
    for (int64_t l = 0; l < num_layers; ++l) pattern[size_t(l)] = (l + 1) % n != 0 ? 1 : 0;
    return pattern;
  }
  MCPP_CHECK_HINT(int64_t(f.list.size()) == num_layers, kWindowFreqHint,
                  "--window-attn-skip-freq '{}' has {} entries but --num-layers is {}", *skip_freq,
                  f.list.size(), num_layers);
  for (int64_t l = 0; l < num_layers; ++l) pattern[size_t(l)] = f.list[size_t(l)] != 0 ? 1 : 0;
  return pattern;
}

bool is_layer_window_attention(const std::optional<WindowSize>& window,
                               const std::optional<std::string>& skip_freq, int64_t layer_number,
                               int64_t num_layers) {
  MCPP_CHECK(layer_number >= 1 && layer_number <= num_layers,
             "layer number {} outside [1, {}] (1-based)", layer_number, num_layers);
  return window_layer_pattern(window, skip_freq, num_layers)[size_t(layer_number - 1)] == 1;
}

void validate_window(Args& a) {
  a.window_left = -1, a.window_layer_pattern.clear();
  if (!a.window_size) {
    if (a.window_attn_skip_freq)
      log::warn(
          "--window-attn-skip-freq {} without --window-size: no layer has a window "
          "(Megatron ignores it likewise)",
          *a.window_attn_skip_freq);
    return;
  }
  const WindowSize w = parse_window_size(*a.window_size);
  if (w.right != 0)
    log::warn(
        "--window-size ({}, {}): attention is causal, which makes the window ({}, 0) as "
        "TransformerEngine's causal mask does (a query never sees later keys)",
        w.left, w.right, w.left);
  // Checked even where L = -1 leaves every layer full, so a typo fails at once.
  const auto pattern = window_layer_pattern(w, a.window_attn_skip_freq, a.num_layers);
  if (w.left < 0) return;  // -1: an unbounded window is plain causal attention
  bool any = false;
  for (int64_t x : pattern) any = any || x == 1;
  if (!any) return;
  // Multi-token prediction depth k's layer has Megatron's layer number k + 1 (its MTP layer
  // offset is 0 without a pipeline layout), so it slides as decoder layer k; a list
  // --window-attn-skip-freq has no entry past the decoder's layers (Megatron would fail there).
  MCPP_CHECK_HINT(a.mtp_num_layers.value_or(0) <= a.num_layers,
                  "give at most --num-layers multi-token prediction depths with --window-size",
                  "--mtp-num-layers {} with --window-size: depth k slides as decoder layer k "
                  "(Megatron's layer number k + 1), and there are {} decoder layers",
                  a.mtp_num_layers.value_or(0), a.num_layers);
  a.window_left = w.left, a.window_layer_pattern = pattern;
}

}  // namespace mcpp::training
