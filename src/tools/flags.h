// A small parser for Megatron-style flags (`--name value`, `--name=value`, `--name v1 v2`
// for list flags, bare `--name` for switches) used by the data subcommands. Every flag
// must be declared; an unknown one is an error naming it.
#pragma once
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

namespace mcpp::tools {

class Flags {
 public:
  enum Kind { Value, List, Switch };
  Flags& add(const std::string& name, Kind kind, std::string help) {
    decl_[name] = {kind, std::move(help)};
    return *this;
  }
  // Parses args; positional words are collected in positional().
  void parse(const std::vector<std::string>& args, const std::string& command) {
    for (size_t i = 0; i < args.size(); ++i) {
      std::string a = args[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::optional<std::string> inline_value;
      if (auto eq = a.find('='); eq != std::string::npos)
        inline_value = a.substr(eq + 1), a = a.substr(0, eq);
      auto it = decl_.find(a);
      if (it == decl_.end() && abbrev_) {
        // argparse's allow_abbrev: a unique prefix names its flag; several are ambiguous.
        std::vector<std::string> match;
        for (const auto& [n, d] : decl_)
          if (n.size() > a.size() && n.compare(0, a.size(), a) == 0) match.push_back(n);
        if (match.size() > 1) {
          std::string all;
          for (const auto& m : match) all += (all.empty() ? "" : ", ") + m;
          throw Error(fmt::format("megatron {}: ambiguous option {} could match {}", command, a,
                                  all),
                      "write the flag in full");
        }
        if (match.size() == 1) a = match[0], it = decl_.find(a);
      }
      if (it == decl_.end()) {
        const std::string near = closest(a);
        throw Error(fmt::format("megatron {}: unknown flag {}{}", command, a,
                                near.empty() ? "" : "; did you mean " + near + "?"),
                    fmt::format("`megatron {} --help` lists the flags", command));
      }
      auto& vals = values_[a];
      vals.clear();
      if (it->second.kind == Switch) {
        if (inline_value) throw Error(fmt::format("megatron {}: {} takes no value", command, a));
        vals.push_back("1");
      } else if (inline_value) {
        vals.push_back(*inline_value);
      } else {
        while (i + 1 < args.size() && (args[i + 1].rfind("--", 0) != 0)) {
          vals.push_back(args[++i]);
          if (it->second.kind == Value) break;
        }
        if (vals.empty()) throw Error(fmt::format("megatron {}: {} needs a value", command, a));
      }
    }
  }
  // Unambiguous prefixes of a flag name it (argparse's allow_abbrev, as preprocess_data.py).
  Flags& allow_abbreviations() {
    abbrev_ = true;
    return *this;
  }
  bool has(const std::string& n) const { return values_.count(n) > 0; }
  std::string get(const std::string& n, const std::string& def = {}) const {
    auto it = values_.find(n);
    return it == values_.end() ? def : it->second.front();
  }
  std::vector<std::string> list(const std::string& n) const {
    auto it = values_.find(n);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  int64_t get_int(const std::string& n, int64_t def) const {
    if (!has(n)) return def;
    try {
      size_t used = 0;
      int64_t v = std::stoll(get(n), &used);
      if (used == get(n).size()) return v;
    } catch (...) {
    }
    throw Error(fmt::format("{} expects an integer, got '{}'", n, get(n)));
  }
  double get_double(const std::string& n, double def) const {
    if (!has(n)) return def;
    try {
      size_t used = 0;
      const double v = std::stod(get(n), &used);
      if (used == get(n).size()) return v;
    } catch (...) {
    }
    throw Error(fmt::format("{} expects a number, got '{}'", n, get(n)));
  }
  std::optional<int64_t> get_opt_int(const std::string& n) const {
    return has(n) ? std::optional<int64_t>(get_int(n, 0)) : std::nullopt;
  }
  const std::vector<std::string>& positional() const { return positional_; }
  std::string help() const {
    std::string s;
    for (auto& [n, d] : decl_)
      s += fmt::format("  {:<28} {}\n",
                       n + (d.kind == Switch ? ""
                            : d.kind == List ? " V..."
                                             : " V"),
                       d.help);
    return s;
  }

 private:
  // The declared flag nearest to `a` by edit distance, if close enough to be a typo.
  std::string closest(const std::string& a) const {
    std::string best;
    size_t best_d = std::max<size_t>(2, a.size() / 3) + 1;
    for (const auto& [n, d] : decl_) {
      std::vector<size_t> row(n.size() + 1);
      for (size_t j = 0; j <= n.size(); ++j) row[j] = j;
      for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= n.size(); ++j) {
          const size_t up = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != n[j - 1])});
          diag = up;
        }
      }
      if (row[n.size()] < best_d) best_d = row[n.size()], best = n;
    }
    return best;
  }

  bool abbrev_ = false;
  struct Decl {
    Kind kind;
    std::string help;
  };
  std::map<std::string, Decl> decl_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// Megatron's tokenizer flags, shared by preprocess / inspect / train.
inline void add_tokenizer_flags(Flags& f) {
  f.add("--tokenizer-type", Flags::Value,
        "GPT2BPETokenizer | SentencePieceTokenizer | Llama2Tokenizer | TikTokenizer | "
        "HuggingFaceTokenizer | NullTokenizer")
      .add("--vocab-file", Flags::Value, "GPT-2 encoder.json")
      .add("--merge-file", Flags::Value, "GPT-2 vocab.bpe / merges.txt")
      .add("--tokenizer-model", Flags::Value,
           "SentencePiece .model / tokenizer.json or its folder / tiktoken ranks")
      .add("--vocab-size", Flags::Value, "vocabulary size (NullTokenizer, TikTokenizer)")
      .add("--tiktoken-pattern", Flags::Value, "v1 | v2 (TikTokenizer)")
      .add("--tiktoken-num-special-tokens", Flags::Value, "TikTokenizer special ids (default 1000)")
      .add("--tokenizer-special-tokens", Flags::List,
           "TikTokenizer special tokens (default <unk> <s> </s>)")
      .add("--tiktoken-special-tokens", Flags::List, "older name of --tokenizer-special-tokens")
      .add("--vocab-extra-ids", Flags::Value, "SentencePieceTokenizer <extra_id_i> count")
      .add("--null-tokenizer-eod-id", Flags::Value, "NullTokenizer: the EOD's id")
      .add("--null-tokenizer-pad-id", Flags::Value, "NullTokenizer: the pad's id (-1: none)")
      .add("--tokenizer-hf-no-include-special-tokens", Flags::Switch,
           "HuggingFaceTokenizer: no template tokens (BOS) in encode, none in decode");
}

inline data::TokenizerArgs tokenizer_args(const Flags& f) {
  data::TokenizerArgs ta;
  ta.type = f.get("--tokenizer-type", "GPT2BPETokenizer");
  ta.vocab_file = f.get("--vocab-file");
  ta.merge_file = f.get("--merge-file");
  ta.tokenizer_model = f.get("--tokenizer-model");
  ta.vocab_size = f.get_opt_int("--vocab-size");
  ta.tiktoken_pattern = f.get("--tiktoken-pattern");
  ta.tiktoken_num_special_tokens = f.get_int("--tiktoken-num-special-tokens", 1000);
  ta.special_tokens = f.has("--tokenizer-special-tokens") ? f.list("--tokenizer-special-tokens")
                                                          : f.list("--tiktoken-special-tokens");
  ta.vocab_extra_ids = f.get_int("--vocab-extra-ids", 0);
  ta.include_special_tokens = !f.has("--tokenizer-hf-no-include-special-tokens");
  ta.null_eod_id = f.get_opt_int("--null-tokenizer-eod-id");
  ta.null_pad_id = f.get_int("--null-tokenizer-pad-id", -1);
  return ta;
}

}  // namespace mcpp::tools
