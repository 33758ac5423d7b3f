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
  if (g_world > 1 && (all_ranks || level >= Level::Warn))
    std::fprintf(out, "[rank %d] %s%s\n", g_rank, tag, msg.c_str());
  else
    std::fprintf(out, "%s%s\n", tag, msg.c_str());
  std::fflush(out);
}

}  // namespace mcpp::log
