// Fill-in-the-middle's flags (data/fim.h): --fim-data and the ten that shape it. What can be
// checked without the tokenizer is checked at start-up (validate_fim); the token strings are
// resolved against the tokenizer when the datasets are built (fim_config).
#include "training/fim_setup.h"

#include "base/error.h"

namespace mcpp::training {

void validate_fim(const Args& a) {
  static const char* const kShaping[][2] = {
      {"fim_rate", "--fim-rate"},
      {"fim_spm_rate", "--fim-spm-rate"},
      {"fim_split_sample", "--fim-split-sample"},
      {"fim_fragment_rate", "--fim-fragment-rate"},
      {"fim_no_prefix", "--fim-no-prefix"},
      {"fim_prefix_token", "--fim-prefix-token"},
      {"fim_middle_token", "--fim-middle-token"},
      {"fim_suffix_token", "--fim-suffix-token"},
      {"fim_pad_token", "--fim-pad-token"},
      {"fim_eod_token", "--fim-eod-token"},
  };
  if (!a.fim_data) {  // Megatron reads them only with --fim-data; here they are not ignored
    for (const auto& [dest, flag] : kShaping)
      MCPP_CHECK_HINT(!a.was_given(dest), fmt::format("add --fim-data, or drop {}", flag),
                      "{} without --fim-data: it shapes fill-in-the-middle samples, which only "
                      "--fim-data makes",
                      flag);
    return;
  }
  MCPP_CHECK_HINT(!a.mock_data,
                  "give --data-path with a dataset tokenized by a tokenizer that has the FIM "
                  "tokens, or drop --fim-data",
                  "--fim-data with --mock-data: mock samples are not text, and Megatron does not "
                  "support them either (\"Mock dataset is not supported with FIM dataset\")");
  MCPP_CHECK_HINT(a.tokenizer_type != "NullTokenizer",
                  "use a tokenizer whose vocabulary has the FIM tokens (e.g. --tokenizer-type "
                  "HuggingFaceTokenizer with a code model's tokenizer.json)",
                  "--fim-data with --tokenizer-type NullTokenizer: fill-in-the-middle cuts each "
                  "document's text at character positions and re-tokenizes the pieces, and "
                  "NullTokenizer has no text and no FIM tokens (Megatron fails there too)");
  auto rate = [](double r, const char* flag) {
    MCPP_CHECK_HINT(r >= 0 && r <= 1, "give a probability between 0 and 1",
                    "{} {} is not a probability in [0, 1]", flag, r);
  };
  rate(a.fim_rate, "--fim-rate");
  rate(a.fim_spm_rate, "--fim-spm-rate");
  if (a.fim_fragment_rate) rate(*a.fim_fragment_rate, "--fim-fragment-rate");
  MCPP_CHECK_HINT(!a.fim_split_sample || a.fim_fragment_rate,
                  "add --fim-fragment-rate R (the FIM probability of each fragment)",
                  "--fim-split-sample {} without --fim-fragment-rate: each fragment needs a "
                  "rate (Megatron fails on the first document that holds the split token)",
                  a.fim_split_sample.value_or(""));
  MCPP_CHECK_HINT(a.fim_split_sample || !a.fim_fragment_rate,
                  "add --fim-split-sample TOKEN, or drop --fim-fragment-rate",
                  "--fim-fragment-rate {} without --fim-split-sample: there are no fragments to "
                  "apply it to",
                  a.fim_fragment_rate.value_or(0));
}

std::shared_ptr<const data::FimConfig> fim_config(const Args& a, const data::Tokenizer& tok) {
  auto c = std::make_shared<data::FimConfig>();
  c->rate = a.fim_rate, c->spm_rate = a.fim_spm_rate;
  c->fragment_rate = a.fim_fragment_rate.value_or(0);
  c->no_prefix = a.fim_no_prefix;
  data::FimTokenNames names;
  names.prefix = a.fim_prefix_token, names.middle = a.fim_middle_token;
  names.suffix = a.fim_suffix_token, names.pad = a.fim_pad_token, names.eod = a.fim_eod_token;
  names.split_sample = a.fim_split_sample;
  data::resolve_fim_tokens(names, tok, *c);
  return c;
}

}  // namespace mcpp::training
