#include "base/error.h"

namespace mcpp {

Error::Error(std::string what, std::string hint, const char* file, int line)
    : std::runtime_error(compose(what, hint, file, line)), what_(std::move(what)),
      hint_(std::move(hint)) {}

std::string Error::compose(const std::string& what, const std::string& hint, const char* file,
                           int line) {
  std::string s = what;
  if (!hint.empty()) s += "\n  HINT: " + hint;
  if (file) s += fmt::format("\n  (at {}:{})", file, line);
  return s;
}

void fail_at(const char* file, int line, std::string what, std::string hint) {
  // Strip the build-machine prefix so messages show src/... paths.
  std::string f = file;
  if (auto p = f.rfind("/src/"); p != std::string::npos) f = f.substr(p + 1);
  throw Error(std::move(what), std::move(hint), f.c_str(), line);
}

}  // namespace mcpp
