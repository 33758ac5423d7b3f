// --dist-ckpt-strictness (strictness.h): the value names and the warnings and errors of a load
// whose keys differ from the model's.
#include "checkpoint/strictness.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"

namespace mcpp::checkpoint {

namespace {
constexpr std::pair<const char*, Strictness> kStrictnessNames[] = {
    {"assume_ok_unexpected", Strictness::AssumeOkUnexpected},
    {"log_unexpected", Strictness::LogUnexpected},
    {"log_all", Strictness::LogAll},
    {"raise_unexpected", Strictness::RaiseUnexpected},
    {"raise_all", Strictness::RaiseAll},
    {"ignore_all", Strictness::IgnoreAll},
};

// "a, b, c, d, e and 7 more (12)".
std::string first_few(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 5;
  std::string s;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > kShown) s += fmt::format(" and {} more", keys.size() - kShown);
  return s;
}
}  // namespace

Strictness parse_strictness(const std::string& s) {
  for (auto [name, v] : kStrictnessNames)
    if (s == name) return v;
  MCPP_CHECK_HINT(s != "return_unexpected" && s != "return_all",
                  "pass --dist-ckpt-strictness log_unexpected (or log_all) to load around "
                  "mismatched keys and list them",
                  "--dist-ckpt-strictness {}: Megatron's loader returns the mismatched keys to "
                  "its caller, and a training run has nothing to do with them",
                  s);
  fail_at(__FILE__, __LINE__, fmt::format("--dist-ckpt-strictness {} is not a strictness", s),
          "choose one of assume_ok_unexpected, log_unexpected, log_all, raise_unexpected, "
          "raise_all, ignore_all");
}

const char* to_string(Strictness s) {
  for (auto [name, v] : kStrictnessNames)
    if (s == v) return name;
  return "?";
}

KeyAction unexpected_action(Strictness s) {
  switch (s) {
    case Strictness::LogUnexpected:
    case Strictness::LogAll: return KeyAction::Warn;
    case Strictness::IgnoreAll: return KeyAction::Ignore;
    default: return KeyAction::Raise;
  }
}

KeyAction missing_action(Strictness s) {
  switch (s) {
    case Strictness::AssumeOkUnexpected:
    case Strictness::RaiseAll: return KeyAction::Raise;
    case Strictness::LogAll: return KeyAction::Warn;
    default: return KeyAction::Ignore;
  }
}

void report_keys(Strictness s, bool unexpected, const std::vector<std::string>& keys,
                 const std::string& what, const std::string& where) {
  if (keys.empty()) return;
  const KeyAction act = unexpected ? unexpected_action(s) : missing_action(s);
  const std::string list = first_few(keys);
  if (unexpected) {
    MCPP_CHECK_HINT(act != KeyAction::Raise,
                    "the model flags differ from the checkpoint's (megatron inspect lists its "
                    "config); or pass --dist-ckpt-strictness log_unexpected to start those "
                    "from their initialisation",
                    "--dist-ckpt-strictness {}: the checkpoint has no tensor for {} {}(s) of "
                    "this model: {}",
                    to_string(s), keys.size(), what, list);
    if (act == KeyAction::Warn)
      log::warn("{}: the checkpoint has no tensor for {} {}(s) of this model; they keep their "
                "initial values (and fresh optimizer state) [--dist-ckpt-strictness {}]: {}",
                where, keys.size(), what, to_string(s), list);
    return;
  }
  MCPP_CHECK_HINT(act != KeyAction::Raise,
                  "the model flags differ from the checkpoint's (megatron inspect lists its "
                  "config); or pass --dist-ckpt-strictness log_all to load without them",
                  "--dist-ckpt-strictness {}: the checkpoint holds {} {}(s) this model does not "
                  "have: {}",
                  to_string(s), keys.size(), what, list);
  if (act == KeyAction::Warn)
    log::warn("{}: ignoring {} {}(s) of the checkpoint that this model does not have "
              "[--dist-ckpt-strictness {}]: {}",
              where, keys.size(), what, to_string(s), list);
}

}  // namespace mcpp::checkpoint
