// Fill-in-the-middle (--fim-data): Megatron's GPTFIMDataset transform of a sample's tokens
// (megatron/training/datasets/fim_dataset.py; Bavarian et al. 2022, "Efficient Training of
// Language Models to Fill in the Middle").
//
// A sample of S + 1 tokens is cut at every EOD into documents. Each document (optionally cut
// again at --fim-split-sample into fragments) is, with probability --fim-rate, detokenised
// (special tokens left out), cut at two uniformly drawn character positions into prefix,
// middle and suffix, each re-tokenised, and laid out as
//   PSM  <prefix> prefix <suffix> suffix <middle> middle          (probability 1 - spm_rate)
//   SPM  <prefix> <suffix> suffix <middle> prefix middle          (probability spm_rate)
// -- Megatron's SPM order, sentinels first. The sample is then cut back to S + 1 tokens or
// padded with <fim_pad>. Megatron's quirks are kept: an empty document between two EODs
// loses its EOD (and an empty fragment its split token), and the empty piece after a final
// EOD is transformed too (into three sentinels, if drawn).
//
// Randomness differs on purpose: Megatron draws from one RandomState(seed) per dataset,
// advanced by every sample read, so a sample's form depends on what was read before it.
// Here each sample has its own RandomState keyed by (seed, split, sample index), drawn in
// Megatron's order with numpy's algorithms: a sample's form is a function of its index.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "base/numpy_rng.h"
#include "data/tokenizers/tokenizer.h"

namespace mcpp::data {

struct FimConfig {
  double rate = 0.5;                      // --fim-rate
  double spm_rate = 0.5;                  // --fim-spm-rate
  std::optional<int64_t> split_sample;    // id of --fim-split-sample
  double fragment_rate = 0;               // --fim-fragment-rate (needed with split_sample)
  std::optional<std::string> no_prefix;   // --fim-no-prefix: documents whose text starts so
  int64_t prefix = 0, middle = 0, suffix = 0, pad = 0, eod = 0;  // --fim-*-token ids
  // Detokenises and re-tokenises; must outlive every dataset holding this config.
  const Tokenizer* tokenizer = nullptr;
};

// The draws of the transform, in Megatron's order; tests script them.
class FimDraws {
 public:
  virtual ~FimDraws() = default;
  virtual bool bernoulli(double p) = 0;  // np_rng.binomial(1, p)
  // sorted(np_rng.randint(low=0, high=n + 1, size=2)): two cuts of n characters.
  virtual std::array<int64_t, 2> boundaries(int64_t n) = 0;
};

// numpy.random.RandomState([seed, split, index % 2^32, index / 2^32]).
class NumpyFimDraws final : public FimDraws {
 public:
  NumpyFimDraws(uint32_t seed, int split, int64_t index);
  bool bernoulli(double p) override { return rng_.binomial(1, p) != 0; }
  std::array<int64_t, 2> boundaries(int64_t n) override;

 private:
  NumpyRandomState rng_;
};

// Transforms `sample` in place (its length is kept).
void fim_transform(std::span<int64_t> sample, const FimConfig& cfg, FimDraws& draws);

// Megatron's token strings for the five FIM tokens, resolved against `tok`; an error names
// the flag, the token and the tokenizer when a string is not exactly one token.
struct FimTokenNames {
  std::string prefix = "<fim_prefix>", middle = "<fim_middle>", suffix = "<fim_suffix>",
              pad = "<fim_pad>", eod = "<|endoftext|>";
  std::optional<std::string> split_sample;  // --fim-split-sample
};
void resolve_fim_tokens(const FimTokenNames& names, const Tokenizer& tok, FimConfig& cfg);

// Python's bytes.decode("utf-8", errors="replace"): each maximal invalid subpart becomes
// U+FFFD (byte-level tokens may split a character; Megatron's text is a Python str).
std::string utf8_replace_invalid(std::string_view s);

}  // namespace mcpp::data
