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
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"

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
  // tp: the tensor-parallel group (cfg.tp_size ranks, this one cfg.tp_rank); null for
  // tp_size 1. Communication happens only through parallel/'s region transitions.
  explicit GPTModel(const TransformerConfig& cfg, comm::Communicator* tp = nullptr);
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

  // Called during backward() when gradients are final for this micro-batch: with l after
  // transformer layer l's backward (its parameters, registry `layer` == l), and with -1 at
  // the end (every parameter with layer -1). The data-parallel reducer starts a bucket's
  // reduction from here (--overlap-grad-reduce). Empty: no calls.
  void set_grad_ready_hook(std::function<void(int layer)> hook) { grad_ready_ = std::move(hook); }

  // Megatron's finalize_model_grads, TP part: with sequence parallelism, the gradients of
  // parameters duplicated across TP that act on sequence shards (norm weights and biases,
  // learned position embeddings) are partial sums: all-reduce them over TP. Call once per
  // step, after the last backward(). No-op without SP.
  void finalize_tp_grads();
  // Whether parameter i's gradient is duplicated across TP ranks (count it once in norms).
  bool tp_duplicated(size_t i) const;
  // Whether parameter i's gradient is a partial sum over TP that finalize_tp_grads reduces.
  bool sp_partial_grad(size_t i) const;

  // Logits [S, B, Vp] of the last forward() (valid until backward()).
  const Tensor& logits() const;
  // Per-token losses [S, B] of the last forward().
  const Tensor& token_losses() const;

 private:
  struct Layer;
  struct Saved;
  void register_params();

  // Region transitions around the parallel linears (identity at tp_size 1).
  void column_input(const Tensor& x, Tensor& x_full, Stream& st);
  void column_input_backward(Tensor& dx_full, Tensor& dx, Stream& st);
  void row_output(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y_full, Tensor& y,
                  Stream& st);
  void row_output_backward(const Tensor& dy, Tensor& dy_full, const Tensor& x, const Tensor& w,
                           Tensor& dx, Tensor& dw, Tensor& db, Stream& st);
  void tp_all_reduce(Tensor& t, comm::ReduceOp op, Stream& st);

  TransformerConfig cfg_;
  comm::Communicator* tp_ = nullptr;
  std::function<void(int)> grad_ready_;
  ParamStore params_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<Saved> saved_;
};

// Megatron-Core parameter name of layer i's parameter, e.g.
// layer_param_name(3, "self_attention.linear_qkv.weight").
std::string layer_param_name(int layer, const std::string& suffix);

}  // namespace mcpp::model
