// Megatron's BlendedDataset (blended_dataset.py, helpers.cpp build_blending_indices):
// a deterministic interleave of several datasets by weight. Sample s comes from the
// dataset whose share lags its weight most (argmax of w_i * max(s, 1) - count_i, ties
// to the lowest index); within a dataset, samples are taken in that dataset's order.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "data/gpt_dataset.h"

namespace mcpp::data {

// build_blending_indices: `size` picks by normalised weights.
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);
// build_exhaustive_blending_indices: exactly sizes[i] picks from dataset i.
void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes,
                                       std::vector<int16_t>& dataset_index,
                                       std::vector<int64_t>& dataset_sample_index);

class BlendedDataset final : public GPTSampleSource {
 public:
  // weights: per dataset (normalised here when size is given); size nullopt: draw
  // every sample of every dataset exactly once (weights must then be the lengths).
  BlendedDataset(std::vector<std::shared_ptr<const GPTSampleSource>> datasets,
                 std::vector<double> weights, std::optional<int64_t> size, Split split,
                 const std::string& path_to_cache = {});

  int64_t size() const override { return int64_t(dataset_index_.size()); }
  void get(int64_t index, GPTSample& out) const override;
  void get_text(int64_t index, std::vector<int64_t>& out) const override;
  std::string describe() const override;

  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::vector<std::shared_ptr<const GPTSampleSource>> datasets_;
  std::vector<double> weights_;
  Split split_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

}  // namespace mcpp::data
