// Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionBlock, its GPT
// path): D MTP layers after the decoder, on the last stage. Depth k = 1..D predicts, at
// position i, the token k + 1 places ahead, from depth k-1's output h_{k-1} (h_0: the
// decoder's output after its final norm, what the LM head's output layer reads) and the
// embedding of the token k places ahead:
//
//   ids_k = roll(ids, -k)                                the last k positions: id 0
//   e_k   = embedding(ids_k)                             the model's own (with its dropout)
//   x_k   = eh_proj([enorm(e_k) | hnorm(h_{k-1})])        [Tl, 2H] -> [Tl, H]
//   h_k   = final_layernorm_k(layer_k(x_k))               layer_k: a transformer layer built
//                                                         like the decoder's last one
//   L_k   = sum_t mask_k[t] CE(output_layer(h_k)[t], labels_k[t]),
//           labels_k = roll(labels, -k), mask_k = roll(mask, -k) (zeros rolled in)
//
// The output layer is the model's (one weight, its gradient summed). L_k is not added to the
// LM loss: its gradient enters the backward with scale (mtp_loss_scaling_factor / D) / n_k,
// n_k = sum(mask_k), times the loss scale a micro-batch's LM loss gets (Megatron's
// MTPLossAutoScaler). RoPE turns the layer's queries and keys by their own positions, as
// the decoder's (as in Megatron, MTP needs RoPE: no learned position table). The log line
// reports L_k / n_k averaged over micro-batches and DP ranks as Megatron's "mtp_k loss".
//
// Parameters (Megatron's names, depth k is mtp.layers.{k-1}): enorm, hnorm, eh_proj.weight
// [H, 2H], final_layernorm, and the transformer layer's under mtp_model_layer. eh_proj is
// whole on every TP rank (its gradient summed over TP under SP, as a norm's); the layer is
// tensor- (and expert-) parallel as the decoder's. The depths run on the last pipeline
// stage, reading the word embedding there (under PP a copy of the first stage's, LmHead's
// pipeline_duplicate). Under --fp8-format eh_proj and the layer run their GEMMs in FP8
// whatever --first-last-layers-bf16 says (Megatron's one global FP8 context for MTP).
#pragma once
#include <memory>
#include <vector>

#include "model/embedding.h"
#include "model/fp8/fp8_linear.h"
#include "model/lm_head.h"
#include "model/transformer_layer.h"

namespace mcpp::model {

class MtpLayer {
 public:
  // depth: 0-based (Megatron's mtp.layers.<depth>), predicting depth + 2 tokens ahead.
  static void add_params(const TransformerConfig& c, int depth, std::vector<ParamInfo>& params);
  static void add_buffers(const TransformerConfig& c, int depth, std::vector<BufferInfo>& out);
  MtpLayer(const TransformerConfig& c, int depth, const ParamStore* store);

  int depth() const { return depth_; }
  TransformerLayer& layer() { return *layer_; }

  struct Saved {
    MicroBatch mb;     // this depth's tokens, labels and loss mask [B,S] (host, rolled)
    double n = 0;      // sum of mask_k (over the whole sequence under CP)
    Embedding::Saved emb;
    Tensor e;          // [Tl,H] e_k
    Norm::Saved en, hn;
    Tensor cat;        // [Tl,2H] eh_proj's input
    Tensor x;          // [Tl,H] eh_proj's output, the layer's input
    LayerSaved layer;
    Tensor t;          // [Tl,H] the layer's output
    LmHead::Saved head;  // final_layernorm (head.lnf.y = h_k), logits and cross-entropy
  };
  void saved_specs(const Dims& d, bool copy_batch, Saved& s, const TensorVisitor& v) const;
  void scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) const;

  // h_prev [Tl,H]: h_{k-1}; mb: the micro-batch (host tensors). Returns L_k (pending).
  PendingLoss forward(const Tensor& h_prev, const MicroBatch& mb, Saved& s, Workspace& ws,
                      const StepContext& cx, const Embedding& emb) const;
  // scale: d(loss)/d(L_k) for this micro-batch; dh_next: d h_k from depth k+1 (null for the
  // last depth). Writes d h_{k-1} into dh_prev (=); parameter gradients +=.
  void backward(const Tensor& h_prev, double scale, Saved& s, const Tensor* dh_next,
                Tensor& dh_prev, Workspace& ws, const StepContext& cx, Embedding& emb);

 private:
  const TransformerConfig* cfg_;
  int depth_;
  Norm enorm_, hnorm_;
  ParamView eh_proj_;
  Fp8Linear eh_fp8_;  // eh_proj's FP8 GEMMs and state, under the depth's layer id
  std::unique_ptr<TransformerLayer> layer_;
  LmHead head_;
};

// The MTP layers' statistics of a global batch: per depth, the sum over training forwards
// of L_k / max(n_k, 1) (pending until read) and their count.
struct MtpStats {
  std::vector<std::vector<PendingLoss>> losses;  // [D][forwards]
  std::vector<std::vector<double>> tokens;       // [D][forwards] n_k
};

}  // namespace mcpp::model
