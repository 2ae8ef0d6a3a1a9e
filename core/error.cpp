// The one place that turns text quoted in errors and warnings into a printable line (error.h).
#include "core/error.h"

#include <algorithm>

namespace forge {
namespace {

// Length of the well-formed UTF-8 sequence at the start of `s` (overlong forms, surrogates and
// code points past U+10FFFF rejected), or 0.
size_t utf8_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // bounds of the second byte
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return 0;
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view text) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    switch (c) {
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      default:
        out += "\\x";
        out += hex[c >> 4];
        out += hex[c & 15];
    }
  };
  for (size_t i = 0; i < text.size();) {
    // A message quoting a whole garbage file or a huge override must stay a readable line.
    if (out.size() >= kMaxPrintable) {
      out += "... (" + std::to_string(text.size() - i) + " more bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
      ++i;
      continue;
    }
    const size_t n = c < 0x80 ? 0 : utf8_length(text.substr(i));
    // U+0080..U+009F (C2 80..C2 9F) are the C1 controls, which some terminals obey like ESC.
    // U+FFFD (EF BF BD) is escaped too: in a message it stands for bytes lost elsewhere, and a
    // reader could not tell it from a decoder's replacement of them.
    if (n == 0 || (n == 2 && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0) ||
        (n == 3 && text.substr(i, 3) == "\xef\xbf\xbd")) {
      for (size_t j = 0; j < std::max<size_t>(n, 1); ++j) escape(static_cast<unsigned char>(text[i + j]));
      i += std::max<size_t>(n, 1);
      continue;
    }
    out.append(text, i, n);
    i += n;
  }
  return out;
}

}  // namespace forge
