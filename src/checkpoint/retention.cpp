#include "checkpoint/retention.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

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

// The rename first: a crash while deleting never leaves a half-deleted iter_* folder behind.
void retire_checkpoint(const std::string& save_dir, int64_t prev, int64_t iteration,
                       int64_t every) {
  if (prev <= 0 || prev == iteration || prev % every == 0) return;
  const fs::path dir = fs::path(save_dir) / iteration_dir_name(prev);
  std::error_code ec;
  if (fs::is_symlink(dir, ec)) {
    log::info(
        "  skipping deleting checkpoint from iteration {:7d} at {} since it is a symbolic "
        "link",
        prev, save_dir);
    return;
  }
  if (!fs::is_directory(dir, ec)) return;  // gone already
  const fs::path doomed = dir.string() + ".del-" + std::to_string(::getpid());
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (!ec) fs::remove_all(doomed, ec);
  if (ec) {
    log::warn(
        "  could not delete checkpoint from iteration {:7d} at {} (--save-retain-interval "
        "{}): {}",
        prev, save_dir, every, ec.message());
    return;
  }
  log::info("  successfully deleted checkpoint from iteration {:7d} at {}", prev, save_dir);
}

}  // namespace mcpp::checkpoint
