// One exception type for every user-facing failure. A message says what went
// wrong, why (what was expected and what was found) and how to fix it; the check
// macros add file and line so a bug report points at the code.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mcpp {

class Error : public std::runtime_error {
 public:
  // what: the failure; hint: what the user should do (may be empty).
  Error(std::string what, std::string hint = {}, const char* file = nullptr, int line = 0);
  const std::string& hint() const { return hint_; }
  const std::string& summary() const { return what_; }

 private:
  static std::string compose(const std::string& what, const std::string& hint, const char* file,
                             int line);
  std::string what_, hint_;
};

[[noreturn]] void fail_at(const char* file, int line, std::string what, std::string hint = {});

}  // namespace mcpp

// MCPP_CHECK(cond, "fmt {}", args...) -> throws mcpp::Error("fmt ...") with file:line.
#define MCPP_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) [[unlikely]]                                       \
      ::mcpp::fail_at(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

// MCPP_CHECK_HINT(cond, hint, "fmt", args...): as MCPP_CHECK with a HINT line.
#define MCPP_CHECK_HINT(cond, hint, ...)                                     \
  do {                                                                       \
    if (!(cond)) [[unlikely]]                                                \
      ::mcpp::fail_at(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__), hint); \
  } while (0)

#define MCPP_FAIL(...) ::mcpp::fail_at(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
