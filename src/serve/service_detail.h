// Internals of the serve service shared by its two files: request field checking and
// the growing text of one sequence.
#pragma once
#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "serve/service.h"

namespace mcpp::serve::detail {

using nlohmann::json;

// JSON text that survives bytes a byte-level tokenizer split inside a UTF-8 character.
inline std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

[[noreturn]] inline void bad(const std::string& param, const std::string& msg, int status = 400) {
  throw ApiError{status, msg, param};
}

inline const char* type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// The fields of a request body: unknown names and wrong types are ApiErrors naming them.
class Fields {
 public:
  Fields(const json& j, const std::string& what, std::initializer_list<const char*> known) : j_(j) {
    if (!j.is_object()) bad("", fmt::format("the body of {} must be a JSON object, got {}", what, type_name(j)));
    std::set<std::string> k(known.begin(), known.end());
    for (const auto& [name, v] : j.items())
      if (!k.count(name)) {
        std::string all;
        for (const char* n : known) all += std::string(all.empty() ? "" : ", ") + n;
        bad(name, fmt::format("unknown field '{}' in {} (known: {})", name, what, all));
      }
  }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const { return j_[k]; }
  bool get_bool(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j_[k].is_boolean()) bad(k, fmt::format("'{}' must be a boolean, got {}", k, type_name(j_[k])));
    return j_[k].get<bool>();
  }
  int64_t get_int(const char* k, int64_t def, int64_t lo, int64_t hi) const {
    if (!has(k)) return def;
    const json& v = j_[k];
    int64_t x = 0;
    if (v.is_number_integer() || v.is_number_unsigned()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) x = INT64_MAX;
      else x = v.get<int64_t>();
    } else {
      bad(k, fmt::format("'{}' must be an integer, got {}", k, type_name(v)));
    }
    if (x < lo || x > hi) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, x));
    return x;
  }
  double get_num(const char* k, double def, double lo, double hi) const {
    if (!has(k)) return def;
    const json& v = j_[k];
    if (!v.is_number()) bad(k, fmt::format("'{}' must be a number, got {}", k, type_name(v)));
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) bad(k, fmt::format("'{}' must be in [{}, {}], got {}", k, lo, hi, x));
    return x;
  }
  std::string get_string(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j_[k].is_string()) bad(k, fmt::format("'{}' must be a string, got {}", k, type_name(j_[k])));
    return j_[k].get<std::string>();
  }

 private:
  const json& j_;
};

// One sequence's text as it grows: the continuation's text is decode(prompt + generated)
// past decode(prompt) (a token's text can depend on its neighbours), stop strings cut it,
// and a stream only sends what can no longer change (no half UTF-8 character, no prefix
// of a stop string).
struct Track {
  std::vector<int32_t> prompt;
  std::string prompt_text;
  std::vector<int32_t> gen;  // generated ids without the EOD
  std::string text;          // the continuation's text
  size_t emitted = 0;
  std::vector<std::string> stops;
  bool stop_eol = false, stop_double_eol = false;
  SequenceResult result;
  bool done = false;
  // Nothing to check or stream per token (no stop strings, no end-of-line stops, not a
  // stream): add() only records the id and settle() decodes the text once at the end,
  // instead of decoding prompt + answer at every token on the engine thread.
  bool lazy = false;

  // false: a stop string or end of line ended the continuation.
  bool add(const data::Tokenizer& tok, int32_t id, bool is_eod) {
    if (is_eod) return true;
    gen.push_back(id);
    if (lazy) return true;
    return update(tok);
  }
  void settle(const data::Tokenizer& tok) {
    if (lazy) update(tok);
  }
  bool update(const data::Tokenizer& tok) {
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    const std::string full = tok.decode(all);
    const size_t before = text.size();
    text = full.compare(0, prompt_text.size(), prompt_text) == 0 ? full.substr(prompt_text.size())
                                                                  : tok.decode(gen);
    size_t cut = std::string::npos;
    for (const auto& s : stops)
      if (auto p = text.find(s, before >= s.size() ? before - s.size() : 0); p != std::string::npos)
        cut = std::min(cut, p);
    if (cut != std::string::npos) {
      text.resize(cut);
      return false;
    }
    if (stop_double_eol && text.find("\n\n") != std::string::npos) return false;
    if (stop_eol && text.find('\n', before > 0 ? before - 1 : 0) != std::string::npos) return false;
    return true;
  }
  std::string take(bool final) {
    size_t end = text.size();
    if (!final) {
      size_t hold = 0;
      for (const auto& s : stops) hold = std::max(hold, s.size() - 1);
      end = end > hold ? end - hold : 0;
      // Not inside a UTF-8 character: back off over continuation bytes to a lead byte
      // whose character is not complete.
      for (size_t back = 1; back <= 4 && back <= end; ++back) {
        const unsigned char c = static_cast<unsigned char>(text[end - back]);
        if ((c & 0xC0) == 0x80) continue;
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) end -= back;
        break;
      }
    }
    if (end <= emitted) return {};
    std::string d = text.substr(emitted, end - emitted);
    emitted = end;
    return d;
  }
};

inline std::string finish_reason(const std::string& stop) {
  if (stop == "max_tokens" || stop == "max_positions") return "length";
  return "stop";
}

inline int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace mcpp::serve::detail

namespace mcpp::serve {

struct Service::Job {
  std::string kind;  // api | completions | chat
  bool stream = false, include_usage = false, echo = false;
  std::string id, model;
  int64_t created = 0;
  std::vector<detail::Track> tracks;
  size_t remaining = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::shared_ptr<Reply> reply;
};

}  // namespace mcpp::serve
