// `megatron generate`: sample text from a checkpoint (docs/generation.md).
//
//   megatron generate --load DIR [--ckpt-step N] --tokenizer-type ... [tokenizer files]
//                     --prompt TEXT [--prompt TEXT ...] | --prompts-file FILE
//                     [--num-tokens-to-generate 64] [--greedy | --temperature T
//                     [--top-k K | --top-p P]] [--seed S] [--stop-token ID ...]
//
// The model's shape comes from the checkpoint's metadata; tokenizer flags default to
// those recorded in the checkpoint's training config when it has them. Prompts run one
// at a time; each continuation streams to stdout as it is produced, and a line with the
// prefill and decode speed goes to stderr.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "data/tokenizers/tokenizer.h"
#include "inference/generator.h"
#include "model/gpt_model.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace mcpp::tools {
namespace {

// --prompt may be repeated (Flags keeps only the last value of a flag), so take them out first.
std::vector<std::string> take_prompts(std::vector<std::string>& args) {
  std::vector<std::string> prompts, rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--prompt") {
      if (i + 1 >= args.size()) throw Error("megatron generate: --prompt needs a value");
      prompts.push_back(args[++i]);
    } else if (args[i].rfind("--prompt=", 0) == 0) {
      prompts.push_back(args[i].substr(9));
    } else {
      rest.push_back(args[i]);
    }
  }
  args = std::move(rest);
  return prompts;
}

double get_double(const Flags& f, const std::string& n, double def) {
  if (!f.has(n)) return def;
  try {
    size_t used = 0;
    double v = std::stod(f.get(n), &used);
    if (used == f.get(n).size()) return v;
  } catch (...) {
  }
  throw Error(fmt::format("{} expects a number, got '{}'", n, f.get(n)));
}

// Tokenizer flags, falling back to the training config stored in the checkpoint.
data::TokenizerArgs tokenizer_args(const Flags& f, const nlohmann::json& md) {
  const nlohmann::json cfg = md.contains("state") && md["state"].contains("config")
                                 ? md["state"]["config"]
                                 : nlohmann::json::object();
  auto recorded = [&](const char* key) -> std::string {
    if (!cfg.is_object() || !cfg.contains(key)) return {};
    const auto& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    return {};
  };
  auto pick = [&](const char* flag, const char* key) {
    return f.has(flag) ? f.get(flag) : recorded(key);
  };
  // A path the checkpoint records (not the user) is opened only when it is a regular file or
  // a folder: a checkpoint from elsewhere naming a FIFO or /dev/zero must not hang the run.
  auto pick_path = [&](const char* flag, const char* key) {
    if (f.has(flag)) return f.get(flag);
    const std::string p = recorded(key);
    std::error_code ec;
    if (p.empty()) return p;
    MCPP_CHECK_HINT(std::filesystem::is_regular_file(p, ec) || std::filesystem::is_directory(p, ec),
                    fmt::format("pass {} with the tokenizer file", flag),
                    "the checkpoint's recorded {} '{}' is not a regular file", key, p);
    std::fprintf(stderr, "[generate] using the tokenizer file %s recorded in the checkpoint (%s "
                 "chooses another)\n", p.c_str(), flag);
    return p;
  };
  data::TokenizerArgs ta;
  ta.type = pick("--tokenizer-type", "tokenizer_type");
  if (ta.type.empty()) ta.type = "GPT2BPETokenizer";
  ta.vocab_file = pick_path("--vocab-file", "vocab_file");
  ta.merge_file = pick_path("--merge-file", "merge_file");
  ta.tokenizer_model = pick_path("--tokenizer-model", "tokenizer_model");
  if (std::string vs = pick("--vocab-size", "vocab_size"); !vs.empty() && vs != "None") {
    try {
      ta.vocab_size = std::stoll(vs);
    } catch (...) {
      throw Error(fmt::format("--vocab-size expects an integer, got '{}'", vs));
    }
  }
  return ta;
}

std::vector<std::string> read_prompts_file(const std::string& path) {
  // A pipe is fine (--prompts-file <(...)); a directory would read as an empty file.
  std::error_code ec;
  MCPP_CHECK_HINT(!std::filesystem::is_directory(path, ec), "give --prompts-file a text file",
                  "--prompts-file {} is a directory, not a file", path);
  std::ifstream in(path);
  MCPP_CHECK_HINT(in.good(), "check the path given to --prompts-file",
                  "cannot read --prompts-file {}", path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

int run_generate(const std::vector<std::string>& raw_args) {
  std::vector<std::string> args = raw_args;
  std::vector<std::string> prompts = take_prompts(args);
  Flags f;
  f.add("--load", Flags::Value, "checkpoint directory (written by train --save)")
      .add("--ckpt-step", Flags::Value, "iteration to load (default: the latest)")
      .add("--prompts-file", Flags::Value, "one prompt a line (also: --prompt TEXT, repeatable)")
      .add("--num-tokens-to-generate", Flags::Value, "new tokens per prompt (default 64)")
      .add("--max-new-tokens", Flags::Value, "alias of --num-tokens-to-generate")
      .add("--greedy", Flags::Switch, "argmax decoding (same as --top-k 1)")
      .add("--temperature", Flags::Value, "0 < T <= 100 (default 1.0)")
      .add("--top-k", Flags::Value, "sample from the K most likely tokens (0: off)")
      .add("--top-p", Flags::Value, "sample from the smallest nucleus of probability P (0: off)")
      .add("--seed", Flags::Value, "random seed of the sampler (default 1234)")
      .add("--stop-token", Flags::List, "token ids that end a continuation (EOD always does)")
      .add("--ignore-eod", Flags::Switch, "do not stop at the tokenizer's end-of-document")
      .add("--threads", Flags::Value, "CPU threads (default: OpenMP's)")
      .add("--help", Flags::Switch, "this text");
  add_tokenizer_flags(f);
  f.parse(args, "generate");
  if (f.has("--help")) {
    std::printf("usage: megatron generate --load DIR --prompt TEXT [flags]\n\n%s",
                f.help().c_str());
    return 0;
  }
  if (!f.positional().empty())
    throw Error(fmt::format("megatron generate: unexpected argument '{}'", f.positional()[0]),
                "put the prompt after --prompt (quoted)");
  MCPP_CHECK_HINT(f.has("--load"), "pass --load DIR, the --save directory of a training run",
                  "megatron generate: no checkpoint given");
  if (f.has("--prompts-file"))
    for (auto& p : read_prompts_file(f.get("--prompts-file"))) prompts.push_back(p);
  MCPP_CHECK_HINT(!prompts.empty(), "pass --prompt TEXT (repeatable) or --prompts-file FILE",
                  "megatron generate: no prompt given");
  if (f.has("--threads")) {
    const int64_t n = f.get_int("--threads", 1);
    MCPP_CHECK_HINT(n >= 1 && n <= 4096, "give --threads at most the number of cores",
                    "--threads {} is outside [1, 4096]", n);
    omp_set_num_threads(int(n));
  }
  openblas_set_num_threads(omp_get_max_threads());

  // Sampling settings first: a typo should not cost a model load.
  inference::GenerateOptions opts;
  opts.tokens_to_generate =
      f.get_int("--num-tokens-to-generate", f.get_int("--max-new-tokens", 64));
  MCPP_CHECK_HINT(opts.tokens_to_generate >= 0, "use --num-tokens-to-generate N with N >= 0",
                  "--num-tokens-to-generate {} is negative", opts.tokens_to_generate);
  auto& sp = opts.sampling;
  sp.greedy = f.has("--greedy");
  sp.temperature = get_double(f, "--temperature", 1.0);
  sp.top_k = f.get_int("--top-k", 0);
  sp.top_p = get_double(f, "--top-p", 0.0);
  sp.seed = uint64_t(f.get_int("--seed", 1234));
  inference::validate(sp);
  for (const auto& s : f.list("--stop-token")) {
    try {
      opts.stop_tokens.push_back(std::stoll(s));
    } catch (...) {
      throw Error(fmt::format("--stop-token expects token ids, got '{}'", s));
    }
  }
  opts.ignore_eod = f.has("--ignore-eod");

  // Checkpoint: shape from its metadata, then the weights.
  const std::string dir = f.get("--load");
  MCPP_CHECK_HINT(std::filesystem::is_directory(dir),
                  "pass the --save directory of a training run to --load",
                  "--load {}: no such directory", dir);
  MCPP_CHECK_HINT(checkpoint::latest_iteration(dir).has_value(),
                  "train with --save DIR first, or point --load at a directory holding iter_*/",
                  "--load {}: no checkpoint found (no iter_*/metadata.json)", dir);
  const std::optional<int64_t> step = f.get_opt_int("--ckpt-step");
  const nlohmann::json md = checkpoint::read_metadata(dir, step);
  model::TransformerConfig cfg = checkpoint::model_config_from_metadata(md);
  cfg.dtype = DType::F32, cfg.tp_size = 1, cfg.tp_rank = 0;
  cfg.hidden_dropout = cfg.attention_dropout = 0;
  model::GPTModel model(cfg);
  checkpoint::LoadOptions lo;
  lo.load_rng = false;
  const auto st = checkpoint::load_checkpoint(dir, step, model, nullptr, lo);

  auto tok = data::make_tokenizer(tokenizer_args(f, md));
  MCPP_CHECK_HINT(tok->vocab_size() <= cfg.padded_vocab_size,
                  "use the tokenizer the model was trained with",
                  "the tokenizer has {} tokens but the checkpoint's vocabulary is {}",
                  tok->vocab_size(), cfg.padded_vocab_size);
  opts.vocab_size = tok->vocab_size();
  opts.eod = tok->eod();
  std::fprintf(stderr,
               "[generate] %s iteration %lld: %lld layers, hidden %lld, %lld heads, vocab %lld; "
               "%s; %d threads\n",
               dir.c_str(), (long long)st.iteration, (long long)cfg.num_layers,
               (long long)cfg.hidden_size, (long long)cfg.num_attention_heads,
               (long long)cfg.padded_vocab_size, tok->name().c_str(), omp_get_max_threads());

  // Encode every prompt before generating, so a too-long one fails before any output.
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(tok->encode(prompts[i]));
    MCPP_CHECK_HINT(!ids.back().empty(), "give a non-empty prompt",
                    "prompt {} encodes to no tokens", i + 1);
    MCPP_CHECK_HINT(
        int64_t(ids.back().size()) <= cfg.max_position_embeddings,
        fmt::format("shorten prompt {} to at most {} tokens", i + 1, cfg.max_position_embeddings),
        "prompt {} has {} tokens, more than the model's max_position_embeddings {}", i + 1,
        ids.back().size(), cfg.max_position_embeddings);
  }

  inference::Generator gen(model.params(), model.config());
  // The cache holds what this run can reach, not max_position_embeddings: a RoPE model's
  // metadata could name 2^40 positions that no tensor backs.
  int64_t reach = 0;
  for (const auto& p : ids) reach = std::max(reach, int64_t(p.size()));
  reach = std::min(cfg.max_position_embeddings,
                   reach + std::min(opts.tokens_to_generate, cfg.max_position_embeddings));
  inference::KVCache cache(cfg, reach, 1);
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_n = 0, decode_n = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Megatron's response text is detokenize(prompt + generated); print it incrementally:
    // the text of all tokens so far beyond what is already printed (a token's text can
    // depend on its neighbours: spaces between ids, SentencePiece's "▁", split UTF-8).
    std::vector<int32_t> all = ids[i];
    std::string printed = tok->decode(all);
    std::fputs(printed.c_str(), stdout);
    std::fflush(stdout);
    auto on_token = [&](int32_t id) {
      if (!opts.ignore_eod && id == opts.eod) return;
      all.push_back(id);
      std::string text = tok->decode(all);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
        std::fflush(stdout);
        printed = std::move(text);
      }
    };
    auto r = inference::generate(gen, cache, ids[i], opts, i, on_token);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    prefill_s += r.prefill_seconds, decode_s += r.decode_seconds;
    prefill_n += r.prompt_tokens, decode_n += r.decode_steps;
    std::fprintf(stderr,
                 "[generate] prompt %zu/%zu: %lld prompt tokens, %zu generated (stop: %s) | "
                 "prefill %.1f tokens/s | decode %.1f tokens/s\n",
                 i + 1, prompts.size(), (long long)r.prompt_tokens, r.tokens.size(),
                 r.stop_reason.c_str(),
                 r.prefill_seconds > 0 ? double(r.prompt_tokens) / r.prefill_seconds : 0.0,
                 r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0.0);
  }
  std::fprintf(stderr,
               "[generate] total: prefill %lld tokens at %.1f tokens/s | decode %lld tokens at "
               "%.1f tokens/s\n",
               (long long)prefill_n, prefill_s > 0 ? double(prefill_n) / prefill_s : 0.0,
               (long long)decode_n, decode_s > 0 ? double(decode_n) / decode_s : 0.0);
  return 0;
}

Registrar reg{"generate", run_generate};

}  // namespace
}  // namespace mcpp::tools
