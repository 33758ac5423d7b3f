#include "base/log.h"

#include <cstdio>
#include <mutex>

namespace mcpp::log {
namespace {
int g_rank = 0, g_world = 1;
Level g_level = Level::Info;
std::mutex g_mu;
}  // namespace

void set_rank(int r, int w) { g_rank = r, g_world = w; }
void set_level(Level l) { g_level = l; }
int rank() { return g_rank; }

void write(Level level, const std::string& msg, bool all_ranks) {
  if (level < g_level) return;
  if (level < Level::Warn && !all_ranks && g_rank != 0) return;
  std::lock_guard lock(g_mu);
  FILE* out = level >= Level::Warn ? stderr : stdout;
  const char* tag = level == Level::Warn ? "WARNING: " : level == Level::Error ? "ERROR: " : "";
  // One write per line (each well under the pipe's atomic size): under mpirun the ranks
  // share one output stream, and a line must never be cut by another rank's.
  const std::string prefix = g_world > 1 && (all_ranks || level >= Level::Warn)
                                 ? "[rank " + std::to_string(g_rank) + "] "
                                 : std::string();
  for (size_t start = 0;;) {
    const size_t nl = msg.find('\n', start);
    const size_t end = nl == std::string::npos ? msg.size() : nl;
    std::string line = start == 0 ? prefix + tag : prefix;  // the tag once, on the first line
    line.append(msg, start, end - start);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
}

}  // namespace mcpp::log
