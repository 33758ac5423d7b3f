// The tokenizer of a checkpoint for the commands that read one (generate, serve): the
// tokenizer flags when given; else the tokenizer files the checkpoint carries (convert
// --from-hf, checkpoint/tokenizer_files.h); else the training config recorded in its
// metadata, whose paths are opened only when they are regular files (or folders), so a
// checkpoint from elsewhere naming a FIFO or /dev/zero cannot hang the command. `who`
// prefixes the line that says which source was used ("generate", "serve").
#pragma once
#include <nlohmann/json.hpp>

#include "data/tokenizers/tokenizer.h"
#include "tools/flags.h"

namespace mcpp::tools {

data::TokenizerArgs checkpoint_tokenizer_args(const Flags& f, const nlohmann::json& md,
                                              const char* who);

}  // namespace mcpp::tools
