#include "data/blended_dataset.h"

#include <algorithm>
#include <limits>
#include <set>

#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "data/index_cache.h"

namespace mcpp::data {

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> count(n, 0);
  dataset_index.resize(size_t(size));
  dataset_sample_index.resize(size_t(size));
  for (int64_t s = 0; s < size; ++s) {
    const double x = std::max(double(s), 1.0);
    size_t best = 0;
    double best_err = weights[0] * x - double(count[0]);
    for (size_t i = 1; i < n; ++i) {
      double err = weights[i] * x - double(count[i]);
      if (err > best_err) best_err = err, best = i;
    }
    dataset_index[s] = int16_t(best);
    dataset_sample_index[s] = count[best]++;
  }
}

void build_exhaustive_blending_indices(const std::vector<int64_t>& sizes,
                                       std::vector<int16_t>& dataset_index,
                                       std::vector<int64_t>& dataset_sample_index) {
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::vector<double> weights(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) weights[i] = double(sizes[i]) / double(total);
  std::vector<double> counts(sizes.size(), 0.0);
  std::set<int32_t> unspent;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 0) unspent.insert(int32_t(i));
  dataset_index.assign(size_t(total), 0);
  dataset_sample_index.assign(size_t(total), 0);
  int64_t s = 0;
  while (!unspent.empty()) {
    const double x = std::max(double(s), 1.0);
    int32_t best = 0;
    double best_err = std::numeric_limits<double>::lowest();
    for (int32_t i : unspent) {
      double err = weights[i] * x - counts[i];
      if (err > best_err) best = i, best_err = err;
    }
    dataset_index[s] = int16_t(best);
    dataset_sample_index[s] = int64_t(counts[best]);
    counts[best] += 1;
    if (sizes[best] - int64_t(counts[best]) == 0) unspent.erase(best);
    ++s;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GPTSampleSource>> datasets,
                               std::vector<double> weights, std::optional<int64_t> size,
                               Split split, const std::string& path_to_cache)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), split_(split) {
  MCPP_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(),
             "blend of {} datasets with {} weights", datasets_.size(), weights_.size());
  MCPP_CHECK(datasets_.size() < 32767, "too many datasets in one blend ({})", datasets_.size());
  if (size) {
    MCPP_CHECK(*size > 0, "blend size must be positive, got {}", *size);
    double sum = 0;
    for (double w : weights_) sum += w;
    for (double& w : weights_) w /= sum;
  }
  // The cache description: Megatron's BlendedDataset identifiers (datasets, weights, size).
  std::string desc = fmt::format("{{\n    \"class\": \"BlendedDataset\",\n    \"size\": {},\n"
                                 "    \"weights\": [",
                                 size ? std::to_string(*size) : "null");
  for (size_t i = 0; i < weights_.size(); ++i)
    desc += fmt::format("{}{:.17g}", i ? ", " : "", weights_[i]);
  desc += "],\n    \"datasets\": [";
  for (size_t i = 0; i < datasets_.size(); ++i)
    desc += fmt::format("{}\n        \"{}\"", i ? "," : "", datasets_[i]->describe());
  desc += fmt::format("\n    ],\n    \"split\": \"{}\"\n}}", split_name(split_));
  std::optional<CacheFiles> cf;
  if (!path_to_cache.empty())
    cf = cache_files(path_to_cache, desc, "BlendedDataset", split_name(split_));
  if (cf && std::filesystem::exists(cf->path("description.txt"))) {
    std::string why = "the description differs";
    if (cache_description_matches(*cf, desc)) {
      auto di = read_npy(cf->path("dataset_index.npy"), &why);
      auto si = di ? read_npy(cf->path("dataset_sample_index.npy"), &why) : std::nullopt;
      if (di && si) {
        auto d = di->as_int64(), s = si->as_int64();
        why = "the arrays are not int16/int64 of one length";
        if (di->descr == "<i2" && si->descr == "<i8" && di->shape.size() == 1 &&
            di->shape == si->shape && (!size || di->shape[0] == *size)) {
          why = "an index is out of range";
          bool ok = true;
          for (size_t k = 0; k < d->size() && ok; ++k)
            ok = (*d)[k] >= 0 && (*d)[k] < int64_t(datasets_.size()) && (*s)[k] >= 0 &&
                 (*s)[k] < datasets_[size_t((*d)[k])]->size();
          if (ok) {
            dataset_index_.assign(d->begin(), d->end());
            dataset_sample_index_ = std::move(*s);
            loaded_from_cache_ = true;
          }
        }
      }
    }
    if (!loaded_from_cache_) log::warn("index cache {}-*: {}; rebuilding it", cf->path(""), why);
  }
  if (loaded_from_cache_) {
    // nothing to build
  } else if (size) {
    build_blending_indices(weights_, *size, dataset_index_, dataset_sample_index_);
  } else {
    std::vector<int64_t> sizes;
    for (double w : weights_) sizes.push_back(int64_t(w));
    build_exhaustive_blending_indices(sizes, dataset_index_, dataset_sample_index_);
  }
  if (cf && !loaded_from_cache_) {
    std::filesystem::create_directories(path_to_cache);
    const int64_t n = int64_t(dataset_index_.size());
    write_npy(cf->path("dataset_index.npy"), "<i2", {n}, dataset_index_.data(), size_t(n) * 2);
    write_npy(cf->path("dataset_sample_index.npy"), "<i8", {n}, dataset_sample_index_.data(),
              size_t(n) * 8);
    write_cache_description(*cf, desc);
  }
  // Megatron raises IndexError on first access of an oversampled dataset; say so now.
  std::vector<int64_t> used(datasets_.size(), 0);
  for (size_t s = 0; s < dataset_index_.size(); ++s)
    used[dataset_index_[s]] = std::max(used[dataset_index_[s]], dataset_sample_index_[s] + 1);
  for (size_t i = 0; i < datasets_.size(); ++i)
    if (used[i] > datasets_[i]->size())
      throw Error(
          fmt::format("the {} blend needs {} samples from dataset {} ({}), which has only {}",
                      split_name(split_), used[i], i, datasets_[i]->describe(),
                      datasets_[i]->size()),
          "lower that dataset's weight or the number of samples, or raise "
          "--mid-level-dataset-surplus (Megatron's default 0.005) for more margin");
}

void BlendedDataset::get(int64_t index, GPTSample& out) const {
  MCPP_CHECK(index >= 0 && index < size(), "blended sample {} out of range [0, {})", index, size());
  datasets_[dataset_index_[index]]->get(dataset_sample_index_[index], out);
}

void BlendedDataset::get_text(int64_t index, std::vector<int64_t>& out) const {
  MCPP_CHECK(index >= 0 && index < size(), "blended sample {} out of range [0, {})", index, size());
  datasets_[dataset_index_[index]]->get_text(dataset_sample_index_[index], out);
}

std::string BlendedDataset::describe() const {
  return fmt::format("BlendedDataset {} split: {} datasets, {} samples", split_name(split_),
                     datasets_.size(), size());
}

}  // namespace mcpp::data
