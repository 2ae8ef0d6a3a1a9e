// GPT-2 byte-level BPE. Loading hand-parses encoder.json (a flat object of string -> id whose keys
// spell bytes through GPT-2's bytes_to_unicode table) and checks vocab.bpe against it. Encoding
// splits specials, pre-tokenises with a hand-written matcher equivalent to GPT-2's regex, then
// merges each piece like tiktoken, with a per-piece cache because natural text repeats words.
#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "data/unicode.h"

namespace forge {
namespace {

using unicode::utf8_decode;

enum CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// JavaScript's \s (ECMAScript WhiteSpace + LineTerminator), which the reference regex uses.
bool is_js_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

CharClass classify(uint32_t cp) {
  if (is_js_space(cp)) return kSpace;
  if (unicode::in_ranges(cp, unicode::kLetterRanges)) return kLetter;
  if (unicode::in_ranges(cp, unicode::kNumberRanges)) return kNumber;
  return kOther;
}

struct AsciiTable {
  CharClass cls[128];
  constexpr AsciiTable() : cls() {
    for (uint32_t c = 0; c < 128; ++c)
      cls[c] = (c >= 0x09 && c <= 0x0D) || c == ' '               ? kSpace
               : (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? kLetter
               : (c >= '0' && c <= '9')                           ? kNumber
                                                                  : kOther;
  }
};
constexpr AsciiTable kAscii;

// Class and byte length of the character at s[i]; invalid UTF-8 is a one-byte kOther.
inline CharClass char_at(std::string_view s, size_t i, size_t& len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return len = 1, kAscii.cls[c];
  uint32_t cp = 0;
  const int n = utf8_decode(s, i, cp);
  if (n == 0) return len = 1, kOther;
  len = static_cast<size_t>(n);
  return classify(cp);
}

// Calls f(piece) for each match of GPT-2's pattern, in order; the matches tile the text.
template <class F>
void for_each_piece(std::string_view s, F&& f) {
  const size_t n = s.size();
  size_t i = 0;
  auto run_end = [&](size_t j, CharClass k) {  // end of the run of class k starting at j
    size_t len = 0;
    while (j < n && char_at(s, j, len) == k) j += len;
    return j;
  };
  while (i < n) {
    size_t len = 0;
    const CharClass k = char_at(s, i, len);
    size_t end = 0;
    if (s[i] == '\'' && i + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d
      const char a = s[i + 1], b = i + 2 < n ? s[i + 2] : '\0';
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        end = i + 3;
    }
    // " ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+" starting with a space
    if (end == 0 && s[i] == ' ' && i + 1 < n) {
      size_t len2 = 0;
      const CharClass k2 = char_at(s, i + 1, len2);
      if (k2 != kSpace) end = run_end(i + 1, k2);
    }
    if (end == 0 && k != kSpace) end = run_end(i, k);
    if (end == 0) {  // \s+(?!\S) | \s+ : a whitespace run, minus its last character if text follows
      size_t j = i, last = i;
      while (j < n && char_at(s, j, len) == kSpace) last = j, j += len;
      end = (j < n && last > i) ? last : j;
    }
    f(s.substr(i, end - i));
    i = end;
  }
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to U+0100 onwards.
struct ByteUnicode {
  uint32_t to_cp[256] = {};
  int from_cp[324] = {};
  ByteUnicode() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : next++;
      from_cp[to_cp[b]] = static_cast<int>(b);
    }
  }
};
const ByteUnicode& byte_unicode() {
  static const ByteUnicode table;
  return table;
}

std::string read_file(const std::filesystem::path& path) {
  return read_input_file(path.string(), kTokenizerInput);
}

// Appends the byte that bytes_to_unicode maps to `cp`; false if no byte maps there.
bool append_unmapped(uint32_t cp, std::string& out) {
  if (cp >= 324 || byte_unicode().from_cp[cp] < 0) return false;
  out.push_back(static_cast<char>(byte_unicode().from_cp[cp]));
  return true;
}

constexpr const char* kEndOfText = "<|endoftext|>";

// encoder.json as (bytes, id) pairs in file order: a flat JSON object whose keys spell bytes
// through bytes_to_unicode. Only the syntax is checked here; build_vocabulary checks the ids.
std::vector<std::pair<std::string, int32_t>> parse_encoder(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  const std::string where = quoted_path(path.string()) + ": ";
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < text.size() &&
           (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
      ++i;
  };
  auto fail = [&](const std::string& what) {
    throw Error(ExitCode::data, detail::concat(where, what, " at byte ", i));
  };
  auto hex4 = [&](size_t at) {
    if (at + 4 > text.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (size_t k = at; k < at + 4; ++k) {
      const char c = text[k];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return v;
  };

  std::vector<std::pair<std::string, int32_t>> entries;
  entries.reserve(60000);
  skip_ws();
  if (i >= text.size() || text[i] != '{') fail("expected a JSON object");
  ++i;
  skip_ws();
  if (i < text.size() && text[i] == '}') fail("empty vocabulary");
  while (true) {
    skip_ws();
    if (i >= text.size() || text[i] != '"') fail("expected a string key");
    ++i;
    std::string bytes;
    while (true) {
      if (i >= text.size()) fail("unterminated string");
      uint32_t cp = 0;
      if (text[i] == '"') {
        ++i;
        break;
      }
      if (text[i] == '\\') {
        if (i + 1 >= text.size()) fail("unterminated escape");
        const char e = text[i + 1];
        i += 2;
        if (e == 'u') {
          cp = hex4(i);
          i += 4;
        } else {
          static constexpr char kFrom[] = "\"\\/bfnrt", kTo[] = "\"\\/\b\f\n\r\t";
          const char* hit = e == '\0' ? nullptr : std::strchr(kFrom, e);
          if (hit == nullptr) fail("bad escape");
          cp = static_cast<unsigned char>(kTo[hit - kFrom]);
        }
      } else {
        const int n = utf8_decode(text, i, cp);
        if (n == 0) fail("invalid UTF-8");
        i += static_cast<size_t>(n);
      }
      if (!append_unmapped(cp, bytes))
        fail(detail::concat("character U+", std::hex, cp, std::dec,
                            " is not a GPT-2 byte-level symbol"));
    }
    skip_ws();
    if (i >= text.size() || text[i] != ':') fail("expected ':'");
    ++i;
    skip_ws();
    int64_t id = 0;
    const size_t digits = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && id < INT32_MAX)
      id = id * 10 + (text[i++] - '0');
    if (i == digits || id >= INT32_MAX) fail("expected a token id");
    entries.emplace_back(std::move(bytes), static_cast<int32_t>(id));
    skip_ws();
    if (i < text.size() && text[i] == ',') {
      ++i;
      continue;
    }
    if (i < text.size() && text[i] == '}') break;
    fail("expected ',' or '}'");
  }
  return entries;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for_each_piece(text, [&](std::string_view p) { pieces.push_back(p); });
  return pieces;
}

std::string gpt2_spelling(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    const uint32_t c = byte_unicode().to_cp[b];
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {  // every code point of the alphabet is below U+0800
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

std::string_view BpeTokenizer::bytes_of(int32_t id) const {
  return std::string_view(
      token_bytes_.data() + token_offsets_[static_cast<size_t>(id)],
      token_offsets_[static_cast<size_t>(id) + 1] - token_offsets_[static_cast<size_t>(id)]);
}

BpeTokenizer::BpeTokenizer(const std::filesystem::path& encoder_file,
                           const std::filesystem::path& merges_file, std::string name,
                           const std::vector<std::string>& specials)
    : name_(std::move(name)) {
  // The merge count decides which ids are specials, so both files are read before the table is
  // built; the encoder first, so that its errors come first.
  auto entries = parse_encoder(encoder_file);
  const std::vector<Merge> merges = read_merges(merges_file);
  build_vocabulary(entries, merges.size(), encoder_file, merges_file);
  check_merges(merges, merges_file, encoder_file);
  merges_.reserve(merges.size());
  for (const Merge& m : merges)
    merges_.emplace_back(token_ids_.at(m.joined), static_cast<uint32_t>(m.left_bytes));
  for (const auto& s : specials) {
    if (special_id(s)) continue;
    add_special(s, num_tokens_ + num_extra_specials_);
    ++num_extra_specials_;
  }
}

void BpeTokenizer::build_vocabulary(const std::vector<std::pair<std::string, int32_t>>& entries,
                                    size_t num_merges, const std::filesystem::path& path,
                                    const std::filesystem::path& merges_file) {
  const std::string where = quoted_path(path.string()) + ": ";
  const std::string merges_name = quoted_path(merges_file.filename().string());
  // Ids must be exactly 0..N-1 so that token bytes sit in one flat array indexed by id.
  num_tokens_ = static_cast<int32_t>(entries.size());
  std::vector<const std::string*> by_id(entries.size(), nullptr);
  for (const auto& [bytes, id] : entries) {
    if (id >= num_tokens_ || by_id[static_cast<size_t>(id)] != nullptr)
      throw Error(ExitCode::data,
                  detail::concat(where, "token ids must be 0..", num_tokens_ - 1, " each once; id ",
                                 id, " is out of range or repeated"));
    by_id[static_cast<size_t>(id)] = &bytes;
  }
  token_offsets_.assign(1, 0);
  for (const std::string* b : by_id) {
    token_bytes_ += *b;
    token_offsets_.push_back(static_cast<uint32_t>(token_bytes_.size()));
  }

  // Views into token_bytes_, which no longer changes. Ids past the merges (256 + num_merges on)
  // are special tokens appended to a trained vocabulary ("<|endoftext|>", "[PAD]", ...); GPT-2's
  // "<|endoftext|>" is special wherever it sits.
  const int64_t first_special = 256 + static_cast<int64_t>(num_merges);
  token_ids_.reserve(entries.size());
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (int32_t id = 0; id < num_tokens_; ++id) {
    const std::string_view bytes = bytes_of(id);
    if (bytes.empty())
      throw Error(ExitCode::data, detail::concat(where, "token ", id, " is empty"));
    if (bytes == kEndOfText || id >= first_special) continue;
    if (!token_ids_.emplace(bytes, id).second)
      throw Error(ExitCode::data, detail::concat(where, "tokens ", token_ids_[bytes], " and ", id,
                                                 " spell the same bytes"));
    if (bytes.size() == 1) byte_ids_[static_cast<unsigned char>(bytes[0])] = id;
  }
  for (int b = 0; b < 256; ++b)
    if (byte_ids_[b] < 0)
      throw Error(ExitCode::data, detail::concat(where, "no token for byte ", b));
  for (int32_t id = 0; id < num_tokens_; ++id) {
    const std::string_view bytes = bytes_of(id);
    if (bytes != kEndOfText && id < first_special) continue;
    if (auto same = token_ids_.find(bytes); same != token_ids_.end())
      throw Error(ExitCode::data, detail::concat(where, "tokens ", same->second, " and ", id,
                                                 " spell the same bytes"));
    if (special_id(bytes))
      throw Error(ExitCode::data, detail::concat(where, "tokens ", *special_id(bytes), " and ", id,
                                                 " spell the same bytes"));
    // A vocab.bpe cut short at a line boundary would turn the tokens of its lost merges into
    // "specials"; the first lost one is two earlier tokens joined, which a real special mixing
    // letters and punctuation (as "[PAD]" does) cannot be: GPT-2's pieces never mix the two.
    for (size_t k = 1; bytes != kEndOfText && k < bytes.size(); ++k)
      if (token_ids_.count(bytes.substr(0, k)) && token_ids_.count(bytes.substr(k)))
        throw Error(ExitCode::data, detail::concat(where, "token ", id, " comes after the ",
                                                   num_merges, " merges of ", merges_name,
                                                   " but joins two tokens like a merge result (is ",
                                                   merges_name, " truncated?)"));
    add_special(std::string(bytes), id);
  }

  // tiktoken merges two adjacent parts whenever their concatenation is a token, with rank = its id,
  // so the pair table holds every split of every token into two tokens.
  std::vector<bpe::Merge> pairs;
  pairs.reserve(entries.size() * 8);
  for (const auto& [bytes, id] : token_ids_) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto a = token_ids_.find(bytes.substr(0, k));
      if (a == token_ids_.end()) continue;
      auto b = token_ids_.find(bytes.substr(k));
      if (b == token_ids_.end()) continue;
      pairs.push_back({a->second, b->second, id, id});
    }
  }
  pairs_.build(pairs);
}

std::vector<BpeTokenizer::Merge> BpeTokenizer::read_merges(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  std::vector<Merge> merges;
  size_t line_start = 0, line_no = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    ++line_no;
    line_start = line_end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const size_t space = line.find(' ');
    std::string joined;
    size_t left_bytes = 0;
    bool ok = space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
              line.find(' ', space + 1) == std::string_view::npos;
    for (size_t i = 0; ok && i < line.size();) {
      if (i == space) {
        left_bytes = joined.size();
        ++i;
        continue;
      }
      uint32_t cp = 0;
      const int n = utf8_decode(line, i, cp);
      ok = n > 0 && append_unmapped(cp, joined);
      i += static_cast<size_t>(std::max(n, 1));
    }
    if (!ok)
      throw Error(ExitCode::data, detail::concat(quoted_path(path.string()), ": line ", line_no,
                                                 " is not a merge of two byte-level symbols"));
    merges.push_back({std::move(joined), left_bytes, line_no});
  }
  return merges;
}

void BpeTokenizer::check_merges(const std::vector<Merge>& merges, const std::filesystem::path& path,
                                const std::filesystem::path& encoder_file) const {
  const std::string encoder_name = quoted_path(encoder_file.filename().string());
  for (const Merge& m : merges)
    if (!token_ids_.count(m.joined))
      throw Error(ExitCode::data,
                  detail::concat(quoted_path(path.string()), ": line ", m.line,
                                 " merges into a token missing from ", encoder_name));
  const size_t expected = token_ids_.size() - 256;
  if (merges.size() != expected)
    throw Error(ExitCode::data, detail::concat(quoted_path(path.string()), ": ", merges.size(),
                                               " merges, but ", encoder_name, " has ", expected,
                                               " non-byte tokens before its special tokens"));
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                                bpe::PieceCache& cache, std::vector<int32_t>& parts,
                                std::vector<int32_t>& ranks) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (auto it = token_ids_.find(piece); it != token_ids_.end()) {
    out.push_back(it->second);
    return;
  }
  if (cache.append(piece, out, nullptr)) return;
  parts.clear();
  for (unsigned char c : piece) parts.push_back(byte_ids_[c]);
  pairs_.merge(parts, nullptr, ranks);
  out.insert(out.end(), parts.begin(), parts.end());
  cache.insert(piece, parts, nullptr);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  std::unique_lock<std::mutex> lock;
  bpe::PieceCache local;
  bpe::PieceCache* cache = &local;
  // Each thread starts at a slot of its own: taking the first free one moved the slots between
  // threads call by call, so every cache was cold in the caches of the core using it, and two
  // threads of forge prepare ran slower than one.
  static std::atomic<size_t> threads_seen{0};
  thread_local const size_t first = threads_seen++ % kCacheSlots;
  for (size_t k = 0; k < kCacheSlots; ++k) {
    CacheSlot& slot = caches_[(first + k) % kCacheSlots];
    lock = std::unique_lock<std::mutex>(slot.mutex, std::try_to_lock);
    if (lock.owns_lock()) {
      cache = &slot.cache;
      break;
    }
  }
  std::vector<int32_t> parts, ranks;
  detail::split_specials(
      text, specials_,
      [&](std::string_view segment) {
        for_each_piece(segment, [&](std::string_view piece) {
          encode_piece(piece, ids, *cache, parts, ranks);
        });
      },
      [&](int32_t id) { ids.push_back(id); });
  return ids;
}

// GPT-2's pattern always ends a piece between a lone '\n' (after a visible ASCII character) and an
// ASCII letter: the letter continues no whitespace run, the only piece that takes a character
// before its letters (` ?\p{L}+`) takes a space, and a one-character whitespace run is its own
// piece whether text or the end of the text follows (a longer one would keep its last character
// at the end of a part, but not before a letter). Cutting there splits no piece; it must only keep
// clear of special tokens, whose leftmost-first matching a cut near one could change.
std::vector<size_t> BpeTokenizer::independent_cuts(std::string_view text, size_t every) const {
  std::vector<std::string_view> avoid;
  for (const auto& [special, id] : specials_) avoid.push_back(special);
  return detail::line_start_cuts(text, every, avoid);
}

std::vector<std::string> BpeTokenizer::spelled_tokens() const {
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size()));
  for (int32_t id = 0; id < num_tokens_; ++id)
    tokens[static_cast<size_t>(id)] = gpt2_spelling(bytes_of(id));
  for (const auto& [text, id] : specials_) tokens[static_cast<size_t>(id)] = text;
  return tokens;
}

std::vector<std::string> BpeTokenizer::spelled_merges() const {
  std::vector<std::string> out;
  out.reserve(merges_.size());
  for (const auto& [id, left_bytes] : merges_) {
    const std::string_view joined = bytes_of(id);
    out.push_back(gpt2_spelling(joined.substr(0, left_bytes)) + " " +
                  gpt2_spelling(joined.substr(left_bytes)));
  }
  return out;
}

std::vector<std::string> BpeTokenizer::spelled_merge_pairs() const {
  // merges_ lists each token's vocab.bpe split; by token id, the left part's length.
  std::vector<uint32_t> listed(static_cast<size_t>(num_tokens_), 0);
  for (const auto& [id, left_bytes] : merges_) listed[static_cast<size_t>(id)] = left_bytes;
  std::vector<std::string> out;
  out.reserve(merges_.size() * 2);
  auto spell = [&](std::string_view joined, size_t k) {
    out.push_back(gpt2_spelling(joined.substr(0, k)) + " " + gpt2_spelling(joined.substr(k)));
  };
  for (int32_t id = 0; id < num_tokens_; ++id) {
    const std::string_view joined = bytes_of(id);
    const auto it = token_ids_.find(joined);
    if (joined.size() < 2 || it == token_ids_.end() || it->second != id) continue;  // special
    const size_t first = listed[static_cast<size_t>(id)];
    if (first > 0) spell(joined, first);
    for (size_t k = 1; k < joined.size(); ++k)
      if (k != first && token_ids_.count(joined.substr(0, k)) && token_ids_.count(joined.substr(k)))
        spell(joined, k);
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (id >= 0 && id < num_tokens_) {
      out += bytes_of(id);
    } else if (id >= num_tokens_ && id < vocab_size()) {
      out += std::find_if(specials_.begin(), specials_.end(), [&](const auto& s) {
               return s.second == id;
             })->first;
    } else {
      throw Error(ExitCode::data, detail::concat(name_, " tokenizer: token id ", id,
                                                 " is outside [0, ", vocab_size(), ")"));
    }
  }
  return out;
}

}  // namespace forge
