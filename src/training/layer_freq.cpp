// Megatron's moe_freq_type expressions (layer_freq.h).
#include "training/layer_freq.h"

#include <fmt/format.h>

#include <cctype>
#include <variant>

#include "base/error.h"

namespace mcpp::training {
namespace {

// A tiny evaluator for the list expressions Megatron's moe_freq_type passes to eval():
// sums of products of integers and integer lists ("([0]+[1]*3)*2").
struct FreqParser {
  const char* flag;
  const std::string& s;
  const char* hint;
  size_t i = 0;
  using Value = std::variant<int64_t, std::vector<int64_t>>;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(fmt::format("{} '{}': {} (at character {})", flag, s, why, i + 1), hint);
  }
  void skip() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    skip();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  int64_t integer() {
    skip();
    size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (start == i || i - start > 9) fail("expected a (small) non-negative integer");
    return std::stoll(s.substr(start, i - start));
  }
  Value factor() {
    if (eat('(')) {
      Value v = expr();
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    if (eat('[')) {
      std::vector<int64_t> l;
      if (!eat(']')) {
        do l.push_back(integer());
        while (eat(','));
        if (!eat(']')) fail("expected ']'");
      }
      return l;
    }
    return integer();
  }
  Value term() {
    Value v = factor();
    while (eat('*')) {
      Value w = factor();
      auto* vl = std::get_if<std::vector<int64_t>>(&v);
      auto* wl = std::get_if<std::vector<int64_t>>(&w);
      if (vl && wl) fail("a list times a list");
      if (!vl && !wl) {
        v = std::get<int64_t>(v) * std::get<int64_t>(w);
        continue;
      }
      const std::vector<int64_t>& l = vl ? *vl : *wl;
      const int64_t n = vl ? std::get<int64_t>(w) : std::get<int64_t>(v);
      if (n > 100000 || int64_t(l.size()) * n > 1000000) fail("list too long");
      std::vector<int64_t> r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), l.begin(), l.end());
      v = std::move(r);
    }
    return v;
  }
  Value expr() {
    Value v = term();
    while (eat('+')) {
      Value w = term();
      auto* vl = std::get_if<std::vector<int64_t>>(&v);
      auto* wl = std::get_if<std::vector<int64_t>>(&w);
      if (!vl != !wl) fail("adds a list and an integer");
      if (vl)
        vl->insert(vl->end(), wl->begin(), wl->end());
      else
        v = std::get<int64_t>(v) + std::get<int64_t>(w);
    }
    return v;
  }
};

}  // namespace

LayerFreq parse_layer_freq(const char* flag, const std::string& spec, const char* hint) {
  FreqParser p{flag, spec, hint};
  const FreqParser::Value v = p.expr();
  p.skip();
  if (p.i != spec.size()) p.fail("unexpected text");
  LayerFreq f;
  if (const auto* n = std::get_if<int64_t>(&v))
    f.every = *n;
  else
    f.list = std::get<std::vector<int64_t>>(v);
  return f;
}

}  // namespace mcpp::training
