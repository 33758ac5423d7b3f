// Hugging Face exchange: a TP=1 ParamStore <-> a Hugging Face model folder
// (model.safetensors + config.json) in the GPT2LMHeadModel layout or Llama's, which
// LlamaForCausalLM, MistralForCausalLM (no sliding window), Qwen2ForCausalLM (+ q/k/v biases:
// --add-qkv-bias) and Qwen3ForCausalLM (+ per-head q/k RMSNorm: --qk-layernorm) share; for
// mixture-of-experts models MixtralForCausalLM or Qwen3MoeForCausalLM (hf_moe.h), and
// GptOssForCausalLM (hf_gpt_oss.h).
//
// Layout conversions (docs/checkpoint.md has the full table):
//  * GPT-2 uses Conv1D, whose weights are stored [in, out]: every linear is transposed.
//    Its c_attn rows are [q; k; v], each head-major, whereas Megatron's linear_qkv groups the
//    rows per query group [q_g0 .. q_g(r-1), k_g, v_g] per group: rows are permuted.
//  * Llama's q_proj / k_proj / v_proj are the same three row sets of the grouped QKV, kept
//    [out, in]; gate_proj / up_proj are the halves of SwiGLU's linear_fc1 [gate; up].
//    Qwen2's q/k/v_proj biases are the same row sets of linear_qkv.bias; Qwen3's
//    self_attn.q_norm / k_norm [HD] are self_attention.q_layernorm / k_layernorm.
//  * RoPE: HF Llama rotates with rotate_half (dims i and i + HD/2 form a pair, inv_freq =
//    theta^(-2i/HD)), exactly Megatron's default non-interleaved RoPE, which is ours
//    (src/ops/cpu/rope.cpp). So q/k rows need no permutation. The permutation seen in HF's
//    convert_llama_weights_to_hf.py converts Meta's original *interleaved* checkpoints (pairs
//    2i, 2i+1) to rotate_half; it does not apply between Megatron-Core and HF. Llama 3.x's
//    RoPE scaling (rope_type "llama3") maps to --use-rope-scaling; config.json's RoPE
//    fields both ways: hf_rope.h.
//  * Vocabulary: all padded_vocab_size rows (Vp) are exported and config.json's vocab_size is
//    Vp, so HF's logits equal ours (Megatron's softmax includes the padding rows too) and the
//    embedding shape matches vocab_size; a tokenizer with fewer tokens simply never emits the
//    padding ids. On import, HF rows are copied and any extra padded rows are zero.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/params.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint {

enum class HfArch { Gpt2, Llama, Mixtral, Qwen3Moe, Qwen2, Qwen3, Mistral, GptOss };
// "GPT2LMHeadModel", "LlamaForCausalLM", ..., "MistralForCausalLM"
const char* hf_arch_name(HfArch a);
// "gpt2", "llama", "mixtral", "qwen3_moe", "qwen2", "qwen3", "mistral" (config.json's model_type)
const char* hf_model_type(HfArch a);
// The HF architecture a model maps to; an mcpp::Error naming the feature when it fits none
// (e.g. GPT-2 needs LayerNorm, GELU, biases, learned positions, tied embeddings, no GQA).
// Llama-style models: Qwen3 with --qk-layernorm, Qwen2 with --add-qkv-bias alone, else Llama.
HfArch hf_arch_of(const model::TransformerConfig& c);
// The architecture to export as: hf_arch_of(c) for an empty model_type, or the model_type
// asked for where it computes the same function ("mistral" for a Llama without biases); an
// mcpp::Error naming the types that fit otherwise.
HfArch hf_export_arch(const model::TransformerConfig& c, const std::string& model_type);

// config.json for the model (vocab_size = padded vocab, torch_dtype of `dtype`) as
// hf_export_arch(c, model_type).
nlohmann::json hf_config(const model::TransformerConfig& c, DType dtype = DType::F32,
                         const std::string& model_type = "");
// A TransformerConfig from an HF config.json (any model_type above); the vocabulary is padded
// to a multiple of make_vocab_size_divisible_by (pass 1 to keep vocab_size as it is). A field
// that changes the function and has no megatron.cpp equivalent (a sliding window shorter than
// max_position_embeddings, RoPE scaling, Qwen3's attention_bias, ...) is an error naming it.
model::TransformerConfig model_config_from_hf(const nlohmann::json& config,
                                              int64_t make_vocab_size_divisible_by = 128);

// HF-named tensors of a TP=1 ParamStore, converted to dtype (F32, F64, BF16 or F16).
std::map<std::string, Tensor> to_hf_tensors(const model::TransformerConfig& c,
                                            const model::ParamStore& params,
                                            DType dtype = DType::F32);
// The inverse: fills every parameter of a TP=1 ParamStore; errors on missing, misshapen or
// unknown tensors (HF's non-parameter buffers such as attn.bias or rotary inv_freq are skipped).
void from_hf_tensors(const model::TransformerConfig& c,
                     const std::map<std::string, Tensor>& tensors, model::ParamStore& params);

// Writes out_dir/model.safetensors and out_dir/config.json (each written atomically).
// model_type: as hf_config's.
void export_hf(const std::string& out_dir, const model::TransformerConfig& c,
               const model::ParamStore& params, DType dtype = DType::F32,
               const std::string& model_type = "");
// Reads config.json's tensors from hf_dir (model.safetensors, or the shards listed in
// model.safetensors.index.json) into params (TP=1, built from model_config_from_hf or flags).
void import_hf(const std::string& hf_dir, const model::TransformerConfig& c,
               model::ParamStore& params);
nlohmann::json read_hf_config(const std::string& hf_dir);
// The safetensors files of hf_dir (model.safetensors, or the index's weight_map files, each
// checked to lie inside the folder).
std::vector<std::string> hf_weight_files(const std::string& hf_dir);
// Before a model of config c is allocated: its parameters must fit in the weight files (a
// config.json with n_layer 2^30 is an error, not an allocation of terabytes).
void check_hf_fits_files(const std::string& hf_dir, const model::TransformerConfig& c);

}  // namespace mcpp::checkpoint
