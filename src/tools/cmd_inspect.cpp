// `megatron inspect`: what is in a Megatron dataset, and which samples training sees.
//
//   megatron inspect PREFIX
//       dtype, sequence / document / token counts, sequence-length statistics
//   megatron inspect CHECKPOINT_DIR
//       iterations, model shape, tensors and shards, every checksum verified; for a
//       Megatron-LM checkpoint (legacy or torch_dist): its layout, ranks, model, and the
//       convert command
//   megatron inspect --data-path ... [--split 969,30,1] --seq-length S --seed N
//                    (--train-samples T | --train-iters I --global-batch-size B)
//                    [--eval-iters E --eval-interval V] --show-samples I:J [--show-split train]
//       token ids of samples I..J-1 of a split, one sample a line, in training order
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_import.h"

#include "data/dataset_builder.h"
#include "data/indexed_dataset.h"
#include "data/num_microbatches.h"
#include "data/tokenizers/tokenizer.h"
#include "tools/commands.h"
#include "training/fim_setup.h"
#include "tools/flags.h"

namespace mcpp::tools {
namespace {

void describe_prefix(const std::string& prefix) {
  data::IndexedDataset ds(prefix);
  std::vector<int32_t> lens(ds.sequence_lengths().begin(), ds.sequence_lengths().end());
  std::sort(lens.begin(), lens.end());
  auto pct = [&](double p) { return lens.empty() ? 0 : lens[size_t(p * double(lens.size() - 1))]; };
  int64_t empty = std::count(lens.begin(), lens.end(), 0);
  std::printf("dataset    %s\n", prefix.c_str());
  std::printf("dtype      %s (code %d, %lld bytes per token)\n", data::index_dtype_name(ds.dtype()),
              int(ds.dtype()), (long long)data::index_dtype_size(ds.dtype()));
  std::printf("sequences  %lld (%lld empty)\n", (long long)ds.num_sequences(), (long long)empty);
  std::printf("documents  %lld\n", (long long)ds.num_documents());
  std::printf("tokens     %lld\n", (long long)ds.num_tokens());
  if (!lens.empty())
    std::printf("length     min %d  p50 %d  mean %.1f  p90 %d  p99 %d  max %d\n", lens.front(),
                pct(0.5), double(ds.num_tokens()) / double(lens.size()), pct(0.9), pct(0.99),
                lens.back());
}

// --fim-data and its flags, as `megatron train` reads them (training/fim_setup.h).
const char* const kFimFlags[][2] = {
    {"--fim-rate", "fim_rate"},
    {"--fim-spm-rate", "fim_spm_rate"},
    {"--fim-split-sample", "fim_split_sample"},
    {"--fim-fragment-rate", "fim_fragment_rate"},
    {"--fim-no-prefix", "fim_no_prefix"},
    {"--fim-prefix-token", "fim_prefix_token"},
    {"--fim-middle-token", "fim_middle_token"},
    {"--fim-suffix-token", "fim_suffix_token"},
    {"--fim-pad-token", "fim_pad_token"},
    {"--fim-eod-token", "fim_eod_token"},
};

void add_fim_flags(Flags& f) {
  f.add("--fim-data", Flags::Switch, "show the samples as --fim-data transforms them");
  for (const auto& [flag, dest] : kFimFlags) f.add(flag, Flags::Value, "as for megatron train");
}

std::shared_ptr<const data::FimConfig> fim_config(const Flags& f, const data::Tokenizer* tok,
                                                  bool mock) {
  training::Args t;
  t.fim_data = f.has("--fim-data"), t.mock_data = mock;
  t.tokenizer_type = f.get("--tokenizer-type", t.tokenizer_type);
  t.fim_rate = f.get_double("--fim-rate", t.fim_rate);
  t.fim_spm_rate = f.get_double("--fim-spm-rate", t.fim_spm_rate);
  if (f.has("--fim-fragment-rate")) t.fim_fragment_rate = f.get_double("--fim-fragment-rate", 0);
  if (f.has("--fim-split-sample")) t.fim_split_sample = f.get("--fim-split-sample");
  if (f.has("--fim-no-prefix")) t.fim_no_prefix = f.get("--fim-no-prefix");
  t.fim_prefix_token = f.get("--fim-prefix-token", t.fim_prefix_token);
  t.fim_middle_token = f.get("--fim-middle-token", t.fim_middle_token);
  t.fim_suffix_token = f.get("--fim-suffix-token", t.fim_suffix_token);
  t.fim_pad_token = f.get("--fim-pad-token", t.fim_pad_token);
  t.fim_eod_token = f.get("--fim-eod-token", t.fim_eod_token);
  for (const auto& [flag, dest] : kFimFlags)
    if (f.has(flag)) t.given[dest] = f.get(flag);
  training::validate_fim(t);
  if (!t.fim_data) return nullptr;
  MCPP_CHECK_HINT(tok, "add the run's tokenizer flags (--tokenizer-type ...)",
                  "megatron inspect --fim-data needs the tokenizer");
  return training::fim_config(t, *tok);
}

int run_inspect(const std::vector<std::string>& args) {
  Flags f;
  f.add("--data-path", Flags::List, "dataset prefixes, optionally weighted: W1 P1 W2 P2")
      .add("--split", Flags::Value, "train,valid,test weights (default 969, 30, 1)")
      .add("--train-data-path", Flags::List, "the train split's own prefixes (as --data-path)")
      .add("--valid-data-path", Flags::List, "the valid split's own prefixes")
      .add("--test-data-path", Flags::List, "the test split's own prefixes")
      .add("--data-cache-path", Flags::Value, "folder of cached index .npy files")
      .add("--mock-data", Flags::Switch, "Megatron's mock dataset")
      .add("--seq-length", Flags::Value, "sequence length S")
      .add("--seed", Flags::Value, "random seed (default 1234)")
      .add("--train-samples", Flags::Value, "training samples")
      .add("--train-iters", Flags::Value, "training iterations (with --global-batch-size)")
      .add("--global-batch-size", Flags::Value, "samples per iteration (default 1)")
      .add("--eval-iters", Flags::Value, "evaluation iterations (default 100)")
      .add("--eval-interval", Flags::Value, "iterations between evaluations (default 1000)")
      .add("--show-samples", Flags::Value, "I:J, the samples to print")
      .add("--show-split", Flags::Value, "train | valid | test (default train)")
      .add("--help", Flags::Switch, "this text");
  add_tokenizer_flags(f);
  add_fim_flags(f);
  f.parse(args, "inspect");
  const bool per_split =
      f.has("--train-data-path") || f.has("--valid-data-path") || f.has("--test-data-path");
  if (f.has("--help") ||
      (f.positional().empty() && !f.has("--data-path") && !f.has("--mock-data") && !per_split)) {
    std::printf(
        "usage: megatron inspect PREFIX...\n       megatron inspect --data-path ... --seq-length S "
        "--train-samples T --show-samples I:J\n\n%s",
        f.help().c_str());
    return f.has("--help") ? 0 : 1;
  }
  int bad_total = 0;
  for (const auto& p : f.positional()) {
    // A directory is a checkpoint (a save folder or one iter_* folder); else a dataset prefix.
    namespace fs = std::filesystem;
    if (fs::is_directory(p)) {
      // A Megatron-LM checkpoint (legacy or torch_dist): say what it is and how to convert it.
      if (auto mg = checkpoint::megatron::detect(p)) {
        for (const auto& line : checkpoint::megatron::describe(*mg))
          std::printf("%s\n", line.c_str());
        continue;
      }
      const bool ckpt = !checkpoint::list_iterations(p).empty() ||
                        fs::exists(fs::path(p) / checkpoint::kTrackerFile) ||
                        fs::exists(fs::path(p) / checkpoint::kMetadataFile);
      if (!ckpt)
        throw Error(fmt::format("{} is a folder with no checkpoint in it (no {}, no iter_*/{} "
                                "of a complete save)",
                                p, checkpoint::kTrackerFile, checkpoint::kMetadataFile),
                    "give a checkpoint folder, or a dataset prefix (PREFIX for PREFIX.bin and "
                    "PREFIX.idx)");
      int bad = 0;
      std::printf("%s", checkpoint::describe_checkpoint(p, &bad).c_str());
      bad_total += bad;
    } else {
      describe_prefix(p);
    }
  }
  if (bad_total)
    throw Error(fmt::format("{} shard(s) failed verification (listed above as BAD)", bad_total),
                "restore the files from a copy, or load an earlier iteration with --ckpt-step");
  if (!f.has("--data-path") && !f.has("--mock-data") && !per_split) return 0;
  MCPP_CHECK_HINT(!per_split || (!f.has("--data-path") && !f.has("--split")),
                  "give --data-path (with --split) or the per-split paths, not both",
                  "--train/valid/test-data-path with --data-path or --split");

  data::GPTDatasetsArgs a;
  a.data_path = f.list("--data-path");
  const char* per_split_flags[] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (int i = 0; i < 3; ++i)
    if (f.has(per_split_flags[i])) a.per_split[size_t(i)] = f.list(per_split_flags[i]);
  a.mock_data = f.has("--mock-data");
  a.split = f.get("--split", "969, 30, 1");
  a.data_cache_path = f.get("--data-cache-path");
  a.seq_length = f.get_int("--seq-length", 0);
  a.seed = uint32_t(f.get_int("--seed", 1234));
  const int64_t gbs = f.get_int("--global-batch-size", 1);
  int64_t train_iters = 0;
  if (f.has("--train-samples")) {
    a.num_samples[0] = f.get_int("--train-samples", 0);
    train_iters = *a.num_samples[0] / gbs;
  } else if (f.has("--train-iters")) {
    train_iters = f.get_int("--train-iters", 0);
    a.num_samples[0] = train_iters * gbs;
  } else {
    throw Error("give --train-samples or --train-iters",
                "the sample order depends on the number of samples");
  }
  const int64_t eval_iters = f.get_int("--eval-iters", 100),
                eval_interval = f.get_int("--eval-interval", 1000),
                egbs = f.get_int("--eval-global-batch-size", gbs);
  const std::optional<int64_t> start_eval =
      f.has("--start-eval-at-iter") ? std::optional<int64_t>(f.get_int("--start-eval-at-iter", 0))
                                    : std::nullopt;
  a.num_samples[1] =
      data::validation_samples(train_iters, eval_interval, eval_iters, egbs, start_eval);
  a.num_samples[2] = eval_iters * egbs;
  std::unique_ptr<data::Tokenizer> tok;  // held by --fim-data's config while samples print
  if (f.has("--tokenizer-type") || a.mock_data) {
    tok = data::make_tokenizer(tokenizer_args(f));
    a.eod = tok->eod();
    a.pad = data::pad_id_for(tok->pad(), tok->eod());
    a.vocab_size = tok->vocab_size();
  }
  a.fim = fim_config(f, tok.get(), a.mock_data);
  const std::string which = f.get("--show-split", "train");
  int idx = which == "train" ? 0 : which == "valid" ? 1 : which == "test" ? 2 : -1;
  if (idx < 0)
    throw Error(fmt::format("--show-split must be train, valid or test, got '{}'", which));
  // Only the shown split must hold samples: with Megatron's default --split 969,30,1 a small
  // dataset's test split rounds to no sequences, which matters only to a run that reads it.
  a.reads = {false, false, false};
  a.reads[size_t(idx)] = f.has("--show-samples");
  auto sets = data::build_train_valid_test_datasets(a);
  for (int i = 0; i < 3; ++i)
    std::fprintf(stderr, "%s: %s\n",
                 i == 0   ? "train"
                 : i == 1 ? "valid"
                          : "test",
                 sets[i] ? sets[i]->describe().c_str()
                         : "(not built: zero width, or too small and not shown)");
  if (!f.has("--show-samples")) return 0;
  if (!sets[idx]) throw Error(fmt::format("the {} split is empty", which));
  const std::string range = f.get("--show-samples");
  auto colon = range.find(':');
  int64_t lo = 0, hi = 0;
  try {
    lo = std::stoll(range.substr(0, colon));
    hi = colon == std::string::npos ? lo + 1 : std::stoll(range.substr(colon + 1));
  } catch (...) {
    throw Error(fmt::format("--show-samples '{}' is not I:J", range));
  }
  hi = std::min(hi, sets[idx]->size());
  std::vector<int64_t> text;
  for (int64_t s = lo; s < hi; ++s) {
    sets[idx]->get_text(s, text);
    std::string line = std::to_string(s) + ":";
    for (int64_t t : text) line += " " + std::to_string(t);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

static Registrar register_inspect{"inspect", run_inspect};

}  // namespace
}  // namespace mcpp::tools
