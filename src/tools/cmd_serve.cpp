// `megatron serve`: a text-generation server over a checkpoint (docs/serving.md).
//
//   megatron serve --load DIR [--port 5000] [--host 127.0.0.1] [--device cpu|cuda]
//                  [--dtype bf16|fp16|fp32]
//                  [--inference-max-requests 8] [--inference-max-seq-length N]
//                  [--max-queued-requests 256] [--max-request-bytes 1048576]
//                  [--chat-template auto|plain|chatml|llama3|llama2] [tokenizer flags]
//   mpirun -np 2 megatron serve --load DIR --tensor-model-parallel-size 2 ...
//
// The model and tokenizer load as for `megatron generate` (the tokenizer defaults to the
// one recorded in the checkpoint). The KV cache is planned once (slots x positions) and
// printed; requests beyond it wait. Rank 0 serves HTTP; the engine loop runs on the main
// thread of every rank (TP ranks follow rank 0's operations). SIGINT/SIGTERM stop it:
// waiting and running requests get a 503, then the process exits 0.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "comm/world.h"
#include "data/tokenizers/tokenizer.h"
#include "inference/generator.h"
#include "serve/chat_template.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "serve/service.h"
#include "tools/checkpoint_tokenizer.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/inference_session.h"

namespace mcpp::tools {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal = sig; }

// tokenizer_config.json beside a Hugging Face tokenizer (or --tokenizer-config).
std::string tokenizer_config_path(const Flags& f, const data::TokenizerArgs& ta) {
  if (f.has("--tokenizer-config")) {
    const std::string p = f.get("--tokenizer-config");
    MCPP_CHECK_HINT(std::filesystem::is_regular_file(p), "pass the path of tokenizer_config.json",
                    "--tokenizer-config {}: no such file", p);
    return p;
  }
  if (ta.tokenizer_model.empty()) return {};
  std::filesystem::path m(ta.tokenizer_model);
  std::filesystem::path dir = std::filesystem::is_directory(m) ? m : m.parent_path();
  const auto p = dir / "tokenizer_config.json";
  return std::filesystem::is_regular_file(p) ? p.string() : std::string();
}

int run_serve(const std::vector<std::string>& args) {
  Flags f;
  f.add("--load", Flags::Value, "checkpoint directory (written by train --save or convert)")
      .add("--ckpt-step", Flags::Value, "iteration to load (default: the latest)")
      .add("--host", Flags::Value, "address to listen on (default 127.0.0.1)")
      .add("--port", Flags::Value, "TCP port (default 5000, Megatron's; 0 picks a free one)")
      .add("--port-file", Flags::Value, "write the bound port to this file once listening")
      .add("--device", Flags::Value, "cpu (default) or cuda")
      .add("--dtype", Flags::Value,
           "the weights, activations and KV cache: bf16 (default on cuda), fp16, fp32 (the "
           "only one on cpu)")
      .add("--no-cuda-graphs", Flags::Switch,
           "launch every op of a greedy decode step instead of replaying a CUDA graph per "
           "batch size (graphs: --device cuda, RoPE models, TP 1)")
      .add("--tensor-model-parallel-size", Flags::Value,
           "TP ranks (run under mpirun/torchrun with that many processes; default 1)")
      .add("--inference-max-requests", Flags::Value,
           "sequences decoded together: the KV cache's slots (default 8)")
      .add("--inference-max-seq-length", Flags::Value,
           "positions per slot, prompt + answer (default max_position_embeddings, at most 4096)")
      .add("--max-queued-requests", Flags::Value,
           "sequences that may wait for a slot; more get 503 (default 256)")
      .add("--max-request-bytes", Flags::Value, "largest request body (default 1048576)")
      .add("--served-model-name", Flags::Value, "the model id of /v1/models (default: --load's name)")
      .add("--chat-template", Flags::Value,
           "auto (tokenizer_config.json, else plain) | plain | chatml | llama3 | llama2")
      .add("--tokenizer-config", Flags::Value, "tokenizer_config.json holding the chat template")
      .add("--seed", Flags::Value, "sampler seed of requests that give none (default: random)")
      .add("--threads", Flags::Value, "CPU threads (default: OpenMP's)")
      .add("--help", Flags::Switch, "this text");
  add_tokenizer_flags(f);
  f.parse(args, "serve");
  if (f.has("--help")) {
    std::printf("usage: megatron serve --load DIR [flags]\n\n%s", f.help().c_str());
    return 0;
  }
  if (!f.positional().empty())
    throw Error(fmt::format("megatron serve: unexpected argument '{}'", f.positional()[0]));
  MCPP_CHECK_HINT(f.has("--load"), "pass --load DIR, the --save directory of a training run",
                  "megatron serve: no checkpoint given");
  if (f.has("--threads")) {
    const int64_t n = f.get_int("--threads", 1);
    MCPP_CHECK_HINT(n >= 1 && n <= 4096, "give --threads at most the number of cores",
                    "--threads {} is outside [1, 4096]", n);
    omp_set_num_threads(int(n));
  }
  openblas_set_num_threads(omp_get_max_threads());
  // On the GPU the checkpoint's f32 weights are cast once at load (bf16 by default: a
  // decode step reads every weight, so half the bytes is about twice the tokens/s).
  const InferenceTarget target = parse_inference_target(f, "bf16");
  const int64_t tp = target.tp;
  const Device device = target.device;
  const std::string& dev_name = target.dev_name;
  const std::string& dtype_str = target.dtype_name;
  MCPP_CHECK_HINT(!f.has("--no-cuda-graphs") || device == Device::CUDA,
                  "drop --no-cuda-graphs: the CPU runs no graphs",
                  "--no-cuda-graphs applies to --device cuda only");
  const int64_t port = f.get_int("--port", 5000);
  MCPP_CHECK_HINT(port >= 0 && port <= 65535, "use --port between 0 and 65535",
                  "--port {} is not a TCP port", port);
  const int64_t max_body = f.get_int("--max-request-bytes", 1 << 20);
  MCPP_CHECK_HINT(max_body >= 1024, "use --max-request-bytes of at least 1024",
                  "--max-request-bytes {} is too small", max_body);
  const std::string chat_choice = f.has("--chat-template") ? f.get("--chat-template") : "auto";

  InferenceSession session = open_inference_session(f, target, "serve");
  const int rank = session.rank;
  comm::Communicator* tp_comm = session.tp_comm;
  const std::string& dir = session.dir;
  const checkpoint::ModelWeights& w = session.weights;
  const model::TransformerConfig& cfg = session.cfg;
  const data::TokenizerArgs& ta = session.tok_args;
  const data::Tokenizer* tok = session.tok.get();
  serve::ChatTemplate chat = serve::load_chat_template(chat_choice, tokenizer_config_path(f, ta));

  serve::EngineOptions eo;
  eo.slots = f.get_int("--inference-max-requests", 8);
  eo.max_seq = f.get_int("--inference-max-seq-length",
                         std::min(cfg.max_position_embeddings, int64_t(4096)));
  eo.max_waiting = f.get_int("--max-queued-requests", 256);
  eo.vocab_size = tok->vocab_size();
  eo.eod = tok->eod();
  eo.device = device;
  inference::Generator gen(w.params, cfg, tp_comm);
  if (f.has("--no-cuda-graphs")) gen.set_cuda_graphs(false);
  serve::Engine engine(gen, eo, tp_comm);
  const auto st = engine.stats();
  if (rank == 0)
    std::fprintf(stderr,
                 "[serve] %s iteration %lld: %lld layers, hidden %lld, vocab %lld; %s; %s %s, TP %lld\n"
                 "[serve] KV cache: %lld slots x %lld positions = %.1f MiB (per rank); up to %lld "
                 "more sequences wait; chat template: %s (%s)\n",
                 dir.c_str(), (long long)w.state.iteration, (long long)cfg.num_layers,
                 (long long)cfg.hidden_size, (long long)cfg.padded_vocab_size, tok->name().c_str(),
                 dev_name.c_str(), dtype_str.c_str(), (long long)tp, (long long)st.slots, (long long)st.max_seq,
                 double(st.kv_cache_bytes) / (1 << 20), (long long)eo.max_waiting,
                 chat.family.c_str(), chat.source.c_str());
  if (rank != 0) {
    // A launcher forwards SIGINT/SIGTERM to every rank: rank 0 stops the followers itself.
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    engine.run();  // follows rank 0 until it exits
    return 0;
  }

  serve::ServiceOptions so;
  so.model_name = f.has("--served-model-name")
                      ? f.get("--served-model-name")
                      : std::filesystem::path(dir).lexically_normal().filename().string();
  if (so.model_name.empty()) so.model_name = "megatron";
  so.default_seed = f.has("--seed") ? f.get_int("--seed", 0) : -1;
  serve::Service service(engine, *tok, chat, so);
  serve::HttpOptions ho;
  ho.host = f.has("--host") ? f.get("--host") : "127.0.0.1";
  ho.port = int(port);
  ho.max_body_bytes = size_t(max_body);
  ho.threads = int(std::max<int64_t>(64, 2 * (eo.slots + 8)));
  serve::HttpServer http(service, ho);
  const int bound = http.bind();
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::thread net([&] { http.listen(); });
  std::thread watch([&] {
    while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "[serve] signal %d: stopping\n", int(g_signal));
    engine.shutdown();
  });
  std::fprintf(stderr, "[serve] listening on http://%s:%d (PUT /api, POST /v1/completions, POST "
               "/v1/chat/completions, GET /v1/models, GET /health)\n", ho.host.c_str(), bound);
  if (f.has("--port-file")) {
    const std::string pf = f.get("--port-file"), tmp = pf + ".tmp";
    std::ofstream(tmp) << bound << "\n";
    std::filesystem::rename(tmp, pf);  // appears whole
  }
  engine.run();  // until shutdown()
  http.stop();
  net.join();
  g_signal = g_signal == 0 ? -1 : int(g_signal);
  watch.join();
  const auto fin = engine.stats();
  std::fprintf(stderr,
               "[serve] %lld decode steps (%.1f rows each, %.3f ms each), %lld prefills (%.1f "
               "prompts each, %.2f ms each); CUDA graphs %s\n",
               (long long)fin.decode_steps,
               fin.decode_steps ? double(fin.decode_rows) / fin.decode_steps : 0.0,
               fin.decode_steps ? 1e3 * fin.decode_seconds / fin.decode_steps : 0.0,
               (long long)fin.prefills,
               fin.prefills ? double(fin.prefill_rows) / fin.prefills : 0.0,
               fin.prefills ? 1e3 * fin.prefill_seconds / fin.prefills : 0.0,
               gen.cuda_graphs() && device == Device::CUDA && cfg.rope && tp == 1 ? "on" : "off");
  std::fprintf(stderr, "[serve] stopped\n");
  return 0;
}

Registrar register_serve{"serve", run_serve};

}  // namespace
}  // namespace mcpp::tools
