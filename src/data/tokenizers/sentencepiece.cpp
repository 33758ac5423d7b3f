// Llama2Tokenizer (Megatron's _Llama2Tokenizer) over libsentencepiece: vocab_size,
// bos, eos and pad are the model's; eod = eos; tokenize() prepends BOS (Megatron's
// tokenize(s, bos=True, eos=False)), so preprocessed documents start with BOS.
#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

#ifdef MCPP_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mcpp::data {

#ifdef MCPP_HAVE_SENTENCEPIECE
namespace {

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

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace
#endif

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model, bool llama2) {
  if (!llama2)
    throw Error(
        "--tokenizer-type SentencePieceTokenizer is not implemented yet (its extra <CLS>, "
        "<SEP>, <EOD>, <MASK> tokens are not reproduced)",
        "for Llama-style models use --tokenizer-type Llama2Tokenizer");
#ifdef MCPP_HAVE_SENTENCEPIECE
  return std::make_unique<Llama2Tokenizer>(model);
#else
  (void)model;
  throw Error("this build has no SentencePiece", "install libsentencepiece-dev and rebuild");
#endif
}

}  // namespace mcpp::data
