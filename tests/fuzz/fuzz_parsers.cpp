// fuzz_parsers: a bounded-time mutation fuzzer over the parsers that read untrusted files and
// flags (issue 23, part B.7). No libFuzzer needed: an own loop mutates a seed corpus (valid
// inputs plus the hostile cases of issue 23) and feeds each input to its parser in-process.
//
//   fuzz_parsers [--seconds S] [--seed N] [--only TARGET] [--corpus DIR] [--out DIR]
//
// Targets: idx (.idx/.bin reader + every token read), jsonl (preprocess), safetensors,
// metadata (checkpoint metadata.json -> load, inspect, model config), hfconfig (config.json
// -> model config and size checks), flags (train argv -> parse_args + validate_args).
//
// The bar: every input either parses or throws mcpp::Error. Anything else fails the run: a
// signal (the handler saves the input and re-raises), another exception type (an "internal
// error" message that names no file or field), or one input running longer than the hang
// limit (a watchdog saves it and aborts). Saved inputs go to --out (default: the working
// folder) as fuzz-<target>-<kind>.bin, ready to become corpus files.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "model/gpt_model.h"
#include "training/arguments.h"

using namespace mcpp;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Bytes = std::string;

namespace {

// ---- crash and hang capture ---------------------------------------------------------------
char g_crash_path[4096];
const char* g_input = nullptr;
size_t g_input_size = 0;
std::atomic<int64_t> g_started_ms{0};

void save_current(const char* path) {  // async-signal-safe
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  size_t off = 0;
  while (g_input && off < g_input_size) {
    ssize_t w = ::write(fd, g_input + off, g_input_size - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  ::close(fd);
}

extern "C" void on_signal(int sig) {
  save_current(g_crash_path);
  const char msg[] = "fuzz_parsers: SIGNAL while parsing; the input is saved\n";
  (void)!::write(2, msg, sizeof msg - 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- mutations ----------------------------------------------------------------------------
const int64_t kInteresting[] = {0,
                                -1,
                                1,
                                -100,
                                255,
                                65535,
                                65536,
                                INT32_MAX,
                                INT32_MIN,
                                int64_t(1) << 31,
                                int64_t(1) << 32,
                                int64_t(1) << 40,
                                INT64_MAX,
                                INT64_MAX - 1,
                                INT64_MIN};

// keep_size: only in-place edits (a format whose size is checked first, such as .idx, is
// otherwise refused before any field is read).
Bytes mutate_bytes(Bytes b, std::mt19937_64& rng, const std::vector<Bytes>& corpus,
                   bool keep_size = false) {
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : 0; };
  const int rounds = 1 + int(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % (keep_size ? 3 : 7)) {
      case 0:  // flip a bit
        if (!b.empty()) b[pick(b.size())] ^= char(1 << (rng() % 8));
        break;
      case 1:  // random byte
        if (!b.empty()) b[pick(b.size())] = char(rng());
        break;
      case 2:  // interesting integer, 1/2/4/8 bytes little-endian
        if (b.size() >= 8) {
          const int64_t v = kInteresting[pick(std::size(kInteresting))];
          const size_t w = size_t(1) << (rng() % 4);
          std::memcpy(b.data() + pick(b.size() - w + 1), &v, w);
        }
        break;
      case 3:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 4: {  // delete a range
        if (b.empty()) break;
        const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(64, b.size() - at));
        b.erase(at, n);
        break;
      }
      case 5: {  // duplicate a range
        if (b.empty()) break;
        const size_t at = pick(b.size()), n = 1 + pick(std::min<size_t>(64, b.size() - at));
        b.insert(pick(b.size()), b.substr(at, n));
        break;
      }
      case 6: {  // splice with another corpus entry
        const Bytes& o = corpus[pick(corpus.size())];
        if (o.empty()) break;
        b = b.substr(0, pick(b.size() + 1)) + o.substr(pick(o.size()));
        break;
      }
    }
  }
  return b;
}

// JSON-aware: replace a random leaf (or a random array/object element) with an interesting
// value; keeps the document parseable so the checks behind the parser are reached.
void mutate_json(json& j, std::mt19937_64& rng) {
  std::vector<json*> nodes;
  std::function<void(json&)> walk = [&](json& x) {
    nodes.push_back(&x);
    if (x.is_structured())
      for (auto& c : x) walk(c);
  };
  walk(j);
  json& n = *nodes[rng() % nodes.size()];
  switch (rng() % 8) {
    case 0:
      n = kInteresting[rng() % std::size(kInteresting)];
      break;
    case 1:
      n = -double(rng() % 1000) / 7.0;
      break;
    case 2:
      n = "1";
      break;
    case 3:
      n = nullptr;
      break;
    case 4:
      n = json::array({kInteresting[rng() % std::size(kInteresting)]});
      break;
    case 5:
      n = json::object();
      break;
    case 6:
      if (n.is_array() && !n.empty()) n.erase(n.begin() + int64_t(rng() % n.size()));
      break;
    case 7:
      if (n.is_number_integer()) n = n.get<int64_t>() + int64_t(rng() % 5) - 2;
      break;
  }
}

Bytes mutate(const Bytes& seed, std::mt19937_64& rng, const std::vector<Bytes>& corpus,
             bool is_json, bool keep_size) {
  if (is_json && rng() % 3 != 0) {
    try {
      json j = json::parse(seed);
      const int rounds = 1 + int(rng() % 3);
      for (int r = 0; r < rounds; ++r) mutate_json(j, rng);
      return j.dump(1);
    } catch (const json::exception&) {
    }
  }
  return mutate_bytes(seed, rng, corpus, keep_size && rng() % 4 != 0);
}

// ---- targets ------------------------------------------------------------------------------
struct Target {
  std::string name;
  bool is_json = false;
  bool keep_size = false;  // mostly in-place mutations (see mutate_bytes)
  std::vector<Bytes> seeds;
  std::function<void(const Bytes&)> run;
};

void write(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), std::streamsize(b.size()));
}
Bytes read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

model::TransformerConfig tiny() {
  model::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 4, c.kv_channels = 4;
  c.num_query_groups = 4, c.ffn_hidden_size = 32, c.seq_length = 8;
  c.max_position_embeddings = 12, c.padded_vocab_size = 64;
  c.hidden_dropout = c.attention_dropout = 0, c.seed = 3;
  return c;
}

std::vector<Target> make_targets(const fs::path& work) {
  std::vector<Target> t;
  // .idx/.bin: the reader's validation, then every sequence read and the vocabulary scan.
  {
    Target x{"idx", false, true};
    const std::string p = (work / "seed").string();
    data::IndexedDatasetBuilder b(p, data::IndexDType::U16);
    for (int s = 0; s < 6; ++s) {
      std::vector<int64_t> ids(size_t(1 + s * 3), s + 1);
      b.add_item(std::span<const int64_t>(ids));
      if (s % 2) b.end_document();
    }
    b.finalize();
    const Bytes idx = read(p + ".idx"), bin = read(p + ".bin");
    x.seeds.push_back(idx);
    Bytes hostile = idx;  // issue 23: a sequence pointer near INT64_MAX
    const int64_t huge = INT64_MAX - 1;
    std::memcpy(hostile.data() + 34 + 4 * 6 + 8 * 2, &huge, 8);
    x.seeds.push_back(hostile);
    const std::string fp = (work / "fz").string();
    write(fp + ".bin", bin);
    x.run = [fp](const Bytes& in) {
      write(fp + ".idx", in);
      data::IndexedDataset d(fp);
      for (int64_t s = 0; s < d.num_sequences(); ++s) d.get(s);
      d.check_vocabulary(100);
    };
    t.push_back(std::move(x));
  }
  // JSON lines through the whole preprocess pipeline (NullTokenizer: ids from the text).
  {
    Target x{"jsonl"};
    x.seeds = {"{\"text\": \"1 2 3\"}\n{\"text\": \"4 5\"}\n",
               "{\"text\": [\"10 11\", \"\", \"12\"]}\r\n{\"text\": \"13\\u0020 14\"}",
               "{\"text\": \"99999999999 -5 7\"}\n", "{\"text\": 1 2}\n"};
    const fs::path dir = work / "jsonl";
    fs::create_directories(dir);
    x.run = [dir](const Bytes& in) {
      write(dir / "in.jsonl", in);
      data::NullTokenizer tok(1000);
      data::PreprocessOptions o;
      o.inputs = {(dir / "in.jsonl").string()};
      o.output_prefix = (dir / "out").string();
      o.workers = 2, o.batch_bytes = 64, o.progress = false, o.skip_bad_lines = in.size() % 2;
      data::preprocess(o, tok);
    };
    t.push_back(std::move(x));
  }
  model::GPTModel m(tiny());
  // safetensors: the header parser and the tensor reads.
  {
    Target x{"safetensors"};
    const fs::path hf = work / "hf";
    checkpoint::export_hf(hf.string(), tiny(), m.params());
    x.seeds.push_back(read(hf / "model.safetensors"));
    const fs::path p = work / "fz.safetensors";
    x.run = [p](const Bytes& in) {
      write(p, in);
      checkpoint::load_safetensors(p.string());
    };
    t.push_back(std::move(x));
  }
  // HF config.json: the model config, the size check against the files, then the import.
  {
    Target x{"hfconfig", true};
    const fs::path hf = work / "hf";
    const Bytes good = read(hf / "config.json");
    x.seeds.push_back(good);
    for (const char* f : {"n_head", "n_inner", "vocab_size", "n_layer"}) {  // issue 23 cases
      json j = json::parse(good);
      j[f] = std::string(f) == "n_layer" ? json(int64_t(1) << 31) : json(0);
      x.seeds.push_back(j.dump(1));
    }
    const fs::path dir = work / "hf_fz";
    fs::create_directories(dir);
    fs::copy_file(hf / "model.safetensors", dir / "model.safetensors");
    x.run = [dir](const Bytes& in) {
      write(dir / "config.json", in);
      auto c = checkpoint::model_config_from_hf(checkpoint::read_hf_config(dir.string()), 1);
      checkpoint::check_hf_fits_files(dir.string(), c);
      model::GPTModel g(c);
      checkpoint::import_hf(dir.string(), c, g.params());
    };
    t.push_back(std::move(x));
  }
  // Checkpoint metadata.json: model config, load into the tiny model, and inspect.
  {
    Target x{"metadata", true};
    const fs::path ck = work / "ck";
    checkpoint::TrainingState st;
    st.iteration = 7;
    checkpoint::save_checkpoint(ck.string(), m, nullptr, st);
    const fs::path md = ck / "iter_0000007" / "metadata.json";
    const Bytes good = read(md);
    x.seeds.push_back(good);
    json j = json::parse(good);  // issue 23: negative local offsets, huge model fields
    j["tensors"]["embedding.word_embeddings.weight"]["shards"][0]["pieces"][0]["local_offsets"] = {
        -100, 0};
    x.seeds.push_back(j.dump(1));
    j = json::parse(good);
    j["model"]["num_layers"] = int64_t(1) << 40;
    x.seeds.push_back(j.dump(1));
    j = json::parse(good);
    j["format_version"] = "1";
    x.seeds.push_back(j.dump(1));
    x.run = [ck, md](const Bytes& in) {
      write(md, in);
      const json meta = checkpoint::read_metadata(ck.string());
      auto c = checkpoint::model_config_from_metadata(meta);
      (void)c;
      model::GPTModel g(tiny());
      checkpoint::load_checkpoint(ck.string(), std::nullopt, g, nullptr);
      checkpoint::describe_checkpoint(ck.string());
    };
    t.push_back(std::move(x));
  }
  // Train flags: argv joined by '\n'; parse_args and validate_args only.
  {
    Target x{"flags"};
    x.seeds = {
        "--mock-data\n--tokenizer-type\nNullTokenizer\n--vocab-size\n512\n--num-layers\n2\n"
        "--hidden-size\n64\n--num-attention-heads\n4\n--seq-length\n64\n"
        "--max-position-embeddings\n64\n--micro-batch-size\n4\n--global-batch-size\n8\n--lr\n"
        "3e-3\n--train-iters\n5",
        "--pipeline-model-parallel-size\n0\n--threads\n100000\n--lr\nnan\n--split\n1e400,1,1\n"
        "--recompute-granularity\nfull\n--recompute-method\nuniform\n--recompute-num-layers\n9"};
    x.run = [](const Bytes& in) {
      std::vector<std::string> argv;
      size_t a = 0;
      for (size_t i = 0; i <= in.size(); ++i)
        if (i == in.size() || in[i] == '\n') argv.push_back(in.substr(a, i - a)), a = i + 1;
      training::Args args = training::parse_args(argv);
      training::validate_args(args, 1 + int(in.size() % 4), true);
    };
    t.push_back(std::move(x));
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  uint64_t seed = 1;
  std::string only, corpus_dir, out_dir = ".";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--seconds")
      seconds = std::stod(v);
    else if (a == "--seed")
      seed = std::stoull(v);
    else if (a == "--only")
      only = v;
    else if (a == "--corpus")
      corpus_dir = v;
    else if (a == "--out")
      out_dir = v;
    else {
      std::cerr << "unknown flag " << a << "\n";
      return 2;
    }
  }
  log::set_level(log::Level::Error);  // the parsers' warnings would flood the output
  // A bounded address space: an unbounded allocation is a bad_alloc (a finding), not the OOM
  // killer.
  rlimit lim{size_t(8) << 30, size_t(8) << 30};
  ::setrlimit(RLIMIT_AS, &lim);
  const fs::path work = fs::temp_directory_path() / ("mcpp_fuzz_" + std::to_string(::getpid()));
  fs::remove_all(work);
  fs::create_directories(work);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(s, on_signal);
  auto targets = make_targets(work);
  int findings = 0;
  std::atomic<bool> done{false};
  std::string current_target;
  const int64_t hang_ms = 10000;
  std::thread watchdog([&] {
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t t0 = g_started_ms.load();
      if (t0 && now_ms() - t0 > hang_ms) {
        save_current((fs::path(out_dir) / ("fuzz-" + current_target + "-hang.bin")).c_str());
        std::cerr << "fuzz_parsers: " << current_target << ": one input ran over " << hang_ms
                  << " ms (a hang); saved\n";
        std::_Exit(1);
      }
    }
  });
  const double per = seconds / double(only.empty() ? targets.size() : 1);
  for (auto& t : targets) {
    if (!only.empty() && t.name != only) continue;
    current_target = t.name;
    std::snprintf(g_crash_path, sizeof g_crash_path, "%s/fuzz-%s-crash.bin", out_dir.c_str(),
                  t.name.c_str());
    std::vector<Bytes> corpus = t.seeds;
    if (!corpus_dir.empty() && fs::is_directory(fs::path(corpus_dir) / t.name))
      for (auto& e : fs::directory_iterator(fs::path(corpus_dir) / t.name))
        corpus.push_back(read(e.path()));
    std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.name));
    int64_t runs = 0, errors = 0;
    const int64_t deadline = now_ms() + int64_t(per * 1000);
    // Every seed as it is first, then mutations of random corpus entries.
    for (size_t k = 0; now_ms() < deadline || k < corpus.size(); ++k) {
      const Bytes in = k < corpus.size() ? corpus[k]
                                         : mutate(corpus[rng() % corpus.size()], rng, corpus,
                                                  t.is_json, t.keep_size);
      g_input = in.data(), g_input_size = in.size();
      g_started_ms.store(now_ms());
      ++runs;
      try {
        t.run(in);
      } catch (const Error&) {
        ++errors;
      } catch (const std::exception& e) {
        ++findings;
        const auto p = fs::path(out_dir) /
                       ("fuzz-" + t.name + "-exception-" + std::to_string(findings) + ".bin");
        save_current(p.c_str());
        std::cerr << "fuzz_parsers: " << t.name << ": not an mcpp::Error: " << e.what()
                  << " (input saved as " << p.string() << ")\n";
      }
      g_started_ms.store(0);
    }
    std::cout << "fuzz_parsers: " << t.name << ": " << runs << " inputs, " << errors
              << " refused with a clear error, " << runs - errors << " accepted\n";
  }
  done.store(true);
  watchdog.join();
  fs::remove_all(work);
  if (findings) std::cout << "fuzz_parsers: " << findings << " finding(s)\n";
  return findings ? 1 : 0;
}
