// A pipeline stage's modules (PipelinePart): the embedding on the first stage, one
// TransformerBlock per model chunk, the LM head on the last stage; the parameters they
// register, in the order of the flat buffers and checkpoints, and the lists of what one
// micro-batch saves (per chunk) and of the shared workspace. GPTModel runs a Stage built
// over its ParamStore; memory_estimate sums a shape-only one.
#pragma once
#include <memory>
#include <vector>

#include "model/embedding.h"
#include "model/lm_head.h"
#include "model/mtp.h"
#include "model/transformer_block.h"

namespace mcpp::model {

namespace moe {
class MoeLayer;
}  // namespace moe

// The part with its chunks filled in (empty: one chunk of every layer), checked.
PipelinePart normalized_part(const TransformerConfig& c, PipelinePart part);

// One micro-batch's saved activations of one model chunk.
struct StageSaved {
  Embedding::Saved emb;  // chunk 0 of the first stage
  BlockSaved block;
  LmHead::Saved head;  // the last chunk of the last stage
  std::vector<MtpLayer::Saved> mtp;  // with the head: one per MTP depth
};

class Stage {
 public:
  // The part's parameters in registry order: embedding, each chunk's layers, head, the
  // MTP depths.
  static std::vector<ParamInfo> parameters(const TransformerConfig& c, const PipelinePart& part);
  // The part's persistent buffers (MoE routers' expert bias), in layer order.
  static std::vector<BufferInfo> buffers(const TransformerConfig& c, const PipelinePart& part);
  // part: normalized; store null: shape only.
  Stage(const TransformerConfig& c, const PipelinePart& part, const ParamStore* store);

  int num_chunks() const { return int(blocks_.size()); }
  bool has_embedding(int chunk) const { return part_.first_stage && chunk == 0; }
  bool has_head(int chunk) const { return part_.last_stage && chunk == num_chunks() - 1; }
  Embedding& embedding() { return embedding_; }
  LmHead& head() { return head_; }
  TransformerBlock& block(int chunk) { return blocks_[size_t(chunk)]; }
  std::vector<MtpLayer>& mtp() { return mtp_; }  // the last stage's MTP depths (mtp.h)
  // Every MoE layer of the stage: the chunks' in order, then the MTP depths'.
  std::vector<moe::MoeLayer*> moe_layers();

  // copy_batch: the batch arrives off the model's device (see Embedding, LmHead).
  void saved_specs(int chunk, const Dims& d, bool copy_batch, StageSaved& s,
                   const TensorVisitor& v) const;
  void scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) const;

 private:
  const TransformerConfig* cfg_;
  PipelinePart part_;
  Embedding embedding_;
  LmHead head_;
  std::vector<TransformerBlock> blocks_;
  std::vector<MtpLayer> mtp_;
};

}  // namespace mcpp::model
