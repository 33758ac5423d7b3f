// Tokenizers selected by Megatron's --tokenizer-type. Every tokenizer is immutable
// after construction, so encode()/decode() may be called from many threads at once.
//
//   NullTokenizer            text is whitespace-separated integer ids; --vocab-size V:
//                            eod = V, vocab_size() = V + 1 (Megatron's _NullTokenizer)
//   GPT2BPETokenizer         --vocab-file encoder.json --merge-file vocab.bpe: byte-level
//                            BPE with GPT-2's pre-tokenisation regex (PCRE2, Unicode classes)
//   SentencePieceTokenizer   --tokenizer-model file.model (libsentencepiece) plus Megatron's
//                            <CLS> <SEP> <EOD> <MASK> (and pad/bos/eos when the model lacks them)
//   Llama2Tokenizer          --tokenizer-model file.model; BOS first, eod = eos
//   TikTokenizer             --tokenizer-model ranks --tiktoken-pattern v1|v2 (Megatron's
//                            CustomTikTokenizer: special tokens first, ranks shifted)
//   HuggingFaceTokenizer     --tokenizer-model tokenizer.json or its folder: byte-level BPE
//                            (GPT-2, Llama-3 style) and BPE with byte fallback (Llama-2, Mistral)
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mcpp::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to out (Megatron's tokenizer.tokenize).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> v;
    encode(text, v);
    return v;
  }
  // Megatron's detokenize. Bytes as produced (byte-level BPE may split a UTF-8 character).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // before padding to a multiple of 128·TP
  virtual int64_t eod() const = 0;
  virtual std::optional<int64_t> bos() const { return std::nullopt; }
  virtual std::optional<int64_t> eos() const { return std::nullopt; }
  virtual std::optional<int64_t> pad() const { return std::nullopt; }
  virtual std::string name() const = 0;  // the --tokenizer-type
  // The id of the one vocabulary entry spelled `token` as the tokenizer's files spell it: an
  // added or special token (<fim_prefix>, <|endoftext|>) or a vocabulary string (GPT-2's
  // "Ġthe"); nullopt when no single token has that spelling. Megatron's tokens_to_ids
  // for one token, except that it answers the unknown token's id (or fails) instead.
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  // Whether `id` is one of the special tokens that Megatron's
  // ids_to_text(ids, remove_special_tokens=True) leaves out.
  virtual bool is_special(int64_t id) const = 0;
};

// Megatron's tokenizer flags.
struct TokenizerArgs {
  std::string type = "GPT2BPETokenizer";  // --tokenizer-type
  std::string vocab_file;                 // --vocab-file
  std::string merge_file;                 // --merge-file
  std::string tokenizer_model;            // --tokenizer-model
  std::optional<int64_t> vocab_size;      // --vocab-size (NullTokenizer, TikTokenizer)
  std::string tiktoken_pattern;           // --tiktoken-pattern v1|v2
  int64_t tiktoken_num_special_tokens = 1000;  // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;     // --tokenizer-special-tokens (TikTokenizer)
  int64_t vocab_extra_ids = 0;                 // --vocab-extra-ids (SentencePieceTokenizer)
  // !--tokenizer-hf-no-include-special-tokens (HuggingFaceTokenizer): encode applies the
  // post-processor's template (e.g. Llama-3's BOS) and decode keeps special tokens; off,
  // neither (Megatron's include_special_tokens).
  bool include_special_tokens = true;
  // NullTokenizer: --null-tokenizer-eod-id, --null-tokenizer-pad-id (-1: no pad).
  std::optional<int64_t> null_eod_id;
  int64_t null_pad_id = -1;
};

// Builds the tokenizer; a missing file or flag is an mcpp::Error naming the flag.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerArgs& args);

// One of OpenAI's tiktoken encodings (r50k_base, p50k_base, p50k_edit, cl100k_base,
// o200k_base) over its rank file, with its pattern and special tokens; encode() is
// tiktoken's encode_ordinary.
std::unique_ptr<Tokenizer> make_tiktoken_encoding(const std::string& name,
                                                  const std::string& rank_file);

class NullTokenizer final : public Tokenizer {
 public:
  // Megatron's legacy size: ids 0..vocab_size, the last the EOD. eod_id
  // (--null-tokenizer-eod-id) names another id as the EOD; pad_id (--null-tokenizer-pad-id,
  // -1: none) names the pad, whose labels the dataset masks out of the loss.
  explicit NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id = std::nullopt,
                         int64_t pad_id = -1);
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return v_ + 1; }
  int64_t eod() const override { return eod_; }
  std::optional<int64_t> pad() const override {
    return pad_ >= 0 ? std::optional<int64_t>(pad_) : std::nullopt;
  }
  std::string name() const override { return "NullTokenizer"; }
  // Its text is ids: no token has a spelling of its own.
  std::optional<int64_t> token_to_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int64_t) const override { return false; }

 private:
  int64_t v_, eod_, pad_;
};

class GPT2BPETokenizer final : public Tokenizer {
 public:
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
  ~GPT2BPETokenizer() override;
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return int64_t(id_to_bytes_.size()); }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  // <|endoftext|>, GPT-2's one special token.
  bool is_special(int64_t id) const override { return id == eod_; }

  // Byte-level BPE of one pre-tokenised word (raw bytes).
  void bpe(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> id_to_bytes_;
  int64_t eod_ = 0;
};

}  // namespace mcpp::data
