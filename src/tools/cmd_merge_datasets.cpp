// `megatron merge-datasets`: Megatron's tools/merge_datasets.py. Every {prefix}.bin/.idx
// pair in --input is appended, in sorted prefix order, to one dataset written to
// --output-prefix; the dtype is the first dataset's and every other must match.
// Unlike the Python tool, files other than .bin/.idx in the folder are ignored.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "data/indexed_dataset.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace mcpp::tools {
namespace {

int run_merge_datasets(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  Flags f;
  f.add("--input", Flags::Value, "folder holding the PREFIX.bin/PREFIX.idx pairs to merge")
      .add("--output-prefix", Flags::Value, "writes OUTPUT_PREFIX.bin/.idx")
      .add("--multimodal", Flags::Switch, "not supported (an error)")
      .add("--help", Flags::Switch, "this text");
  f.parse(args, "merge-datasets");
  if (f.has("--help")) {
    std::printf("usage: megatron merge-datasets --input DIR --output-prefix PREFIX\n\n%s",
                f.help().c_str());
    return 0;
  }
  if (f.has("--multimodal"))
    throw Error("merge-datasets --multimodal is not supported", "merge text datasets only");
  const std::string in = f.get("--input"), out = f.get("--output-prefix");
  if (in.empty() || !fs::is_directory(in))
    throw Error(fmt::format("--input '{}' is not a folder", in),
                "give the folder that holds the .bin/.idx pairs to merge");
  if (out.empty()) throw Error("--output-prefix is required");
  std::set<std::string> prefixes;
  for (const auto& e : fs::directory_iterator(in)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".bin" && ext != ".idx") continue;
    fs::path base = e.path();
    base.replace_extension();
    const std::string pair = ext == ".bin" ? ".idx" : ".bin";
    if (!fs::is_regular_file(base.string() + pair))
      throw Error(fmt::format("{}: {} file not provided for {}", in, pair, base.string()),
                  "every dataset needs both PREFIX.bin and PREFIX.idx");
    prefixes.insert(base.string());
  }
  if (prefixes.empty())
    throw Error(fmt::format("--input {} holds no .bin/.idx pairs", in));
  std::unique_ptr<data::IndexedDatasetBuilder> builder;
  for (const std::string& p : prefixes) {  // std::set: sorted, as Python's sorted()
    if (!builder)
      builder = std::make_unique<data::IndexedDatasetBuilder>(out, data::IndexedDataset(p).dtype());
    builder->add_index(p);
  }
  builder->finalize();
  data::IndexedDataset merged(out);
  log::info("merge-datasets: {} datasets -> {}: {} sequences, {} documents", prefixes.size(), out,
            merged.num_sequences(), merged.num_documents());
  return 0;
}

static Registrar register_merge_datasets{"merge-datasets", run_merge_datasets};

}  // namespace
}  // namespace mcpp::tools
