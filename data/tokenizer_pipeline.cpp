// tokenizer.json's normalizers, pre-tokenizers, decoders and post-processors, ported from Hugging
// Face's `tokenizers` (Rust) so that text, splits and offsets come out the same: alignments follow
// NormalizedString::transform, splits follow its split behaviours, regexes run on Oniguruma with
// the onig crate's syntax and empty-match rule, and NFC/NFD follow the
// unicode-normalization-alignments crate (utf8proc supplies the Unicode data).
#include "data/tokenizer_pipeline.h"

#include <oniguruma.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer_unicode_tables.h"
#include "data/unicode.h"

namespace forge::tokenizer_json {

using nlohmann::json;

JsonPlace JsonPlace::at(std::string_view key) const {
  return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
}

JsonPlace JsonPlace::at(size_t index) const {
  return {file, path + "[" + std::to_string(index) + "]"};
}

void JsonPlace::fail(std::string_view what) const {
  throw Error(ExitCode::data,
              file + ": " + (path.empty() ? std::string() : path + ": ") + std::string(what));
}

namespace {

using Origin = std::pair<uint32_t, uint32_t>;

// A value from the file, quoted and made printable for a one-line message.
std::string shown(std::string_view s) { return "\"" + printable(s) + "\""; }

// A byte that does not start valid UTF-8 stands for itself as a one-byte character whose code point
// lies past Unicode, so no property holds for it and it is written back unchanged.
constexpr uint32_t kRawByte = 0x110000;

// Length of the character at s[i] and its code point.
inline int char_at(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return cp = c, 1;
  const int n = unicode::utf8_decode(s, i, cp);
  if (n == 0) return cp = kRawByte + c, 1;
  return n;
}

inline void append_cp(uint32_t cp, std::string& out) {
  if (cp >= kRawByte)
    out.push_back(static_cast<char>(cp - kRawByte));
  else
    unicode::append_utf8(cp, out);
}

// The span of the character holding byte i of an unchanged text that starts at `base`.
Origin identity_origin(std::string_view s, size_t i, uint32_t base) {
  size_t j = i;
  while (j > 0 && i - j < 3 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  uint32_t cp = 0;
  const int n = unicode::utf8_decode(s, j, cp);
  if (n > 0 && j + static_cast<size_t>(n) > i)
    return {base + static_cast<uint32_t>(j), base + static_cast<uint32_t>(j + n)};
  return {base + static_cast<uint32_t>(i), base + static_cast<uint32_t>(i + 1)};
}

inline Origin origin_at(const NormalizedText& t, size_t i) {
  return t.is_identity() ? identity_origin(t.text, i, t.base) : t.origin[i];
}

// The origin of the `n`-byte character at byte i, without looking for its start.
inline Origin char_origin(const NormalizedText& t, size_t i, size_t n) {
  return t.is_identity() ? Origin{t.base + uint32_t(i), t.base + uint32_t(i + n)} : t.origin[i];
}

// Appends the origins of bytes [begin, end), which start and end on character boundaries.
void append_origins(const NormalizedText& t, size_t begin, size_t end, std::vector<Origin>& out) {
  if (!t.is_identity()) {
    out.insert(out.end(), t.origin.begin() + ptrdiff_t(begin), t.origin.begin() + ptrdiff_t(end));
    return;
  }
  for (size_t i = begin; i < end;) {
    uint32_t cp = 0;
    const auto n = static_cast<size_t>(char_at(t.text, i, cp));
    out.insert(out.end(), n, char_origin(t, i, n));
    i += n;
  }
}

// ---- Unicode properties, as the Unicode tables inside Hugging Face's library answer ----


inline bool is_numeric(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return unicode::in_ranges(c, hf_unicode::kNumeric);
}

inline bool is_punctuation(uint32_t c) { return unicode::in_ranges(c, hf_unicode::kPunctuation); }

inline bool is_mark(uint32_t c) { return c >= 0x300 && unicode::in_ranges(c, hf_unicode::kMark); }

inline bool is_nonspacing_mark(uint32_t c) {
  return c >= 0x300 && unicode::in_ranges(c, hf_unicode::kNonspacingMark);
}

// char::to_lowercase: one character, except U+0130's two.
template <class Emit>
void lowercase(uint32_t c, Emit&& emit) {
  if (c < 0x80) return emit(c >= 'A' && c <= 'Z' ? c + 32 : c);
  if (c == 0x130) {
    emit(0x69);
    return emit(0x307);
  }
  const auto* end = std::end(hf_unicode::kLowercase);
  const auto* it =
      std::lower_bound(std::begin(hf_unicode::kLowercase), end, c,
                       [](const hf_unicode::LowerPair& p, uint32_t x) { return p.from < x; });
  emit(it != end && it->from == c ? it->to : c);
}

// BertNormalizer's Chinese characters: the CJK ideograph blocks as Hugging Face lists them.
inline bool is_chinese(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// ---- Editing text while keeping origins ----

// Replaces every character by the characters emit() is given for it (none drops it); each new
// character keeps the origin of the one it replaces, which is what NormalizedString::transform
// gives a character mapped with change 0 and those added after it with change 1.
template <class Map>
void map_chars(NormalizedText& t, Map&& map) {
  std::string text;
  std::vector<Origin> origin;
  text.reserve(t.text.size());
  origin.reserve(t.text.size());
  for (size_t i = 0; i < t.text.size();) {
    uint32_t cp = 0;
    const auto n = static_cast<size_t>(char_at(t.text, i, cp));
    const Origin o = char_origin(t, i, n);
    map(cp, [&](uint32_t c) {
      append_cp(c, text);
      origin.resize(text.size(), o);
    });
    i += n;
  }
  t.text = std::move(text);
  t.origin = std::move(origin);
}

template <class Keep>
void filter_chars(NormalizedText& t, Keep&& keep) {
  map_chars(t, [&](uint32_t c, auto&& emit) {
    if (keep(c)) emit(c);
  });
}

// A character of NormalizedString::transform's input: `change` is 0 for a character that replaces
// the next one of the old text, 1 for an inserted one and -n for one that replaces the next and
// removes the n after it.
struct Change {
  uint32_t cp;
  int32_t change;
};

// NormalizedString::transform over the whole text (initial_offset 0): origins follow the old
// characters each change consumes, an inserted character taking the origin of the byte before it.
void apply_changes(NormalizedText& t, const std::vector<Change>& changes) {
  std::string text;
  std::vector<Origin> origin;
  text.reserve(t.text.size());
  origin.reserve(t.text.size());
  size_t offset = 0;
  auto consume = [&] {
    uint32_t cp = 0;
    offset += offset < t.text.size() ? static_cast<size_t>(char_at(t.text, offset, cp)) : 0;
  };
  for (const Change& c : changes) {
    Origin o;
    if (c.change > 0)
      o = offset < 1 ? Origin{t.base, t.base} : origin_at(t, offset - 1);
    else
      o = origin_at(t, std::min(offset, t.text.size() - 1));
    if (c.change <= 0) consume();
    for (int32_t k = 0; k < -c.change; ++k) consume();
    append_cp(c.cp, text);
    origin.resize(text.size(), o);
  }
  t.text = std::move(text);
  t.origin = std::move(origin);
}

// Matches of a pattern over a text, in order, with the text between them: Hugging Face's
// Pattern::find_matches.
struct Segment {
  uint32_t begin, end;
  bool is_match;
};
using Segments = std::vector<Segment>;

// `content` in place of each match (NormalizedString::replace): the new bytes take the origin of
// the last byte each match replaces (of the byte before an empty match).
void replace_matches(NormalizedText& t, const Segments& segments, std::string_view content) {
  bool any = false;
  for (const Segment& s : segments) any |= s.is_match;
  if (!any) return;
  std::string text;
  std::vector<Origin> origin;
  text.reserve(t.text.size() + content.size());
  origin.reserve(t.text.size() + content.size());
  for (const Segment& s : segments) {
    if (!s.is_match) {
      text.append(t.text, s.begin, s.end - s.begin);
      append_origins(t, s.begin, s.end, origin);
      continue;
    }
    const Origin o = s.end < 1 ? Origin{t.base, t.base} : origin_at(t, s.end - 1);
    text += content;
    origin.resize(text.size(), o);
  }
  t.text = std::move(text);
  t.origin = std::move(origin);
}

// NormalizedString::prepend: the new bytes take the origin of the first character.
void prepend(NormalizedText& t, std::string_view s) {
  if (t.text.empty() || s.empty()) return;
  t.materialize();
  t.origin.insert(t.origin.begin(), s.size(), t.origin.front());
  t.text.insert(0, s);
}

// ---- Patterns ----

// An Oniguruma regex compiled as the onig crate compiles one (Regex::new: UTF-8, the Oniguruma
// syntax, no options); searched as its find_iter searches. A String pattern, which Hugging Face
// escapes into a regex, is searched for as the literal it is: the same matches, without a regex
// search per match.
class Regex {
 public:
  struct Literal {};
  Regex(Literal, std::string text, const JsonPlace& place) : literal_(std::move(text)) {
    if (literal_.empty()) compile("", place);  // matches the empty string everywhere
  }
  Regex(const std::string& pattern, const JsonPlace& place) { compile(pattern, place); }
  ~Regex() {
    if (regex_) onig_free(regex_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Fills `out` with the matches in `s` and the text between them. A match may be empty, but
  /// not right where the previous match ended (there the search moves one character on).
  void find_matches(std::string_view s, OnigRegion* region, Segments& out) const {
    if (regex_) return search(s, region, out);
    out.clear();
    if (s.empty()) return out.push_back({0, 0, false});
    size_t prev = 0;
    for (size_t at; (at = s.find(literal_, prev)) != std::string_view::npos;) {
      if (at != prev) out.push_back({uint32_t(prev), uint32_t(at), false});
      prev = at + literal_.size();
      out.push_back({uint32_t(at), uint32_t(prev), true});
    }
    if (prev != s.size()) out.push_back({uint32_t(prev), uint32_t(s.size()), false});
  }

 private:
  void compile(const std::string& pattern, const JsonPlace& place) {
    static std::once_flag init;
    static std::mutex lock;  // onig_new is not thread-safe (the onig crate locks it too)
    std::call_once(init, [] {
      OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
      onig_initialize(encodings, 1);
    });
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    OnigErrorInfo info{};
    int r = 0;
    {
      std::lock_guard<std::mutex> held(lock);
      r = onig_new(&regex_, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                   ONIG_SYNTAX_ONIGURUMA, &info);
    }
    if (r != ONIG_NORMAL) {
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, r, &info);
      place.fail("invalid regex " + shown(pattern) + ": " + reinterpret_cast<const char*>(message));
    }
  }
  void search(std::string_view s, OnigRegion* region, Segments& out) const {
    out.clear();
    if (s.empty()) return out.push_back({0, 0, false});
    const auto* str = reinterpret_cast<const OnigUChar*>(s.data());
    const OnigUChar* end = str + s.size();
    size_t prev = 0, from = 0;
    std::optional<size_t> last_match_end;
    while (from <= s.size()) {
      const int r = onig_search(regex_, str, end, str + from, end, region, ONIG_OPTION_NONE);
      if (r == ONIG_MISMATCH) break;
      if (r < 0) {
        OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(message, r);
        throw Error(ExitCode::data,
                    std::string("regex search failed: ") + reinterpret_cast<const char*>(message));
      }
      const auto begin = static_cast<size_t>(region->beg[0]);
      const auto stop = static_cast<size_t>(region->end[0]);
      if (begin == stop && last_match_end == stop) {
        uint32_t cp = 0;
        from += from < s.size() ? static_cast<size_t>(char_at(s, from, cp)) : 1;
        continue;
      }
      from = stop;
      last_match_end = stop;
      if (prev != begin) out.push_back({uint32_t(prev), uint32_t(begin), false});
      out.push_back({uint32_t(begin), uint32_t(stop), true});
      prev = stop;
    }
    if (prev != s.size()) out.push_back({uint32_t(prev), uint32_t(s.size()), false});
  }

  std::string literal_;
  regex_t* regex_ = nullptr;
};

// One Oniguruma match region per call that searches (regions are per thread, regexes shared).
class Region {
 public:
  Region() : region_(onig_region_new()) {}
  ~Region() { onig_region_free(region_, 1); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  OnigRegion* get() const { return region_; }

 private:
  OnigRegion* region_;
};

// Pattern::find_matches for a character predicate: each matching character is a match.
template <class Pred>
void find_char_matches(std::string_view s, Pred&& pred, Segments& out) {
  out.clear();
  if (s.empty()) return out.push_back({0, 0, false});
  uint32_t last = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const auto n = static_cast<uint32_t>(char_at(s, i, cp));
    const auto b = static_cast<uint32_t>(i);
    if (pred(cp)) {
      if (last < b) out.push_back({last, b, false});
      out.push_back({b, b + n, true});
      last = b + n;
    }
    i += n;
  }
  if (s.size() > last) out.push_back({last, static_cast<uint32_t>(s.size()), false});
}

void invert(Segments& segments) {
  for (Segment& s : segments) s.is_match = !s.is_match;
}

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// NormalizedString::split: the pieces the segments make under `behavior`, empty ones dropped (as
// PreTokenizedString::split drops them), appended to `out`. `scratch` is reused across calls.
void split(const NormalizedText& t, const Segments& segments, Behavior behavior, Pieces& out,
           std::vector<std::pair<uint32_t, uint32_t>>& scratch) {
  auto& kept = scratch;
  kept.clear();
  bool previous_match = false;
  switch (behavior) {
    case Behavior::isolated:
      for (const Segment& s : segments) kept.push_back({s.begin, s.end});
      break;
    case Behavior::removed:
      for (const Segment& s : segments)
        if (!s.is_match) kept.push_back({s.begin, s.end});
      break;
    case Behavior::contiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !kept.empty())
          kept.back().second = s.end;
        else
          kept.push_back({s.begin, s.end});
        previous_match = s.is_match;
      }
      break;
    case Behavior::merged_with_previous:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !kept.empty())
          kept.back().second = s.end;
        else
          kept.push_back({s.begin, s.end});
        previous_match = s.is_match;
      }
      break;
    case Behavior::merged_with_next:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty())
          kept.back().first = it->begin;
        else
          kept.push_back({it->begin, it->end});
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  out.reserve(out.size() + kept.size());
  for (const auto& [begin, end] : kept)
    if (end > begin) out.push_back(t.slice(begin, end));
}

// ---- Unicode normalisation with alignments (the unicode-normalization-alignments crate) ----

inline uint8_t combining_class(uint32_t c) {
  return c < 0x300 || !unicode::in_ranges(c, hf_unicode::kCombining)
             ? 0
             : static_cast<uint8_t>(
                   utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class);
}

template <class Emit>
void decompose(uint32_t c, bool compatible, Emit&& emit) {
  if (c < 0xA0 || !unicode::in_ranges(c, hf_unicode::kDecomposable)) return emit(c);
  utf8proc_int32_t out[32];
  int boundclass = 0;
  const auto options =
      static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | (compatible ? UTF8PROC_COMPAT : 0));
  const utf8proc_ssize_t n =
      utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), out, 32, options, &boundclass);
  if (n <= 0 || n > 32) return emit(c);
  for (utf8proc_ssize_t k = 0; k < n; ++k) emit(static_cast<uint32_t>(out[k]));
}

// The primary composite of a starter and the character after it (0 if none): Hangul by formula,
// the rest through utf8proc's composition (with its exclusions), asked only for the pairs its
// tables mark as composable.
uint32_t compose(uint32_t a, uint32_t b) {
  constexpr uint32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
  if (a >= l_base && a < l_base + 19 && b >= v_base && b < v_base + 21)
    return s_base + ((a - l_base) * 21 + (b - v_base)) * 28;
  if (a >= s_base && a < s_base + 11172 && (a - s_base) % 28 == 0 && b > t_base && b < t_base + 28)
    return a + (b - t_base);
  if (a >= kRawByte || b >= kRawByte || b < 0x300) return 0;
  const auto* pa = utf8proc_get_property(static_cast<utf8proc_int32_t>(a));
  const auto* pb = utf8proc_get_property(static_cast<utf8proc_int32_t>(b));
  if (pa->comb_index >= 0x8000 || pb->comb_index == UINT16_MAX || pb->comb_index < 0x8000) return 0;
  utf8proc_int32_t pair[2] = {static_cast<utf8proc_int32_t>(a), static_cast<utf8proc_int32_t>(b)};
  const auto n = utf8proc_normalize_utf32(
      pair, 2, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
  const auto r = static_cast<uint32_t>(pair[0]);
  return n == 1 && unicode::in_ranges(r, hf_unicode::kDecomposable) ? r : 0;
}

// Decompositions: each character's decomposition (its first character with change 0, the rest
// inserted), then every run of non-starters sorted by combining class, stably, changes moving
// with their characters.
std::vector<Change> decompositions(std::string_view s, bool compatible) {
  std::vector<Change> out;
  std::vector<uint8_t> classes;
  out.reserve(s.size());
  classes.reserve(s.size());
  size_t pending = 0;  // start of the run not yet sorted
  auto sort_pending = [&] {
    if (out.size() - pending > 1) {
      std::vector<size_t> order(out.size() - pending);
      for (size_t k = 0; k < order.size(); ++k) order[k] = pending + k;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t x, size_t y) { return classes[x] < classes[y]; });
      std::vector<Change> sorted_changes;
      std::vector<uint8_t> sorted_classes;
      for (size_t k : order) {
        sorted_changes.push_back(out[k]);
        sorted_classes.push_back(classes[k]);
      }
      std::copy(sorted_changes.begin(), sorted_changes.end(), out.begin() + pending);
      std::copy(sorted_classes.begin(), sorted_classes.end(), classes.begin() + pending);
    }
    pending = out.size();
  };
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    i += static_cast<size_t>(char_at(s, i, cp));
    bool first = true;
    decompose(cp, compatible, [&](uint32_t d) {
      const uint8_t k = combining_class(d);
      if (k == 0) sort_pending();
      out.push_back({d, first ? 0 : 1});
      classes.push_back(k);
      first = false;
    });
  }
  sort_pending();
  return out;
}

// Recompositions, step for step: a starter absorbs each following character it composes with
// (the composite's change is k + change - 1); a character blocked by an equal or higher class in
// between is held back and emitted after the composee.
std::vector<Change> recompositions(const std::vector<Change>& decomposed) {
  std::vector<Change> out;
  out.reserve(decomposed.size());
  std::vector<Change> buffer;
  std::optional<Change> composee;
  int last_ccc = -1;  // class of the last character held back, -1 for none
  for (const Change& ch : decomposed) {
    const uint8_t ch_class = combining_class(ch.cp);
    if (!composee) {
      if (ch_class != 0) {
        out.push_back(ch);
        continue;
      }
      composee = ch;
      continue;
    }
    const Change k = *composee;
    if (last_ccc < 0) {
      if (const uint32_t r = compose(k.cp, ch.cp)) {
        composee = Change{r, k.change + ch.change - 1};
        continue;
      }
      if (ch_class == 0) {
        composee = ch;
        out.push_back(k);
        continue;
      }
      buffer.push_back(ch);
      last_ccc = ch_class;
      continue;
    }
    if (last_ccc >= ch_class) {
      if (ch_class == 0) {
        composee = ch;
        last_ccc = -1;
        out.push_back(k);
        out.insert(out.end(), buffer.begin(), buffer.end());
        buffer.clear();
        continue;
      }
      buffer.push_back(ch);
      last_ccc = ch_class;
      continue;
    }
    if (const uint32_t r = compose(k.cp, ch.cp)) {
      composee = Change{r, k.change + ch.change - 1};
      continue;
    }
    buffer.push_back(ch);
    last_ccc = ch_class;
  }
  if (composee) out.push_back(*composee);
  out.insert(out.end(), buffer.begin(), buffer.end());
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

enum class Form { nfd, nfkd, nfc, nfkc };

void normalize_unicode(NormalizedText& t, Form form) {
  if (is_ascii(t.text)) return;  // every normalisation form leaves ASCII as it is
  const bool compatible = form == Form::nfkd || form == Form::nfkc;
  std::vector<Change> changes = decompositions(t.text, compatible);
  if (form == Form::nfc || form == Form::nfkc) changes = recompositions(changes);
  apply_changes(t, changes);
}

}  // namespace

// ---- NormalizedText ----

NormalizedText NormalizedText::original(std::string_view text, size_t base) {
  return {std::string(text), {}, static_cast<uint32_t>(base)};
}

NormalizedText NormalizedText::slice(size_t begin, size_t end) const {
  NormalizedText out;
  out.text.assign(text, begin, end - begin);
  out.base = begin < text.size() ? origin_at(*this, begin).first : base;
  if (!is_identity()) out.origin.assign(origin.begin() + begin, origin.begin() + end);
  return out;
}

std::pair<uint32_t, uint32_t> NormalizedText::span(size_t begin, size_t end) const {
  return {origin_at(*this, begin).first, origin_at(*this, end - 1).second};
}

std::pair<uint32_t, uint32_t> NormalizedText::span() const {
  return text.empty() ? std::pair{base, base} : span(0, text.size());
}

void NormalizedText::materialize() {
  if (!is_identity()) return;
  origin.resize(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const auto n = static_cast<uint32_t>(char_at(text, i, cp));
    const auto b = base + static_cast<uint32_t>(i);
    for (uint32_t k = 0; k < n; ++k) origin[i + k] = {b, b + n};
    i += n;
  }
}

namespace {

// ---- Reading a component's fields ----

std::string type_name(const nlohmann::json& v) { return v.type_name(); }

const nlohmann::json& field(const nlohmann::json& node, const JsonPlace& place,
                            std::string_view key) {
  const auto it = node.find(key);
  if (it == node.end()) place.at(key).fail("missing");
  return *it;
}

bool get_bool(const nlohmann::json& node, const JsonPlace& place, std::string_view key) {
  const nlohmann::json& v = field(node, place, key);
  if (!v.is_boolean()) place.at(key).fail("expected true or false, got " + type_name(v));
  return v.get<bool>();
}

bool get_bool_or(const nlohmann::json& node, const JsonPlace& place, std::string_view key,
                 bool otherwise) {
  return node.contains(key) ? get_bool(node, place, key) : otherwise;
}

std::string get_string(const nlohmann::json& v, const JsonPlace& place) {
  if (!v.is_string()) place.fail("expected a string, got " + type_name(v));
  return v.get<std::string>();
}

std::string get_string(const nlohmann::json& node, const JsonPlace& place, std::string_view key) {
  return get_string(field(node, place, key), place.at(key));
}

// A Rust `char`: a string of exactly one character.
std::string get_char(const nlohmann::json& node, const JsonPlace& place, std::string_view key) {
  std::string s = get_string(node, place, key);
  uint32_t cp = 0;
  if (s.empty() || unicode::utf8_decode(s, 0, cp) != static_cast<int>(s.size()))
    place.at(key).fail("expected a single character, got " + shown(s));
  return s;
}

uint64_t get_uint(const nlohmann::json& v, const JsonPlace& place, uint64_t max) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > max)
    place.fail("expected an integer from 0 to " + std::to_string(max) + ", got " +
               (v.is_number() ? v.dump() : type_name(v)));
  return v.get<uint64_t>();
}

uint64_t get_uint(const nlohmann::json& node, const JsonPlace& place, std::string_view key,
                  uint64_t max) {
  return get_uint(field(node, place, key), place.at(key), max);
}

const nlohmann::json& get_array(const nlohmann::json& node, const JsonPlace& place,
                                std::string_view key) {
  const nlohmann::json& v = field(node, place, key);
  if (!v.is_array()) place.at(key).fail("expected an array, got " + type_name(v));
  return v;
}

// The "type" of a component's object.
std::string component_type(const nlohmann::json& node, const JsonPlace& place) {
  if (!node.is_object()) place.fail("expected an object, got " + type_name(node));
  return get_string(node, place, "type");
}

// A Split's or Replace's {"String": s} or {"Regex": r}, as the regex Hugging Face compiles.
std::unique_ptr<Regex> get_pattern(const nlohmann::json& node, const JsonPlace& place) {
  const nlohmann::json& v = field(node, place, "pattern");
  const JsonPlace at = place.at("pattern");
  if (!v.is_object() || v.size() != 1 || !(v.contains("String") || v.contains("Regex")))
    at.fail("expected {\"String\": ...} or {\"Regex\": ...}");
  if (v.contains("String"))
    return std::make_unique<Regex>(Regex::Literal{}, get_string(v["String"], at.at("String")), at);
  return std::make_unique<Regex>(get_string(v["Regex"], at.at("Regex")), at.at("Regex"));
}

Behavior get_behavior(const nlohmann::json& v, const JsonPlace& place) {
  const std::string s = get_string(v, place);
  if (s == "Removed") return Behavior::removed;
  if (s == "Isolated") return Behavior::isolated;
  if (s == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (s == "MergedWithNext") return Behavior::merged_with_next;
  if (s == "Contiguous") return Behavior::contiguous;
  place.fail("unknown behavior " + shown(s) +
             " (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

// ---- Normalizers ----

// Sequence, for any stage: its parts run in order, through the stage's own method.
template <class Stage, class... Args>
class SequenceOf : public Stage {
 public:
  explicit SequenceOf(std::vector<std::unique_ptr<Stage>> parts) : parts_(std::move(parts)) {}

 protected:
  void run(void (Stage::*method)(Args...) const, Args... args) const {
    for (const auto& p : parts_) ((*p).*method)(args...);
  }

 private:
  std::vector<std::unique_ptr<Stage>> parts_;
};

class SequenceNormalizer final : public SequenceOf<Normalizer, NormalizedText&> {
 public:
  using SequenceOf::SequenceOf;
  void normalize(NormalizedText& t) const override { run(&Normalizer::normalize, t); }
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(Form form) : form_(form) {}
  void normalize(NormalizedText& text) const override { normalize_unicode(text, form_); }

 private:
  Form form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(NormalizedText& t) const override {
    if (is_ascii(t.text)) {  // same lengths: origins stay as they are
      for (char& c : t.text)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
      return;
    }
    map_chars(t, [](uint32_t c, auto&& emit) { lowercase(c, emit); });
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void normalize(NormalizedText& t) const override {
    Region region;
    Segments segments;
    regex_->find_matches(t.text, region.get(), segments);
    replace_matches(t, segments, content_);
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(NormalizedText& t) const override { prepend(t, prefix_); }

 private:
  std::string prefix_;
};

// NormalizedString::lrstrip: whitespace off either end; the characters kept keep their origins.
class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(NormalizedText& t) const override {
    size_t begin = 0, end = t.text.size();
    while (left_ && begin < end) {
      uint32_t cp = 0;
      const int n = char_at(t.text, begin, cp);
      if (!unicode::is_white_space(cp)) break;
      begin += static_cast<size_t>(n);
    }
    while (right_ && end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(t.text[start]) & 0xC0) == 0x80) --start;
      uint32_t cp = 0;
      if (static_cast<size_t>(char_at(t.text, start, cp)) != end - start || !unicode::is_white_space(cp))
        break;
      end = start;
    }
    if (begin == 0 && end == t.text.size()) return;
    t.materialize();
    t.text = t.text.substr(begin, end - begin);
    t.origin = std::vector<Origin>(t.origin.begin() + begin, t.origin.begin() + end);
  }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  void normalize(NormalizedText& t) const override {
    if (!is_ascii(t.text)) filter_chars(t, [](uint32_t c) { return !is_mark(c); });
  }
};

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        chinese_(chinese),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}
  void normalize(NormalizedText& t) const override {
    if (clean_text_)
      map_chars(t, [](uint32_t c, auto&& emit) {
        if (unicode::in_ranges(c, hf_unicode::kCleanDropped)) return;
        emit(unicode::is_white_space(c) ? ' ' : c);
      });
    if (chinese_ && !is_ascii(t.text))
      map_chars(t, [](uint32_t c, auto&& emit) {
        if (!is_chinese(c)) return emit(c);
        emit(' ');
        emit(c);
        emit(' ');
      });
    if (strip_accents_ && !is_ascii(t.text)) {
      normalize_unicode(t, Form::nfd);
      filter_chars(t, [](uint32_t c) { return !is_nonspacing_mark(c); });
    }
    if (lowercase_) Lowercase().normalize(t);
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

// ---- Pre-tokenizers ----

class SequencePreTokenizer final : public SequenceOf<PreTokenizer, Pieces&> {
 public:
  using SequenceOf::SequenceOf;
  void pre_tokenize(Pieces& pieces) const override { run(&PreTokenizer::pre_tokenize, pieces); }
};

// Replaces every piece by what split_one appends for it.
template <class SplitOne>
void split_each(Pieces& pieces, SplitOne&& split_one) {
  Pieces out;
  out.reserve(pieces.size() * 2);
  for (NormalizedText& piece : pieces) split_one(piece, out);
  pieces = std::move(out);
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(Pieces& pieces) const override {
    Region region;
    Segments segments;
    std::vector<std::pair<uint32_t, uint32_t>> scratch;
    split_each(pieces, [&](const NormalizedText& piece, Pieces& out) {
      regex_->find_matches(piece.text, region.get(), segments);
      if (invert_) invert(segments);
      split(piece, segments, behavior_, out, scratch);
    });
  }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

// Splits every piece on the characters `pred` holds for.
template <class Pred>
void split_on_chars(Pieces& pieces, Pred&& pred, Behavior behavior) {
  Segments segments;
  std::vector<std::pair<uint32_t, uint32_t>> scratch;
  split_each(pieces, [&](const NormalizedText& piece, Pieces& out) {
    find_char_matches(piece.text, pred, segments);
    split(piece, segments, behavior, out, scratch);
  });
}

// GPT-2's bytes_to_unicode spelling of each byte.
struct ByteAlphabet {
  char spelling[256][2];
  uint8_t length[256];
  int byte_of[324];  // code point of the alphabet -> byte, -1 for code points outside it
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    for (int b = 0; b < 256; ++b) {
      const std::string s = gpt2_spelling(std::string(1, static_cast<char>(b)));
      // Every code point of the alphabet is below U+0800.
      length[b] = static_cast<uint8_t>(s.size());
      std::copy(s.begin(), s.end(), spelling[b]);
      uint32_t cp = 0;
      unicode::utf8_decode(s, 0, cp);
      byte_of[cp] = b;
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// The GPT-2 pattern ByteLevel splits with when use_regex is set.
const Regex& gpt2_regex() {
  static const Regex regex(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      JsonPlace{"tokenizer_pipeline.cpp", "GPT-2 pattern"});
  return regex;
}

// Every byte as its character of the byte alphabet, all of them with the origin of the character
// the byte belongs to.
void to_byte_alphabet(NormalizedText& t) {
  const ByteAlphabet& alphabet = byte_alphabet();
  std::string text(t.text.size() * 2, '\0');
  std::vector<Origin> origin(text.size());
  size_t out = 0;
  for (size_t i = 0; i < t.text.size();) {
    uint32_t cp = 0;
    const auto n = static_cast<size_t>(char_at(t.text, i, cp));
    const Origin o = char_origin(t, i, n);
    const size_t start = out;
    for (size_t k = i; k < i + n; ++k) {
      const auto b = static_cast<unsigned char>(t.text[k]);
      text[out++] = alphabet.spelling[b][0];
      if (alphabet.length[b] == 2) text[out++] = alphabet.spelling[b][1];
    }
    std::fill(origin.begin() + static_cast<ptrdiff_t>(start),
              origin.begin() + static_cast<ptrdiff_t>(out), o);
    i += n;
  }
  text.resize(out);
  origin.resize(out);
  t.text = std::move(text);
  t.origin = std::move(origin);
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(Pieces& pieces) const override {
    Region region;
    Segments segments;
    std::vector<std::pair<uint32_t, uint32_t>> scratch;
    split_each(pieces, [&](NormalizedText& piece, Pieces& out) {
      if (add_prefix_space_ && !piece.text.empty() && piece.text.front() != ' ')
        prepend(piece, " ");
      if (!use_regex_) {
        if (!piece.text.empty()) out.push_back(std::move(piece));
        return;
      }
      gpt2_regex().find_matches(piece.text, region.get(), segments);
      split(piece, segments, Behavior::isolated, out, scratch);
    });
    for (NormalizedText& piece : pieces) to_byte_alphabet(piece);
  }

 private:
  bool add_prefix_space_, use_regex_;
};

enum class PrependScheme { first, always, never };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    unicode::utf8_decode(replacement_, 0, replacement_cp_);
  }
  void pre_tokenize(Pieces& pieces) const override {
    Segments segments;
    std::vector<std::pair<uint32_t, uint32_t>> scratch;
    split_each(pieces, [&](NormalizedText& piece, Pieces& out) {
      find_char_matches(
          piece.text, [](uint32_t c) { return c == ' '; }, segments);
      replace_matches(piece, segments, replacement_);
      const bool starts = piece.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::always ||
                      (scheme_ == PrependScheme::first && piece.base == 0)))
        prepend(piece, replacement_);
      if (!split_) {
        if (!piece.text.empty()) out.push_back(std::move(piece));
        return;
      }
      const uint32_t r = replacement_cp_;
      find_char_matches(
          piece.text, [r](uint32_t c) { return c == r; }, segments);
      split(piece, segments, Behavior::merged_with_next, out, scratch);
    });
  }

 private:
  std::string replacement_;
  uint32_t replacement_cp_ = 0;
  PrependScheme scheme_;
  bool split_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_on_chars(pieces, is_numeric, individual_ ? Behavior::isolated : Behavior::contiguous);
  }

 private:
  bool individual_;
};

class BertPreTokenizer final : public PreTokenizer {
 public:
  void pre_tokenize(Pieces& pieces) const override {
    split_on_chars(pieces, unicode::is_white_space, Behavior::removed);
    split_on_chars(pieces, is_punctuation, Behavior::isolated);
  }
};

class WhitespaceSplit final : public PreTokenizer {
 public:
  void pre_tokenize(Pieces& pieces) const override {
    split_on_chars(pieces, unicode::is_white_space, Behavior::removed);
  }
};

class Punctuation final : public PreTokenizer {
 public:
  explicit Punctuation(Behavior behavior) : behavior_(behavior) {}
  void pre_tokenize(Pieces& pieces) const override {
    split_on_chars(pieces, is_punctuation, behavior_);
  }

 private:
  Behavior behavior_;
};

// Whitespace keeps the matches of Rust's `\w+|[^\w\s]+`, spelled out with the properties Rust's
// regex crate gives \w and \s (Oniguruma's own \w differs: it takes every number, not only Nd).
class Whitespace final : public PreTokenizer {
 public:
  void pre_tokenize(Pieces& pieces) const override {
    static const Regex regex(
        R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+)"
        R"(|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)",
        JsonPlace{"tokenizer_pipeline.cpp", "Whitespace pattern"});
    Region region;
    Segments segments;
    std::vector<std::pair<uint32_t, uint32_t>> scratch;
    split_each(pieces, [&](const NormalizedText& piece, Pieces& out) {
      regex.find_matches(piece.text, region.get(), segments);
      invert(segments);
      split(piece, segments, Behavior::removed, out, scratch);
    });
  }
};

}  // namespace

namespace {

// ---- Decoders ----

using Tokens = std::vector<std::string>;

// Rust's str::replace: every non-overlapping occurrence, leftmost first; an empty `from` matches at
// every character boundary.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) {
    out += to;
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = 0;
      const auto n = static_cast<size_t>(char_at(s, i, cp));
      out.append(s, i, n);
      out += to;
      i += n;
    }
    return out;
  }
  size_t i = 0;
  for (size_t at; (at = s.find(from, i)) != std::string_view::npos; i = at + from.size()) {
    out.append(s, i, at - i);
    out += to;
  }
  out.append(s, i, std::string_view::npos);
  return out;
}

// String::from_utf8_lossy: each maximal prefix of a valid sequence that breaks off (or lone bad
// byte) becomes one U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const int n = unicode::utf8_decode(s, i, cp);
    if (n > 0) {
      out.append(s, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
      continue;
    }
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    size_t bad = 1;
    auto cont = [&](size_t k, unsigned char lo, unsigned char hi) {
      return k < s.size() && b(k) >= lo && b(k) <= hi;
    };
    if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      if (cont(i + 1, lo, hi)) bad = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      if (cont(i + 1, lo, hi)) bad = cont(i + 2, 0x80, 0xBF) ? 3 : 2;
    }
    out += "\xEF\xBF\xBD";
    i += bad;
  }
  return out;
}

class SequenceDecoder final : public SequenceOf<Decoder, Tokens&> {
 public:
  using SequenceOf::SequenceOf;
  void decode_chain(Tokens& tokens) const override { run(&Decoder::decode_chain, tokens); }
};

// Each token's characters back to bytes (a token with a character outside the byte alphabet stays
// as it is), all tokens joined into one string, invalid UTF-8 replaced.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(Tokens& tokens) const override {
    const ByteAlphabet& alphabet = byte_alphabet();
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < token.size() && mapped;) {
        uint32_t cp = 0;
        i += static_cast<size_t>(char_at(token, i, cp));
        mapped = cp < 324 && alphabet.byte_of[cp] >= 0;
        if (mapped) bytes.push_back(static_cast<char>(alphabet.byte_of[cp]));
      }
      if (!mapped) bytes.replace(mark, std::string::npos, token);
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = replace_all(tokens[i], replacement_,
                              i == 0 && scheme_ != PrependScheme::never ? "" : " ");
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

// Runs of "<0xXX>" tokens become the text their bytes spell, or one U+FFFD per byte if they are
// not valid UTF-8.
class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(Tokens& tokens) const override {
    Tokens out;
    std::string run;
    size_t run_length = 0;
    auto flush = [&] {
      if (run_length == 0) return;
      if (unicode::first_invalid_utf8(run) == std::string_view::npos)
        out.push_back(run);
      else
        out.insert(out.end(), run_length, "\xEF\xBF\xBD");
      run.clear();
      run_length = 0;
    };
    for (std::string& token : tokens) {
      if (const std::optional<char> byte = byte_token(token)) {
        run.push_back(*byte);
        ++run_length;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }

 private:
  // u8::from_str_radix(token[3..5], 16) of a six-byte "<0x..>", which also takes "+F".
  static std::optional<char> byte_token(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
    auto hex = [](char c) {
      return c >= '0' && c <= '9'   ? c - '0'
             : c >= 'a' && c <= 'f' ? c - 'a' + 10
             : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                    : -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    if (t[3] == '+' && lo >= 0) return static_cast<char>(lo);
    if (hi < 0 || lo < 0) return std::nullopt;
    return static_cast<char>(hi * 16 + lo);
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(Tokens& tokens) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

// Up to `start` leading and `stop` trailing `content` characters off each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(Tokens& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // byte offset and length of each character
      for (size_t i = 0; i < token.size();) {
        uint32_t cp = 0;
        const auto n = static_cast<size_t>(char_at(token, i, cp));
        chars.push_back({i, n});
        i += n;
      }
      auto is_content = [&](size_t k) {
        return token.compare(chars[k].first, chars[k].second, content_) == 0;
      };
      size_t begin = 0, end = chars.size();
      while (begin < std::min(start_, chars.size()) && is_content(begin)) ++begin;
      while (chars.size() - end < stop_ && end > begin && is_content(end - 1)) --end;
      const size_t from = begin < chars.size() ? chars[begin].first : token.size();
      const size_t to = end < chars.size() ? chars[end].first : token.size();
      token = token.substr(from, to - from);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode_chain(Tokens& tokens) const override {
    Region region;
    Segments segments;
    for (std::string& token : tokens) {
      regex_->find_matches(token, region.get(), segments);
      std::string out;
      for (const Segment& s : segments)
        if (s.is_match)
          out += content_;
        else
          out.append(token, s.begin, s.end - s.begin);
      token = std::move(out);
    }
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& token = tokens[i];
      if (i != 0) {
        if (token.compare(0, prefix_.size(), prefix_) == 0)
          token.erase(0, prefix_.size());
        else
          token.insert(0, " ");
      }
      if (cleanup_) token = cleanup(token);
    }
  }

 private:
  static std::string cleanup(std::string s) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) s = replace_all(s, from, to);
    return s;
  }
  std::string prefix_;
  bool cleanup_;
};

// The suffix marks a word's end: a space, or nothing after the last token.
class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(Tokens& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

// ---- Post-processors ----

// byte_level::process_offsets: a token's leading and trailing spaces ("Ġ" or whitespace) leave its
// offsets, except the one space add_prefix_space put before the first token.
void trim_offsets(Encoding& encoding, bool add_prefix_space, const TokenText& token_text) {
  auto is_space = [](uint32_t c) { return c == 0x120 || unicode::is_white_space(c); };
  for (size_t i = 0; i < encoding.ids.size(); ++i) {
    const std::string_view token = token_text(encoding.ids[i]);
    std::vector<uint32_t> cps;
    for (size_t k = 0; k < token.size();) {
      uint32_t cp = 0;
      k += static_cast<size_t>(char_at(token, k, cp));
      cps.push_back(cp);
    }
    size_t leading = 0, trailing = 0;
    while (leading < cps.size() && is_space(cps[leading])) ++leading;
    while (trailing < cps.size() && is_space(cps[cps.size() - 1 - trailing])) ++trailing;
    auto& [begin, end] = encoding.offsets[i];
    if (leading > 0) {
      const bool first = i == 0 || begin == 0;
      if (first && add_prefix_space && leading == 1) leading = 0;
      begin = std::min(begin + leading, end);
    }
    if (trailing > 0 && end >= trailing) end = std::max(end - trailing, begin);
  }
}

void surround(Encoding& encoding, int32_t before, int32_t after) {
  encoding.ids.insert(encoding.ids.begin(), before);
  encoding.ids.push_back(after);
  encoding.offsets.insert(encoding.offsets.begin(), {0, 0});
  encoding.offsets.push_back({0, 0});
}

class SequenceProcessor final
    : public SequenceOf<PostProcessor, Encoding&, bool, const TokenText&> {
 public:
  using SequenceOf::SequenceOf;
  void process(Encoding& encoding, bool add_special_tokens,
               const TokenText& token_text) const override {
    run(&PostProcessor::process, encoding, add_special_tokens, token_text);
  }
};

class ByteLevelProcessor final : public PostProcessor {
 public:
  ByteLevelProcessor(bool add_prefix_space, bool trim)
      : add_prefix_space_(add_prefix_space), trim_(trim) {}
  void process(Encoding& encoding, bool, const TokenText& token_text) const override {
    if (trim_) trim_offsets(encoding, add_prefix_space_, token_text);
  }

 private:
  bool add_prefix_space_, trim_;
};

// BertProcessing, and RobertaProcessing (which trims offsets first): [CLS] text [SEP].
class SurroundProcessor final : public PostProcessor {
 public:
  SurroundProcessor(int32_t cls, int32_t sep, bool trim, bool add_prefix_space)
      : cls_(cls), sep_(sep), trim_(trim), add_prefix_space_(add_prefix_space) {}
  void process(Encoding& encoding, bool add_special_tokens,
               const TokenText& token_text) const override {
    if (trim_) trim_offsets(encoding, add_prefix_space_, token_text);
    if (add_special_tokens) surround(encoding, cls_, sep_);
  }

 private:
  int32_t cls_, sep_;
  bool trim_, add_prefix_space_;
};

// TemplateProcessing's single template: the sequence, and special tokens' ids around it.
class TemplateProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence;
    std::vector<int32_t> ids;  // of a special token
  };
  explicit TemplateProcessor(std::vector<Piece> single) : single_(std::move(single)) {}
  void process(Encoding& encoding, bool add_special_tokens, const TokenText&) const override {
    Encoding out;
    for (const Piece& p : single_) {
      if (p.is_sequence) {
        out.ids.insert(out.ids.end(), encoding.ids.begin(), encoding.ids.end());
        out.offsets.insert(out.offsets.end(), encoding.offsets.begin(), encoding.offsets.end());
      } else if (add_special_tokens) {
        out.ids.insert(out.ids.end(), p.ids.begin(), p.ids.end());
        out.offsets.resize(out.ids.size(), {0, 0});
      }
    }
    encoding = std::move(out);
  }

 private:
  std::vector<Piece> single_;
};

// A [token, id] pair of BertProcessing and RobertaProcessing.
int32_t get_token_id(const nlohmann::json& node, const JsonPlace& place, std::string_view key) {
  const nlohmann::json& v = field(node, place, key);
  const JsonPlace at = place.at(key);
  if (!v.is_array() || v.size() != 2) at.fail("expected [token, id]");
  get_string(v[0], at.at(size_t{0}));
  return static_cast<int32_t>(get_uint(v[1], at.at(size_t{1}), INT32_MAX));
}

std::vector<TemplateProcessor::Piece> read_template(const nlohmann::json& node,
                                                    const JsonPlace& place, std::string_view key) {
  const nlohmann::json& specials = field(node, place, "special_tokens");
  if (!specials.is_object())
    place.at("special_tokens").fail("expected an object, got " + type_name(specials));
  const nlohmann::json& pieces = get_array(node, place, key);
  std::vector<TemplateProcessor::Piece> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const JsonPlace at = place.at(key).at(i);
    const nlohmann::json& p = pieces[i];
    if (!p.is_object() || p.size() != 1 || !(p.contains("Sequence") || p.contains("SpecialToken")))
      at.fail("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const bool is_sequence = p.contains("Sequence");
    const JsonPlace inner = at.at(is_sequence ? "Sequence" : "SpecialToken");
    const nlohmann::json& body = p.begin().value();
    if (!body.is_object()) inner.fail("expected an object, got " + type_name(body));
    get_uint(body, inner, "type_id", UINT32_MAX);
    const std::string id = get_string(body, inner, "id");
    if (is_sequence) {
      if (id != "A" && id != "B") inner.at("id").fail("expected \"A\" or \"B\", got " + shown(id));
      if (key == "single" && id == "B")
        inner.at("id").fail("the single template cannot use sequence B");
      out.push_back({true, {}});
      continue;
    }
    const auto it = specials.find(id);
    // Hugging Face loads a pair template naming a token it lacks (and fails only on a pair);
    // only the single template is applied here.
    if (it == specials.end() && key == "pair") continue;
    if (it == specials.end()) inner.at("id").fail(shown(id) + " is not in special_tokens");
    const JsonPlace sp = place.at("special_tokens").at(id);
    if (!it->is_object()) sp.fail("expected an object, got " + type_name(*it));
    const nlohmann::json& ids = get_array(*it, sp, "ids");
    const nlohmann::json& tokens = get_array(*it, sp, "tokens");
    if (ids.size() != tokens.size()) sp.fail("ids and tokens must be of the same length");
    TemplateProcessor::Piece piece{false, {}};
    for (size_t k = 0; k < ids.size(); ++k)
      piece.ids.push_back(static_cast<int32_t>(get_uint(ids[k], sp.at("ids").at(k), INT32_MAX)));
    out.push_back(std::move(piece));
  }
  return out;
}

PrependScheme get_prepend_scheme(const nlohmann::json& node, const JsonPlace& place) {
  PrependScheme scheme = PrependScheme::always;
  if (node.contains("prepend_scheme")) {
    const std::string s = get_string(node, place, "prepend_scheme");
    if (s == "first")
      scheme = PrependScheme::first;
    else if (s == "never")
      scheme = PrependScheme::never;
    else if (s != "always")
      place.at("prepend_scheme")
          .fail("unknown prepend_scheme " + shown(s) + " (expected first, always or never)");
  }
  // The legacy add_prefix_space: false means never (and contradicts any other scheme).
  if (node.contains("add_prefix_space") && !node["add_prefix_space"].is_null() &&
      !get_bool(node, place, "add_prefix_space")) {
    if (scheme != PrependScheme::never)
      place.at("add_prefix_space").fail("false does not match prepend_scheme");
    scheme = PrependScheme::never;
  }
  return scheme;
}

template <class Part, class Make>
std::vector<std::unique_ptr<Part>> sequence_parts(const nlohmann::json& node,
                                                  const JsonPlace& place, std::string_view key,
                                                  Make&& make) {
  const nlohmann::json& list = get_array(node, place, key);
  std::vector<std::unique_ptr<Part>> parts;
  for (size_t i = 0; i < list.size(); ++i) {
    const JsonPlace at = place.at(key).at(i);
    if (list[i].is_null()) at.fail("expected an object, got null");
    parts.push_back(make(list[i], at));
  }
  return parts;
}

// What each builder reads, for the message that refuses anything else.
constexpr const char* kNormalizers =
    "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, StripAccents and "
    "BertNormalizer";
constexpr const char* kPreTokenizers =
    "Sequence, Split, ByteLevel, Metaspace, Digits, BertPreTokenizer, Whitespace, "
    "WhitespaceSplit and Punctuation";
constexpr const char* kDecoders =
    "Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece and BPEDecoder";
constexpr const char* kPostProcessors =
    "Sequence, TemplateProcessing, ByteLevel, BertProcessing and RobertaProcessing";

// The start of every builder: null is no stage (nothing, no type), a Sequence is built from its
// parts; anything else gives its type to build.
template <class Sequence, class Stage>
std::pair<std::unique_ptr<Stage>, std::string> start(
    const nlohmann::json& node, const JsonPlace& place, std::string_view parts,
    std::unique_ptr<Stage> (*make)(const nlohmann::json&, const JsonPlace&)) {
  if (node.is_null()) return {};
  std::string type = component_type(node, place);
  if (type != "Sequence") return {nullptr, std::move(type)};
  return {std::make_unique<Sequence>(sequence_parts<Stage>(node, place, parts, make)), type};
}

// A type Hugging Face has but Forge refuses, with the reason; else one it does not know.
[[noreturn]] void unknown_type(const JsonPlace& place, const std::string& type, const char* kind,
                               const char* known) {
  if (type == "Precompiled")
    place.at("type").fail(
        "Precompiled is not supported: it applies a SentencePiece normalisation charsmap; use the "
        "model's tokenizer.model instead");
  if (type == "CTC")
    place.at("type").fail("CTC is not supported: it decodes speech models' outputs");
  place.at("type").fail("unknown " + std::string(kind) + " " + shown(type) + " (Forge reads " +
                        known + ")");
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& node, const JsonPlace& place) {
  auto [out, type] = start<SequenceNormalizer>(node, place, "normalizers", make_normalizer);
  if (out || type.empty()) return std::move(out);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(Form::nfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(Form::nfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(Form::nfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(Form::nfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Replace") {
    auto pattern = get_pattern(node, place);
    return std::make_unique<ReplaceNormalizer>(std::move(pattern),
                                               get_string(node, place, "content"));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(get_string(node, place, "prepend"));
  if (type == "Strip") {
    const bool left = get_bool(node, place, "strip_left");
    return std::make_unique<Strip>(left, get_bool(node, place, "strip_right"));
  }
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "BertNormalizer") {
    const bool clean_text = get_bool(node, place, "clean_text");
    const bool chinese = get_bool(node, place, "handle_chinese_chars");
    // An Option in Hugging Face's struct: missing or null means "as lowercase".
    const bool unset = !node.contains("strip_accents") || node["strip_accents"].is_null();
    const bool strip_accents = !unset && get_bool(node, place, "strip_accents");
    const bool lowercase = get_bool(node, place, "lowercase");
    return std::make_unique<BertNormalizer>(clean_text, chinese, unset ? lowercase : strip_accents,
                                            lowercase);
  }
  unknown_type(place, type, "normalizer", kNormalizers);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& node, const JsonPlace& place) {
  auto [out, type] = start<SequencePreTokenizer>(node, place, "pretokenizers", make_pre_tokenizer);
  if (out || type.empty()) return std::move(out);
  if (type == "Split") {
    auto pattern = get_pattern(node, place);
    const Behavior behavior = get_behavior(field(node, place, "behavior"), place.at("behavior"));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior,
                                               get_bool(node, place, "invert"));
  }
  if (type == "ByteLevel") {
    const bool add_prefix_space = get_bool(node, place, "add_prefix_space");
    get_bool(node, place, "trim_offsets");
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space,
                                                   get_bool_or(node, place, "use_regex", true));
  }
  if (type == "Metaspace") {
    std::string replacement = get_char(node, place, "replacement");
    const PrependScheme scheme = get_prepend_scheme(node, place);
    const bool split =
        node.contains("split") && !node["split"].is_null() ? get_bool(node, place, "split") : true;
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
  }
  if (type == "Digits") return std::make_unique<Digits>(get_bool(node, place, "individual_digits"));
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "Whitespace") return std::make_unique<Whitespace>();
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Punctuation")
    return std::make_unique<Punctuation>(node.contains("behavior")
                                             ? get_behavior(node["behavior"], place.at("behavior"))
                                             : Behavior::isolated);
  unknown_type(place, type, "pre-tokenizer", kPreTokenizers);
}

std::unique_ptr<Decoder> make_decoder(const json& node, const JsonPlace& place) {
  auto [out, type] = start<SequenceDecoder>(node, place, "decoders", make_decoder);
  if (out || type.empty()) return std::move(out);
  if (type == "ByteLevel") {
    get_bool(node, place, "add_prefix_space");
    get_bool(node, place, "trim_offsets");
    get_bool_or(node, place, "use_regex", true);
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "Metaspace") {
    std::string replacement = get_char(node, place, "replacement");
    return std::make_unique<MetaspaceDecoder>(std::move(replacement),
                                              get_prepend_scheme(node, place));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    std::string content = get_char(node, place, "content");
    const uint64_t start = get_uint(node, place, "start", UINT32_MAX);
    return std::make_unique<StripDecoder>(std::move(content), start,
                                          get_uint(node, place, "stop", UINT32_MAX));
  }
  if (type == "Replace") {
    auto pattern = get_pattern(node, place);
    return std::make_unique<ReplaceDecoder>(std::move(pattern), get_string(node, place, "content"));
  }
  if (type == "WordPiece") {
    std::string prefix = get_string(node, place, "prefix");
    return std::make_unique<WordPieceDecoder>(std::move(prefix), get_bool(node, place, "cleanup"));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeDecoder>(get_string(node, place, "suffix"));
  unknown_type(place, type, "decoder", kDecoders);
}

std::unique_ptr<PostProcessor> make_post_processor(const json& node, const JsonPlace& place) {
  auto [out, type] = start<SequenceProcessor>(node, place, "processors", make_post_processor);
  if (out || type.empty()) return std::move(out);
  if (type == "TemplateProcessing") {
    read_template(node, place, "pair");
    return std::make_unique<TemplateProcessor>(read_template(node, place, "single"));
  }
  if (type == "ByteLevel") {
    const bool add_prefix_space = get_bool(node, place, "add_prefix_space");
    const bool trim = get_bool(node, place, "trim_offsets");
    get_bool_or(node, place, "use_regex", true);
    return std::make_unique<ByteLevelProcessor>(add_prefix_space, trim);
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const int32_t sep = get_token_id(node, place, "sep");
    const int32_t cls = get_token_id(node, place, "cls");
    if (type == "BertProcessing")
      return std::make_unique<SurroundProcessor>(cls, sep, false, false);
    const bool trim = get_bool(node, place, "trim_offsets");
    return std::make_unique<SurroundProcessor>(cls, sep, trim,
                                               get_bool(node, place, "add_prefix_space"));
  }
  unknown_type(place, type, "post-processor", kPostProcessors);
}

}  // namespace forge::tokenizer_json
