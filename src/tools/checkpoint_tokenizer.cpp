#include "tools/checkpoint_tokenizer.h"

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "base/error.h"
#include "checkpoint/tokenizer_files.h"

namespace mcpp::tools {

data::TokenizerArgs checkpoint_tokenizer_args(const Flags& f, const nlohmann::json& md,
                                              const char* who) {
  // The tokenizer files the checkpoint carries (convert --from-hf), unless flags name one.
  const bool flags = f.has("--tokenizer-type") || f.has("--vocab-file") || f.has("--merge-file") ||
                     f.has("--tokenizer-model");
  const nlohmann::json cfg = md.contains("state") && md["state"].contains("config")
                                 ? md["state"]["config"]
                                 : nlohmann::json::object();
  // --tokenizer-hf-no-include-special-tokens: given here, or by the run that trained it.
  const bool include_special =
      !(f.has("--tokenizer-hf-no-include-special-tokens") ||
        (cfg.is_object() && cfg.value("tokenizer_hf_no_include_special_tokens", "") == "True"));
  if (!flags)
    if (const auto t = checkpoint::checkpoint_tokenizer(md.value("__iter_dir", std::string(".")), md)) {
      std::fprintf(stderr, "[%s] using the %s files the checkpoint carries (%s)\n", who,
                   t->type.c_str(), (std::filesystem::path(md.value("__iter_dir", std::string("."))) /
                                     "tokenizer").c_str());
      data::TokenizerArgs ta;
      ta.type = t->type, ta.vocab_file = t->vocab_file, ta.merge_file = t->merge_file;
      ta.tokenizer_model = t->tokenizer_model;
      ta.include_special_tokens = include_special;
      return ta;
    }
  auto recorded = [&](const char* key) -> std::string {
    if (!cfg.is_object() || !cfg.contains(key)) return {};
    const auto& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    return {};
  };
  auto pick = [&](const char* flag, const char* key) {
    return f.has(flag) ? f.get(flag) : recorded(key);
  };
  // A path the checkpoint records (not the user) is opened only when it is a regular file or
  // a folder: a checkpoint from elsewhere naming a FIFO or /dev/zero must not hang the run.
  auto pick_path = [&](const char* flag, const char* key) {
    if (f.has(flag)) return f.get(flag);
    const std::string p = recorded(key);
    std::error_code ec;
    if (p.empty()) return p;
    MCPP_CHECK_HINT(std::filesystem::is_regular_file(p, ec) || std::filesystem::is_directory(p, ec),
                    fmt::format("pass {} with the tokenizer file", flag),
                    "the checkpoint's recorded {} '{}' is not a regular file", key, p);
    std::fprintf(stderr, "[%s] using the tokenizer file %s recorded in the checkpoint (%s "
                 "chooses another)\n", who, p.c_str(), flag);
    return p;
  };
  data::TokenizerArgs ta;
  ta.type = pick("--tokenizer-type", "tokenizer_type");
  if (ta.type.empty()) ta.type = "GPT2BPETokenizer";
  ta.vocab_file = pick_path("--vocab-file", "vocab_file");
  ta.merge_file = pick_path("--merge-file", "merge_file");
  ta.tokenizer_model = pick_path("--tokenizer-model", "tokenizer_model");
  if (std::string vs = pick("--vocab-size", "vocab_size"); !vs.empty() && vs != "None") {
    try {
      ta.vocab_size = std::stoll(vs);
    } catch (...) {
      throw Error(fmt::format("--vocab-size expects an integer, got '{}'", vs));
    }
  }
  // NullTokenizer ids, as the training run set them (or as given here).
  auto id_of = [&](const char* flag, const char* key) -> std::optional<int64_t> {
    const std::string v = pick(flag, key);
    if (v.empty() || v == "None") return std::nullopt;
    try {
      return std::stoll(v);
    } catch (...) {
      throw Error(fmt::format("{} expects an integer, got '{}'", flag, v));
    }
  };
  if (ta.type == "NullTokenizer") {
    ta.null_eod_id = id_of("--null-tokenizer-eod-id", "null_tokenizer_eod_id");
    ta.null_pad_id = id_of("--null-tokenizer-pad-id", "null_tokenizer_pad_id").value_or(-1);
  }
  ta.include_special_tokens = include_special;
  return ta;
}

}  // namespace mcpp::tools
