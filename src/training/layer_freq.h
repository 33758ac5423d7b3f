// Megatron's moe_freq_type flags (--moe-layer-freq, --window-attn-skip-freq): an integer N,
// or a Python list expression that Megatron passes to eval(), built from [..], +, * and
// non-negative integers ("([0]+[1]*3)*2"). Each flag gives the result its own meaning.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mcpp::training {

struct LayerFreq {
  std::optional<int64_t> every;  // the integer form
  std::vector<int64_t> list;     // the list form (every unset)
};

// Parses `spec`; a malformed one throws mcpp::Error naming `flag`, with `hint` as its HINT.
LayerFreq parse_layer_freq(const char* flag, const std::string& spec, const char* hint);

}  // namespace mcpp::training
