#include "data/dataset_builder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "data/blended_dataset.h"
#include "data/index_cache.h"

namespace mcpp::data {

int64_t pad_id_for(std::optional<int64_t> tokenizer_pad, int64_t eod) {
  if (!tokenizer_pad || *tokenizer_pad < 0 || *tokenizer_pad == eod) return -1;
  return *tokenizer_pad;
}

Blend parse_data_path(const std::vector<std::string>& words_in, const std::string& flag) {
  std::vector<std::string> words;
  for (const auto& w : words_in) {  // a single quoted argument may hold several words
    std::istringstream is(w);
    for (std::string t; is >> t;) words.push_back(t);
  }
  Blend b;
  if (words.empty())
    throw Error(fmt::format("{} is empty", flag),
                fmt::format("give a dataset prefix, e.g. {} my-gpt2_text_document", flag));
  if (words.size() == 1) {
    b.prefixes = words;
    return b;
  }
  bool weighted = words.size() % 2 == 0;
  std::vector<double> w;
  for (size_t i = 0; weighted && i < words.size(); i += 2) {
    char* end = nullptr;
    double x = std::strtod(words[i].c_str(), &end);
    if (end == words[i].c_str() || *end != '\0')
      weighted = false;
    else
      w.push_back(x);
  }
  if (weighted) {
    for (size_t i = 1; i < words.size(); i += 2) b.prefixes.push_back(words[i]);
    for (double x : w)
      if (!(x >= 0) || !std::isfinite(x))
        throw Error(fmt::format("{} weight {} is not a non-negative number", flag, x));
    double sum = 0;
    for (double x : w) sum += x;
    if (!(sum > 0)) throw Error(fmt::format("{} weights sum to zero", flag));
    for (double& x : w) x /= sum;  // normalize(): float64 division by the float sum
    b.weights = w;
  } else {
    b.prefixes = words;
  }
  return b;
}

std::vector<std::string> read_data_args_file(const std::string& path) {
  std::ifstream f(path);
  MCPP_CHECK_HINT(f.good(), "check --data-args-path (a text file of --data-path words)",
                  "cannot read --data-args-path {}", path);
  std::vector<std::string> words;
  for (std::string w; f >> w;) words.push_back(w);
  MCPP_CHECK_HINT(!words.empty(), "write the --data-path words into it: PREFIX or W1 P1 W2 P2 ...",
                  "--data-args-path {} holds no words", path);
  return words;
}

std::array<std::optional<std::vector<std::string>>, 3> read_per_split_data_args(
    const std::string& path) {
  std::ifstream f(path);
  const char* fix = "a JSON object {\"train\": ..., \"valid\": ..., \"test\": ...} of "
                    "--data-path words (a string or a list of strings each)";
  MCPP_CHECK_HINT(f.good(), fix, "cannot read --per-split-data-args-path {}", path);
  nlohmann::json j;
  try {
    f >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--per-split-data-args-path {} is not JSON: {}", path, e.what()), fix);
  }
  MCPP_CHECK_HINT(j.is_object(), fix, "--per-split-data-args-path {} is not a JSON object", path);
  std::array<std::optional<std::vector<std::string>>, 3> out;
  const char* keys[] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    MCPP_CHECK_HINT(j.contains(keys[i]), fix, "--per-split-data-args-path {} has no \"{}\" entry",
                    path, keys[i]);
    const nlohmann::json& v = j[keys[i]];
    if (v.is_null()) continue;
    std::vector<std::string> words;
    auto add = [&](const nlohmann::json& s) {
      MCPP_CHECK_HINT(s.is_string(), fix,
                      "--per-split-data-args-path {}: \"{}\" holds {}, not a string of words",
                      path, keys[i], s.dump());
      std::istringstream is(s.get<std::string>());
      for (std::string w; is >> w;) words.push_back(w);
    };
    if (v.is_array())
      for (const auto& s : v) add(s);
    else
      add(v);
    out[i] = std::move(words);
  }
  return out;
}

namespace {

// The largest token id of a dataset from --data-cache-path when a run computed it for the
// same files (path, sizes and modification times), else computed once and stored there: a
// pass over the whole .bin, which a large corpus should not repeat at every start.
std::optional<int64_t> cached_max_token_id(const IndexedDataset& ds, const std::string& dir) {
  if (dir.empty()) return std::nullopt;
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string key = ds.prefix();
  for (const std::string& f : {idx_path(ds.prefix()), bin_path(ds.prefix())}) {
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    if (ec) return std::nullopt;
    key += fmt::format("\n{} {} {}", f, size, int64_t(mtime));
  }
  const CacheFiles cf = cache_files(dir, key, "IndexedDataset", "vocabulary");
  if (cache_description_matches(cf, key)) {
    if (auto a = read_npy(cf.path("max_token_id.npy")); a && a->as_int64() && a->numel() == 1)
      return (*a->as_int64())[0];
  }
  const int64_t mx = ds.max_token_id();
  try {
    fs::create_directories(dir, ec);
    write_npy(cf.path("max_token_id.npy"), "<i8", {1}, &mx, 8);
    write_cache_description(cf, key);
  } catch (const Error& e) {
    log::warn("could not cache the largest token id of {} in {}: {}", ds.prefix(), dir,
              e.summary());
  }
  return mx;
}

GPTDatasetConfig make_config(const GPTDatasetsArgs& a) {
  GPTDatasetConfig c;
  c.sequence_length = a.seq_length;
  c.seed = a.seed;
  c.reset_position_ids = a.reset_position_ids;
  c.reset_attention_mask = a.reset_attention_mask;
  c.eod_mask_loss = a.eod_mask_loss;
  c.eod = a.eod;
  c.pad = a.pad;
  c.mock = a.mock_data;
  c.path_to_cache = a.data_cache_path;
  c.split_spec = a.split;
  c.fim = a.fim;
  return c;
}

using Splits = std::array<std::shared_ptr<GPTSampleSource>, 3>;

// _build_megatron_dataset_splits for one prefix (or the mock dataset).
Splits build_splits(std::shared_ptr<const LowLevelDataset> low,
                    const std::vector<std::optional<std::pair<double, double>>>& matrix,
                    const std::array<std::optional<int64_t>, 3>& sizes,
                    const GPTDatasetConfig& cfg, const std::array<bool, 3>& reads) {
  Splits out;
  const double n = double(low->num_sequences());
  for (int i = 0; i < 3; ++i) {
    if (!matrix[i]) continue;
    const int64_t beg = python_round(matrix[i]->first * n),
                  end = python_round(matrix[i]->second * n);
    std::vector<int32_t> indices;
    int64_t tokens = 0;
    for (int64_t k = beg; k < end; ++k)
      indices.push_back(int32_t(k)), tokens += low->sequence_length(k);
    // Too small for one sample and not read by this run: left out instead of an error (the
    // GPTDataset constructor gives the error, with the counts, when it is read).
    if (!reads[size_t(i)] && !cfg.mock && tokens <= cfg.add_extra_token) {
      log::info("the {} split of {} holds {} sequences ({} tokens): not built, as this run does "
                "not read it",
                split_name(Split(i)), low->path(), indices.size(), tokens);
      continue;
    }
    out[i] = std::make_shared<GPTDataset>(low, std::move(indices), sizes[i], Split(i), cfg);
  }
  return out;
}

}  // namespace

namespace {

using Matrix = std::vector<std::optional<std::pair<double, double>>>;
using Sizes = std::array<std::optional<int64_t>, 3>;

// BlendedMegatronDatasetBuilder.build for one blend and the splits `matrix` names: the
// prefix's splits directly when `direct` (one prefix), else one mid-level dataset per prefix
// and split, blended per split.
Splits build_blend(const Blend& blend, const Matrix& matrix, const Sizes& num_samples,
                   bool direct, const GPTDatasetConfig& cfg, const GPTDatasetsArgs& a) {
  auto open = [&](const std::string& prefix) {
    auto low = std::make_shared<IndexedLowLevelDataset>(prefix, a.mmap_bin_files);
    if (a.padded_vocab_size > 0)
      low->indexed().check_vocabulary(a.padded_vocab_size,
                                      cached_max_token_id(low->indexed(), a.data_cache_path));
    return low;
  };
  if (direct) return build_splits(open(blend.prefixes[0]), matrix, num_samples, cfg, a.reads);

  const size_t P = blend.prefixes.size();
  const bool weighted = !blend.weights.empty();
  // _get_size_per_split_per_dataset: target and (with surplus) buffer sizes.
  auto sizes_for = [&](double w, double surplus) {
    Sizes s{};
    for (int i = 0; i < 3; ++i)
      if (num_samples[i])
        s[i] = int64_t(std::ceil(std::ceil(double(*num_samples[i]) * w) * (1.0 + surplus)));
    return s;
  };
  std::vector<Splits> per_dataset(P);
  for (size_t p = 0; p < P; ++p) {
    auto low = open(blend.prefixes[p]);
    Sizes sizes{};
    if (weighted) sizes = sizes_for(blend.weights[p], a.mid_level_dataset_surplus);
    per_dataset[p] = build_splits(low, matrix, sizes, cfg, a.reads);
  }
  Splits out;
  for (int i = 0; i < 3; ++i) {
    if (!matrix[i]) continue;
    std::vector<std::shared_ptr<const GPTSampleSource>> ds;
    bool missing = false;  // a prefix's split left out (not read, too small): no blend
    for (size_t p = 0; p < P; ++p) ds.push_back(per_dataset[p][i]), missing |= !ds.back();
    if (missing) continue;
    std::vector<double> weights;
    std::optional<int64_t> size;
    if (weighted) {
      if (!num_samples[i])
        throw Error(fmt::format("a weighted --data-path needs a sample count for the {} split",
                                split_name(Split(i))),
                    "this happens with --full-validation; give unweighted prefixes instead");
      int64_t total = 0;
      for (size_t p = 0; p < P; ++p) total += *sizes_for(blend.weights[p], 0.0)[i];
      weights = blend.weights;
      size = total;
    } else {
      int64_t sum = 0;
      for (auto& d : ds) weights.push_back(double(d->size())), sum += d->size();
      if (num_samples[i]) size = std::min(*num_samples[i], sum);
    }
    out[i] = std::make_shared<BlendedDataset>(std::move(ds), std::move(weights), size, Split(i),
                                              a.data_cache_path);
  }
  return out;
}

}  // namespace

std::array<std::shared_ptr<GPTSampleSource>, 3> build_train_valid_test_datasets(
    const GPTDatasetsArgs& a) {
  if (a.seq_length <= 0) throw Error("--seq-length must be positive");
  GPTDatasetConfig cfg = make_config(a);
  if (a.mock_data) {
    auto low = std::make_shared<MockGPTLowLevelDataset>(a.vocab_size, a.eod);
    return build_splits(low, split_matrix(parse_split("1,1,1")), a.num_samples, cfg, a.reads);
  }
  if (std::any_of(a.per_split.begin(), a.per_split.end(), [](auto& w) { return w.has_value(); })) {
    // Each split from its own blend: the whole of each prefix, as the split Megatron's
    // builder spoofs ((0, 1) for this split, none for the others); Megatron's split is None.
    cfg.split_spec = "None";
    static const char* flags[] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    Splits out;
    for (int i = 0; i < 3; ++i) {
      if (!a.per_split[i]) continue;
      const Blend blend = parse_data_path(*a.per_split[i], flags[i]);
      Matrix matrix(3);
      matrix[i] = std::pair(0.0, 1.0);
      Sizes sizes{};
      sizes[i] = a.num_samples[i];
      out[i] = build_blend(blend, matrix, sizes, blend.prefixes.size() == 1, cfg, a)[i];
    }
    return out;
  }
  const Blend blend = parse_data_path(a.data_path);
  const bool direct = blend.prefixes.size() == 1 && blend.weights.empty();
  return build_blend(blend, split_matrix(parse_split(a.split)), a.num_samples, direct, cfg, a);
}

std::vector<std::shared_ptr<GPTSampleSource>> build_validation_sets(const GPTDatasetsArgs& a) {
  if (a.seq_length <= 0) throw Error("--seq-length must be positive");
  if (!a.per_split[1])
    throw Error("--multiple-validation-sets: no --valid-data-path (or \"valid\" entry of "
                "--per-split-data-args-path) lists the validation sets",
                "give the sets as --valid-data-path PREFIX1 PREFIX2 ...");
  const Blend blend = parse_data_path(*a.per_split[1], "--valid-data-path");
  if (!blend.weights.empty())
    throw Error(fmt::format("--multiple-validation-sets with weights in --valid-data-path ({} "
                            "prefixes): each set is evaluated alone, a weight would mean nothing",
                            blend.prefixes.size()),
                "list the prefixes without weights");
  GPTDatasetConfig cfg = make_config(a);
  cfg.split_spec = "None";
  Matrix matrix(3);
  matrix[1] = std::pair(0.0, 1.0);
  Sizes sizes{};
  sizes[1] = a.num_samples[1];
  std::vector<std::shared_ptr<GPTSampleSource>> out;
  for (const auto& prefix : blend.prefixes)
    out.push_back(build_blend(Blend{{prefix}, {}}, matrix, sizes, true, cfg, a)[1]);
  return out;
}

}  // namespace mcpp::data
