#include "data/tokenizers/unicode_norm.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

#ifdef MCPP_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace mcpp::data {

bool parse_unicode_form(std::string_view name, UnicodeForm& form) {
  if (name == "NFC") return form = UnicodeForm::NFC, true;
  if (name == "NFD") return form = UnicodeForm::NFD, true;
  if (name == "NFKC") return form = UnicodeForm::NFKC, true;
  if (name == "NFKD") return form = UnicodeForm::NFKD, true;
  return false;
}

bool unicode_normalization_available() {
#ifdef MCPP_HAVE_UTF8PROC
  return true;
#else
  return false;
#endif
}

std::string normalize(std::string_view text, UnicodeForm form) {
  bool ascii = true;
  for (char c : text) ascii &= uint8_t(c) < 0x80;
  if (ascii) return std::string(text);
#ifdef MCPP_HAVE_UTF8PROC
  // The options of utf8proc_NFC() & co. (utf8proc.c), with a length instead of a
  // terminating NUL: the text may hold U+0000.
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::NFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case UnicodeForm::NFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case UnicodeForm::NFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case UnicodeForm::NFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   utf8proc_ssize_t(text.size()), &out, utf8proc_option_t(options));
  if (n < 0)
    throw Error(fmt::format("Unicode normalization failed: {}", utf8proc_errmsg(n)),
                "the text must be valid UTF-8");
  std::string r(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return r;
#else
  (void)form;
  throw Error("Unicode normalization (NFC/NFD/NFKC/NFKD) needs libutf8proc, which this build lacks",
              "install libutf8proc-dev (scripts/setup.sh) and rebuild");
#endif
}

}  // namespace mcpp::data
