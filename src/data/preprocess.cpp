#include "data/preprocess.h"

#include <string.h>  // memrchr (GNU)
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
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
    if (got == 0) {
      // zlib reports a stream that ends before its trailer as Z_BUF_ERROR ("unexpected end
      // of file") and still returns 0 as at a clean end: without this check a cut-off file
      // would be accepted, or blamed on the JSON of its last, partial line.
      int err = 0;
      const char* msg = gzerror(f_, &err);
      if (err == Z_BUF_ERROR)
        throw Error(fmt::format("{}: truncated gzip file ({}): the input ends before the gzip "
                                "trailer",
                                path_, msg),
                    "the download or copy was cut short; fetch the file again");
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

// Batches and their outputs are written by different workers at once: each starts on its
// own cache line so that no two workers write one line (false sharing).
struct alignas(64) KeyOut {
  std::vector<int32_t> tokens;    // this batch's ids, back to back
  std::vector<uint8_t> bin;       // the same ids in the dataset's dtype: .bin bytes
  std::vector<int32_t> seq_lens;  // every sequence's length
  std::vector<int32_t> doc_nseq;  // sequences per document
};

// A batch of whole input lines and what the worker made of them. Batches are pooled
// and reused, so their buffers stop allocating once grown.
struct alignas(64) Batch {
  const std::string* file = nullptr;
  int64_t first_line = 0;
  std::vector<char> data;  // lines, then kPadding spaces, then spare capacity
  size_t size = 0;         // bytes of lines in data
  std::vector<KeyOut> out;
  int64_t docs = 0, skipped = 0;
  std::exception_ptr error;
  bool done = false;
};

struct Worker {
#ifdef MCPP_HAVE_SIMDJSON
  simdjson::dom::parser parser;
#endif
  std::vector<int32_t> ids, nseq;
  std::vector<size_t> mark_tok, mark_len;
};

[[noreturn]] void bad_line(const Batch& b, int64_t line, const std::string& why) {
  throw Error(fmt::format("{}:{}: {}", *b.file, line, why),
              "fix or remove the line, or pass --skip-bad-lines to count and skip such lines");
}

// Parses and tokenises the batch's lines, then converts the ids to the dataset dtype,
// so the writer only copies bytes.
void process_batch(Batch& b, const PreprocessOptions& opt, const Tokenizer& tok,
                   std::span<const std::string> datasets, IndexDType dtype, Worker& w) {
  const size_t K = opt.json_keys.size();
  b.out.resize(K);
  for (KeyOut& o : b.out) o.tokens.clear(), o.bin.clear(), o.seq_lens.clear(), o.doc_nseq.clear();
  size_t pos = 0;
  int64_t line = b.first_line - 1;
  // Per line: the documents of all keys, committed only if the whole line is good.
  w.mark_tok.resize(K), w.mark_len.resize(K);
  std::vector<int32_t>& nseq = w.nseq;
  while (pos < b.size) {
    const char* nl = static_cast<const char*>(std::memchr(b.data.data() + pos, '\n', b.size - pos));
    const size_t end = nl ? size_t(nl - b.data.data()) : b.size;
    std::string_view ln(b.data.data() + pos, end - pos);
    const size_t line_start = pos;
    pos = end + 1;
    ++line;
    if (!ln.empty() && ln.back() == '\r') ln.remove_suffix(1);
    if (ln.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
    for (size_t k = 0; k < K; ++k)
      w.mark_tok[k] = b.out[k].tokens.size(), w.mark_len[k] = b.out[k].seq_lens.size();
    try {
      auto add_doc_text = [&](size_t k, std::string_view text, int32_t& n) {
        w.ids.clear();
        tok.encode(text, w.ids);
        if (w.ids.empty()) return;  // empty sentences are dropped
        if (w.ids.size() > size_t(std::numeric_limits<int32_t>::max()))
          bad_line(b, line, "a document of more than 2^31 tokens");
        b.out[k].tokens.insert(b.out[k].tokens.end(), w.ids.begin(), w.ids.end());
        b.out[k].seq_lens.push_back(int32_t(w.ids.size()));
        ++n;
      };
      nseq.assign(K, 0);
#ifdef MCPP_HAVE_SIMDJSON
      // The DOM parser validates the whole line, as json.loads does. The bytes after the
      // line (the next lines, then kPadding spaces) serve as simdjson's read padding.
      simdjson::dom::element doc;
      if (auto e = w.parser.parse(b.data.data() + line_start, ln.size(), false).get(doc))
        bad_line(b, line, fmt::format("not valid JSON ({})", simdjson::error_message(e)));
      if (!doc.is_object()) bad_line(b, line, "not a JSON object");
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
      (void)line_start;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(ln);
      } catch (const std::exception& e) {
        bad_line(b, line, fmt::format("not valid JSON ({})", e.what()));
      }
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
        b.out[k].tokens.resize(w.mark_tok[k]);
        b.out[k].seq_lens.resize(w.mark_len[k]);
        // doc_nseq was not yet pushed for this line unless every key finished; undo it.
        if (b.out[k].doc_nseq.size() > size_t(b.docs)) b.out[k].doc_nseq.resize(size_t(b.docs));
      }
      ++b.skipped;
    }
  }
  for (size_t k = 0; k < K; ++k) append_as_dtype(dtype, b.out[k].tokens, b.out[k].bin, datasets[k]);
}

double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

}  // namespace

// Three stages, each overlapped with the others: the calling thread reads whole lines
// into pooled batches; `workers` threads parse, tokenise and convert them in any order;
// one writer thread appends finished batches to the .bin/.idx builders in input order.
// The pool (2·workers + 2 batches) bounds memory: the reader waits for a free batch.
constexpr int kMaxWorkers = 1024;

PreprocessStats preprocess(const PreprocessOptions& opt, const Tokenizer& tok) {
  const double cpu0 = process_cpu_seconds();
  if (opt.inputs.empty())
    throw Error("--input is required", "give a JSON-lines file (.jsonl, .gz or .zst)");
  if (opt.output_prefix.empty()) throw Error("--output-prefix is required");
  if (opt.json_keys.empty()) throw Error("--json-keys needs at least one key");
  if (opt.workers < 1) throw Error(fmt::format("--workers must be >= 1, got {}", opt.workers));
  // Each worker is a thread with its own batches: thousands exhaust the process before any
  // output exists (and a failed thread start would abort, leaving temporary files).
  if (opt.workers > kMaxWorkers)
    throw Error(fmt::format("--workers {} is more than {}", opt.workers, kMaxWorkers),
                "give --workers at most the number of cores");
  const auto t0 = std::chrono::steady_clock::now();
  const IndexDType dtype = optimal_index_dtype(tok.vocab_size());
  std::vector<std::string> datasets;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& key : opt.json_keys) {
    datasets.push_back(fmt::format("{}_{}_document", opt.output_prefix, key));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(datasets.back(), dtype));
  }

  PreprocessStats st;
  std::atomic<int64_t> bytes_in{0};
  std::mutex mu;  // guards everything below up to `threads`
  std::condition_variable cv_todo, cv_done, cv_free;
  std::vector<std::unique_ptr<Batch>> pool(size_t(2 * opt.workers + 2));
  std::vector<Batch*> free_list;
  for (auto& b : pool) free_list.push_back((b = std::make_unique<Batch>()).get());
  std::deque<Batch*> todo, in_order;
  bool reading_done = false, stopping = false;
  std::exception_ptr error;
  auto fail = [&](std::exception_ptr e) {
    {
      std::lock_guard lk(mu);
      if (!error) error = e;
      stopping = true;
    }
    cv_todo.notify_all(), cv_done.notify_all(), cv_free.notify_all();
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < opt.workers; ++t)
    threads.emplace_back([&] {
      Worker w;
      for (;;) {
        Batch* b;
        {
          std::unique_lock lk(mu);
          cv_todo.wait(lk, [&] { return stopping || !todo.empty(); });
          if (stopping) return;
          b = todo.front();
          todo.pop_front();
        }
        try {
          process_batch(*b, opt, tok, datasets, dtype, w);
        } catch (...) {
          b->error = std::current_exception();  // raised by the writer, in input order
        }
        {
          std::lock_guard lk(mu);
          b->done = true;
        }
        cv_done.notify_one();
      }
    });

  const bool tty = opt.progress && ::isatty(2);
  // The input's size for the progress line's ETA: known for plain files only (a .gz or
  // .zst decompresses to an unknown size).
  int64_t total_bytes = 0;
  for (const auto& path : opt.inputs) {
    std::error_code ec;
    const bool plain = !path.ends_with(".gz") && !path.ends_with(".zst") &&
                       std::filesystem::is_regular_file(path, ec);
    total_bytes = plain && total_bytes >= 0 ? total_bytes + int64_t(std::filesystem::file_size(path, ec))
                                            : -1;
  }
  threads.emplace_back([&] {  // the writer
    auto last_report = t0;
    int64_t bytes_done = 0, next_log = opt.log_interval;
    try {
      for (;;) {
        Batch* b;
        {
          std::unique_lock lk(mu);
          cv_done.wait(lk, [&] {
            return stopping || (!in_order.empty() && in_order.front()->done) ||
                   (reading_done && in_order.empty());
          });
          if (stopping || in_order.empty()) return;
          b = in_order.front();
          in_order.pop_front();
        }
        if (b->error) std::rethrow_exception(b->error);
        for (size_t k = 0; k < builders.size(); ++k) {
          const KeyOut& o = b->out[k];
          builders[k]->add_documents(o.bin, o.seq_lens, o.doc_nseq);
          st.tokens += int64_t(o.tokens.size());
        }
        st.documents += b->docs;
        st.skipped += b->skipped;
        bytes_done += int64_t(b->size);
        // Megatron's print_processing_stats: every --log-interval documents (a batch may
        // cross several multiples; each is reported once, at the rate so far).
        for (; opt.log_interval > 0 && st.documents >= next_log; next_log += opt.log_interval) {
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::string eta;  // ours, after Megatron's sentence
          if (total_bytes > 0 && bytes_done > 0) {
            const double left = double(total_bytes - bytes_done) / (double(bytes_done) / s);
            eta = fmt::format(" {:.0f}% of the input, ETA {}:{:02d}:{:02d}",
                              100.0 * double(bytes_done) / double(total_bytes), int64_t(left) / 3600,
                              int64_t(left) / 60 % 60, int64_t(left) % 60);
          }
          std::fprintf(stderr, "%sProcessed %lld documents (%.1f docs/s, %.2f MB/s).%s\n",
                       tty ? "\r" : "", (long long)next_log, double(next_log) / s,
                       double(bytes_done) / s / 1024 / 1024, eta.c_str());
        }
        {
          std::lock_guard lk(mu);
          free_list.push_back(b);
        }
        cv_free.notify_one();
        if (tty) {
          auto now = std::chrono::steady_clock::now();
          if (now - last_report > std::chrono::milliseconds(500)) {
            last_report = now;
            double s = std::chrono::duration<double>(now - t0).count();
            double mb = double(bytes_in.load()) / 1e6;
            std::fprintf(stderr, "\r%lld docs  %.1f MB  %.0f docs/s  %.2f MB/s   ",
                         (long long)st.documents, mb, double(st.documents) / s, mb / s);
          }
        }
      }
    } catch (...) {
      fail(std::current_exception());
    }
  });

  auto join_all = [&] {
    {
      std::lock_guard lk(mu);
      reading_done = true;
    }
    cv_done.notify_all();
    threads.back().join();  // the writer first: it ends when every batch is written
    threads.pop_back();
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    cv_todo.notify_all();
    for (auto& t : threads) t.join();
  };

  // The reader: whole lines into free batches, in order.
  auto read_all = [&] {
    const size_t want = size_t(std::max<int64_t>(opt.batch_bytes, 1));
    const size_t read_step = std::max<size_t>(want, 64 << 10);
    std::vector<char> carry;
    for (const auto& path : opt.inputs) {
      auto in = open_input(path);
      carry.clear();
      int64_t next_line = 1;
      for (bool eof = false; !eof;) {
        Batch* b;
        {
          std::unique_lock lk(mu);
          cv_free.wait(lk, [&] { return stopping || !free_list.empty(); });
          if (stopping) return;
          b = free_list.back();
          free_list.pop_back();
        }
        b->file = &path, b->first_line = next_line;
        b->docs = b->skipped = 0, b->error = nullptr, b->done = false;
        size_t n = carry.size();  // the previous batch's unfinished line
        if (b->data.size() < n + read_step + kPadding) b->data.resize(n + read_step + kPadding);
        std::memcpy(b->data.data(), carry.data(), n);
        const char* last_nl = nullptr;
        // Fill to `want` bytes and on to a newline (a line may be longer than a batch).
        while (!eof && (n < want || !last_nl)) {
          if (b->data.size() < n + read_step + kPadding) b->data.resize(2 * b->data.size());
          const size_t room = b->data.size() - kPadding - n;
          const size_t got =
              in->read(b->data.data() + n, std::min(room, n < want ? want - n : read_step));
          if (got == 0) {
            eof = true;
            break;
          }
          if (const void* p = ::memrchr(b->data.data() + n, '\n', got))
            last_nl = static_cast<const char*>(p);
          n += got;
          bytes_in += int64_t(got);
        }
        const size_t cut = eof ? n : size_t(last_nl - b->data.data()) + 1;
        carry.assign(b->data.data() + cut, b->data.data() + n);
        if (cut == 0) {  // the input ended with the previous batch
          std::lock_guard lk(mu);
          free_list.push_back(b);
          break;
        }
        next_line += std::count(b->data.data(), b->data.data() + cut, '\n');
        b->size = cut;
        std::memset(b->data.data() + cut, ' ', kPadding);
        {
          std::lock_guard lk(mu);
          todo.push_back(b);
          in_order.push_back(b);
        }
        cv_todo.notify_one();
      }
    }
  };
  try {
    read_all();
  } catch (...) {
    fail(std::current_exception());
  }
  join_all();
  // On an error the builders are destroyed unfinalised: their temporary files are removed.
  if (error) std::rethrow_exception(error);
  for (auto& b : builders) b->finalize();
  st.bytes_in = bytes_in.load();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.cpu_seconds = process_cpu_seconds() - cpu0;
  if (tty) std::fprintf(stderr, "\n");
  return st;
}

}  // namespace mcpp::data
