// Mixture-of-experts flags (docs/moe.md): Megatron's checks of the MoE arguments
// (megatron/training/arguments.py and TransformerConfig.__post_init__), and what
// megatron.cpp does not implement yet, each an error naming the flag with a HINT.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mcpp::training {

struct Args;

// Checks the MoE flags and fills the derived values (moe_ffn_hidden_size,
// expert_tensor_parallel_size, moe_layer_pattern, moe_aux_loss_coeff_values). A dense model
// (no --num-experts) must not give MoE-only flags a non-default value.
void validate_moe(Args& a);

// --moe-layer-freq: an integer N (layer i is a MoE layer iff i % N == 0) or a Python list
// expression of 0/1 entries built from [..], +, * and integers, e.g. "([0]+[1]*23)", with
// one entry per layer. Throws mcpp::Error naming the flag.
std::vector<int64_t> parse_moe_layer_freq(const std::string& spec, int64_t num_layers);

}  // namespace mcpp::training
