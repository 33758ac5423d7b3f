// Trainer::State::build_datasets: the train, validation and test datasets of a run, as
// Megatron's build_train_valid_test_datasets (the set-up's last step, trainer_setup.cpp).
#include <algorithm>

#include "base/log.h"
#include "data/dataset_builder.h"
#include "data/tokenizers/tokenizer.h"
#include "ops/ops.h"
#include "training/fim_setup.h"
#include "training/trainer_state.h"
#include "training/validate_compat.h"

namespace mcpp::training {

// The train, validation and test datasets (Megatron's build_train_valid_test_datasets).
void Trainer::State::build_datasets() {
  auto& s = *this;
  const Args& a = s.args;
  // Samples per split, as get_train_valid_test_num_samples().
  data::GPTDatasetsArgs d;
  d.data_path = a.data_args_path ? data::read_data_args_file(*a.data_args_path) : a.data_path;
  if (a.per_split_data_args_path) {
    d.per_split = data::read_per_split_data_args(*a.per_split_data_args_path);
  } else {
    const std::vector<std::string>* flags[] = {&a.train_data_path, &a.valid_data_path,
                                               &a.test_data_path};
    const char* dests[] = {"train_data_path", "valid_data_path", "test_data_path"};
    for (int i = 0; i < 3; ++i)
      if (a.was_given(dests[i])) d.per_split[size_t(i)] = *flags[i];
  }
  d.mock_data = a.mock_data, d.seq_length = a.seq_length;
  d.split = a.split.value_or("969, 30, 1");
  d.seed = uint32_t(a.seed), d.eod = s.tok->eod(), d.pad = data::pad_id_for(s.tok->pad(), s.tok->eod());
  d.vocab_size = s.tok->vocab_size();
  d.padded_vocab_size = *a.padded_vocab_size;  // dataset ids checked when opened
  // Which splits the run reads: a split that rounds to no sequences is an error only then.
  const bool evaluates = a.eval_interval && (a.eval_iters > 0 || a.full_validation);
  d.reads = {!a.skip_train, evaluates, a.eval_interval && a.eval_iters > 0};
  d.eod_mask_loss = a.eod_mask_loss;
  d.reset_position_ids = a.reset_position_ids, d.reset_attention_mask = a.reset_attention_mask;
  d.data_cache_path = a.data_cache_path.value_or("");
  d.mmap_bin_files = a.mmap_bin_files;  // --no-mmap-bin-files
  d.mid_level_dataset_surplus = a.mid_level_dataset_surplus;
  if (a.fim_data) d.fim = fim_config(a, *s.tok);
  const int64_t gbs = a.global_batch_size, egbs = *a.eval_global_batch_size;
  if (const auto steps = step_batch_schedule(a))
    d.num_samples[0] = a.train_samples.value_or(data::samples_for_iters(a.train_iters, *steps));
  else
    d.num_samples[0] = a.train_samples.value_or(data::samples_for_iters(
        a.train_iters, gbs, a.micro_batch_size, a.data_parallel_size, batch_rampup(a)));
  if (a.eval_interval)
    d.num_samples[1] = data::validation_samples(a.train_iters, *a.eval_interval, a.eval_iters,
                                                egbs, a.start_eval_at_iter);
  if (a.full_validation) d.num_samples[1].reset();  // each evaluation reads the whole epoch
  d.num_samples[2] = a.eval_iters * egbs;
  log::info("> building train, validation, and test datasets ...");
  // With --data-cache-path rank 0 builds (and caches) the indices first, as Megatron
  // does; the other ranks then read its cache instead of all writing the same files.
  // --multiple-validation-sets over --valid-data-path: each prefix alone, not their blend.
  std::vector<std::shared_ptr<data::GPTSampleSource>> sets;
  data::GPTDatasetsArgs rest = d;
  const bool own_sets = a.multiple_validation_sets && d.per_split[1].has_value();
  if (own_sets) rest.per_split[1].reset();
  const bool others = !own_sets || std::any_of(rest.per_split.begin(), rest.per_split.end(),
                                               [](const auto& p) { return p.has_value(); });
  auto build = [&] {
    if (own_sets) sets = data::build_validation_sets(d);
    if (others) s.datasets = data::build_train_valid_test_datasets(rest);
  };
  comm::Communicator& w = s.world->world();
  if (!d.data_cache_path.empty() && w.size() > 1) {
    if (w.rank() == 0) build();
    w.barrier(ops::default_stream(Device::CPU));
    if (w.rank() != 0) build();
  } else {
    build();
  }
  const bool per_split = std::any_of(d.per_split.begin(), d.per_split.end(),
                                     [](const auto& w) { return w.has_value(); });
  MCPP_CHECK_HINT(s.datasets[0] || a.skip_train,
                  per_split ? "give --train-data-path (or a \"train\" entry in "
                              "--per-split-data-args-path)"
                            : "give the train split a non-zero weight in --split",
                  "no training dataset was built ({})",
                  per_split ? "no train data path" : "--split " + d.split);
  for (int i = 0; i < 3; ++i)
    if (s.datasets[i] && (i != 1 || !(a.multiple_validation_sets || a.full_validation)))
      log::info("    {}: {}", i == 0 ? "train" : i == 1 ? "validation" : "test",
                s.datasets[i]->describe());
  build_validation_sets(std::move(sets));
}

}  // namespace mcpp::training
