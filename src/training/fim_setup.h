// --fim-data: the start-up checks of the FIM flags and the transform's configuration.
#pragma once
#include <memory>

#include "data/fim.h"
#include "training/arguments.h"

namespace mcpp::training {

// The flag rules that need no tokenizer (validate_args calls it): FIM flags without
// --fim-data, rates outside [0, 1], --mock-data or NullTokenizer with --fim-data, a split
// token without a fragment rate or the reverse.
void validate_fim(const Args& a);

// The transform's configuration: the rates, and the token strings resolved against `tok`
// (an error naming the flag, the token and the tokenizer when one is not a single token).
// `tok` must outlive the datasets that hold the result.
std::shared_ptr<const data::FimConfig> fim_config(const Args& a, const data::Tokenizer& tok);

}  // namespace mcpp::training
