#include "parallel/pipeline/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "base/error.h"
#include "parallel/pipeline/schedule.h"

namespace mcpp::parallel::pipeline {

namespace {

constexpr const char* kFlag = "--pipeline-model-parallel-layout";
constexpr const char* kSyntax =
    "write the layout with E (embedding), t (transformer layer), m (MTP layer), L (loss), "
    "'|' between stages, x*N and (...)*N repeats, e.g. \"Et*3|(tt|)*2tmL\"";
// A typo such as t*99999999 must fail here, not exhaust memory.
constexpr size_t kMaxExpanded = size_t(1) << 20;

bool is_symbol(char c) { return c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|'; }

// Recursive descent over  seq := item*,  item := (symbol | '|' | '(' seq ')') ('*' N)?
// Megatron expands the same strings with two regular expressions, which do not nest and
// silently misread "x*2*3"; those are errors here.
struct Expander {
  const std::string& text;  // the flag's value, commas removed
  size_t pos = 0;

  [[noreturn]] void fail(const std::string& what, const std::string& hint = kSyntax) const {
    throw Error(fmt::format("{} \"{}\": {}", kFlag, text, what), hint);
  }

  std::string seq(int depth) {
    std::string out;
    while (pos < text.size() && text[pos] != ')') {
      const char c = text[pos];
      std::string atom;
      if (c == '(') {
        ++pos;
        atom = seq(depth + 1);
        if (pos >= text.size()) fail("a '(' is never closed");
        ++pos;  // ')'
        if (pos >= text.size() || text[pos] != '*')
          fail("a parenthesised group must be followed by *N (Megatron expands only those)");
      } else if (is_symbol(c)) {
        atom = std::string(1, c), ++pos;
      } else if (c == '*') {
        fail(fmt::format("the '*' at position {} repeats nothing", pos));
      } else {
        fail(
            fmt::format("unknown layer symbol '{}' at position {}; Megatron's GPT layout "
                        "knows E, t, m and L (a hybrid model's symbols are not supported)",
                        c, pos));
      }
      size_t count = 1;
      if (pos < text.size() && text[pos] == '*') {
        const size_t start = ++pos;
        while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
        if (pos == start) fail(fmt::format("the '*' at position {} has no count", start - 1));
        if (pos - start > 7) fail("a repeat count above 9999999");
        count = std::stoul(text.substr(start, pos - start));
        if (pos < text.size() && text[pos] == '*')
          fail(
              fmt::format("a repeat of a repeat at position {}; put the group in "
                          "parentheses: (x*N)*M",
                          pos));
      }
      if (out.size() + atom.size() * count > kMaxExpanded)
        fail(fmt::format("expands to more than {} symbols", kMaxExpanded));
      for (size_t k = 0; k < count; ++k) out += atom;
    }
    if (depth == 0 && pos < text.size()) fail(fmt::format("a ')' at position {} without '('", pos));
    return out;
  }
};

int count(const std::vector<std::string>& stages, char c) {
  int n = 0;
  for (const auto& s : stages) n += int(std::count(s.begin(), s.end(), c));
  return n;
}

}  // namespace

std::vector<std::string> expand_layout(const std::string& text) {
  std::string t = text;
  t.erase(std::remove(t.begin(), t.end(), ','), t.end());  // cosmetic (Megatron drops them)
  Expander ex{t};
  const std::string flat = ex.seq(0);
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|')
      stages.emplace_back();
    else
      stages.back() += c;
  }
  return stages;
}

LayerLayout parse_layout(const std::string& text, int pp, int num_layers, int mtp_num_layers) {
  LayerLayout l;
  l.stages = expand_layout(text);
  const auto& st = l.stages;
  const int n = int(st.size());
  auto check = [&](bool ok, const std::string& hint, const std::string& what) {
    if (!ok) throw Error(fmt::format("{} \"{}\": {}", kFlag, text, what), hint);
  };
  check(pp >= 1, "set --pipeline-model-parallel-size to 1 or more",
        fmt::format("--pipeline-model-parallel-size {} must be positive", pp));
  check(n % pp == 0,
        "give a multiple of --pipeline-model-parallel-size stages ('|' separates stages)",
        fmt::format("{} stages are not divisible by --pipeline-model-parallel-size {} (each "
                    "rank runs stages/PP model chunks)",
                    n, pp));
  l.pp = pp, l.vpp = n / pp;
  check(l.vpp == 1 || pp > 1, "put every layer in one stage (no '|'), or raise PP",
        fmt::format("{} stages with --pipeline-model-parallel-size 1 would be {} virtual "
                    "stages, which need --pipeline-model-parallel-size > 1",
                    n, n));
  // Megatron's validate_layer_layout, in its order, with megatron.cpp's placements.
  const int E = count(st, 'E'), L = count(st, 'L'), T = count(st, 't'), M = count(st, 'm');
  check(E == 1, "put one E at the start of the first stage",
        fmt::format("the embedding (E) must appear exactly once, found {}", E));
  check(st.front().starts_with('E'), "start the layout with E",
        "E must open the first stage: megatron.cpp holds the embedding at the start of "
        "pipeline rank 0's first model chunk (another placement is not implemented)");
  check(L == 1, "put one L at the end of the last stage",
        fmt::format("the loss (L) must appear exactly once, found {}", L));
  check(st.back().ends_with('L'), "end the layout with L",
        "L must close the last stage: megatron.cpp holds the output layer and loss at the end "
        "of the last pipeline rank's last model chunk (another placement is not implemented)");
  check(T == num_layers, "give the layout as many t as --num-layers",
        fmt::format("{} transformer layers (t), but --num-layers is {}", T, num_layers));
  check(M == mtp_num_layers, "give the layout as many m as --mtp-num-layers",
        fmt::format("{} MTP layers (m), but --mtp-num-layers is {}", M, mtp_num_layers));
  bool seen_m = false;
  for (int i = 0; i < n; ++i)
    for (char c : st[size_t(i)]) {
      seen_m |= c == 'm';
      check(!(seen_m && c == 't'), "move every m after the last t",
            fmt::format("stage {} has a transformer layer (t) after an MTP layer (m): decoder "
                        "layers must come before the MTP layers (as in Megatron)",
                        i));
    }
  for (int i = 0; i + 1 < n; ++i) {
    if (st[size_t(i)].find('m') == std::string::npos) continue;
    const int rank = i % pp, chunk = i / pp;
    check(chunk == l.vpp - 1, "put the m's in the last stage, right before L",
          fmt::format("stage {} (pipeline rank {}, model chunk {}) holds MTP layers: Megatron "
                      "requires them in a rank's last model chunk",
                      i, rank, chunk));
    check(false, "put the m's in the last stage, right before L",
          fmt::format("stage {} (pipeline rank {}) holds MTP layers: megatron.cpp runs them on "
                      "the last stage next to the output layer (Megatron's standalone MTP "
                      "stage is not implemented)",
                      i, rank));
  }
  // A rank with no parameters at all would join the gradient and optimizer collectives with
  // empty buffers, which megatron.cpp does not support; a chunk without layers is fine.
  for (int r = 0; r < pp; ++r) {
    bool holds = false;
    for (int c = 0; c < l.vpp; ++c) holds |= !l.stage(r, c).empty();
    check(holds, "give every pipeline rank at least one layer (or E / L)",
          fmt::format("pipeline rank {} holds nothing in any of its {} stage(s): a rank without "
                      "parameters is not implemented",
                      r, l.vpp));
  }
  // Layers in stage order: Megatron's get_layer_offset sums the t of the earlier stages,
  // the rounds of model chunks outermost.
  l.layers.assign(size_t(n), {});
  int id = 0;
  for (int i = 0; i < n; ++i)
    for (char c : st[size_t(i)])
      if (c == 't') l.layers[size_t(i % pp) * size_t(l.vpp) + size_t(i / pp)].push_back(id++);
  return l;
}

std::vector<std::string> describe_layout(const LayerLayout& l) {
  std::vector<std::string> out;
  for (int r = 0; r < l.pp; ++r) {
    std::string line = fmt::format("rank {}:", r);
    for (int c = 0; c < l.vpp; ++c) {
      const std::string& s = l.stage(r, c);
      const auto& ids = l.layers[size_t(r) * size_t(l.vpp) + size_t(c)];
      std::string part;
      auto add = [&](const std::string& x) { part += (part.empty() ? "" : " ") + x; };
      if (s.find('E') != std::string::npos) add("E");
      if (ids.size() == 1) add(fmt::format("t{}", ids.front()));
      if (ids.size() > 1) add(fmt::format("t{}-t{}", ids.front(), ids.back()));
      const auto m = std::count(s.begin(), s.end(), 'm');
      if (m > 0) add(m == 1 ? std::string("m") : fmt::format("m*{}", m));
      if (s.find('L') != std::string::npos) add("L");
      line += (c ? " | " : " ") + (part.empty() ? std::string("(empty)") : part);
    }
    out.push_back(line);
  }
  return out;
}

std::vector<std::vector<int>> stage_layers(int num_layers, int pp, int vpp,
                                           const LayerSplit& split) {
  if (!split.layout) return assign_layers(num_layers, pp, vpp, split.first, split.last);
  MCPP_CHECK_HINT(!split.first && !split.last,
                  "drop --decoder-first/last-pipeline-num-layers: the layout places every layer",
                  "{} cannot be combined with --decoder-first/last-pipeline-num-layers (as in "
                  "Megatron)",
                  kFlag);
  const LayerLayout l = parse_layout(*split.layout, pp, num_layers, split.mtp_num_layers);
  MCPP_CHECK_HINT(l.vpp == vpp, "drop the virtual-stage flags: the layout sets them",
                  "{} \"{}\" sets {} model chunks per pipeline rank, but {} were asked for", kFlag,
                  *split.layout, l.vpp, vpp);
  return l.layers;
}

}  // namespace mcpp::parallel::pipeline
