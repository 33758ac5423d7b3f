// The embedding (Megatron-Core's LanguageModelEmbedding with a VocabParallelEmbedding):
// vocab-parallel word lookup (rows outside this rank's vocabulary slice give zero),
// summed over TP (SP: reduce-scattered to the sequence shard), plus learned absolute
// positions (GPT; RoPE models have none), then embedding dropout.
//
//   forward:  h0 = dropout(reduce(word[tokens]) + pos[s0 + s])        [Sl,B,H]
//   backward: demb = dropout'(dh0); dpos += demb (by position);
//             dword += gather(demb) scattered by token id (this rank's slice)
#pragma once
#include <vector>

#include "model/module.h"
#include "model/params.h"

namespace mcpp::model {

class Embedding {
 public:
  // The word table [Vp, H] split by vocabulary rows; the position table (GPT) duplicated
  // over TP and acting on the sequence shard under SP.
  static void add_params(const TransformerConfig& c, std::vector<ParamInfo>& params);
  Embedding() = default;
  Embedding(const TransformerConfig& c, const ParamStore* store);

  struct Saved {
    Tensor tokens;    // [B,S] i64 on the model's device (when the batch is not there)
    Tensor emb;       // [Sl,B,H] the embedding before dropout
    Tensor emb_full;  // [S,B,H] partial word embeddings before the reduce-scatter (SP)
  };
  // copy_batch: the batch arrives on another device (the host) and is copied over.
  static void saved_specs(const Dims& d, bool copy_batch, Saved& s, const TensorVisitor& v);
  static void scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v);

  // tokens [B,S] i64 -> h0 [Tl,H]. dropout_layer: the layer id of the dropout stream (-1:
  // the embedding's own, num_layers; an MTP depth passes its layer's).
  void forward(const Tensor& tokens, Saved& s, Tensor& h0, const StepContext& cx,
               int64_t dropout_layer = -1) const;
  // The workspace's dx = d(h0) in; word (and position) gradients +=.
  void backward(const Tensor& tokens, Saved& s, Workspace& ws, const StepContext& cx,
                int64_t dropout_layer = -1);

 private:
  const TransformerConfig* cfg_ = nullptr;
  ParamView word_, pos_;
};

}  // namespace mcpp::model
