// Hugging Face exchange of mixture-of-experts models, called from hf.cpp (which keeps the
// attention, norm and embedding mapping they share with Llama). docs/moe.md, "Hugging Face
// MoE models", has the tables.
//
//  * MixtralForCausalLM: Llama attention + a MoE MLP on every layer, softmax router (fp32)
//    -> top-k -> renormalise, which is Megatron's default router (post-softmax top-k), so
//    the forward matches exactly. Hub layout per layer L and expert e:
//      model.layers.L.block_sparse_moe.gate.weight [E, H]  <-> mlp.router.weight
//      ....experts.e.w1.weight [I, H] (gate), w3 [I, H] (up) <-> linear_fc1.weight{e} rows
//                                         [0, I) and [I, 2I) (SwiGLU's [gate; up])
//      ....experts.e.w2.weight [H, I]      <-> mlp.experts.linear_fc2.weight{e}
//      post_attention_layernorm            <-> pre_mlp_layernorm (as for Llama)
//    transformers 5 holds the experts fused (mlp.gate.weight, mlp.experts.gate_up_proj
//    [E, 2I, H] = per expert [w1; w3], mlp.experts.down_proj [E, H, I]); a folder in that
//    layout is read too. We always write the Hub layout, which both 4.x and 5.x load.
//  * Qwen3MoeForCausalLM: Llama attention with q/k RMSNorm per head (self_attn.q_norm /
//    k_norm <-> self_attention.q_layernorm / k_layernorm, --qk-layernorm), MoE layers
//    (mlp.gate.weight <-> router; mlp.experts.e.gate_proj / up_proj / down_proj <-> as w1 /
//    w3 / w2 above) and dense layers (mlp_only_layers, decoder_sparse_step: Llama's
//    mlp.gate_proj / up_proj / down_proj, of intermediate_size); norm_topk_prob true is the
//    default router, false is --moe-router-pre-softmax (softmax, top-k, no renormalising).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::hf_moe {

// model_type values handled here ("mixtral", "qwen3_moe").
bool is_moe_model_type(const std::string& type);
// The MoE fields (and Qwen3's q/k norms) of a config.json into c, whose Llama-like part is
// already read.
void moe_config_from_hf(const nlohmann::json& j, const std::string& type,
                        model::TransformerConfig& c);
enum class MoeArch { Mixtral, Qwen3Moe };
// Qwen3-MoE with --qk-layernorm, else Mixtral; an error naming the first MoE setting of c
// that the architecture cannot express.
MoeArch moe_arch_of(const model::TransformerConfig& c);
// Turns the Llama config.json of c's attention part into Mixtral's / Qwen3-MoE's.
void to_moe_config(const model::TransformerConfig& c, nlohmann::json& j);

// One HF tensor = rows [row0, row1) of a Megatron parameter (row1 < 0: all rows).
struct RowsEntry {
  std::string mname, hname;
  int64_t row0 = 0, row1 = -1;
};
// The MLP tensors of MoE layer `layer` in the Hub layout.
std::vector<RowsEntry> moe_layer_entries(const model::TransformerConfig& c, int layer);

// `in` with transformers 5's fused expert tensors replaced by the Hub's per-expert ones
// (shapes checked against c; a tensor given in both layouts is an error).
std::map<std::string, Tensor> unfuse_experts(const model::TransformerConfig& c,
                                             const std::map<std::string, Tensor>& in);

}  // namespace mcpp::checkpoint::hf_moe
