// A model chunk (Megatron-Core's TransformerBlock): consecutive transformer layers, what
// one micro-batch keeps of them, and full activation recomputation.
//
// Full recomputation (--recompute-granularity full) keeps only the input of each group of
// recompute_num_layers layers (method uniform: the chunk's layers in consecutive groups;
// block: the first recompute_num_layers layers of the chunk, one layer a group) and
// re-runs the group's forward, into the shared workspace, just before its backward.
// Dropout masks are functions of global coordinates, so the recomputed forward is bitwise
// the original. Selective recomputation is the core attention's (core_attention.h).
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "model/transformer_layer.h"

namespace mcpp::model {

// Recompute groups of a chunk of n layers: [begin, end) local indices; layers outside
// every group are stored.
std::vector<std::pair<int, int>> recompute_groups(const TransformerConfig& c, int n);
// Which of a model chunk's n layers keep their MLP activation (--keep-mlp-activations): the
// first cfg.keep_mlp_activations of those outside every full-recompute group.
std::vector<bool> keeps_mlp_activation(const TransformerConfig& c, int n);

// One micro-batch's saved activations of a chunk.
struct BlockSaved {
  std::vector<Tensor> hidden;      // n+1 x [Tl,H]: hidden[i] is local layer i's input,
                                   // hidden[n] the chunk's output (not kept inside groups)
  std::vector<LayerSaved> layers;  // per local layer (empty for recomputed layers)
};

class TransformerBlock {
 public:
  // layers: the global ids; store null: shape only.
  TransformerBlock(const TransformerConfig& c, const std::vector<int>& layers,
                   const ParamStore* store);

  int size() const { return int(layers_.size()); }
  const TransformerLayer& layer(int i) const { return layers_[size_t(i)]; }
  int max_group() const;
  // Whether some layer leaves its MLP activation in the shared workspace.
  bool uses_scratch_activation() const;

  void saved_specs(const Dims& d, BlockSaved& s, const TensorVisitor& v) const;
  // The layers' workspace entries (uses_scratch_activation: of the whole stage), and the
  // full-recompute workspace for groups of up to max_group layers.
  void scratch_specs(const Dims& d, bool uses_scratch_activation, int max_group, Workspace& ws,
                     const TensorVisitor& v) const;

  // s.hidden[0] in, s.hidden[n] out. params_needed(l) runs before layer l reads its
  // parameters.
  void forward(BlockSaved& s, Workspace& ws, const StepContext& cx,
               const std::function<void(int)>& params_needed) const;
  // The workspace's dx: d(hidden[n]) in, d(hidden[0]) out. ready(l) runs after layer l's
  // backward.
  void backward(BlockSaved& s, Workspace& ws, const StepContext& cx,
                const std::function<void(int)>& ready);

 private:
  const TransformerConfig* cfg_;
  std::vector<TransformerLayer> layers_;
  std::vector<std::pair<int, int>> groups_;
  std::vector<int> group_of_;  // local layer -> its group, -1: stored
  std::vector<bool> keep_act_;
};

}  // namespace mcpp::model
