#include "data/tokenizers/tokenizer.h"

#include <charconv>
#include <climits>

#include "base/error.h"

namespace mcpp::data {

NullTokenizer::NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id, int64_t pad_id)
    : v_(vocab_size), eod_(eod_id.value_or(vocab_size)), pad_(pad_id) {
  if (vocab_size <= 0)
    throw Error("NullTokenizer needs --vocab-size > 0", "pass e.g. --vocab-size 32000");
  MCPP_CHECK_HINT(eod_ >= 0 && eod_ <= vocab_size,
                  fmt::format("give an id in [0, {}] (the default is {})", vocab_size, vocab_size),
                  "--null-tokenizer-eod-id {} is not a token id of the NullTokenizer's {} ids",
                  eod_, vocab_size + 1);
  MCPP_CHECK_HINT(pad_ >= -1 && pad_ <= vocab_size,
                  fmt::format("give an id in [0, {}], or -1 for no pad token", vocab_size),
                  "--null-tokenizer-pad-id {} is not a token id of the NullTokenizer's {} ids",
                  pad_, vocab_size + 1);
  // Ids are int32 and the EOD id is vocab_size itself: a larger size would wrap them.
  if (vocab_size >= INT32_MAX)
    throw Error(fmt::format("NullTokenizer: --vocab-size {} does not fit the int32 token ids",
                            vocab_size),
                "give --vocab-size below 2^31 - 1");
}

void NullTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(uint8_t(text[i]))) ++i;
    if (i == text.size()) break;
    size_t j = i;
    while (j < text.size() && !std::isspace(uint8_t(text[j]))) ++j;
    int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    if (ec != std::errc() || p != text.data() + j || v < 0 || v > v_)
      throw Error(fmt::format("NullTokenizer: '{}' is not a token id in [0, {}]",
                              text.substr(i, j - i), v_),
                  "NullTokenizer text is whitespace-separated integer ids");
    out.push_back(int32_t(v));
    i = j;
  }
}

std::string NullTokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerArgs& a, bool llama2);
std::unique_ptr<Tokenizer> make_tiktokenizer(const TokenizerArgs& a);
std::unique_ptr<Tokenizer> make_hf_tokenizer(const TokenizerArgs& a);

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerArgs& a) {
  if (!a.include_special_tokens && a.type != "HuggingFaceTokenizer")
    throw Error(fmt::format("--tokenizer-hf-no-include-special-tokens with --tokenizer-type {}: "
                            "only HuggingFaceTokenizer adds special tokens (its "
                            "post-processor's template) that the flag would leave out",
                            a.type),
                "drop --tokenizer-hf-no-include-special-tokens");
  if (a.type != "NullTokenizer")
    for (auto [given, flag] : {std::pair{a.null_eod_id.has_value(), "--null-tokenizer-eod-id"},
                               std::pair{a.null_pad_id != -1, "--null-tokenizer-pad-id"}})
      if (given)
        throw Error(fmt::format("{} with --tokenizer-type {}: it sets an id of the "
                                "NullTokenizer only",
                                flag, a.type),
                    fmt::format("drop {}", flag));
  if (a.type == "NullTokenizer") {
    if (!a.vocab_size) throw Error("--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*a.vocab_size, a.null_eod_id, a.null_pad_id);
  }
  if (a.type == "GPT2BPETokenizer")
    return std::make_unique<GPT2BPETokenizer>(a.vocab_file, a.merge_file);
  if (a.type == "SentencePieceTokenizer" || a.type == "Llama2Tokenizer") {
    if (a.tokenizer_model.empty())
      throw Error(fmt::format("--tokenizer-type {} needs --tokenizer-model", a.type));
    return make_sentencepiece_tokenizer(a, a.type == "Llama2Tokenizer");
  }
  if (a.type == "TikTokenizer") return make_tiktokenizer(a);
  if (a.type == "HuggingFaceTokenizer") return make_hf_tokenizer(a);
  static const char* later[] = {"BertWordPieceLowerCase",    "BertWordPieceCase",
                                "GPTSentencePieceTokenizer", "MultimodalTokenizer",
                                "NullMultimodalTokenizer"};
  for (const char* t : later)
    if (a.type == t)
      throw Error(fmt::format("--tokenizer-type {} is not implemented yet", a.type),
                  "use GPT2BPETokenizer, SentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, "
                  "HuggingFaceTokenizer or NullTokenizer");
  throw Error(fmt::format("unknown --tokenizer-type '{}'", a.type),
              "one of GPT2BPETokenizer, SentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, "
              "HuggingFaceTokenizer, NullTokenizer");
}

}  // namespace mcpp::data
