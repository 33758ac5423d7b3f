#include "data/fim.h"

#include <algorithm>
#include <vector>

#include "base/error.h"

namespace mcpp::data {

NumpyFimDraws::NumpyFimDraws(uint32_t seed, int split, int64_t index)
    : rng_(std::array<uint32_t, 4>{seed, uint32_t(split), uint32_t(uint64_t(index)),
                                   uint32_t(uint64_t(index) >> 32)}) {}

std::array<int64_t, 2> NumpyFimDraws::boundaries(int64_t n) {
  // randint's masked draws, one per value; n == 0 draws nothing.
  int64_t a = int64_t(rng_.random_interval(uint64_t(n)));
  int64_t b = int64_t(rng_.random_interval(uint64_t(n)));
  if (b < a) std::swap(a, b);
  return {a, b};
}

std::string utf8_replace_invalid(std::string_view s) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint8_t b = uint8_t(s[i]);
    if (b < 0x80) {
      out += char(b), ++i;
      continue;
    }
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    }
    size_t j = i + 1;
    int got = 0;
    for (; need > 0 && got < need && j < s.size(); ++j, ++got) {
      const uint8_t c = uint8_t(s[j]);
      if (c < (got == 0 ? lo : 0x80) || c > (got == 0 ? hi : 0xBF)) break;
    }
    if (need > 0 && got == need)
      out.append(s.substr(i, j - i));
    else
      out += kReplacement;  // the start byte and the continuation bytes that fitted
    i = j;
  }
  return out;
}

namespace {

using Span = std::span<const int64_t>;

void append(std::vector<int64_t>& out, Span s) { out.insert(out.end(), s.begin(), s.end()); }

void append_encoded(std::vector<int64_t>& out, const Tokenizer& tok, std::string_view text) {
  thread_local std::vector<int32_t> ids;
  ids.clear();
  tok.encode(text, ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

// Megatron's _permute (truncate_or_pad=False) of one document or fragment.
void permute(Span seg, double rate, const FimConfig& c, FimDraws& d, std::vector<int64_t>& out) {
  if (!d.bernoulli(rate)) return append(out, seg);
  const Tokenizer& tok = *c.tokenizer;
  // ids_to_text(remove_special_tokens=True); ids outside the vocabulary have no token and
  // are left out as well (Hugging Face's ids_to_tokens gives None for them).
  thread_local std::vector<int32_t> ids;
  ids.clear();
  for (int64_t id : seg)
    if (id >= 0 && id < tok.vocab_size() && !tok.is_special(id)) ids.push_back(int32_t(id));
  const std::string text = utf8_replace_invalid(tok.decode(ids));
  if (c.no_prefix && text.starts_with(*c.no_prefix)) return append(out, seg);
  // Cuts are in characters (code points), as on Megatron's Python str.
  std::vector<size_t> at;  // byte offset of each character, then the end
  for (size_t i = 0; i < text.size(); ++i)
    if ((uint8_t(text[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(text.size());
  const auto [b0, b1] = d.boundaries(int64_t(at.size()) - 1);
  const std::string_view all(text);
  const std::string_view prefix = all.substr(0, at[size_t(b0)]),
                         middle = all.substr(at[size_t(b0)], at[size_t(b1)] - at[size_t(b0)]),
                         suffix = all.substr(at[size_t(b1)]);
  if (d.bernoulli(c.spm_rate)) {  // SPM, Megatron's variant: sentinels first
    out.push_back(c.prefix), out.push_back(c.suffix);
    append_encoded(out, tok, suffix);
    out.push_back(c.middle);
    append_encoded(out, tok, prefix);
    append_encoded(out, tok, middle);
  } else {  // PSM
    out.push_back(c.prefix);
    append_encoded(out, tok, prefix);
    out.push_back(c.suffix);
    append_encoded(out, tok, suffix);
    out.push_back(c.middle);
    append_encoded(out, tok, middle);
  }
}

// Megatron's _fim_split_and_permute_sequence of one document.
void split_and_permute(Span doc, const FimConfig& c, FimDraws& d, std::vector<int64_t>& out) {
  const bool splits =
      c.split_sample && std::find(doc.begin(), doc.end(), *c.split_sample) != doc.end();
  if (!splits) return permute(doc, c.rate, c, d, out);
  if (!d.bernoulli(c.rate)) return append(out, doc);
  size_t start = 0;
  for (size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] != *c.split_sample) continue;
    if (i > start) {  // an empty fragment is dropped with its split token, as in Megatron
      permute(doc.subspan(start, i - start), c.fragment_rate, c, d, out);
      out.push_back(*c.split_sample);
    }
    start = i + 1;
  }
  permute(doc.subspan(start), c.fragment_rate, c, d, out);
}

}  // namespace

void fim_transform(std::span<int64_t> sample, const FimConfig& c, FimDraws& d) {
  MCPP_CHECK(c.tokenizer, "fill-in-the-middle without a tokenizer");
  thread_local std::vector<int64_t> out;
  out.clear();
  const Span in(sample.data(), sample.size());
  size_t start = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != c.eod) continue;
    if (i > start) {  // an empty document loses its EOD, as in Megatron
      split_and_permute(in.subspan(start, i - start), c, d, out);
      out.push_back(c.eod);
    }
    start = i + 1;
  }
  split_and_permute(in.subspan(start), c, d, out);  // the rest (all of it without an EOD)
  out.resize(sample.size(), c.pad);                  // cut, or pad with <fim_pad>
  std::copy(out.begin(), out.end(), sample.begin());
}

void resolve_fim_tokens(const FimTokenNames& names, const Tokenizer& tok, FimConfig& cfg) {
  auto id_of = [&](const std::string& token, const char* flag) -> int64_t {
    const std::optional<int64_t> id = tok.token_to_id(token);
    if (id) return *id;
    // Say whether the text exists as several tokens, which is the usual case (GPT-2 BPE
    // spells <fim_prefix> with six).
    std::string as;
    try {
      const size_t n = tok.encode(token).size();
      as = n ? fmt::format(" (its text encodes as {} tokens)", n) : std::string();
    } catch (const Error&) {
    }
    throw Error(fmt::format("{} '{}': the {} has no such token{}; --fim-data needs each FIM "
                            "token to be exactly one token of the vocabulary",
                            flag, token, tok.name(), as),
                fmt::format("use a tokenizer whose vocabulary has the FIM tokens (e.g. "
                            "--tokenizer-type HuggingFaceTokenizer with a code model's "
                            "tokenizer.json), or pass {} with a token this tokenizer has",
                            flag));
  };
  cfg.prefix = id_of(names.prefix, "--fim-prefix-token");
  cfg.middle = id_of(names.middle, "--fim-middle-token");
  cfg.suffix = id_of(names.suffix, "--fim-suffix-token");
  cfg.pad = id_of(names.pad, "--fim-pad-token");
  cfg.eod = id_of(names.eod, "--fim-eod-token");
  if (names.split_sample) cfg.split_sample = id_of(*names.split_sample, "--fim-split-sample");
  cfg.tokenizer = &tok;
}

}  // namespace mcpp::data
