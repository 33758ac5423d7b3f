// Megatron-LM flags: table, parser, implemented/by-design lists, print_args (validation:
// validate_args.cpp).
// Semantics follow Python's argparse as Megatron configures it (allow_abbrev=False) and
// megatron/training/arguments.py's validate_args; see docs/flags.md.
#include "training/arguments.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string_view>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "data/gpt_dataset.h"
#include "parallel/pipeline/schedule.h"

namespace mcpp::training {
namespace {

constexpr FlagRow kMegatronFlags[] = {
#include "training/flag_table.inc"
};

// megatron.cpp's own flags: not Megatron-LM's, so they are listed apart and marked as ours.
constexpr FlagRow kOurFlags[] = {
    {"megatron.cpp", "--device", "device", FlagAction::Store, "str", "", "auto|cpu|cuda", "auto"},
    {"megatron.cpp", "--threads", "threads", FlagAction::Store, "int", "", "", "0"},
    {"megatron.cpp", "--pipeline-schedule", "pipeline_schedule", FlagAction::Store, "str", "",
     "1f1b|gpipe", "1f1b"},
    {"megatron.cpp", "--keep-mlp-activations", "keep_mlp_activations", FlagAction::Store, "int", "",
     "", "0"},
};

const char* const kFlagsDoc = "docs/flags.md";

// ---- small helpers ----------------------------------------------------------------------

std::vector<std::string> split_on(std::string_view s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    if (p == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidates closest to `word` (at most 3), when close enough to be a plausible typo.
std::vector<std::string> closest(const std::string& word, const std::vector<std::string>& cands) {
  size_t best = SIZE_MAX;
  std::vector<std::string> out;
  for (const auto& c : cands) {
    size_t d = edit_distance(word, c);
    if (d < best) best = d, out.clear();
    if (d == best && out.size() < 3) out.push_back(c);
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  if (best > limit) out.clear();
  return out;
}

bool looks_like_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

bool is_flag_token(const std::string& s) {
  return s.size() >= 2 && s[0] == '-' && !looks_like_number(s);
}

std::optional<int64_t> to_int(std::string s) {
  std::erase(s, '_');  // Python's int() accepts 1_000
  std::string_view v = s;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return out;
}

std::optional<double> to_float(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return std::nullopt;
  return v;
}

bool is_int_type(const FlagRow& r) { return std::string_view(r.type) == "int"; }
bool is_float_type(const FlagRow& r) { return std::string_view(r.type) == "float"; }
bool is_bool_action(const FlagRow& r) { return r.action != FlagAction::Store; }
bool is_list(const FlagRow& r) { return r.nargs[0] != '\0'; }

// Choice as the user types it: Megatron's enum choices print as "AttnBackend.flash".
std::string choice_name(const FlagRow& r, const std::string& c) {
  if (std::string_view(r.type) == "enum_type_handler") {
    auto p = c.rfind('.');
    if (p != std::string::npos) return c.substr(p + 1);
  }
  return c;
}

// A default as the user would type it: "<AttnBackend.auto: 5>" -> "auto".
std::string default_name(const FlagRow& r) {
  std::string d = r.dflt;
  if (d.size() > 2 && d.front() == '<' && d.back() == '>') {
    auto colon = d.find(':');
    auto dot = d.rfind('.', colon);
    if (colon != std::string::npos && dot != std::string::npos)
      return d.substr(dot + 1, colon - dot - 1);
  }
  std::replace(d.begin(), d.end(), '"', '\'');
  return d;
}

// Python's str() of one parsed token of this flag's type.
std::string scalar_str(const FlagRow& r, const std::string& tok) {
  if (is_int_type(r))
    if (auto v = to_int(tok)) return std::to_string(*v);
  if (is_float_type(r))
    if (auto v = to_float(tok)) return python_float(*v);
  return tok;
}

std::string list_str(const FlagRow& r, const std::vector<std::string>& toks) {
  std::vector<std::string> items;
  for (const auto& t : toks) {
    std::string s = scalar_str(r, t);
    items.push_back(is_int_type(r) || is_float_type(r) ? s : "'" + s + "'");
  }
  return "[" + join(items, ", ") + "]";
}

// ---- what the command line said ---------------------------------------------------------

struct Given {
  const FlagRow* row = nullptr;
  std::string spelling;             // as typed, without "=value"
  std::vector<std::string> tokens;  // Store: the values; bool actions: none
  bool flag_value = false;          // bool actions: the value stored
  std::string str() const {
    if (is_bool_action(*row)) return flag_value ? "True" : "False";
    if (is_list(*row)) return list_str(*row, tokens);
    return scalar_str(*row, tokens.at(0));
  }
};

// Same value as Megatron's default? Numbers compare as numbers ("1e-5" == "1e-05").
bool equals_default(const Given& g) {
  const FlagRow& r = *g.row;
  const std::string d = default_name(r);
  if (!is_bool_action(r) && !is_list(r) && d != "None") {
    if (is_int_type(r) || is_float_type(r)) {
      auto a = to_float(g.tokens.at(0)), b = to_float(d);
      return a && b && *a == *b;
    }
  }
  if (is_bool_action(r) && d == "None") return false;
  return g.str() == d;
}

// ---- typed fields: the list of implemented dests -----------------------------------------

int64_t get_int(const Given& g) { return *to_int(g.tokens.at(0)); }
double get_float(const Given& g) { return *to_float(g.tokens.at(0)); }

void assign(int64_t& f, const Given& g) { f = get_int(g); }
void assign(double& f, const Given& g) { f = get_float(g); }
void assign(bool& f, const Given& g) { f = g.flag_value; }
void assign(std::string& f, const Given& g) { f = g.tokens.at(0); }
void assign(std::optional<int64_t>& f, const Given& g) { f = get_int(g); }
void assign(std::optional<double>& f, const Given& g) { f = get_float(g); }
void assign(std::optional<std::string>& f, const Given& g) { f = g.tokens.at(0); }
void assign(std::optional<bool>& f, const Given& g) { f = g.flag_value; }
void assign(std::vector<std::string>& f, const Given& g) { f = g.tokens; }
void assign(std::vector<int64_t>& f, const Given& g) {
  f.clear();
  for (const auto& t : g.tokens) f.push_back(*to_int(t));
}
void assign(std::optional<std::vector<int64_t>>& f, const Given& g) {
  f.emplace();
  assign(*f, g);
}

std::string show(int64_t v) { return std::to_string(v); }
std::string show(double v) { return python_float(v); }
std::string show(bool v) { return v ? "True" : "False"; }
std::string show(const std::string& v) { return v; }
template <typename T>
std::string show(const std::optional<T>& v) {
  return v ? show(*v) : "None";
}
std::string show(const std::vector<std::string>& v) {
  if (v.empty()) return "None";
  std::vector<std::string> q;
  for (const auto& s : v) q.push_back("'" + s + "'");
  return "[" + join(q, ", ") + "]";
}

std::string show(const std::vector<int64_t>& v) {
  std::vector<std::string> q;
  for (int64_t x : v) q.push_back(std::to_string(x));
  return "[" + join(q, ", ") + "]";
}
std::string show(const std::optional<std::vector<int64_t>>& v) {
  return v ? show(*v) : "None";
}

std::string show_int_or_float(const std::optional<double>& v) {
  return v ? python_int_or_float(*v) : "None";
}

template <auto M>
void set_field(Args& a, const Given& g) {
  assign(a.*M, g);
}
template <auto M>
std::string show_field(const Args& a) {
  return show(a.*M);
}

struct Binding {
  const char* dest;
  void (*set)(Args&, const Given&);  // null: derived, shown by print_args but not a flag here
  std::string (*show)(const Args&);
};

#define MCPP_FLAG(name) \
  Binding { #name, &set_field < &Args::name>, &show_field < &Args::name> }
#define MCPP_DERIVED(name) \
  Binding { #name, nullptr, &show_field < &Args::name> }

// Flags whose request megatron.cpp always satisfies. `values` lists the accepted values
// (Python str() form, '|'-separated); empty accepts any.
struct ByDesign {
  const char* dest;
  const char* values;
  const char* reason;
};

#include "training/flag_bindings.inc"

// ---- lookup -----------------------------------------------------------------------------

struct Spelling {
  const FlagRow* row;
  bool ours;
};

const std::unordered_map<std::string, Spelling>& spellings() {
  static const auto* m = [] {
    auto* m = new std::unordered_map<std::string, Spelling>;
    for (const auto& r : kMegatronFlags)
      for (const auto& s : split_on(r.flags, ' ')) (*m)[s] = {&r, false};
    for (const auto& r : kOurFlags)
      for (const auto& s : split_on(r.flags, ' ')) (*m)[s] = {&r, true};
    return m;
  }();
  return *m;
}

const Binding* find_binding(const std::string& dest) {
  for (const auto& b : kBindings)
    if (dest == b.dest) return &b;
  return nullptr;
}

const ByDesign* find_by_design(const std::string& dest) {
  for (const auto& b : kByDesign)
    if (dest == b.dest) return &b;
  return nullptr;
}

const FlagRow* row_of(const std::string& dest) {
  for (const auto& r : kOurFlags)
    if (dest == r.dest) return &r;
  for (const auto& r : kMegatronFlags)
    if (dest == r.dest) return &r;
  return nullptr;
}

std::string first_spelling(const FlagRow& r) { return split_on(r.flags, ' ').at(0); }

}  // namespace

std::string flag_name(const std::string& dest) {
  const FlagRow* r = row_of(dest);
  return r ? first_spelling(*r) : "--" + dest;
}

namespace {

[[noreturn]] void unknown_flag(const std::string& name) {
  std::vector<std::string> all;
  for (const auto& [s, _] : spellings()) all.push_back(s);
  std::sort(all.begin(), all.end());
  std::string probe = name;
  if (probe.size() > 1 && probe[1] != '-') probe = "-" + probe;  // "-lr" -> "--lr"
  auto near = closest(probe, all);
  std::string what = "unknown flag " + name;
  if (!near.empty()) what += "; did you mean " + join(near, " or ") + "?";
  throw Error(what, fmt::format("`megatron train --help` lists the flags megatron.cpp "
                                "implements; {} explains the rest",
                                kFlagsDoc));
}

// Converts and checks one value token of `row` (type and choices), as argparse does.
void check_value(const FlagRow& row, const std::string& spelling, const std::string& tok) {
  if (is_int_type(row) && !to_int(tok))
    throw Error(fmt::format("{} expects an integer, got '{}'", spelling, tok),
                fmt::format("write a whole number, e.g. {} 8", spelling));
  if (is_float_type(row) && !to_float(tok))
    throw Error(fmt::format("{} expects a number, got '{}'", spelling, tok),
                fmt::format("write a decimal number, e.g. {} 1e-4", spelling));
  // Python's float() takes "nan" and "inf"; no flag of ours means anything by them, and a
  // NaN passes every later `x >= 0` check the wrong way (--lr nan "is negative").
  if (is_float_type(row) && !std::isfinite(*to_float(tok)))
    throw Error(fmt::format("{} expects a finite number, got '{}'", spelling, tok),
                fmt::format("write a decimal number, e.g. {} 1e-4", spelling));
  if (!row.choices[0]) return;
  std::vector<std::string> names;
  bool numeric = true;
  for (const auto& c : split_on(row.choices, '|')) {
    names.push_back(choice_name(row, c));
    numeric = numeric && to_int(c).has_value();
  }
  // Enum choices printed as numbers (--exit-signal) are converted from names by Megatron.
  if (numeric && std::string_view(row.type) == "enum_type_handler") return;
  const std::string v = scalar_str(row, tok);
  if (std::find(names.begin(), names.end(), v) != names.end()) return;
  auto near = closest(v, names);
  throw Error(
      fmt::format("{}: '{}' is not one of {}", spelling, tok, join(names, ", ")),
      near.empty() ? "pick one of the listed values" : fmt::format("did you mean '{}'?", near[0]));
}

}  // namespace

// ---- public: tables ---------------------------------------------------------------------

std::span<const FlagRow> megatron_flag_table() { return kMegatronFlags; }
std::span<const FlagRow> mcpp_flag_table() { return kOurFlags; }

FlagSupport flag_support(const std::string& dest) {
  for (const auto& r : kOurFlags)
    if (dest == r.dest) return FlagSupport::Ours;
  if (const Binding* b = find_binding(dest); b && b->set) return FlagSupport::Implemented;
  if (find_by_design(dest)) return FlagSupport::ByDesign;
  return FlagSupport::NotImplemented;
}

std::string python_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // 1 -> 1.0; not 1e-05/inf/nan
  return s;
}

std::string python_int_or_float(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15)
    return std::to_string(int64_t(v));
  return python_float(v);
}

// ---- public: parsing --------------------------------------------------------------------

Args parse_args(const std::vector<std::string>& argv) {
  Args args;
  std::map<std::string, Given> given;  // by dest; a repeated flag overwrites (last wins)
  const auto& index = spellings();

  for (size_t i = 0; i < argv.size();) {
    const std::string& tok = argv[i++];
    if (tok == "-h" || tok == "--help") {
      args.help = true;
      continue;
    }
    if (!is_flag_token(tok))
      throw Error(
          fmt::format("unexpected argument '{}': it follows no flag that takes a value", tok),
          "flags start with --; check the quoting of the previous flag's value, and "
          "that the previous flag takes a value at all");
    std::string name = tok;
    std::optional<std::string> inline_value;
    if (auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq);
      inline_value = tok.substr(eq + 1);
    }
    auto it = index.find(name);
    if (it == index.end()) unknown_flag(name);
    const FlagRow& row = *it->second.row;

    Given g;
    g.row = &row;
    g.spelling = name;
    if (is_bool_action(row)) {
      if (inline_value)
        throw Error(fmt::format("{} takes no value (got '{}')", name, *inline_value),
                    fmt::format("write {} alone", name));
      if (row.action == FlagAction::StoreTrue) g.flag_value = true;
      if (row.action == FlagAction::StoreFalse) g.flag_value = false;
      if (row.action == FlagAction::BooleanOptional)
        g.flag_value = name != first_spelling(row) ? false : true;  // --no-x is the 2nd spelling
    } else {
      const std::string nargs = row.nargs;
      if (inline_value) {
        g.tokens.push_back(*inline_value);
      } else if (nargs.empty()) {
        if (i >= argv.size() || is_flag_token(argv[i]))
          throw Error(fmt::format("{} needs a value", name),
                      fmt::format("write {} VALUE (Megatron's default is {})", name, row.dflt));
        g.tokens.push_back(argv[i++]);
      } else {
        while (i < argv.size() && !is_flag_token(argv[i])) g.tokens.push_back(argv[i++]);
      }
      if (nargs == "+" && g.tokens.empty())
        throw Error(fmt::format("{} needs at least one value", name),
                    fmt::format("write {} VALUE [VALUE ...]", name));
      if (auto n = to_int(nargs); n && static_cast<int64_t>(g.tokens.size()) != *n)
        throw Error(fmt::format("{} needs exactly {} values, got {}", name, *n, g.tokens.size()),
                    fmt::format("write {} followed by {} values", name, *n));
      for (const auto& t : g.tokens) check_value(row, name, t);
    }
    given[row.dest] = std::move(g);
  }

  std::vector<std::string> not_implemented;
  for (const auto& [dest, g] : given) {
    args.given[dest] = g.str();
    if (const Binding* b = find_binding(dest); b && b->set) {
      b->set(args, g);
      continue;
    }
    if (const ByDesign* d = find_by_design(dest)) {
      auto ok = split_on(d->values, '|');
      if (ok.empty() || equals_default(g) || std::count(ok.begin(), ok.end(), g.str())) continue;
      throw Error(
          fmt::format("{} {} is not supported by megatron.cpp (accepted: {}): {}", g.spelling,
                      g.str(), join(ok, ", "), d->reason),
          fmt::format("drop {} or give one of the accepted values; see {}", g.spelling, kFlagsDoc));
    }
    if (equals_default(g)) continue;  // harmless: asks for what Megatron does by default
    not_implemented.push_back(
        fmt::format("{} is a Megatron-LM flag that megatron.cpp does not implement yet (given {}, "
                    "Megatron's default is {})",
                    g.spelling, g.str(), g.row->dflt));
  }
  if (!not_implemented.empty())
    throw Error(join(not_implemented, "\n"),
                fmt::format("remove the flag(s) or set them to Megatron's default; {} lists "
                            "what megatron.cpp implements and how to ask for more",
                            kFlagsDoc));
  return args;
}

optim::SchedulerConfig lr_scheduler_config(const Args& a) {
  MCPP_CHECK_HINT(a.global_batch_size > 0 && (a.lr_decay_iters || a.lr_decay_samples),
                  "call validate_args first", "lr_scheduler_config: arguments not validated");
  optim::SchedulerConfig c;
  c.init_lr = a.lr_warmup_init;
  c.max_lr = a.lr;
  c.min_lr = a.min_lr;
  c.decay_style = optim::parse_lr_decay_style(a.lr_decay_style);
  c.wsd_decay_style = optim::parse_wsd_decay_style(a.lr_wsd_decay_style);
  c.wd_incr_style = optim::parse_wd_incr_style(a.weight_decay_incr_style);
  c.start_wd = a.start_weight_decay.value_or(a.weight_decay);
  c.end_wd = a.end_weight_decay.value_or(a.weight_decay);
  const int64_t gbs = a.global_batch_size;
  if (!a.sample_based()) {  // Megatron's get_optimizer_param_scheduler, iteration branch
    c.decay_steps = a.lr_decay_iters.value_or(a.train_iters) * gbs;
    c.wd_incr_steps = a.train_iters * gbs;
    if (a.lr_wsd_decay_iters) c.wsd_decay_steps = *a.lr_wsd_decay_iters * gbs;
    c.warmup_steps = a.lr_warmup_fraction
                         ? *a.lr_warmup_fraction * static_cast<double>(c.decay_steps)
                         : static_cast<double>(a.lr_warmup_iters * gbs);
  } else {  // sample branch
    c.decay_steps = a.lr_decay_samples.value_or(*a.train_samples);
    c.wd_incr_steps = *a.train_samples;
    c.wsd_decay_steps = a.lr_wsd_decay_samples;
    c.warmup_steps = a.lr_warmup_fraction
                         ? *a.lr_warmup_fraction * static_cast<double>(c.decay_steps)
                         : static_cast<double>(a.lr_warmup_samples);
  }
  return c;
}

// ---- public: vocabulary padding ---------------------------------------------------------

int64_t padded_vocab_size(int64_t orig, int64_t divisible_by, int64_t tp) {
  MCPP_CHECK_HINT(orig > 0, "check the tokenizer / --vocab-size",
                  "vocabulary size {} is not "
                  "positive",
                  orig);
  MCPP_CHECK_HINT(divisible_by > 0 && tp > 0, "give --make-vocab-size-divisible-by >= 1",
                  "cannot pad the vocabulary to a multiple of {} x TP {}", divisible_by, tp);
  const int64_t multiple = divisible_by * tp;
  return (orig + multiple - 1) / multiple * multiple;
}

int64_t resolve_padded_vocab_size(Args& a, int64_t vocab) {
  if (!a.was_given("padded_vocab_size")) {
    a.padded_vocab_size =
        padded_vocab_size(vocab, a.make_vocab_size_divisible_by, a.tensor_model_parallel_size);
    return *a.padded_vocab_size;
  }
  // Megatron takes the size as is; a size below the tokenizer's would leave token ids
  // without an embedding row (an out-of-range read in the first step).
  const int64_t n = *a.padded_vocab_size;
  MCPP_CHECK_HINT(n >= vocab,
                  fmt::format("give --padded-vocab-size at least {}, or drop it (the tokenizer's "
                              "size is then padded to a multiple of "
                              "--make-vocab-size-divisible-by x TP: {})",
                              vocab,
                              padded_vocab_size(vocab, a.make_vocab_size_divisible_by,
                                                a.tensor_model_parallel_size)),
                  "--padded-vocab-size {} is smaller than the vocabulary of the tokenizer ({}, "
                  "{} token ids): ids {} and up would have no embedding row",
                  n, a.tokenizer_type, vocab, n);
  return n;
}

std::string padded_vocab_message(int64_t orig, int64_t padded, bool from_flag) {
  return fmt::format(" > padded vocab (size: {}) with {} dummy tokens (new size: {}{})", orig,
                     padded - orig, padded, from_flag ? ", --padded-vocab-size" : "");
}

// ---- public: printing -------------------------------------------------------------------

std::string format_args(const Args& a) {
  std::map<std::string, std::string> values;  // dest -> Python str()
  for (const auto& r : kMegatronFlags) {
    auto it = a.given.find(r.dest);
    if (!values.count(r.dest)) values[r.dest] = it != a.given.end() ? it->second : r.dflt;
  }
  for (const auto& b : kBindings) {
    std::string v = b.show(a);
    const FlagRow* r = row_of(b.dest);
    // A required size not given (0) prints as Megatron's None.
    if (r && std::string_view(r->dflt) == "None" && !a.was_given(b.dest) &&
        (v == "0" || v == "0.0"))
      v = "None";
    values[b.dest] = v;
  }
  std::vector<std::string> lines;
  for (const auto& [name, v] : values) {
    const int dots = 48 - static_cast<int>(name.size());
    lines.push_back(fmt::format("  {} {} {}", name, std::string(std::max(dots, 0), '.'), v));
  }
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  std::stable_sort(lines.begin(), lines.end(),
                   [&](const std::string& x, const std::string& y) { return lower(x) < lower(y); });
  std::string out = "------------------------ arguments ------------------------\n";
  for (const auto& l : lines) out += l + "\n";
  out += "-------------------- end of arguments ---------------------";
  return out;
}

void print_args(const Args& a) { log::info("{}", format_args(a)); }

std::vector<std::string> describe_by_design_flags(const Args& a) {
  std::vector<std::string> out;
  for (const auto& d : kByDesign)
    if (auto it = a.given.find(d.dest); it != a.given.end())
      out.push_back(
          fmt::format("{} {}: accepted by design: {}", flag_name(d.dest), it->second, d.reason));
  return out;
}

std::string help_text() {
  std::string out =
      "usage: megatron train [flags]   (Megatron-LM pretrain_gpt.py flags)\n\n"
      "Implemented Megatron-LM flags:\n";
  auto line = [](const FlagRow& r) {
    std::string spell = join(split_on(r.flags, ' '), ", ");
    std::string meta;
    if (r.action == FlagAction::Store)
      meta = r.choices[0] ? " {" + join(split_on(r.choices, '|'), ",") + "}"
             : is_list(r) ? " VALUE [VALUE ...]"
                          : " " + std::string(is_int_type(r)     ? "N"
                                              : is_float_type(r) ? "X"
                                                                 : "S");
    if (is_bool_action(r)) return fmt::format("  {}\n", spell);  // a switch: no default shown
    return fmt::format("  {}{}  (default: {})\n", spell, meta, r.dflt);
  };
  std::string group;
  for (const auto& r : kMegatronFlags) {
    if (flag_support(r.dest) != FlagSupport::Implemented) continue;
    if (group != r.group) out += fmt::format(" [{}]\n", group = r.group);
    out += line(r);
  }
  out += "\nAccepted by design (megatron.cpp always behaves this way):\n";
  for (const auto& d : kByDesign) out += fmt::format("  {}: {}\n", flag_name(d.dest), d.reason);
  out += "\nmegatron.cpp's own flags (not Megatron-LM's):\n";
  for (const auto& r : kOurFlags) out += line(r);
  out += fmt::format(
      "\nEvery other Megatron-LM flag is accepted only with its default value; see {}.\n",
      kFlagsDoc);
  return out;
}

}  // namespace mcpp::training
