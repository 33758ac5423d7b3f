// HuggingFaceTokenizer: a `tokenizer.json` (Hugging Face tokenizers) read without Python.
// Supported, component by component (anything else is an mcpp::Error naming it):
//   added_tokens    matched in the raw text first (leftmost, longest on a tie) and
//                   emitted as their ids; lstrip/rstrip/single_word must be false
//   normalizer      null, NFC, NFD, NFKC, NFKD (libutf8proc), Prepend, Replace (String
//                   pattern), Sequence of those
//   pre_tokenizer   null, ByteLevel (use_regex: GPT-2's pattern; add_prefix_space),
//                   Split (Regex or String pattern, behavior Isolated, invert false),
//                   Sequence of those
//   model           BPE: vocab, merges ("a b" or ["a", "b"]), byte_fallback, fuse_unk,
//                   unk_token, ignore_merges; no dropout, no subword prefix/suffix
//   post_processor  null, ByteLevel (offsets only), TemplateProcessing ("single"),
//                   Sequence of those
//   decoder         ByteLevel, or the Metaspace-style Sequence (Replace, ByteFallback, Fuse,
//                   Strip) of Llama/Mistral; used only by decode()
// This covers GPT-2, Llama-3 and similar byte-level BPE models and the Llama-2 /
// Mistral BPE with byte fallback. Megatron's _HuggingFaceTokenizer.tokenize() is
// tokenizer(text).input_ids, so the post-processor's template (e.g. BOS) is applied (not
// with --tokenizer-hf-no-include-special-tokens, which also drops special tokens in decode);
// eod = eos_token_id, read from tokenizer_config.json next to tokenizer.json (its
// "eos_token"), else the first of </s>, <|endoftext|>, <|end_of_text|> in the vocabulary.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer.h"
#include "data/tokenizers/unicode_norm.h"

namespace mcpp::data {

namespace {

using json = nlohmann::json;

std::string str_or(const json& j, const char* key, const std::string& def = {}) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : def;
}
bool bool_or(const json& j, const char* key, bool def) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : def;
}

class HFTokenizer final : public Tokenizer {
 public:
  HFTokenizer(const std::string& path, bool include_special)
      : include_special_(include_special) {
    namespace fs = std::filesystem;
    std::string file = path, dir;
    if (fs::is_directory(path)) file = (fs::path(path) / "tokenizer.json").string();
    dir = fs::path(file).parent_path().string();
    file_ = file;
    std::ifstream f(file);
    if (path.empty() || !f)
      throw Error(fmt::format("cannot read the Hugging Face tokenizer '{}'", file),
                  "pass --tokenizer-model DIR (holding tokenizer.json) or the tokenizer.json file");
    json j;
    try {
      j = json::parse(f);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} is not valid JSON: {}", file, e.what()));
    }
    load_model(j.value("model", json()));
    load_added(j.value("added_tokens", json::array()));
    load_normalizer(j.value("normalizer", json()));
    load_pre(j.value("pre_tokenizer", json()));
    load_post(j.value("post_processor", json()));
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      std::string d = j["decoder"].dump();
      byte_level_decode_ = d.find("\"ByteLevel\"") != std::string::npos;
    } else {
      byte_level_decode_ = byte_level_;
    }
    // eod / bos from tokenizer_config.json when present.
    json cfg;
    if (std::ifstream cf(dir.empty() ? "tokenizer_config.json" : dir + "/tokenizer_config.json");
        cf) {
      try {
        cfg = json::parse(cf);
      } catch (...) {
      }
    }
    auto token_of = [&](const char* key) -> std::string {
      if (!cfg.is_object() || !cfg.contains(key)) return {};
      const json& v = cfg[key];
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object()) return str_or(v, "content");
      return {};
    };
    auto id_of = [&](const std::string& t) -> std::optional<int64_t> {
      auto it = vocab_.find(t);
      if (it != vocab_.end()) return it->second;
      return std::nullopt;
    };
    if (auto e = token_of("eos_token"); !e.empty()) eos_ = id_of(e);
    if (auto b = token_of("bos_token"); !b.empty()) bos_ = id_of(b);
    if (auto p = token_of("pad_token"); !p.empty()) pad_ = id_of(p);
    if (!eos_)
      for (const char* t : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>"})
        if ((eos_ = id_of(t))) break;
    if (!bos_)
      for (const char* t : {"<s>", "<|begin_of_text|>"})
        if ((bos_ = id_of(t))) break;
    if (!eos_)
      throw Error(fmt::format("{}: no end-of-text token found", file),
                  "put a tokenizer_config.json with \"eos_token\" next to tokenizer.json");
  }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    if (!bpe::utf8_valid(text))
      throw Error("HuggingFaceTokenizer: the text is not valid UTF-8",
                  "decode the input as UTF-8 first");
    if (include_special_) out.insert(out.end(), prefix_.begin(), prefix_.end());
    size_t pos = 0;
    while (pos < text.size()) {
      size_t best = std::string_view::npos, len = 0;
      int32_t id = 0;
      for (const auto& [t, tid] : added_) {
        size_t p = text.find(t, pos);
        if (p < best || (p == best && p != std::string_view::npos && t.size() > len))
          best = p, len = t.size(), id = tid;
      }
      encode_segment(text.substr(pos, best == std::string_view::npos ? text.npos : best - pos),
                     out);
      if (best == std::string_view::npos) break;
      out.push_back(id);
      pos = best + len;
    }
    if (include_special_) out.insert(out.end(), suffix_.begin(), suffix_.end());
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      MCPP_CHECK(id >= 0 && size_t(id) < id_to_token_.size(),
                 "token id {} outside the vocabulary of {}", id, id_to_token_.size());
      const std::string& t = id_to_token_[size_t(id)];
      if (!include_special_ && is_special(id)) continue;  // Megatron's remove_special_tokens
      if (is_added_[size_t(id)]) {
        s += t;
      } else if (byte_level_decode_) {
        std::string raw;
        s += bpe::unicode_to_bytes(t, raw) ? raw : t;
      } else if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') {
        s += char(std::stoi(t.substr(3, 2), nullptr, 16));
      } else {
        for (size_t i = 0; i < t.size();) {
          if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
            s += ' ', i += 3;
          } else {
            s += t[i++];
          }
        }
      }
    }
    if (!byte_level_decode_ && strip_leading_space_ && !s.empty() && s[0] == ' ') s.erase(0, 1);
    return s;
  }
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  int64_t eod() const override { return *eos_; }
  std::optional<int64_t> bos() const override { return bos_; }
  std::optional<int64_t> eos() const override { return eos_; }
  std::optional<int64_t> pad() const override { return pad_; }
  std::string name() const override { return "HuggingFaceTokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    auto it = vocab_.find(std::string(token));  // added tokens included
    return it == vocab_.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  // The added tokens marked "special" (Hugging Face's all_special_tokens).
  bool is_special(int64_t id) const override {
    return id >= 0 && size_t(id) < is_special_.size() && is_special_[size_t(id)];
  }

 private:
  [[noreturn]] void unsupported(const std::string& what) const {
    throw Error(fmt::format("{}: unsupported tokenizer.json component: {}", file_, what),
                "megatron.cpp reads byte-level BPE (GPT-2, Llama-3 style) and BPE with byte "
                "fallback (Llama-2, Mistral); preprocess with the Python tool for other models");
  }

  void load_model(const json& m) {
    if (!m.is_object()) unsupported("missing \"model\"");
    const std::string type = str_or(m, "type", "BPE");
    if (type != "BPE") unsupported(fmt::format("model type {}", type));
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0)
      unsupported("BPE dropout");
    if (!str_or(m, "continuing_subword_prefix").empty()) unsupported("continuing_subword_prefix");
    if (!str_or(m, "end_of_word_suffix").empty()) unsupported("end_of_word_suffix");
    byte_fallback_ = bool_or(m, "byte_fallback", false);
    fuse_unk_ = bool_or(m, "fuse_unk", false);
    ignore_merges_ = bool_or(m, "ignore_merges", false);
    const json& v = m.value("vocab", json::object());
    if (!v.is_object() || v.empty()) unsupported("BPE model without a vocab");
    for (auto& [tok, idv] : v.items()) {
      if (!idv.is_number_integer()) unsupported("vocab id that is not an integer");
      int64_t id = idv.get<int64_t>();
      if (id < 0 || id > (int64_t(1) << 30)) unsupported(fmt::format("vocab id {}", id));
      if (size_t(id) >= id_to_token_.size()) id_to_token_.resize(size_t(id) + 1);
      id_to_token_[size_t(id)] = tok;
      vocab_.emplace(tok, int32_t(id));
    }
    if (auto u = str_or(m, "unk_token"); !u.empty() && vocab_.count(u)) unk_ = vocab_[u];
    // Byte-level when every byte's GPT-2 character is a token.
    byte_level_ = true;
    std::string ch;
    for (int b = 0; b < 256 && byte_level_; ++b) {
      ch.clear();
      bpe::utf8_append(bpe::byte_to_unicode()[b], ch);
      auto it = vocab_.find(ch);
      if (it == vocab_.end())
        byte_level_ = false;
      else
        byte_id_[b] = it->second;
    }
    const json& merges = m.value("merges", json::array());
    model_.reserve(merges.size());
    int32_t rank = 0;
    for (const json& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        auto sp = s.find(' ');
        if (sp == std::string::npos) unsupported(fmt::format("merge '{}'", s));
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
      } else {
        unsupported("merge entry that is neither \"a b\" nor [a, b]");
      }
      auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end())
        throw Error(fmt::format("{}: merge '{} {}' uses a token missing from the vocab", file_, a,
                                b));
      model_.add_merge(ia->second, ib->second, rank++, im->second);
    }
    if (byte_level_) {
      model_.set_byte_ids(byte_id_);
      if (ignore_merges_) {
        std::unordered_map<std::string, int32_t> whole;
        std::string raw;
        for (auto& [t, id] : vocab_)
          if (bpe::unicode_to_bytes(t, raw)) whole.emplace(raw, id);
        model_.set_whole_pieces(std::move(whole));
      }
    }
  }

  void load_added(const json& a) {
    is_added_.assign(id_to_token_.size(), 0);
    is_special_.assign(id_to_token_.size(), 0);
    for (const json& t : a) {
      int64_t id = t.value("id", int64_t(-1));
      std::string content = str_or(t, "content");
      if (id < 0 || content.empty()) unsupported("added token without id or content");
      if (bool_or(t, "lstrip", false) || bool_or(t, "rstrip", false) ||
          bool_or(t, "single_word", false))
        unsupported(fmt::format("added token '{}' with lstrip/rstrip/single_word", content));
      if (size_t(id) >= id_to_token_.size()) {
        id_to_token_.resize(size_t(id) + 1);
        is_added_.resize(size_t(id) + 1, 0);
        is_special_.resize(size_t(id) + 1, 0);
      }
      id_to_token_[size_t(id)] = content;
      is_added_[size_t(id)] = 1;
      is_special_[size_t(id)] = bool_or(t, "special", false);
      vocab_[content] = int32_t(id);
      added_.emplace_back(content, int32_t(id));
    }
  }

  void load_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = str_or(n, "type");
    if (type == "Sequence") {
      for (const json& x : n.value("normalizers", json::array())) load_normalizer(x);
    } else if (type == "Prepend") {
      norm_.push_back({Norm::Prepend, {}, str_or(n, "prepend")});
    } else if (type == "Replace") {
      const json& p = n.value("pattern", json::object());
      if (!p.contains("String")) unsupported("Replace normalizer with a Regex pattern");
      norm_.push_back({Norm::Replace, p["String"].get<std::string>(), str_or(n, "content")});
    } else if (UnicodeForm form; parse_unicode_form(type, form)) {
      if (!unicode_normalization_available())
        throw Error(fmt::format("{}: the normalizer {} needs libutf8proc, which this build lacks",
                                file_, type),
                    "install libutf8proc-dev (scripts/setup.sh) and rebuild megatron.cpp");
      norm_.push_back({Norm::Unicode, {}, {}, form});
    } else {
      unsupported(fmt::format("normalizer {}", type));
    }
  }

  void load_pre(const json& p) {
    if (p.is_null()) return;
    const std::string type = str_or(p, "type");
    if (type == "Sequence") {
      for (const json& x : p.value("pretokenizers", json::array())) load_pre(x);
    } else if (type == "ByteLevel") {
      if (bool_or(p, "add_prefix_space", false)) add_prefix_space_ = true;
      if (bool_or(p, "use_regex", true))
        splits_.push_back(std::make_unique<bpe::Pretokenizer>(bpe::kGpt2Pattern));
    } else if (type == "Split") {
      if (str_or(p, "behavior") != "Isolated")
        unsupported(fmt::format("Split behavior {}", str_or(p, "behavior")));
      if (bool_or(p, "invert", false)) unsupported("Split with invert");
      const json& pat = p.value("pattern", json::object());
      std::string re;
      if (pat.contains("Regex")) {
        re = pat["Regex"].get<std::string>();
      } else if (pat.contains("String")) {
        for (char c : pat["String"].get<std::string>()) {  // quote it
          if (std::strchr("\\^$.|?*+()[]{}", c)) re += '\\';
          re += c;
        }
      } else {
        unsupported("Split without a pattern");
      }
      splits_.push_back(std::make_unique<bpe::Pretokenizer>(re));
    } else {
      unsupported(fmt::format("pre_tokenizer {}", type));
    }
  }

  void load_post(const json& p) {
    if (p.is_null()) return;
    const std::string type = str_or(p, "type");
    if (type == "Sequence") {
      for (const json& x : p.value("processors", json::array())) load_post(x);
    } else if (type == "ByteLevel") {
      // offsets only
    } else if (type == "TemplateProcessing") {
      bool seen_a = false;
      for (const json& item : p.value("single", json::array())) {
        if (item.contains("Sequence")) {
          seen_a = true;
        } else if (item.contains("SpecialToken")) {
          std::string t = item["SpecialToken"].value("id", "");
          std::vector<int32_t> ids;
          const json& st = p.value("special_tokens", json::object());
          if (st.contains(t)) {
            for (const json& x : st[t].value("ids", json::array())) ids.push_back(x.get<int32_t>());
          } else if (vocab_.count(t)) {
            ids.push_back(vocab_.at(t));
          } else {
            unsupported(fmt::format("TemplateProcessing special token '{}' with no id", t));
          }
          auto& dst = seen_a ? suffix_ : prefix_;
          dst.insert(dst.end(), ids.begin(), ids.end());
        }
      }
    } else {
      unsupported(fmt::format("post_processor {}", type));
    }
  }

  // Normalise, pre-tokenise and BPE one stretch of text free of added tokens.
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
    if (seg.empty()) return;
    std::string norm;
    if (!norm_.empty() || add_prefix_space_) {
      norm.assign(seg);
      for (const Norm& n : norm_) {
        if (n.kind == Norm::Unicode) {
          norm = normalize(norm, n.form);
        } else if (n.kind == Norm::Prepend) {
          norm.insert(0, n.content);
        } else if (!n.from.empty()) {
          std::string r;
          for (size_t i = 0; i < norm.size();) {
            if (norm.compare(i, n.from.size(), n.from) == 0)
              r += n.content, i += n.from.size();
            else
              r += norm[i++];
          }
          norm.swap(r);
        }
      }
      if (add_prefix_space_ && norm[0] != ' ') norm.insert(0, " ");
      seg = norm;
    }
    split_and_encode(seg, 0, out);
  }

  void split_and_encode(std::string_view s, size_t level, std::vector<int32_t>& out) const {
    if (level < splits_.size()) {
      splits_[level]->split(s, true,
                            [&](std::string_view piece) { split_and_encode(piece, level + 1, out); });
      return;
    }
    if (byte_level_) return model_.encode_bytes(s, out);
    // Character-level BPE: characters -> ids (bytes <0xNN> or unk when unknown) -> merges.
    if (ignore_merges_)
      if (auto it = vocab_.find(std::string(s)); it != vocab_.end())
        return out.push_back(it->second);
    std::vector<int32_t> sym;
    sym.reserve(s.size());
    std::string ch;
    for (size_t i = 0; i < s.size();) {
      size_t n = bpe::utf8_len(uint8_t(s[i]));
      ch.assign(s.substr(i, n));
      if (auto it = vocab_.find(ch); it != vocab_.end()) {
        sym.push_back(it->second);
      } else if (byte_fallback_) {
        for (size_t k = 0; k < n; ++k) {
          auto bt = vocab_.find(fmt::format("<0x{:02X}>", uint8_t(s[i + k])));
          if (bt == vocab_.end()) unsupported("byte_fallback without <0xNN> tokens");
          sym.push_back(bt->second);
        }
      } else if (unk_) {
        if (!(fuse_unk_ && !sym.empty() && sym.back() == *unk_)) sym.push_back(*unk_);
      } else {
        throw Error(fmt::format("{}: character '{}' is not in the vocabulary and there is no "
                                "unk_token or byte fallback",
                                file_, ch));
      }
      i += n;
    }
    model_.merge(sym);
    out.insert(out.end(), sym.begin(), sym.end());
  }

  struct Norm {
    enum Kind { Prepend, Replace, Unicode } kind;
    std::string from, content;            // Replace: from -> content; Prepend: content
    UnicodeForm form = UnicodeForm::NFC;  // Unicode
  };
  std::string file_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> is_added_, is_special_;
  std::vector<std::pair<std::string, int32_t>> added_;
  std::vector<Norm> norm_;
  std::vector<std::unique_ptr<bpe::Pretokenizer>> splits_;
  bpe::BpeModel model_;
  std::array<int32_t, 256> byte_id_{};
  bool byte_level_ = false, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  bool add_prefix_space_ = false, byte_level_decode_ = false, strip_leading_space_ = true;
  std::optional<int32_t> unk_;
  std::vector<int32_t> prefix_, suffix_;
  bool include_special_ = true;  // !--tokenizer-hf-no-include-special-tokens
  std::optional<int64_t> eos_, bos_, pad_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerArgs& a) {
  if (a.tokenizer_model.empty())
    throw Error("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model",
                "pass the folder holding tokenizer.json, or the tokenizer.json file");
  return std::make_unique<HFTokenizer>(a.tokenizer_model, a.include_special_tokens);
}

}  // namespace mcpp::data
