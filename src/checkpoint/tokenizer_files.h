// The tokenizer files a checkpoint carries: `convert --from-hf` stores the Hugging
// Face folder's tokenizer files inside the checkpoint, so that generate, training with
// --finetune and `convert --to-hf` need no tokenizer flags, and HF -> checkpoint -> HF gives
// the same files back, byte for byte.
//
// Layout: iter_N/tokenizer/<HF file name> for the files of kTokenizerFileNames that exist,
// recorded in metadata.json as
//   "tokenizer": {"type": "GPT2BPETokenizer" | "HuggingFaceTokenizer" | "Llama2Tokenizer",
//                 "files": {"vocab.json": {"bytes": N, "checksum": "<hex>"}, ...}}
// (checksum_algorithm() as the shards). Reading trusts nothing: only the names of that list,
// only regular files (no symlinks) inside the iteration folder, each of the recorded size
// and checksum, at most kMaxTokenizerFile bytes. Paths a checkpoint records in its training
// config are never followed.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace mcpp::checkpoint {

// The Hugging Face tokenizer files a checkpoint may carry, in the names HF loaders look for.
inline constexpr const char* kTokenizerFileNames[] = {
    "vocab.json",          "merges.txt",         "tokenizer.json", "tokenizer.model",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"};
inline constexpr int64_t kMaxTokenizerFile = int64_t(256) << 20;

struct TokenizerFiles {
  std::string type;                          // Megatron's --tokenizer-type for these files
  std::map<std::string, std::string> files;  // HF file name -> path on this machine
  // The flags that load them: --vocab-file/--merge-file, or --tokenizer-model.
  std::string vocab_file, merge_file, tokenizer_model;
};

// The tokenizer files of a Hugging Face model folder (the user's; symlinks into an HF cache
// are followed, to regular files only). The type: GPT-2 BPE when vocab.json and merges.txt
// are there, else tokenizer.json (HuggingFaceTokenizer), else tokenizer.model
// (Llama2Tokenizer). nullopt when the folder has none of them.
std::optional<TokenizerFiles> find_hf_tokenizer(const std::string& hf_dir);

// Copies the files into dir/tokenizer/ (durably) and returns their metadata record.
nlohmann::json write_tokenizer_files(const std::string& dir, const TokenizerFiles& t);

// The tokenizer carried by the checkpoint iteration folder `iter_dir` whose metadata.json is
// `metadata`, every file verified (see above); nullopt when it carries none. A recorded file
// that is missing, altered, a symlink or not in the list is an Error naming it.
std::optional<TokenizerFiles> checkpoint_tokenizer(const std::string& iter_dir,
                                                   const nlohmann::json& metadata);

}  // namespace mcpp::checkpoint
