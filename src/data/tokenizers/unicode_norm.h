// Unicode normalization forms (UAX #15) for the normalizers of Hugging Face
// tokenizer.json files ("NFC", "NFD", "NFKC", "NFKD"; Qwen2 declares NFC), through
// Debian's libutf8proc. Optional: a build without it reports the missing library when
// a tokenizer needs it.
#pragma once
#include <string>
#include <string_view>

namespace mcpp::data {

enum class UnicodeForm { NFC, NFD, NFKC, NFKD };

// The form named as in tokenizer.json ("NFC", ...); false for any other name.
bool parse_unicode_form(std::string_view name, UnicodeForm& form);

// Whether this build has libutf8proc (normalize() throws without it).
bool unicode_normalization_available();

// `text` (valid UTF-8) in `form`. Pure ASCII, which every form leaves unchanged, is
// returned as is without calling the library.
std::string normalize(std::string_view text, UnicodeForm form);

}  // namespace mcpp::data
