// UTF-8 decoding and encoding and lookups in the generated Unicode tables (data/unicode_tables.h),
// shared by the tokenizers: GPT-2's pre-tokeniser (data/bpe.cpp) and BERT's basic tokenisation
// (data/wordpiece.cpp) both walk text one code point at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "data/unicode_tables.h"

namespace forge::unicode {

/// Decodes one strict UTF-8 character at s[i] (no overlongs, surrogates or code points past
/// U+10FFFF); returns its length, or 0 if the bytes there are not valid UTF-8.
inline int utf8_decode(std::string_view s, size_t i, uint32_t& cp) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t left = s.size() - i;
  auto cont = [&](size_t k) { return k < s.size() && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return cp = c, 1;
  if (c >= 0xC2 && c <= 0xDF && left >= 2 && cont(i + 1))
    return cp = ((c & 0x1Fu) << 6) | (b(i + 1) & 0x3Fu), 2;
  if (c >= 0xE0 && c <= 0xEF && left >= 3 && cont(i + 1) && cont(i + 2)) {
    cp = ((c & 0x0Fu) << 12) | ((b(i + 1) & 0x3Fu) << 6) | (b(i + 2) & 0x3Fu);
    return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4 && left >= 4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    cp = ((c & 0x07u) << 18) | ((b(i + 1) & 0x3Fu) << 12) | ((b(i + 2) & 0x3Fu) << 6) |
         (b(i + 3) & 0x3Fu);
    return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

/// The byte where `s` stops being strict UTF-8 (utf8_decode's rules), or npos when all of it is.
inline size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const int n = utf8_decode(s, i, cp);
    if (n == 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

/// Unicode's White_Space property (stable since Unicode 6): Rust's char::is_whitespace and regex
/// \s, which Hugging Face's tokenizer.json components test.
inline bool is_white_space(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// Appends code point `cp` (at most U+10FFFF) as UTF-8.
inline void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// Whether `cp` lies in one of the sorted, disjoint `table` ranges.
template <size_t N>
bool in_ranges(uint32_t cp, const CodeRange (&table)[N]) {
  const CodeRange* it = std::upper_bound(table, table + N, cp,
                                         [](uint32_t c, const CodeRange& r) { return c < r.lo; });
  return it != table && cp <= (it - 1)->hi;
}

/// The entry of the sorted `table` for `cp`, or nullptr when `cp` maps to itself.
template <size_t N>
const CodeMapping* find_mapping(uint32_t cp, const CodeMapping (&table)[N]) {
  const CodeMapping* it = std::lower_bound(
      table, table + N, cp, [](const CodeMapping& m, uint32_t c) { return m.from < c; });
  return it != table + N && it->from == cp ? it : nullptr;
}

}  // namespace forge::unicode
