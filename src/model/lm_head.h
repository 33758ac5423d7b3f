// The language-model head: final norm, column-parallel output layer giving this rank's
// vocabulary slice of the logits (tied: the word embedding), vocab-parallel
// cross-entropy (Megatron's vocab_parallel_cross_entropy, one pass: see forward).
//
//   forward:  logits [T, Vp/TP] = linear(norm(x)); loss[t] = logsumexp - logit[target]
//             returns sum_t mask[t] * loss[t]
//   backward: dlogits = mask * grad_scale * (softmax - onehot(target)) (in place);
//             dx = norm'(linear'(dlogits)) (=)
#pragma once
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/norm.h"

namespace mcpp::model {

// A micro-batch's masked loss sum, still on the device (ops::dot_begin's partial sums):
// value() waits for the forward that computes it. A step queues every micro-batch's
// forward and backward before it reads any of them, so the GPU never waits for the host
// between micro-batches.
struct PendingLoss {
  Tensor partial;          // undefined: no loss here (0)
  Stream* stream = nullptr;
  double value() const;
};

class LmHead {
 public:
  // The final norm, and the output layer (untied), and on a last stage without the
  // embedding the word embedding's copy (pipeline_duplicate) when the output layer is tied
  // to it or MTP layers read it.
  static void add_params(const TransformerConfig& c, bool first_stage,
                         std::vector<ParamInfo>& params);
  LmHead() = default;
  // norm: the final norm's parameter prefix (an MTP depth's final_layernorm shares the
  // output layer).
  LmHead(const TransformerConfig& c, const ParamStore* store,
         const std::string& norm = "decoder.final_layernorm");

  struct Saved {
    Norm::Saved lnf;                     // [Tl,H] final norm
    ColumnParallelLinear::Saved out_in;  // [T,H] gathered (SP)
    Tensor logits;                       // [T,Vp/TP]; overwritten by its gradient in backward
    Tensor labels, mask_bs;              // the batch on the model's device, [B,S]
    Tensor targets, mask_f32;            // [S,B] i64, f32 (sequence-first order)
    Tensor mask;                         // [S,B] stat dtype (mask_f32 itself when f32)
    Tensor row_max, sum_exp, target_logit, losses;  // [T]
  };
  static void saved_specs(const TransformerConfig& c, const Dims& d, bool copy_batch, Saved& s,
                          const TensorVisitor& v);
  static void scratch_specs(const TransformerConfig& c, const Dims& d, Workspace& ws,
                            const TensorVisitor& v);

  // x [Tl,H]; returns the masked loss sum, read when the caller asks (PendingLoss).
  PendingLoss forward(const Tensor& x, const MicroBatch& mb, Saved& s, Workspace& ws,
                      const StepContext& cx) const;
  // Generation: this rank's logits [rows, Vp/TP] of x [rows, H] into s.logits (no loss).
  void logits_forward(const Tensor& x, Saved& s, const StepContext& cx) const;
  // d loss / d token_loss = mask * grad_scale; the workspace's dx = d(x) out. d_norm_out:
  // a gradient of the final norm's output from elsewhere (the MTP layers read it), added.
  void backward(const Tensor& x, double grad_scale, Saved& s, Workspace& ws,
                const StepContext& cx, const Tensor* d_norm_out = nullptr);

 private:
  // --use-mup: logits times the output multiplier (Megatron's _scale_logits), in place.
  void scale_logits(Tensor& logits, const StepContext& cx) const;
  const TransformerConfig* cfg_ = nullptr;
  Norm norm_;
  ColumnParallelLinear output_;
};

}  // namespace mcpp::model
