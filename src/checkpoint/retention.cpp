#include "checkpoint/retention.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <regex>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;

std::optional<int64_t> tracked_iteration(const std::string& save_dir) {
  const std::string path = (fs::path(save_dir) / kTrackerFile).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  try {
    std::string s = read_text_file(path, 4096);
    s.erase(std::remove_if(s.begin(), s.end(), ::isspace), s.end());
    return parse_iteration_digits(s);
  } catch (const Error&) {
    return std::nullopt;
  }
}

namespace {

// The rename first: a crash while deleting never leaves a half-deleted iter_* folder behind.
// `why` names the flag in a warning.
void remove_iteration(const std::string& save_dir, int64_t it, const std::string& why) {
  const fs::path dir = fs::path(save_dir) / iteration_dir_name(it);
  std::error_code ec;
  if (fs::is_symlink(dir, ec)) {
    log::info(
        "  skipping deleting checkpoint from iteration {:7d} at {} since it is a symbolic "
        "link",
        it, save_dir);
    return;
  }
  if (!fs::is_directory(dir, ec)) return;  // gone already
  const fs::path doomed = dir.string() + ".del-" + std::to_string(::getpid());
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (!ec) fs::remove_all(doomed, ec);
  if (ec) {
    log::warn("  could not delete checkpoint from iteration {:7d} at {} ({}): {}", it, save_dir,
              why, ec.message());
    return;
  }
  log::info("  successfully deleted checkpoint from iteration {:7d} at {}", it, save_dir);
}

}  // namespace

void retire_checkpoint(const std::string& save_dir, int64_t prev, int64_t iteration,
                       int64_t every) {
  if (prev <= 0 || prev == iteration || prev % every == 0) return;
  remove_iteration(save_dir, prev, fmt::format("--save-retain-interval {}", every));
}

void retire_older_checkpoints(const std::string& save_dir, int64_t iteration) {
  static const std::regex name(R"(iter_(\d{7,}))");
  std::vector<int64_t> older;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!std::regex_match(n, m, name)) continue;
    if (const auto it = parse_iteration_digits(m[1]); it && *it < iteration)
      older.push_back(*it);
  }
  std::sort(older.begin(), older.end());
  for (int64_t it : older) remove_iteration(save_dir, it, "non-persistent checkpoints");
}

}  // namespace mcpp::checkpoint
