// `megatron preprocess`: Megatron's tools/preprocess_data.py, multi-threaded.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/log.h"
#include "data/preprocess.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace mcpp::tools {
namespace {

int run_preprocess(const std::vector<std::string>& args) {
  Flags f;
  f.add("--input", Flags::List, "JSON-lines file(s): .jsonl, .json, .gz, .zst")
      .add("--json-keys", Flags::List, "keys to extract (default: text)")
      .add("--output-prefix", Flags::Value, "writes PREFIX_KEY_document.{bin,idx}")
      .add("--append-eod", Flags::Switch,
           "append the tokenizer's EOD id to every non-empty document")
      .add("--workers", Flags::Value, "tokenising threads (default 1)")
      .add("--skip-bad-lines", Flags::Switch,
           "count and skip lines that are not valid JSON or lack a key")
      .add("--split-sentences", Flags::Switch, "not implemented (an error)")
      .add("--keep-newlines", Flags::Switch, "only with --split-sentences")
      .add("--partitions", Flags::Value, "accepted for compatibility; must be 1")
      .add("--log-interval", Flags::Value,
           "print 'Processed N documents (docs/s, MB/s)' every N documents (default: a "
           "progress line on a terminal)")
      .add("--lang", Flags::Value, "accepted for compatibility")
      .add("--keep-sequential-samples", Flags::Switch,
           "accepted for compatibility (order is always kept)")
      .add("--help", Flags::Switch, "this text");
  add_tokenizer_flags(f);
  // preprocess_data.py's argparse takes unambiguous prefixes (--json-key for --json-keys).
  f.allow_abbreviations();
  f.parse(args, "preprocess");
  if (f.has("--help")) {
    std::printf("usage: megatron preprocess --input FILE --output-prefix PREFIX [flags]\n\n%s",
                f.help().c_str());
    return 0;
  }
  if (f.has("--split-sentences"))
    throw Error("--split-sentences is not implemented",
                "preprocess whole documents (drop the flag)");
  if (f.get_int("--partitions", 1) != 1)
    throw Error("--partitions > 1 is not needed: megatron preprocess streams with bounded memory",
                "drop --partitions and use --workers");
  const auto t_load = std::chrono::steady_clock::now();
  auto tok = data::make_tokenizer(tokenizer_args(f));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  data::PreprocessOptions o;
  o.inputs = f.list("--input");
  if (f.has("--json-keys")) o.json_keys = f.list("--json-keys");
  o.output_prefix = f.get("--output-prefix");
  o.append_eod = f.has("--append-eod");
  o.workers = int(std::clamp<int64_t>(f.get_int("--workers", 1), -1, 1 << 30));  // checked there
  o.skip_bad_lines = f.has("--skip-bad-lines");
  o.log_interval = f.get_int("--log-interval", 0);
  if (o.log_interval < 0)
    throw Error(fmt::format("--log-interval {} is negative", o.log_interval),
                "give --log-interval N >= 1 (documents between progress lines)");
  if (f.has("--log-interval")) o.progress = false;
  auto st = data::preprocess(o, *tok);
  for (const auto& k : o.json_keys) log::info("wrote {}_{}_document.bin/.idx", o.output_prefix, k);
  log::info(
      "preprocess: {} documents{}, {} tokens, {:.2f} MB in {:.2f} s: {:.0f} docs/s, {:.2f} MB/s, "
      "{:.0f} tokens/s ({} workers; {:.2f} CPU s = {:.2f} MB per CPU-second; tokenizer loaded in "
      "{:.3f} s)",
      st.documents, st.skipped ? fmt::format(" ({} bad lines skipped)", st.skipped) : "", st.tokens,
      double(st.bytes_in) / 1e6, st.seconds, double(st.documents) / st.seconds,
      double(st.bytes_in) / 1e6 / st.seconds, double(st.tokens) / st.seconds, o.workers,
      st.cpu_seconds, double(st.bytes_in) / 1e6 / st.cpu_seconds, load_s);
  return 0;
}

static Registrar register_preprocess{"preprocess", run_preprocess};

}  // namespace
}  // namespace mcpp::tools
