// Hugging Face exchange of gpt-oss models (GptOssForCausalLM), called from hf.cpp and
// hf_config.cpp, which keep the attention, norm and embedding mapping it shares with Llama
// (q/k/v/o_proj with biases, as --add-bias-linear). docs/checkpoint.md has the table.
//
// What gpt-oss adds, and its megatron.cpp form:
//  * self_attn.sinks [NH]: a learnable logit per head in the softmax (--softmax-type
//    learnable; self_attention.core_attention.softmax_offset).
//  * A MoE MLP on every layer: mlp.router.weight [E, H] and .bias [E] (mlp.router.weight /
//    .bias under --add-bias-linear); logits -> top-k -> softmax over the k, which is
//    Megatron's default router (post-softmax top-k).
//  * Experts in one tensor each, gate and up interleaved by column:
//      mlp.experts.gate_up_proj [E, H, 2F]: column 2i = gate unit i, 2i + 1 = up unit i
//        <-> linear_fc1.weight{e} [2F, H] = [gate; up], transposed
//      mlp.experts.gate_up_proj_bias [E, 2F] (the same interleave) <-> linear_fc1.bias{e}
//      mlp.experts.down_proj [E, F, H] <-> linear_fc2.weight{e} [H, F], transposed
//      mlp.experts.down_proj_bias [E, H] <-> linear_fc2.bias{e} (times the routing weight,
//        as the experts' output)
//  * The clamped GLU: (up + 1) * gate * sigmoid(1.702 gate) with gate <= limit and
//    |up| <= limit: --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value limit
//    (config.json's swiglu_limit).
//  * layer_types of sliding_attention / full_attention with sliding_window (--window-size,
//    a window pattern), YaRN RoPE (rope_parameters / rope_scaling, hf_rope.h).
// The Hub's released checkpoints hold the experts MXFP4-quantised (*_blocks, *_scales): they
// are dequantised on import (exactly, to f32; split_experts), as transformers does on load.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::hf_gpt_oss {

// config.json's model_type "gpt_oss".
bool is_gpt_oss_type(const std::string& type);
// Whether c is a gpt-oss model (quick-GEGLU experts, learnable sinks): the one test that
// sends a model to this architecture; check_exportable then names what does not fit.
bool looks_like_gpt_oss(const model::TransformerConfig& c);
// An error naming the first setting of c that GptOssForCausalLM cannot express.
void check_exportable(const model::TransformerConfig& c);
// gpt-oss's fields of a config.json into c, whose Llama-like and MoE parts are read.
void config_from_hf(const nlohmann::json& j, model::TransformerConfig& c);
// Turns the Llama config.json of c's attention part into gpt-oss's.
void config_to_hf(const model::TransformerConfig& c, nlohmann::json& j);

// One HF tensor of a layer: rows `rows` (empty: all, in order) of the Megatron parameter,
// transposed or not. The experts' are per expert, named "<fused name>.<e>": to_hf_tensors
// stacks them (fuse_experts), from_hf_tensors splits the file's first (split_experts).
struct Entry {
  std::string mname, hname;
  std::vector<int64_t> rows;
  bool transpose = false;
};
std::vector<Entry> layer_entries(const model::TransformerConfig& c, int layer);

// The per-expert "<name>.<e>" tensors of `t` stacked into "<name>" [E, ...] (moved).
void fuse_experts(const model::TransformerConfig& c, std::map<std::string, Tensor>& t);
// The inverse: a folder's [E, ...] expert tensors (dequantised first where MXFP4) as
// per-expert ones (shapes checked).
std::map<std::string, Tensor> split_experts(const model::TransformerConfig& c,
                                            const std::map<std::string, Tensor>& in);

}  // namespace mcpp::checkpoint::hf_gpt_oss
