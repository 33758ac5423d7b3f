// Builds the train/valid/test sample sources from Megatron-style arguments, as
// BlendedMegatronDatasetBuilder does for pretrain_gpt.py:
//
//   --data-path P            one GPTDataset per split over P's sequence ranges
//   --data-path W1 P1 W2 P2  per-prefix GPTDatasets sized ceil(ceil(T*w)*(1+surplus)),
//                            blended to sum_i ceil(T*w_i) samples
//   --data-path P1 P2        blended by the datasets' lengths, min(T, sum len) samples
//   --mock-data              MockGPTDataset over MockGPTLowLevelDataset, split "1,1,1"
//   --train-data-path ... --valid-data-path ... --test-data-path ...
//                            each split from its own blend (blend_per_split): split i
//                            built as above with the whole of each of its prefixes, a
//                            single prefix directly (its weight, if any, unused); a split
//                            without paths is not built
//
// Each split i of a prefix with N sequences covers sequences
// [round(lo_i*N), round(hi_i*N)) (Python's round). A split of zero width is not built
// (null); a non-zero split that holds no sequences is an error naming the split,
// the dataset and its sequence count when the run reads that split (else it is null too).
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"

namespace mcpp::data {

struct GPTDatasetsArgs {
  std::vector<std::string> data_path;  // --data-path words, as given
  // --train-data-path / --valid-data-path / --test-data-path words (or their
  // --per-split-data-args-path entries); any set: each split from its own blend, and
  // data_path and split are unused. nullopt: that split has no data.
  std::array<std::optional<std::vector<std::string>>, 3> per_split{};
  std::string split = "969, 30, 1";    // --split
  bool mock_data = false;              // --mock-data
  int64_t seq_length = 0;              // --seq-length
  uint32_t seed = 1234;                // --seed
  // Samples wanted per split (train, valid, test); nullopt = one epoch.
  std::array<std::optional<int64_t>, 3> num_samples{};
  int64_t eod = 0;         // tokenizer eod id
  int64_t pad = -1;        // tokenizer pad id, -1 if none (see pad_id_for)
  int64_t vocab_size = 0;  // tokenizer vocab size (mock data only)
  // The model's padded vocabulary: every dataset's token ids must lie below it (checked when
  // the dataset is opened; 0 = not checked).
  int64_t padded_vocab_size = 0;
  // Which splits this run reads (train, valid, test). A split of non-zero weight that rounds
  // to no sequences (or too few tokens for one sample) is an error naming it and its counts
  // when it is read; when it is not (training without evaluation, `inspect` of another
  // split) it is left out (null), as Megatron builds on with Megatron's default --split on a
  // small dataset.
  std::array<bool, 3> reads{true, true, true};
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
  double mid_level_dataset_surplus = 0.005;  // --mid-level-dataset-surplus
  std::string data_cache_path;               // --data-cache-path ("" = no cache)
  bool mmap_bin_files = true;                // false: --no-mmap-bin-files (pread the .bin)
  std::shared_ptr<const FimConfig> fim;      // --fim-data (null: off); every split, as Megatron
};

// Megatron's pad rule: the tokenizer's pad id unless it is absent or equals EOD.
int64_t pad_id_for(std::optional<int64_t> tokenizer_pad, int64_t eod);

// (prefixes, weights) from --data-path words (get_blend_from_list); weights empty when none given.
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};
// flag: the flag the words came from, for the errors.
Blend parse_data_path(const std::vector<std::string>& words,
                      const std::string& flag = "--data-path");

// --data-args-path FILE: the --data-path words the file holds (whitespace-separated).
std::vector<std::string> read_data_args_file(const std::string& path);
// --per-split-data-args-path FILE: a JSON object whose "train", "valid" and "test" entries
// each hold the words of that split's --*-data-path (one string, or a list of strings;
// null: no data for the split). Errors name the file and the entry.
std::array<std::optional<std::vector<std::string>>, 3> read_per_split_data_args(
    const std::string& path);

// Returns {train, valid, test}; an entry is null when its split has zero width.
std::array<std::shared_ptr<GPTSampleSource>, 3> build_train_valid_test_datasets(
    const GPTDatasetsArgs& args);

// --multiple-validation-sets: each prefix of the per-split validation blend
// (--valid-data-path) as its own dataset, in the order given, as Megatron's builder makes
// them (the whole prefix; num_samples[1] samples, or its one epoch when unset). Weights in
// the list are an error (each prefix is evaluated alone), as is a run without per-split
// validation data.
std::vector<std::shared_ptr<GPTSampleSource>> build_validation_sets(const GPTDatasetsArgs& args);

}  // namespace mcpp::data
