#include "training/progress_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/log.h"

namespace mcpp::training {

namespace {

constexpr const char* kTimeFormat = "%Y-%m-%d %H:%M:%S";  // Megatron's, local time

std::string format_time(std::time_t t) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  return std::string(buf, std::strftime(buf, sizeof buf, kTimeFormat, &tm));
}

std::optional<std::time_t> parse_time(const std::string& s) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), kTimeFormat, &tm);
  if (!end || *end) return std::nullopt;
  tm.tm_isdst = -1;  // whatever daylight saving time said then
  const std::time_t t = std::mktime(&tm);
  if (t == std::time_t(-1)) return std::nullopt;
  return t;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = line.find('\t', a)) != std::string::npos; a = b + 1)
    out.push_back(line.substr(a, b - a));
  out.push_back(line.substr(a));
  return out;
}

// The value of a "Name: value" field (Megatron's _get_field: the text after ": ").
template <typename T>
std::optional<T> field(const std::string& s) {
  const size_t p = s.find(": ");
  if (p == std::string::npos) return std::nullopt;
  const std::string v = s.substr(p + 2);
  try {
    size_t used = 0;
    T x;
    if constexpr (std::is_same_v<T, int64_t>)
      x = std::stoll(v, &used);
    else
      x = std::stod(v, &used);
    if (used != v.size()) return std::nullopt;
    return x;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string progress_line(const std::string& timestamp, const std::string& job_id,
                          int64_t world_size, const std::string& message) {
  return fmt::format("{}\tJob ID: {}\t# GPUs: {}\t{}\n", timestamp, job_id, world_size, message);
}

std::optional<ProgressStart> progress_start(const std::string& text, int64_t world_size) {
  std::optional<ProgressStart> start;
  double latest = 0;                  // flops of the last committed checkpoint
  // "Saving async checkpoint" until its "Saved" line (a flag beside the value, not an
  // optional: g++ 12 warns of a maybe-uninitialised optional<double> here).
  double uncommitted = 0;
  bool pending = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    const std::vector<std::string> t = split_tabs(line);
    if (t.size() < 4) continue;
    const auto world = field<int64_t>(t[2]);
    if (!world) continue;
    const std::string& what = t[3];
    const auto flops = t.size() > 7 ? field<double>(t[7]) : std::nullopt;
    if (what == "Saved checkpoint" && flops) {
      latest = *flops;
    } else if (what == "Saving async checkpoint" && flops) {
      uncommitted = *flops, pending = true;
    } else if (what == "Saved async checkpoint" && pending) {
      latest = uncommitted, pending = false;
    }
    if (*world != world_size) {  // another world size: the run of jobs starts again
      start.reset();
      continue;
    }
    if (what == "Starting job" && !start)
      if (const auto when = parse_time(t[0])) start = ProgressStart{*when, latest};
  }
  return start;
}

ProgressLog::ProgressLog(std::string save_dir, int64_t world_size, bool writer)
    : path_((std::filesystem::path(std::move(save_dir)) / "progress.txt").string()),
      world_size_(world_size),
      writer_(writer),
      job_start_(std::chrono::steady_clock::now()),
      job_start_wall_(std::time(nullptr)) {
  if (!writer_) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  append("Starting job");
}

void ProgressLog::append(const std::string& message) const {
  if (!writer_) return;
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string line =
      progress_line(format_time(std::time(nullptr)), job ? job : "", world_size_, message);
  std::FILE* f = std::fopen(path_.c_str(), "a");
  bool ok = f != nullptr;
  if (f) {
    ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
    ok = std::fclose(f) == 0 && ok;  // flushed and closed at every line
  }
  if (!ok)
    log::warn("--log-progress: could not append to {}; the line was: {}", path_,
              line.substr(0, line.size() - 1));
}

void ProgressLog::checkpoint_saved(int64_t iteration, double flops_so_far,
                                   double flops_at_job_start, int64_t tokens_so_far,
                                   bool async) const {
  if (!writer_) return;
  const double job_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start_).count();
  const double tera_gpus = 1e12 * double(world_size_);
  const double job = (flops_so_far - flops_at_job_start) / (job_seconds * tera_gpus);
  // Since the first job of this world size. The file holds this job's own "Starting job";
  // should it have been removed, this job is the start. Its timestamps have whole seconds:
  // the span is at least this job's own, measured precisely.
  std::string text;
  if (std::FILE* f = std::fopen(path_.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
  }
  const ProgressStart start = progress_start(text, world_size_)
                                  .value_or(ProgressStart{job_start_wall_, flops_at_job_start});
  const double since = std::max(std::difftime(std::time(nullptr), start.time), job_seconds);
  const double cumulative = (flops_so_far - start.flops) / (since * tera_gpus);
  append(
      fmt::format("{}\tIteration: {}\tJob throughput: {:.1f} TFLOP/s/GPU\tCumulative "
                  "throughput: {:.1f} TFLOP/s/GPU\tFloating-point operations: {:.2e}\t"
                  "Tokens (in billions): {:.2f}",
                  async ? "Saving async checkpoint" : "Saved checkpoint", iteration, job,
                  cumulative, flops_so_far, double(tokens_so_far) / 1e9));
}

}  // namespace mcpp::training
