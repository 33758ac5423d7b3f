// GPTModel: embedding -> L pre-norm transformer layers -> final norm -> output
// layer -> vocab cross-entropy, with an explicit forward and backward per module
// (ARCHITECTURE.md, principle 2). GPT-2 style (learned positions, LayerNorm, GELU,
// biases, tied embeddings) and Llama style (RoPE, RMSNorm, SwiGLU, GQA, untied,
// no biases) are the same code with TransformerConfig switches.
//
// Activations are sequence-first [S, B, H]; the batch arrives as [B, S] ids.
// forward() saves what backward() needs in per-layer buffers that are reused
// from one micro-batch to the next (shapes are static).
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/params.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::model {

// One micro-batch: tokens, labels [B, S] i64; loss_mask [B, S] f32.
struct MicroBatch {
  Tensor tokens, labels, loss_mask;
};

// Keys that make dropout a function of global coordinates: the same masks for
// any split of the global batch into micro-batches and data-parallel ranks.
struct StepKeys {
  int64_t iteration = 0;
  int64_t sample_offset = 0;  // index of this micro-batch's first sample in the global batch
  int64_t global_batch = 0;   // global batch size (0: this micro-batch is the whole batch)
  bool training = true;       // false: no dropout (evaluation, generation)
};

class GPTModel {
 public:
  explicit GPTModel(const TransformerConfig& cfg);
  ~GPTModel();

  const TransformerConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  // Runs the forward pass and the loss; returns the sum over tokens of
  // loss_mask * token_loss (not normalised). Saves activations for backward.
  double forward(const MicroBatch& mb, const StepKeys& keys);
  // Backpropagates d(loss)/d(token_loss[t]) = loss_mask[t] * grad_scale and
  // accumulates (+=) every parameter gradient. Needs the preceding forward().
  void backward(double grad_scale);

  // Logits [S, B, Vp] of the last forward() (valid until backward()).
  const Tensor& logits() const;
  // Per-token losses [S, B] of the last forward().
  const Tensor& token_losses() const;

 private:
  struct Layer;
  struct Saved;
  void register_params();

  TransformerConfig cfg_;
  ParamStore params_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Saved> saved_;
};

// Megatron-Core parameter name of layer i's parameter, e.g.
// layer_param_name(3, "self_attention.linear_qkv.weight").
std::string layer_param_name(int layer, const std::string& suffix);

}  // namespace mcpp::model
