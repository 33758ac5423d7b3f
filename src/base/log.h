// Rank-aware logging on top of spdlog. By default only rank 0 prints INFO;
// warnings and errors print on every rank, prefixed with the rank.
#pragma once
#include <fmt/format.h>

#include <string>

namespace mcpp::log {

enum class Level { Debug, Info, Warn, Error };

void set_rank(int rank, int world_size);
void set_level(Level level);
int rank();
// Writes one line to stdout (info/debug) or stderr (warn/error).
void write(Level level, const std::string& msg, bool all_ranks);

template <typename... A>
void info(fmt::format_string<A...> f, A&&... a) {
  write(Level::Info, fmt::format(f, std::forward<A>(a)...), false);
}
template <typename... A>
void info_all(fmt::format_string<A...> f, A&&... a) {
  write(Level::Info, fmt::format(f, std::forward<A>(a)...), true);
}
template <typename... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  write(Level::Debug, fmt::format(f, std::forward<A>(a)...), false);
}
template <typename... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  write(Level::Warn, fmt::format(f, std::forward<A>(a)...), true);
}
template <typename... A>
void error(fmt::format_string<A...> f, A&&... a) {
  write(Level::Error, fmt::format(f, std::forward<A>(a)...), true);
}

}  // namespace mcpp::log
