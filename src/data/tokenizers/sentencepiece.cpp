// SentencePiece tokenizers over libsentencepiece.
//   Llama2Tokenizer (Megatron's _Llama2Tokenizer): vocab_size, bos, eos and pad are the
//   model's; eod = eos; tokenize() prepends BOS (Megatron's tokenize(s, bos=True,
//   eos=False)), so preprocessed documents start with BOS.
//   SentencePieceTokenizer (Megatron's _SentencePieceTokenizer): the model's pieces, then
//   the special tokens <CLS> <SEP> <EOD> <MASK>, the pad/bos/eos pieces (<PAD> <BOS>
//   <EOS> when the model has none) and --vocab-extra-ids <extra_id_i>, each appended
//   after the vocabulary unless already a piece; eod = <EOD>. tokenize() cuts the text at
//   the earliest special-token string (the first-added one on a tie), encodes the parts
//   without BOS/EOS and puts the special ids between them. detokenize() joins decoded
//   runs and special tokens with a space after each, as Megatron does.
#include <algorithm>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

#ifdef MCPP_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mcpp::data {

#ifdef MCPP_HAVE_SENTENCEPIECE
namespace {

// The id of the piece spelled `token`; PieceToId answers unk for an unknown piece, so only a
// piece that spells `token` back counts.
std::optional<int64_t> piece_id(const sentencepiece::SentencePieceProcessor& sp,
                                std::string_view token) {
  const int id = sp.PieceToId(token);
  if (id < 0 || id >= sp.GetPieceSize() || sp.IdToPiece(id) != token) return std::nullopt;
  return id;
}

class Llama2Tokenizer final : public Tokenizer {
 public:
  explicit Llama2Tokenizer(const std::string& model) {
    auto st = sp_.Load(model);
    if (!st.ok())
      throw Error(fmt::format("cannot load --tokenizer-model {}: {}", model, st.ToString()),
                  "pass a SentencePiece .model file");
  }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw Error(fmt::format("SentencePiece encode failed: {}", st.ToString()));
    out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string s;
    auto st = sp_.Decode(v, &s);
    if (!st.ok()) throw Error(fmt::format("SentencePiece decode failed: {}", st.ToString()));
    return s;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t eod() const override { return sp_.eos_id(); }
  std::optional<int64_t> bos() const override { return sp_.bos_id(); }
  std::optional<int64_t> eos() const override { return sp_.eos_id(); }
  std::optional<int64_t> pad() const override {
    return sp_.pad_id() >= 0 ? std::optional<int64_t>(sp_.pad_id()) : std::nullopt;
  }
  std::string name() const override { return "Llama2Tokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    return piece_id(sp_, token);
  }
  bool is_special(int64_t id) const override {  // <s>, </s> and the model's other controls
    return id >= 0 && id < sp_.GetPieceSize() && sp_.IsControl(int(id));
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model, int64_t vocab_extra_ids) {
    auto st = sp_.Load(model);
    if (!st.ok())
      throw Error(fmt::format("cannot load --tokenizer-model {}: {}", model, st.ToString()),
                  "pass a SentencePiece .model file");
    size_ = sp_.GetPieceSize();
    auto piece_or = [&](int id, const char* fallback) {
      return id >= 0 && id < sp_.GetPieceSize() ? sp_.IdToPiece(id) : std::string(fallback);
    };
    cls_ = add_special("<CLS>");
    sep_ = add_special("<SEP>");
    eod_ = add_special("<EOD>");
    mask_ = add_special("<MASK>");
    pad_ = add_special(piece_or(sp_.pad_id(), "<PAD>"));
    bos_ = add_special(piece_or(sp_.bos_id(), "<BOS>"));
    eos_ = add_special(piece_or(sp_.eos_id(), "<EOS>"));
    for (int64_t i = 0; i < vocab_extra_ids; ++i) add_special(fmt::format("<extra_id_{}>", i));
  }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    auto piece = [&](std::string_view s) {
      auto st = sp_.Encode(s, &ids);
      if (!st.ok()) throw Error(fmt::format("SentencePiece encode failed: {}", st.ToString()));
      out.insert(out.end(), ids.begin(), ids.end());
    };
    size_t idx = 0;
    for (;;) {
      size_t best = std::string_view::npos, which = 0;
      for (size_t k = 0; k < specials_.size(); ++k) {
        size_t p = text.find(specials_[k].first, idx);
        if (p < best) best = p, which = k;  // strict: the first-added wins a tie
      }
      if (best == std::string_view::npos) break;
      piece(text.substr(idx, best - idx));
      out.push_back(specials_[which].second);
      idx = best + specials_[which].first.size();
    }
    piece(text.substr(idx));
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    size_t last = 0;
    auto run = [&](size_t a, size_t b) {
      std::vector<int> v(ids.begin() + ptrdiff_t(a), ids.begin() + ptrdiff_t(b));
      for (int id : v)
        MCPP_CHECK(id >= 0 && id < sp_.GetPieceSize(), "token id {} outside the vocabulary", id);
      std::string s;
      auto st = sp_.Decode(v, &s);
      if (!st.ok()) throw Error(fmt::format("SentencePiece decode failed: {}", st.ToString()));
      return s;
    };
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = std::find_if(specials_.begin(), specials_.end(),
                             [&](const auto& p) { return p.second == ids[i]; });
      if (it == specials_.end()) continue;
      text += run(last, i) + " " + it->first + " ";
      last = i + 1;
    }
    return text + run(last, ids.size());
  }
  int64_t vocab_size() const override { return size_; }
  int64_t eod() const override { return eod_; }
  std::optional<int64_t> bos() const override { return bos_; }
  std::optional<int64_t> eos() const override { return eos_; }
  std::optional<int64_t> pad() const override { return pad_; }
  std::string name() const override { return "SentencePieceTokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    for (auto& [t, id] : specials_)
      if (t == token) return id;
    return piece_id(sp_, token);
  }
  // Megatron's special tokens (<CLS> ... <extra_id_i>) and the model's control pieces.
  bool is_special(int64_t id) const override {
    for (auto& [t, sid] : specials_)
      if (sid == id) return true;
    return id >= 0 && id < sp_.GetPieceSize() && sp_.IsControl(int(id));
  }

 private:
  int32_t add_special(const std::string& t) {
    for (auto& [s, id] : specials_)
      if (s == t) return id;
    int id = sp_.PieceToId(t);
    // PieceToId answers unk for an unknown piece; only a real match counts.
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IdToPiece(id) != t) id = int(size_++);
    specials_.emplace_back(t, int32_t(id));
    return int32_t(id);
  }
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // in Megatron's insertion order
  int64_t size_ = 0, cls_ = 0, sep_ = 0, eod_ = 0, mask_ = 0, pad_ = 0, bos_ = 0, eos_ = 0;
};

}  // namespace
#endif

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerArgs& a, bool llama2) {
#ifdef MCPP_HAVE_SENTENCEPIECE
  if (llama2) return std::make_unique<Llama2Tokenizer>(a.tokenizer_model);
  return std::make_unique<SentencePieceTokenizer>(a.tokenizer_model, a.vocab_extra_ids);
#else
  (void)a, (void)llama2;
  throw Error("this build has no SentencePiece", "install libsentencepiece-dev and rebuild");
#endif
}

}  // namespace mcpp::data
