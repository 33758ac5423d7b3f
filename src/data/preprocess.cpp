#include "data/preprocess.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "data/indexed_dataset.h"

#ifdef MCPP_HAVE_SIMDJSON
#include <simdjson.h>
#else
#include <nlohmann/json.hpp>
#endif
#ifdef MCPP_HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef MCPP_HAVE_ZSTD
#include <zstd.h>
#endif

namespace mcpp::data {

namespace {

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// ---- input ------------------------------------------------------------------------

class Input {
 public:
  virtual ~Input() = default;
  virtual size_t read(char* buf, size_t n) = 0;  // 0 at end
};

class PlainInput final : public Input {
 public:
  explicit PlainInput(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    if (!f_) throw Error(fmt::format("cannot open --input {}: {}", path, std::strerror(errno)));
  }
  ~PlainInput() override { std::fclose(f_); }
  size_t read(char* buf, size_t n) override {
    size_t got = std::fread(buf, 1, n, f_);
    if (got == 0 && std::ferror(f_)) throw Error(fmt::format("read error on {}", path_));
    return got;
  }

 private:
  std::string path_;
  std::FILE* f_;
};

#ifdef MCPP_HAVE_ZLIB
class GzInput final : public Input {
 public:
  explicit GzInput(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (!f_) throw Error(fmt::format("cannot open --input {}", path));
    gzbuffer(f_, 1 << 20);
  }
  ~GzInput() override { gzclose(f_); }
  size_t read(char* buf, size_t n) override {
    int got = gzread(f_, buf, unsigned(std::min<size_t>(n, 1u << 30)));
    if (got < 0) {
      int err = 0;
      throw Error(fmt::format("{}: corrupt gzip data: {}", path_, gzerror(f_, &err)));
    }
    return size_t(got);
  }

 private:
  std::string path_;
  gzFile f_;
};
#endif

#ifdef MCPP_HAVE_ZSTD
class ZstdInput final : public Input {
 public:
  explicit ZstdInput(const std::string& path) : raw_(path), path_(path), in_(ZSTD_DStreamInSize()) {
    ds_ = ZSTD_createDStream();
    ZSTD_initDStream(ds_);
  }
  ~ZstdInput() override { ZSTD_freeDStream(ds_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (ib_.pos == ib_.size) {
        size_t got = raw_.read(in_.data(), in_.size());
        if (got == 0) {
          if (last_ != 0) throw Error(fmt::format("{}: truncated zstd stream", path_));
          return 0;
        }
        ib_ = {in_.data(), got, 0};
      }
      last_ = ZSTD_decompressStream(ds_, &out, &ib_);
      if (ZSTD_isError(last_))
        throw Error(fmt::format("{}: corrupt zstd data: {}", path_, ZSTD_getErrorName(last_)));
    }
    return out.pos;
  }

 private:
  PlainInput raw_;
  std::string path_;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  ZSTD_DStream* ds_;
  size_t last_ = 0;
};
#endif

std::unique_ptr<Input> open_input(const std::string& path) {
  if (ends_with(path, ".gz")) {
#ifdef MCPP_HAVE_ZLIB
    return std::make_unique<GzInput>(path);
#else
    throw Error("this build cannot read .gz input", "install zlib1g-dev and rebuild");
#endif
  }
  if (ends_with(path, ".zst")) {
#ifdef MCPP_HAVE_ZSTD
    return std::make_unique<ZstdInput>(path);
#else
    throw Error("this build cannot read .zst input", "install libzstd-dev and rebuild");
#endif
  }
  return std::make_unique<PlainInput>(path);
}

// ---- batches ----------------------------------------------------------------------

constexpr size_t kPadding = 64;  // simdjson reads up to SIMDJSON_PADDING past a line

struct KeyOut {
  std::vector<int32_t> tokens;    // all documents' ids, back to back
  std::vector<int64_t> seq_lens;  // all sequences' lengths
  std::vector<int32_t> doc_nseq;  // sequences per document
};

struct Batch {
  std::string file;
  int64_t first_line = 0;
  std::string data;  // whole lines, followed by kPadding spare bytes
  size_t size = 0;   // bytes of lines in data
  std::vector<KeyOut> out;
  int64_t docs = 0, skipped = 0;
  std::exception_ptr error;
  bool done = false;
};

struct Worker {
#ifdef MCPP_HAVE_SIMDJSON
  simdjson::dom::parser parser;
#endif
  std::vector<int32_t> ids;
};

[[noreturn]] void bad_line(const Batch& b, int64_t line, const std::string& why) {
  throw Error(fmt::format("{}:{}: {}", b.file, line, why),
              "fix or remove the line, or pass --skip-bad-lines to count and skip such lines");
}

void process_batch(Batch& b, const PreprocessOptions& opt, const Tokenizer& tok, Worker& w) {
  const size_t K = opt.json_keys.size();
  b.out.assign(K, {});
  size_t pos = 0;
  int64_t line = b.first_line - 1;
  // Per line: the documents of all keys, committed only if the whole line is good.
  std::vector<size_t> mark_tok(K), mark_len(K);
  while (pos < b.size) {
    size_t end = b.data.find('\n', pos);
    if (end == std::string::npos || end > b.size) end = b.size;
    std::string_view ln(b.data.data() + pos, end - pos);
    const size_t line_start = pos;
    pos = end + 1;
    ++line;
    if (!ln.empty() && ln.back() == '\r') ln.remove_suffix(1);
    if (ln.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
    for (size_t k = 0; k < K; ++k)
      mark_tok[k] = b.out[k].tokens.size(), mark_len[k] = b.out[k].seq_lens.size();
    try {
      auto add_doc_text = [&](size_t k, std::string_view text, int32_t& nseq) {
        w.ids.clear();
        tok.encode(text, w.ids);
        if (w.ids.empty()) return;  // empty sentences are dropped
        b.out[k].tokens.insert(b.out[k].tokens.end(), w.ids.begin(), w.ids.end());
        b.out[k].seq_lens.push_back(int64_t(w.ids.size()));
        ++nseq;
      };
#ifdef MCPP_HAVE_SIMDJSON
      // The DOM parser validates the whole line, as json.loads does. The bytes after the
      // line (the next lines, then kPadding spaces) serve as simdjson's read padding.
      simdjson::dom::element doc;
      if (auto e = w.parser.parse(b.data.data() + line_start, ln.size(), false).get(doc))
        bad_line(b, line, fmt::format("not valid JSON ({})", simdjson::error_message(e)));
      if (!doc.is_object()) bad_line(b, line, "not a JSON object");
      std::vector<int32_t> nseq(K, 0);
      for (size_t k = 0; k < K; ++k) {
        simdjson::dom::element v;
        if (doc.get_object().at_key(opt.json_keys[k]).get(v))
          bad_line(b, line, fmt::format("no key \"{}\"", opt.json_keys[k]));
        if (v.is_string()) {
          add_doc_text(k, std::string_view(v.get_string().value_unsafe()), nseq[k]);
        } else if (v.is_array()) {
          simdjson::dom::array arr;
          if (v.get_array().get(arr)) bad_line(b, line, "bad array");
          for (simdjson::dom::element item : arr) {
            if (!item.is_string())
              bad_line(
                  b, line,
                  fmt::format("\"{}\" must be a string or a list of strings", opt.json_keys[k]));
            add_doc_text(k, std::string_view(item.get_string().value_unsafe()), nseq[k]);
          }
        } else {
          bad_line(b, line,
                   fmt::format("\"{}\" must be a string or a list of strings", opt.json_keys[k]));
        }
      }
#else
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(ln);
      } catch (const std::exception& e) {
        bad_line(b, line, fmt::format("not valid JSON ({})", e.what()));
      }
      std::vector<int32_t> nseq(K, 0);
      for (size_t k = 0; k < K; ++k) {
        if (!j.is_object() || !j.contains(opt.json_keys[k]))
          bad_line(b, line, fmt::format("no key \"{}\"", opt.json_keys[k]));
        auto& v = j[opt.json_keys[k]];
        if (v.is_string())
          add_doc_text(k, v.get_ref<const std::string&>(), nseq[k]);
        else if (v.is_array())
          for (auto& s : v) {
            if (!s.is_string()) bad_line(b, line, "list items must be strings");
            add_doc_text(k, s.get_ref<const std::string&>(), nseq[k]);
          }
        else
          bad_line(b, line,
                   fmt::format("\"{}\" must be a string or a list of strings", opt.json_keys[k]));
      }
#endif
      for (size_t k = 0; k < K; ++k) {
        if (opt.append_eod && nseq[k] > 0) {
          b.out[k].tokens.push_back(int32_t(tok.eod()));
          b.out[k].seq_lens.back() += 1;  // counted in the last sentence
        }
        b.out[k].doc_nseq.push_back(nseq[k]);
      }
      ++b.docs;
    } catch (const Error&) {
      if (!opt.skip_bad_lines) throw;
      for (size_t k = 0; k < K; ++k) {
        b.out[k].tokens.resize(mark_tok[k]);
        b.out[k].seq_lens.resize(mark_len[k]);
        // doc_nseq was not yet pushed for this line unless every key finished; undo it.
        if (b.out[k].doc_nseq.size() > size_t(b.docs)) b.out[k].doc_nseq.resize(size_t(b.docs));
      }
      ++b.skipped;
    }
  }
}

}  // namespace

namespace {
double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
}  // namespace

PreprocessStats preprocess(const PreprocessOptions& opt, const Tokenizer& tok) {
  const double cpu0 = process_cpu_seconds();
  if (opt.inputs.empty())
    throw Error("--input is required", "give a JSON-lines file (.jsonl, .gz or .zst)");
  if (opt.output_prefix.empty()) throw Error("--output-prefix is required");
  if (opt.json_keys.empty()) throw Error("--json-keys needs at least one key");
  if (opt.workers < 1) throw Error(fmt::format("--workers must be >= 1, got {}", opt.workers));
  const auto t0 = std::chrono::steady_clock::now();
  const IndexDType dtype = optimal_index_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& key : opt.json_keys)
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(
        fmt::format("{}_{}_document", opt.output_prefix, key), dtype));

  PreprocessStats st;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<std::shared_ptr<Batch>> todo;
  bool closing = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < opt.workers; ++t)
    threads.emplace_back([&] {
      Worker w;
      for (;;) {
        std::shared_ptr<Batch> b;
        {
          std::unique_lock lk(mu);
          cv_work.wait(lk, [&] { return closing || !todo.empty(); });
          if (todo.empty()) return;
          b = todo.front();
          todo.pop_front();
        }
        try {
          process_batch(*b, opt, tok, w);
        } catch (...) {
          b->error = std::current_exception();
        }
        {
          std::lock_guard lk(mu);
          b->done = true;
        }
        cv_done.notify_all();
      }
    });
  auto stop_workers = [&] {
    {
      std::lock_guard lk(mu);
      closing = true;
      todo.clear();
    }
    cv_work.notify_all();
    for (auto& t : threads) t.join();
    threads.clear();
  };

  const bool tty = opt.progress && ::isatty(2);
  auto last_report = t0;
  std::deque<std::shared_ptr<Batch>> in_flight;
  auto write_front = [&] {
    std::shared_ptr<Batch> b = in_flight.front();
    {
      std::unique_lock lk(mu);
      cv_done.wait(lk, [&] { return b->done; });
    }
    in_flight.pop_front();
    if (b->error) std::rethrow_exception(b->error);
    for (size_t k = 0; k < builders.size(); ++k) {
      const KeyOut& o = b->out[k];
      size_t tpos = 0, lpos = 0;
      for (int32_t n : o.doc_nseq) {
        int64_t total = 0;
        for (int32_t s = 0; s < n; ++s) total += o.seq_lens[lpos + s];
        builders[k]->add_document(std::span<const int32_t>(o.tokens.data() + tpos, size_t(total)),
                                  std::span<const int64_t>(o.seq_lens.data() + lpos, size_t(n)));
        tpos += size_t(total), lpos += size_t(n);
      }
      st.tokens += int64_t(o.tokens.size());
    }
    st.documents += b->docs;
    st.skipped += b->skipped;
    if (tty) {
      auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::milliseconds(500)) {
        last_report = now;
        double s = std::chrono::duration<double>(now - t0).count();
        std::fprintf(stderr, "\r%lld docs  %.1f MB  %.0f docs/s  %.2f MB/s   ",
                     (long long)st.documents, double(st.bytes_in) / 1e6, double(st.documents) / s,
                     double(st.bytes_in) / 1e6 / s);
      }
    }
  };

  try {
    std::vector<char> chunk(size_t(1) << 20);
    const size_t max_in_flight = size_t(2 * opt.workers);
    for (const auto& path : opt.inputs) {
      auto in = open_input(path);
      std::string carry;
      int64_t next_line = 1;
      bool eof = false;
      while (!eof) {
        auto b = std::make_shared<Batch>();
        b->file = path;
        b->first_line = next_line;
        b->data = std::move(carry);
        carry.clear();
        // Fill to batch_bytes (and on to a newline), then cut after the last newline.
        while (!eof && (b->data.size() < size_t(opt.batch_bytes) ||
                        b->data.find('\n') == std::string::npos)) {
          size_t got = in->read(chunk.data(), chunk.size());
          if (got == 0) {
            eof = true;
            break;
          }
          st.bytes_in += int64_t(got);
          b->data.append(chunk.data(), got);
        }
        size_t cut = b->data.size();
        if (!eof) {
          cut = b->data.rfind('\n') + 1;
          carry.assign(b->data, cut, std::string::npos);
          b->data.resize(cut);
        }
        if (cut == 0) break;
        for (size_t i = 0; i < cut; ++i) next_line += b->data[i] == '\n';
        b->size = cut;
        b->data.append(kPadding, ' ');
        while (in_flight.size() >= max_in_flight) write_front();
        in_flight.push_back(b);
        {
          std::lock_guard lk(mu);
          todo.push_back(b);
        }
        cv_work.notify_one();
      }
    }
    while (!in_flight.empty()) write_front();
  } catch (...) {
    stop_workers();
    throw;  // builders are destroyed unfinalised: their temporary files are removed
  }
  stop_workers();
  for (auto& b : builders) b->finalize();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.cpu_seconds = process_cpu_seconds() - cpu0;
  if (tty) std::fprintf(stderr, "\n");
  return st;
}

}  // namespace mcpp::data
