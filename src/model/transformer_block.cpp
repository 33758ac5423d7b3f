#include "model/transformer_block.h"

#include <algorithm>

#include "ops/ops.h"

namespace mcpp::model {

std::vector<std::pair<int, int>> recompute_groups(const TransformerConfig& c, int n) {
  // Megatron's _checkpointed_forward: uniform = consecutive groups of k layers over the
  // chunk (the last may be shorter); block = each of the first k layers alone.
  std::vector<std::pair<int, int>> g;
  if (c.recompute != TransformerConfig::Recompute::Full) return g;
  const int k = int(c.recompute_num_layers);
  MCPP_CHECK(k >= 1, "--recompute-num-layers must be >= 1 with full recomputation, got {}", k);
  if (c.recompute_method == TransformerConfig::RecomputeMethod::Uniform)
    for (int a = 0; a < n; a += k) g.push_back({a, std::min(n, a + k)});
  else
    for (int a = 0; a < std::min(n, k); ++a) g.push_back({a, a + 1});
  return g;
}

std::vector<bool> keeps_mlp_activation(const TransformerConfig& c, int n) {
  std::vector<bool> recomputed(size_t(n), false), keep(size_t(n), false);
  for (const auto& [a, e] : recompute_groups(c, n))
    for (int i = a; i < e; ++i) recomputed[size_t(i)] = true;
  int64_t left = c.keep_mlp_activations;
  for (int i = 0; i < n && left > 0; ++i)
    if (!recomputed[size_t(i)]) keep[size_t(i)] = true, --left;
  return keep;
}

TransformerBlock::TransformerBlock(const TransformerConfig& c, const std::vector<int>& layers,
                                   const ParamStore* store)
    : cfg_(&c) {
  const int n = int(layers.size());
  layers_.reserve(size_t(n));
  for (int l : layers) layers_.emplace_back(c, l, store);
  groups_ = recompute_groups(c, n);
  keep_act_ = keeps_mlp_activation(c, n);
  group_of_.assign(size_t(n), -1);
  for (size_t k = 0; k < groups_.size(); ++k)
    for (int i = groups_[k].first; i < groups_[k].second; ++i) group_of_[size_t(i)] = int(k);
}

int TransformerBlock::max_group() const {
  int m = 0;
  for (const auto& [a, e] : groups_) m = std::max(m, e - a);
  return m;
}

bool TransformerBlock::uses_scratch_activation() const {
  return std::find(keep_act_.begin(), keep_act_.end(), false) != keep_act_.end();
}

void TransformerBlock::saved_specs(const Dims& d, BlockSaved& s, const TensorVisitor& v) const {
  const int n = size();
  s.hidden.resize(size_t(n) + 1);
  s.layers.resize(size_t(n));
  // Every hidden state but those inside a recompute group (its input and output stay).
  for (int i = 0; i <= n; ++i) {
    bool inside = false;
    for (const auto& [a, e] : groups_) inside = inside || (a < i && i < e);
    v(s.hidden[size_t(i)], {d.Tl, d.H}, d.dt, !inside);
  }
  for (int i = 0; i < n; ++i)
    if (group_of_[size_t(i)] < 0)
      layers_[size_t(i)].saved_specs(d, keep_act_[size_t(i)], s.layers[size_t(i)], v);
}

void TransformerBlock::scratch_specs(const Dims& d, bool uses_scratch_activation, int max_group,
                                     Workspace& ws, const TensorVisitor& v) const {
  // dloss is the head's, but every chunk's backward has had it (the plans count it so).
  v(ws.dloss, {d.S, d.B}, d.sdt, true);
  for (const auto& L : layers_) L.scratch_specs(d, uses_scratch_activation, ws, v);
  // The recompute buffers are the stage's, shaped by any layer: a chunk without layers
  // (--pipeline-model-parallel-layout) leaves them to the others.
  if (max_group == 0 || layers_.empty()) return;
  if (ws.rc_acts.size() < size_t(max_group)) ws.rc_acts.resize(size_t(max_group));
  if (ws.rc_hidden.size() < size_t(max_group) + 1) ws.rc_hidden.resize(size_t(max_group) + 1);
  for (int j = 0; j < max_group; ++j) layers_[0].saved_specs(d, false, ws.rc_acts[size_t(j)], v);
  for (int j = 0; j <= max_group; ++j) v(ws.rc_hidden[size_t(j)], {d.Tl, d.H}, d.dt, true);
}

void TransformerBlock::forward(BlockSaved& s, Workspace& ws, const StepContext& cx,
                               const std::function<void(int)>& params_needed) const {
  const int n = size();
  for (int i = 0; i < n; ++i) {
    const TransformerLayer& L = layers_[size_t(i)];
    if (params_needed) params_needed(L.global());
    const int k = group_of_[size_t(i)];
    if (k >= 0) {  // inside a recompute group: the workspace, nothing kept
      const int a = groups_[size_t(k)].first, e = groups_[size_t(k)].second;
      const Tensor& x = i == a ? s.hidden[size_t(a)] : ws.rc_hidden[size_t(i - a)];
      Tensor& out = i == e - 1 ? s.hidden[size_t(e)] : ws.rc_hidden[size_t(i - a + 1)];
      L.forward(x, ws.rc_acts[size_t(i - a)], out, ws, cx);
    } else {
      L.forward(s.hidden[size_t(i)], s.layers[size_t(i)], s.hidden[size_t(i + 1)], ws, cx);
    }
  }
}

void TransformerBlock::backward(BlockSaved& s, Workspace& ws, const StepContext& cx,
                                const std::function<void(int)>& ready) {
  const auto& grp = groups_;
  int i = size() - 1;
  size_t k = grp.size();
  while (i >= 0) {
    while (k > 0 && grp[k - 1].first > i) --k;
    const bool in_group = k > 0 && grp[k - 1].first <= i && i < grp[k - 1].second;
    if (in_group) {
      // Re-run the group's forward from its kept input, then its backward.
      const int a = grp[k - 1].first, e = grp[k - 1].second;
      for (int j = a; j < e; ++j) {
        const Tensor& x = j == a ? s.hidden[size_t(a)] : ws.rc_hidden[size_t(j - a)];
        layers_[size_t(j)].forward(x, ws.rc_acts[size_t(j - a)], ws.rc_hidden[size_t(j - a + 1)],
                                   ws, cx);
      }
      for (int j = e - 1; j >= a; --j) {
        TransformerLayer& L = layers_[size_t(j)];
        const Tensor& x = j == a ? s.hidden[size_t(a)] : ws.rc_hidden[size_t(j - a)];
        L.backward(x, ws.rc_acts[size_t(j - a)], ws, cx);
        if (ready) ready(L.global());
      }
      i = a - 1;
      --k;
      continue;
    }
    TransformerLayer& L = layers_[size_t(i)];
    L.backward(s.hidden[size_t(i)], s.layers[size_t(i)], ws, cx);
    if (ready) ready(L.global());
    --i;
  }
}

}  // namespace mcpp::model
