// Model FLOPs per iteration, as Megatron's num_floating_point_operations()
// (megatron/training/training.py; megatron.md §5.1), so "throughput per GPU (TFLOP/s/GPU)"
// is comparable with Megatron-LM runs.
//
// Covered: dense GPT/Llama layers with MHA, GQA or multi-latent attention, GeLU or SwiGLU MLP, causal attention
// (the s² term halved), logits over the padded vocabulary, MoE layers (k routed experts and
// the shared experts, Megatron's formula; the router's GEMM is left out as there). Omitted, because megatron.cpp
// does not implement them yet (their flags are rejected by parse_args):
// multi-token prediction, attention output gate, linear-attention / hybrid (Mamba) layers,
// packed (THD) sequences.
#pragma once
#include <cstdint>

#include "training/arguments.h"

namespace mcpp::training {

// Shape numbers the formula reads; from_args fills them from validated Args.
struct FlopsShape {
  int64_t num_layers = 0;           // L
  int64_t hidden_size = 0;          // h
  int64_t ffn_hidden_size = 0;      // F
  int64_t num_attention_heads = 0;  // nh
  int64_t num_query_groups = 0;     // ng (= nh without GQA)
  int64_t kv_channels = 0;          // head dim
  int64_t seq_length = 0;           // s
  int64_t padded_vocab_size = 0;    // V (padded)
  bool swiglu = false;
  // ---- mixture of experts (Megatron's terms): MoE layers run k routed experts of width
  // moe_ffn plus the shared experts' width instead of the dense MLP.
  int64_t num_moe_layers = 0, moe_ffn_hidden_size = 0, moe_topk = 0, shared_ffn_hidden_size = 0;
  // ---- multi-latent attention (Megatron's MLA terms); mla false: MHA / GQA.
  bool mla = false;
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_emb_head_dim = 0;
  int64_t v_head_dim = 0;
  // ---- multi-token prediction (Megatron's terms): D more layers (MoE when the last one is),
  // their norms and eh_proj, and D more logits GEMMs.
  int64_t mtp_num_layers = 0;
  bool last_layer_moe = false;
  static FlopsShape from_args(const Args& args);  // needs args.padded_vocab_size set
};

// FLOPs of one iteration over `batch_size` sequences (Megatron passes the global batch).
double num_floating_point_operations(const FlopsShape& shape, int64_t batch_size);
double num_floating_point_operations(const Args& args, int64_t batch_size);

// Megatron's reported value: flops / (seconds per iteration · 1e12 · world size).
double throughput_tflops_per_gpu(double flops_per_iteration, double seconds_per_iteration,
                                 int64_t world_size);

}  // namespace mcpp::training
