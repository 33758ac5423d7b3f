// Where the training data comes from (Megatron's rule: at most one source): --mock-data,
// --data-path / --data-args-path (one blend split by --split), or --train-data-path /
// --valid-data-path / --test-data-path / --per-split-data-args-path (each split its own
// blend, no --split). The files themselves are read when the datasets are built. Also the
// rules of --full-validation, --multiple-validation-sets and --validation-set-names.
#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"

namespace mcpp::training {

// training: a run that needs data (generation and conversion do not).
void validate_data_sources(Args& a, bool training) {
  const bool flags_per_split = a.was_given("train_data_path") ||
                               a.was_given("valid_data_path") || a.was_given("test_data_path");
  const bool per_split = flags_per_split || a.per_split_data_args_path.has_value();
  const bool blend = !a.data_path.empty() || a.data_args_path.has_value();
  MCPP_CHECK_HINT(a.data_path.empty() || !a.data_args_path,
                  "give the words on the command line or in the file, not both",
                  "--data-path and --data-args-path {} both give the data", *a.data_args_path);
  MCPP_CHECK_HINT(!flags_per_split || !a.per_split_data_args_path,
                  "give the per-split paths on the command line or in the file, not both",
                  "--train/valid/test-data-path and --per-split-data-args-path {} both give the "
                  "data",
                  a.per_split_data_args_path.value_or(""));
  MCPP_CHECK_HINT(int(a.mock_data) + int(blend) + int(per_split) <= 1,
                  "give one of --mock-data, --data-path (or --data-args-path), and "
                  "--train/valid/test-data-path (or --per-split-data-args-path)",
                  "a single data source must be given: {}{}{}",
                  a.mock_data ? "--mock-data " : "", blend ? "--data-path " : "",
                  per_split ? "--train/valid/test-data-path" : "");
  MCPP_CHECK_HINT(!per_split || !a.split,
                  "drop --split: each split reads the whole of its own datasets",
                  "--split {} with --train/valid/test-data-path (Megatron: split and "
                  "blend_per_split are incompatible)",
                  a.split.value_or(""));
  if (training)
    MCPP_CHECK_HINT(blend || per_split || a.mock_data,
                    "give --data-path PREFIX (a Megatron .bin/.idx prefix) or --mock-data",
                    "no training data: neither --data-path nor --mock-data was given");
  if (training && per_split)
    MCPP_CHECK_HINT(!flags_per_split || a.was_given("train_data_path") || a.skip_train,
                    "add --train-data-path PREFIX, or --skip-train",
                    "--valid/test-data-path without --train-data-path: nothing to train on");
  if (blend && !a.split) a.split = "969, 30, 1";  // Megatron's default, warned
  // Full validation and several validation sets, as Megatron-LM allows them.
  MCPP_CHECK_HINT(!a.multiple_validation_sets || a.full_validation,
                  "add --full-validation (each set is then read whole at every evaluation)",
                  "--multiple-validation-sets needs --full-validation (Megatron-LM: "
                  "\"--multiple-validation-sets currently requires --full-validation\")");
  MCPP_CHECK_HINT(a.validation_set_names.empty() || a.multiple_validation_sets,
                  "add --multiple-validation-sets, or drop --validation-set-names",
                  "--validation-set-names requires --multiple-validation-sets");
  if (a.full_validation && !a.eval_interval)
    log::warn("--full-validation without --eval-interval: no evaluation runs");
}

}  // namespace mcpp::training
