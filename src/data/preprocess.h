// `megatron preprocess`: JSON lines -> Megatron .bin/.idx, the counterpart of
// Megatron's tools/preprocess_data.py (without sentence splitting). For every
// --json-keys key, writes {output_prefix}_{key}_document.{bin,idx} byte-identical to
// what preprocess_data.py writes for the same token ids.
//
// Pipeline, three overlapped stages: the calling thread reads the input (.jsonl, .gz,
// .zst) into batches of whole lines; `workers` threads parse JSON, tokenise and convert
// the ids to the dataset dtype, in any order; one writer thread appends finished
// batches to the .bin/.idx in input order. Batches come from a pool of 2·workers + 2, so
// memory stays bounded whatever the input size. The tokenizer is shared by all workers
// (its BPE piece cache too); see docs/data.md for what limits scaling.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizers/tokenizer.h"

namespace mcpp::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;  // --input (one or more files)
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;      // --output-prefix
  bool append_eod = false;        // --append-eod
  int workers = 1;                // --workers
  bool skip_bad_lines = false;    // --skip-bad-lines: count and skip, do not fail
  int64_t batch_bytes = 128 << 10;  // bytes of input per batch (small: many batches keep
                                    // every worker busy to the end of the input)
  bool progress = true;           // progress line on a terminal
  int64_t log_interval = 0;       // --log-interval: a "Processed N documents" line every N
};

struct PreprocessStats {
  int64_t documents = 0, skipped = 0, tokens = 0, bytes_in = 0;
  double seconds = 0;      // wall clock
  double cpu_seconds = 0;  // user + system CPU time of the whole process during the run
};

PreprocessStats preprocess(const PreprocessOptions& opt, const Tokenizer& tokenizer);

}  // namespace mcpp::data
