#include "checkpoint/tokenizer_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <iterator>

#include <fmt/format.h>

#include "base/error.h"
#include "checkpoint/fs.h"

namespace mcpp::checkpoint {
namespace fs = std::filesystem;

namespace {

bool allowed(const std::string& name) {
  return std::find(std::begin(kTokenizerFileNames), std::end(kTokenizerFileNames), name) !=
         std::end(kTokenizerFileNames);
}

// The type and loading flags for a set of file names in `dir`.
void assign_type(TokenizerFiles& t, const std::string& dir) {
  auto has = [&](const char* n) { return t.files.count(n) != 0; };
  const fs::path d(dir);
  if (has("vocab.json") && has("merges.txt")) {
    t.type = "GPT2BPETokenizer";
    t.vocab_file = (d / "vocab.json").string(), t.merge_file = (d / "merges.txt").string();
  } else if (has("tokenizer.json")) {
    t.type = "HuggingFaceTokenizer", t.tokenizer_model = d.string();
  } else if (has("tokenizer.model")) {
    t.type = "Llama2Tokenizer", t.tokenizer_model = (d / "tokenizer.model").string();
  } else {
    t.type.clear();
  }
}

}  // namespace

std::optional<TokenizerFiles> find_hf_tokenizer(const std::string& hf_dir) {
  TokenizerFiles t;
  for (const char* n : kTokenizerFileNames) {
    const fs::path p = fs::path(hf_dir) / n;
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    MCPP_CHECK_HINT(fs::is_regular_file(p, ec), "remove it or replace it by the file",
                    "{} is not a regular file", p.string());
    MCPP_CHECK_HINT(int64_t(fs::file_size(p, ec)) <= kMaxTokenizerFile,
                    "a tokenizer file is at most a few hundred MB",
                    "{} is larger than {} bytes", p.string(), kMaxTokenizerFile);
    t.files[n] = p.string();
  }
  assign_type(t, hf_dir);
  if (t.files.empty()) return std::nullopt;
  return t;
}

nlohmann::json write_tokenizer_files(const std::string& dir, const TokenizerFiles& t) {
  const fs::path out = fs::path(dir) / "tokenizer";
  fs::create_directories(out);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, src] : t.files) {
    MCPP_CHECK(allowed(name), "tokenizer file name '{}' is not one of the Hugging Face names", name);
    const std::string bytes = read_text_file(src, size_t(kMaxTokenizerFile));
    write_file_durable((out / name).string(), bytes);
    files[name] = {{"bytes", int64_t(bytes.size())},
                   {"checksum", checksum_hex(bytes.data(), bytes.size())}};
  }
  fsync_dir(out.string());
  return {{"type", t.type}, {"files", files}};
}

std::optional<TokenizerFiles> checkpoint_tokenizer(const std::string& iter_dir,
                                                   const nlohmann::json& md) {
  if (!md.is_object() || !md.contains("tokenizer")) return std::nullopt;
  const std::string where = fmt::format("{}/metadata.json 'tokenizer'", iter_dir);
  const auto& rec = md["tokenizer"];
  MCPP_CHECK(rec.is_object() && rec.contains("files") && rec["files"].is_object(),
             "{}: expected an object with 'files'", where);
  const fs::path dir = fs::path(iter_dir) / "tokenizer";
  TokenizerFiles t;
  for (const auto& [name, f] : rec["files"].items()) {
    MCPP_CHECK_HINT(allowed(name), "the checkpoint is damaged or not megatron.cpp's",
                    "{}: '{}' is not a tokenizer file name", where, name);
    MCPP_CHECK(f.is_object() && f.contains("bytes") && f["bytes"].is_number_integer() &&
                   f.contains("checksum") && f["checksum"].is_string(),
               "{}: malformed entry for {}", where, name);
    const fs::path p = dir / name;
    struct stat st {};
    MCPP_CHECK_HINT(::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode),
                    "restore the checkpoint's tokenizer folder, or pass the tokenizer flags",
                    "{}: the checkpoint's tokenizer file {} is missing or not a regular file",
                    where, p.string());
    const int64_t want = f["bytes"].get<int64_t>();
    MCPP_CHECK_HINT(want >= 0 && want <= kMaxTokenizerFile && int64_t(st.st_size) == want,
                    "restore the checkpoint's tokenizer folder, or pass the tokenizer flags",
                    "{}: {} has {} bytes, the metadata says {}", where, p.string(),
                    int64_t(st.st_size), want);
    const std::string bytes = read_text_file(p.string(), size_t(kMaxTokenizerFile));
    MCPP_CHECK_HINT(checksum_hex(bytes.data(), bytes.size()) == f["checksum"].get<std::string>(),
                    "restore the checkpoint's tokenizer folder, or pass the tokenizer flags",
                    "{}: {} does not match its checksum", where, p.string());
    t.files[name] = p.string();
  }
  assign_type(t, dir.string());
  if (t.files.empty()) return std::nullopt;
  MCPP_CHECK(!t.type.empty(), "{}: files {} make no tokenizer (need vocab.json + merges.txt, "
             "tokenizer.json or tokenizer.model)", where, rec["files"].dump());
  return t;
}

}  // namespace mcpp::checkpoint
