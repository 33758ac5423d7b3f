#include "model/stage.h"

#include <algorithm>
#include <cmath>

#include "model/moe/moe_layer.h"

namespace mcpp::model {

PipelinePart normalized_part(const TransformerConfig& c, PipelinePart part) {
  if (part.chunks.empty()) {
    MCPP_CHECK(part.first_stage && part.last_stage,
               "GPTModel: a pipeline part without layers must be the whole model");
    part.chunks.emplace_back();
    for (int l = 0; l < c.num_layers; ++l) part.chunks[0].push_back(l);
  }
  return part;
}

std::vector<ParamInfo> Stage::parameters(const TransformerConfig& c, const PipelinePart& in) {
  const PipelinePart part = normalized_part(c, in);
  std::vector<ParamInfo> out;
  if (part.first_stage) Embedding::add_params(c, out);
  for (const auto& ch : part.chunks)
    for (int l : ch) TransformerLayer::add_params(c, l, out);
  if (part.last_stage) LmHead::add_params(c, part.first_stage, out);
  if (part.last_stage)
    for (int k = 0; k < int(c.mtp_num_layers); ++k) MtpLayer::add_params(c, k, out);
  // --init-method-xavier-uniform: Megatron's init_method and scaled_init_method both become
  // xavier_uniform_, which every weight drawn from them (embeddings, output layer, router,
  // every linear) then uses. An --embedding-init-method-std other than --init-method-std
  // keeps the embeddings normal with that std (Megatron's embedding_init_method).
  const bool own_embedding_std =
      c.embedding_init_method_std && *c.embedding_init_method_std != c.init_method_std;
  auto embedding = [](const ParamInfo& p) {
    return p.name == "embedding.word_embeddings.weight" ||
           p.name == "embedding.position_embeddings.weight";
  };
  // --use-mup: an untied output layer is drawn as the embeddings are (Megatron's
  // embedding_init_method), and every other weight from init_method or
  // output_layer_init_method has its std divided by sqrt(width_mult); the embeddings keep
  // theirs. Under --init-method-xavier-uniform the two methods are Xavier's, unscaled.
  const bool mup_output = c.mup.on && !c.tie_embeddings;
  auto drawn_as_embedding = [&](const ParamInfo& p) {
    return embedding(p) || (mup_output && p.name == "output_layer.weight");
  };
  if (c.init_method_xavier_uniform)
    for (ParamInfo& p : out)
      if (p.init == Init::Normal && !(own_embedding_std && drawn_as_embedding(p)))
        p.init = Init::XavierUniform;
  if (c.mup.on)
    for (ParamInfo& p : out) {
      if (p.init != Init::Normal) continue;
      if (drawn_as_embedding(p))
        p.init_std = c.embedding_init_std();
      else
        p.init_std /= std::sqrt(c.mup.width_mult);
    }
  return out;
}

std::vector<BufferInfo> Stage::buffers(const TransformerConfig& c, const PipelinePart& in) {
  const PipelinePart part = normalized_part(c, in);
  std::vector<BufferInfo> out;
  for (const auto& ch : part.chunks)
    for (int l : ch) TransformerLayer::add_buffers(c, l, out);
  if (part.last_stage)
    for (int k = 0; k < int(c.mtp_num_layers); ++k) MtpLayer::add_buffers(c, k, out);
  return out;
}

Stage::Stage(const TransformerConfig& c, const PipelinePart& part, const ParamStore* store)
    : cfg_(&c), part_(part) {
  if (part_.first_stage) embedding_ = Embedding(c, store);
  if (part_.last_stage) head_ = LmHead(c, store);
  blocks_.reserve(part_.chunks.size());
  for (const auto& ch : part_.chunks) blocks_.emplace_back(c, ch, store);
  if (part_.last_stage && c.mtp_num_layers > 0) {
    // The depths read the model's word embedding: the first stage's, or on a last stage
    // without it the copy LmHead registers (summed over the embedding group, as Megatron
    // shares it with the MTP stage).
    if (!part_.first_stage) embedding_ = Embedding(c, store);
    for (int k = 0; k < int(c.mtp_num_layers); ++k) mtp_.emplace_back(c, k, store);
  }
}

std::vector<moe::MoeLayer*> Stage::moe_layers() {
  std::vector<moe::MoeLayer*> out;
  for (auto& b : blocks_)
    for (int i = 0; i < b.size(); ++i)
      if (auto* l = dynamic_cast<moe::MoeLayer*>(&b.layer(i).mlp())) out.push_back(l);
  for (auto& d : mtp_)
    if (auto* l = dynamic_cast<moe::MoeLayer*>(&d.layer().mlp())) out.push_back(l);
  return out;
}

void Stage::saved_specs(int chunk, const Dims& d, bool copy_batch, StageSaved& s,
                        const TensorVisitor& v) const {
  if (has_embedding(chunk)) Embedding::saved_specs(d, copy_batch, s.emb, v);
  blocks_[size_t(chunk)].saved_specs(d, s.block, v);
  if (has_head(chunk)) LmHead::saved_specs(*cfg_, d, copy_batch, s.head, v);
  if (has_head(chunk)) {
    s.mtp.resize(mtp_.size());  // the depths' batches are made on the host: copied over
    for (size_t k = 0; k < mtp_.size(); ++k)
      mtp_[k].saved_specs(d, d.dev != Device::CPU, s.mtp[k], v);
  }
}

void Stage::scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) const {
  bool scratch_act = false;
  int max_group = 0;
  for (const auto& b : blocks_) {
    scratch_act = scratch_act || b.uses_scratch_activation();
    max_group = std::max(max_group, b.max_group());
  }
  for (const auto& b : blocks_) b.scratch_specs(d, scratch_act, max_group, ws, v);
  if (part_.first_stage) Embedding::scratch_specs(d, ws, v);
  if (part_.last_stage) LmHead::scratch_specs(*cfg_, d, ws, v);
  for (const auto& m : mtp_) m.scratch_specs(d, ws, v);
}

}  // namespace mcpp::model
