// Tokenizer encode and `megatron preprocess` throughput on a JSON-lines corpus.
//
//   bench_tokenizers [--corpus FILE.jsonl] [--assets DIR] [--threads N] [--out DIR]
//
// Defaults: the Gutenberg corpus of scripts/make_corpus.sh and the assets of
// scripts/fetch_assets.sh under .cache/assets, N = hardware threads. Prints a table:
//   encode: one document at a time on one thread, MB/s of UTF-8 text and tokens/s,
//           each tokenizer freshly loaded (its piece cache starts cold);
//   preprocess: the whole pipeline (read, JSON, tokenise, .bin/.idx) with 1 and N workers,
//           a fresh tokenizer each. Thread scaling on ~100 MB: bench/preprocess_scaling.sh.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "data/preprocess.h"
#include "data/tokenizers/tokenizer.h"

using namespace mcpp::data;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string root = std::string(MCPP_SOURCE_DIR) + "/.cache/assets";
  std::string corpus, out = "/tmp/mcpp_bench_tokenizers";
  int threads = int(std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--corpus") corpus = argv[i + 1];
    else if (a == "--assets") root = argv[i + 1];
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--out") out = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (corpus.empty()) corpus = root + "/gutenberg.jsonl";
  std::vector<std::string> docs;
  {
    std::ifstream f(corpus);
    if (!f) {
      std::fprintf(stderr, "cannot read %s (run scripts/make_corpus.sh)\n", corpus.c_str());
      return 1;
    }
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  }
  size_t bytes = 0;
  for (auto& d : docs) bytes += d.size();
  std::printf("corpus %s: %zu documents, %.2f MB of text; %d threads\n\n", corpus.c_str(),
              docs.size(), double(bytes) / 1e6, threads);

  struct Case {
    const char* name;
    std::function<std::unique_ptr<Tokenizer>()> make;
  };
  const std::string tk = root + "/tiktoken/package/data/";
  std::vector<Case> cases = {
      {"GPT2BPETokenizer (GPT-2 files)",
       [&] {
         return make_tokenizer({.type = "GPT2BPETokenizer",
                                .vocab_file = root + "/gpt2/package/encoder.json",
                                .merge_file = root + "/gpt2/package/vocab.bpe"});
       }},
      {"tiktoken r50k_base", [&] { return make_tiktoken_encoding("r50k_base", tk + "r50k_base.tiktoken"); }},
      {"tiktoken cl100k_base",
       [&] { return make_tiktoken_encoding("cl100k_base", tk + "cl100k_base.tiktoken"); }},
      {"tiktoken o200k_base", [&] { return make_tiktoken_encoding("o200k_base", tk + "o200k_base.tiktoken"); }},
      {"HuggingFaceTokenizer (Mistral, byte fallback)",
       [&] {
         return make_tokenizer(
             {.type = "HuggingFaceTokenizer", .tokenizer_model = root + "/hf/package/models"});
       }},
      {"Llama2Tokenizer (sentencepiece)",
       [&] {
         return make_tokenizer({.type = "Llama2Tokenizer", .tokenizer_model = root + "/llama/llama.model"});
       }},
  };
  std::printf("| tokenizer (encode, 1 thread, cold cache) | MB/s | tokens/s | tokens |\n|---|---:|---:|---:|\n");
  for (auto& c : cases) {
    std::unique_ptr<Tokenizer> t;
    try {
      t = c.make();
    } catch (const std::exception& e) {
      std::printf("| %s | skipped: %s | | |\n", c.name, e.what());
      continue;
    }
    size_t ntok = 0;
    double secs = 0;
    std::thread th([&] {
      std::vector<int32_t> ids;
      double t0 = now();
      for (auto& d : docs) {
        ids.clear();
        t->encode(d, ids);
        ntok += ids.size();
      }
      secs = now() - t0;
    });
    th.join();
    std::printf("| %s | %.2f | %.0f | %zu |\n", c.name, double(bytes) / 1e6 / secs,
                double(ntok) / secs, ntok);
  }

  std::printf("\n| preprocess (GPT2BPETokenizer, --append-eod) | workers | MB/s | tokens/s | "
              "MB/s per worker | wall s |\n|---|---:|---:|---:|---:|---:|\n");
  std::filesystem::create_directories(out);
  double one = 0;
  for (int w : {1, threads}) {
    auto gpt2 = cases[0].make();  // a fresh tokenizer: its piece cache starts cold
    PreprocessOptions o;
    o.inputs = {corpus};
    o.output_prefix = out + "/bench";
    o.append_eod = true;
    o.workers = w;
    o.progress = false;
    PreprocessStats st;
    st = preprocess(o, *gpt2);
    double mbs = double(st.bytes_in) / 1e6 / st.seconds;
    if (w == 1) one = mbs;
    std::printf("| %s | %d | %.2f | %.0f | %.2f | %.2f |\n", corpus.c_str(), w, mbs,
                double(st.tokens) / st.seconds, mbs / w, st.seconds);
    if (w == threads && threads > 1)
      std::printf("\nscaling: %.1fx on %d workers = %.0f%% of linear\n", mbs / one, w,
                  100.0 * mbs / one / w);
    if (threads == 1) break;
  }
  return 0;
}
