// `megatron generate`: sample text from a checkpoint (docs/generation.md).
//
//   megatron generate --load DIR [--ckpt-step N] --tokenizer-type ... [tokenizer files]
//                     --prompt TEXT [--prompt TEXT ...] | --prompts-file FILE
//                     [--num-tokens-to-generate 64] [--greedy | --temperature T
//                     [--top-k K | --top-p P]] [--seed S] [--stop-token ID ...]
//                     [--micro-batch-size N] [--device cpu|cuda] [--dtype fp32|bf16|fp16]
//   mpirun -np 2 megatron generate --tensor-model-parallel-size 2 ...
//
// The model's shape comes from the checkpoint's metadata (any TP layout; the weights are
// loaded without gradient or optimizer buffers, checkpoint/weights.h); tokenizer flags
// default to those recorded in the checkpoint's training config when it has them.
// Prompts run in batches of --micro-batch-size (default 1): a batch of one streams its
// continuation to stdout as it is produced; a larger batch prints each prompt's text when
// the batch ends, in prompt order. A line with the prefill and decode speed per prompt
// goes to stderr. Under a launcher the ranks form one tensor-parallel group: rank 0 reads
// and tokenizes the prompts and broadcasts the token ids; only rank 0 prints.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "comm/world.h"
#include "checkpoint/tokenizer_files.h"
#include "data/tokenizers/tokenizer.h"
#include "inference/generator.h"
#include "ops/ops.h"
#include "tools/checkpoint_tokenizer.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/inference_session.h"

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

// Rank 0 sends the prompts' token ids to the TP group: a header {failed, count, total},
// the lengths, then the ids (i64). The other ranks pass nothing and receive them.
std::vector<std::vector<int32_t>> broadcast_prompts(comm::Communicator& c,
                                                    const std::vector<std::vector<int32_t>>& ids,
                                                    bool failed) {
  Stream& st = ops::default_stream(Device::CPU);
  Tensor head = Tensor::zeros({3}, DType::I64);
  int64_t* h = head.data<int64_t>();
  if (c.rank() == 0) {
    h[0] = failed ? 1 : 0, h[1] = int64_t(ids.size());
    for (const auto& p : ids) h[2] += int64_t(p.size());
  }
  c.broadcast(head, 0, st);
  if (h[0] != 0)
    throw Error("megatron generate: rank 0 could not read the prompts (its message says why)");
  Tensor lens = Tensor::zeros({std::max<int64_t>(h[1], 1)}, DType::I64);
  Tensor flat = Tensor::zeros({std::max<int64_t>(h[2], 1)}, DType::I64);
  if (c.rank() == 0) {
    int64_t k = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      lens.data<int64_t>()[i] = int64_t(ids[i].size());
      for (int32_t id : ids[i]) flat.data<int64_t>()[k++] = id;
    }
  }
  c.broadcast(lens, 0, st);
  c.broadcast(flat, 0, st);
  if (c.rank() == 0) return ids;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(h[1]));
  int64_t k = 0;
  for (size_t i = 0; i < out.size(); ++i)
    for (int64_t j = 0; j < lens.data<int64_t>()[i]; ++j)
      out[i].push_back(int32_t(flat.data<int64_t>()[k++]));
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
      .add("--micro-batch-size", Flags::Value, "prompts generated together (default 1)")
      .add("--tensor-model-parallel-size", Flags::Value,
           "TP ranks (run under mpirun/torchrun with that many processes; default 1)")
      .add("--device", Flags::Value, "cpu (default) or cuda")
      .add("--dtype", Flags::Value,
           "weights, activations and KV cache: fp32 (default), or bf16 / fp16 on cuda (the "
           "checkpoint's f32 cast once at load, as `megatron serve --device cuda` runs)")
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
  MCPP_CHECK_HINT(!prompts.empty() || f.has("--prompts-file"),
                  "pass --prompt TEXT (repeatable) or --prompts-file FILE",
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

  const int64_t mbs = f.get_int("--micro-batch-size", 1);
  MCPP_CHECK_HINT(mbs >= 1 && mbs <= 4096, "use --micro-batch-size N with 1 <= N <= 4096",
                  "--micro-batch-size {} is out of range", mbs);
  const InferenceTarget target = parse_inference_target(f, "fp32");
  const int64_t tp = target.tp;
  const Device device = target.device;
  const std::string& dev_name = target.dev_name;

  InferenceSession session = open_inference_session(f, target, "generate");
  const int rank = session.rank;
  comm::Communicator* tp_comm = session.tp_comm;
  const std::string& dir = session.dir;
  const checkpoint::ModelWeights& w = session.weights;
  const model::TransformerConfig& cfg = session.cfg;
  const data::Tokenizer* tok = session.tok.get();
  opts.vocab_size = tok->vocab_size();
  opts.eod = tok->eod();
  if (rank == 0)
    std::fprintf(stderr,
                 "[generate] %s iteration %lld: %lld layers, hidden %lld, %lld heads, vocab %lld; "
                 "%s; %s, TP %lld, micro-batch %lld; %d threads\n",
                 dir.c_str(), (long long)w.state.iteration, (long long)cfg.num_layers,
                 (long long)cfg.hidden_size, (long long)cfg.num_attention_heads,
                 (long long)cfg.padded_vocab_size, tok->name().c_str(), dev_name.c_str(),
                 (long long)tp, (long long)mbs, omp_get_max_threads());

  // Rank 0 encodes every prompt before generating (a too-long one fails before any
  // output) and broadcasts the ids; a failure there is announced so no rank waits.
  std::vector<std::vector<int32_t>> ids;
  if (rank == 0) {
    std::string failure;
    try {
      if (f.has("--prompts-file"))
        for (auto& p : read_prompts_file(f.get("--prompts-file"))) prompts.push_back(p);
      MCPP_CHECK_HINT(!prompts.empty(), "pass --prompt TEXT (repeatable) or --prompts-file FILE",
                      "megatron generate: no prompt given");
      for (size_t i = 0; i < prompts.size(); ++i) {
        ids.push_back(tok->encode(prompts[i]));
        MCPP_CHECK_HINT(!ids.back().empty(), "give a non-empty prompt",
                        "prompt {} encodes to no tokens", i + 1);
        MCPP_CHECK_HINT(int64_t(ids.back().size()) <= cfg.max_position_embeddings,
                        fmt::format("shorten prompt {} to at most {} tokens", i + 1,
                                    cfg.max_position_embeddings),
                        "prompt {} has {} tokens, more than the model's "
                        "max_position_embeddings {}",
                        i + 1, ids.back().size(), cfg.max_position_embeddings);
      }
    } catch (const Error& e) {
      if (!tp_comm) throw;
      failure = e.what();
    }
    if (tp_comm) broadcast_prompts(*tp_comm, ids, !failure.empty());
    if (!failure.empty()) throw Error(failure);
  } else {
    ids = broadcast_prompts(*tp_comm, {}, false);
  }

  inference::Generator gen(w.params, cfg, tp_comm);
  // The cache holds what this run can reach, not max_position_embeddings: a RoPE model's
  // metadata could name 2^40 positions that no tensor backs.
  int64_t reach = 0;
  for (const auto& p : ids) reach = std::max(reach, int64_t(p.size()));
  reach = std::min(cfg.max_position_embeddings,
                   reach + std::min(opts.tokens_to_generate, cfg.max_position_embeddings));
  const int64_t B = std::min<int64_t>(mbs, int64_t(ids.size()));
  inference::KVCache cache(cfg, reach, B, device);
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_n = 0, decode_n = 0;
  for (size_t first = 0; first < ids.size(); first += size_t(B)) {
    const size_t n = std::min(ids.size() - first, size_t(B));
    std::vector<std::span<const int32_t>> batch;
    for (size_t i = first; i < first + n; ++i) batch.emplace_back(ids[i]);
    // Megatron's response text is detokenize(prompt + generated). A batch of one prints
    // it incrementally: the text of all tokens so far beyond what is already printed (a
    // token's text can depend on its neighbours: spaces between ids, SentencePiece's
    // "▁", split UTF-8). A larger batch prints each text when the batch ends.
    const bool stream = n == 1 && rank == 0;
    std::vector<std::vector<int32_t>> all(ids.begin() + long(first), ids.begin() + long(first + n));
    std::string printed;
    if (stream) {
      printed = tok->decode(all[0]);
      std::fputs(printed.c_str(), stdout);
      std::fflush(stdout);
    }
    auto on_token = [&](size_t i, int32_t id) {
      if (!opts.ignore_eod && id == opts.eod) return;
      all[i].push_back(id);
      if (!stream) return;
      std::string text = tok->decode(all[i]);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        std::fwrite(text.data() + printed.size(), 1, text.size() - printed.size(), stdout);
        std::fflush(stdout);
        printed = std::move(text);
      }
    };
    auto res = inference::generate_batch(gen, cache, batch, opts, first, on_token);
    if (rank != 0) continue;
    for (size_t i = 0; i < n; ++i) {
      if (!stream) std::fputs(tok->decode(all[i]).c_str(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      const auto& r = res[i];
      prefill_s += r.prefill_seconds, decode_s += r.decode_seconds;
      prefill_n += r.prompt_tokens, decode_n += r.decode_steps;
      std::fprintf(stderr,
                   "[generate] prompt %zu/%zu: %lld prompt tokens, %zu generated (stop: %s) | "
                   "prefill %.1f tokens/s | decode %.1f tokens/s\n",
                   first + i + 1, ids.size(), (long long)r.prompt_tokens, r.tokens.size(),
                   r.stop_reason.c_str(),
                   r.prefill_seconds > 0 ? double(r.prompt_tokens) / r.prefill_seconds : 0.0,
                   r.decode_seconds > 0 ? double(r.decode_steps) / r.decode_seconds : 0.0);
    }
  }
  if (rank == 0)
    std::fprintf(stderr,
                 "[generate] total: prefill %lld tokens at %.1f tokens/s | decode %lld tokens "
                 "at %.1f tokens/s\n",
                 (long long)prefill_n, prefill_s > 0 ? double(prefill_n) / prefill_s : 0.0,
                 (long long)decode_n, decode_s > 0 ? double(decode_n) / decode_s : 0.0);
  return 0;
}

Registrar register_generate{"generate", run_generate};

}  // namespace
}  // namespace mcpp::tools
