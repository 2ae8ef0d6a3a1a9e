// BERT's WordPiece. Hugging Face's BertTokenizer makes several passes over Python strings (clean,
// pad CJK, split on whitespace, lowercase and strip accents per word, split punctuation, then
// WordPiece per word); every step but the last maps one character at a time, so here they are one
// pass over UTF-8 that builds each word in a reused buffer and hands it to WordPiece at once.
#include "data/wordpiece.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "core/file_io.h"
#include "data/tokenizer_config.h"
#include "data/unicode.h"

namespace forge {
namespace {

enum Kind : uint8_t { kPlain, kDrop, kSpace, kPunct, kChinese };

// ASCII punctuation is every non-alphanumeric printable (BERT counts $ + < = > ^ ` | ~ too, which
// Unicode files under symbols).
struct AsciiTable {
  Kind kind[128];
  char lower[128];
  constexpr AsciiTable() : kind(), lower() {
    for (int c = 0; c < 128; ++c) {
      lower[c] = static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
      kind[c] = c == '\t' || c == '\n' || c == '\r' || c == ' ' ? kSpace
                : c < 0x20 || c == 0x7F                         ? kDrop
                : (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                        (c >= 123 && c <= 126)
                    ? kPunct
                    : kPlain;
    }
  }
};
constexpr AsciiTable kAscii;

// The ranges BERT calls Chinese characters: the CJK Unified Ideographs blocks and their
// compatibility blocks (not Hangul, Hiragana or Katakana, which separate words with spaces).
bool is_chinese(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// A non-ASCII character before lowercasing. Cleaning drops U+FFFD and every C* character and turns
// Zs into a space; U+2028 and U+2029 survive it but Python's str.split still splits there.
// Punctuation is decided after lowercasing and stripping, which can make some (U+1FEF -> `).
Kind kind_of(uint32_t cp) {
  if (cp == 0xFFFD || unicode::in_ranges(cp, unicode::kOtherRanges)) return kDrop;
  if (unicode::in_ranges(cp, unicode::kSpaceSeparatorRanges) || cp == 0x2028 || cp == 0x2029)
    return kSpace;
  return is_chinese(cp) ? kChinese : kPlain;
}

bool is_punctuation(uint32_t cp) {
  return cp < 0x80 ? kAscii.kind[cp] == kPunct
                   : unicode::in_ranges(cp, unicode::kPunctuationRanges);
}

// Calls emit(y) for each code point `cp` becomes when lowercased and/or stripped of accents.
// Stripping decomposes each character on its own and drops its Mn marks; Python decomposes the
// whole word and also reorders marks canonically, which changes the result only when two of the
// few non-Mn marks with a combining class (e.g. U+1D165) stand out of canonical order.
template <class Emit>
void map_char(uint32_t cp, const BertTextOptions& o, Emit&& emit) {
  const uint32_t self[unicode::kMaxMapped] = {cp};
  const uint32_t* lowered = self;
  if (o.lower_case)
    if (const unicode::CodeMapping* m = unicode::find_mapping(cp, unicode::kLowercase))
      lowered = m->to;
  for (size_t k = 0; k < unicode::kMaxMapped && lowered[k] != 0; ++k) {
    const uint32_t c = lowered[k];
    if (!o.strip_accents) {
      emit(c);
    } else if (c >= 0xAC00 && c <= 0xD7A3) {
      // A Hangul syllable decomposes into its leading consonant, vowel and trailing consonant.
      const uint32_t s = c - 0xAC00;
      emit(0x1100 + s / 588);
      emit(0x1161 + s % 588 / 28);
      if (s % 28 != 0) emit(0x11A7 + s % 28);
    } else if (const unicode::CodeMapping* m = unicode::find_mapping(c, unicode::kStripAccents)) {
      for (size_t j = 0; j < unicode::kMaxMapped && m->to[j] != 0; ++j) emit(m->to[j]);
    } else if (!unicode::in_ranges(c, unicode::kNonspacingMarkRanges)) {
      emit(c);
    }
  }
}

// Calls on_word(word, characters) for each word of BERT's basic tokenisation of `text`, built in
// `word` (a buffer the caller keeps across calls).
template <class OnWord>
void for_each_word(std::string_view text, const BertTextOptions& o, std::string& word,
                   OnWord&& on_word) {
  size_t chars = 0;
  word.clear();
  auto end_word = [&] {
    if (word.empty()) return;
    on_word(std::string_view(word), chars);
    word.clear();
    chars = 0;
  };
  auto add = [&](uint32_t c) {
    const bool alone = is_punctuation(c);
    if (alone) end_word();
    unicode::append_utf8(c, word);
    ++chars;
    if (alone) end_word();
  };
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      ++i;
      const Kind k = kAscii.kind[b];
      if (k == kSpace) {
        end_word();
      } else if (k == kPunct) {
        add(b);
      } else if (k == kPlain) {
        word.push_back(o.lower_case ? kAscii.lower[b] : static_cast<char>(b));
        ++chars;
      }
      continue;
    }
    uint32_t cp = 0;
    const int n = unicode::utf8_decode(text, i, cp);
    i += n > 0 ? static_cast<size_t>(n) : 1;
    if (n == 0) continue;  // Python would read an invalid byte as U+FFFD, which cleaning drops
    switch (kind_of(cp)) {
      case kDrop:
        break;
      case kSpace:
        end_word();
        break;
      case kChinese:
        if (o.split_chinese) end_word();
        map_char(cp, o, add);
        if (o.split_chinese) end_word();
        break;
      default:
        map_char(cp, o, add);
    }
  }
  end_word();
}

bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Every line is at least one byte and a newline, so a vocabulary within the file limit has fewer
// than 2^31 tokens and its ids fit int32.
static_assert(kTokenizerInput.max_bytes / 2 < uint64_t{INT32_MAX});

}  // namespace

std::vector<std::string> bert_basic_tokenize(std::string_view text,
                                             const BertTextOptions& options) {
  std::vector<std::string> words;
  std::string word;
  for_each_word(text, options, word, [&](std::string_view w, size_t) { words.emplace_back(w); });
  return words;
}

WordPieceTokenizer::WordPieceTokenizer(const std::filesystem::path& dir, std::string name,
                                       const std::vector<std::string>& specials)
    : name_(std::move(name)) {
  read_vocabulary(dir / "vocab.txt");
  if (std::filesystem::exists(dir / "tokenizer_config.json"))
    read_config(dir / "tokenizer_config.json");
  // Specials the vocabulary has are registered in id order, the appended ones after them.
  std::vector<std::pair<std::string, int32_t>> known;
  auto add_known = [&](const std::string& token) {
    const auto it = start_ids_.find(token);
    if (it == start_ids_.end()) return;
    for (const auto& k : known)
      if (k.second == it->second) return;
    known.emplace_back(token, it->second);
  };
  for (const char* token : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) add_known(token);
  for (const auto& s : specials) add_known(s);
  std::sort(known.begin(), known.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  for (auto& [token, id] : known) add_special(std::move(token), id);
  for (const auto& s : specials) {
    if (special_id(s)) continue;
    add_special(s, num_tokens_ + num_extra_specials_);
    ++num_extra_specials_;
  }
}

void WordPieceTokenizer::read_vocabulary(const std::filesystem::path& path) {
  const std::string text = read_input_file(path.string(), kTokenizerInput);
  const std::string where = quoted_path(path.string());
  if (text.empty())
    throw Error(ExitCode::data, where + ":1: empty file (expected one token a line)");
  token_bytes_.reserve(text.size());
  token_offsets_.assign(1, 0);
  size_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty())
      throw Error(ExitCode::data,
                  detail::concat(where, ":", line_no, ": empty line (a token cannot be empty)"));
    for (size_t i = 0; i < line.size();) {
      uint32_t cp = 0;
      const int n = unicode::utf8_decode(line, i, cp);
      if (n == 0)
        throw Error(ExitCode::data,
                    detail::concat(where, ":", line_no, ": invalid UTF-8 at byte ", i + 1));
      i += static_cast<size_t>(n);
    }
    token_bytes_ += line;
    token_offsets_.push_back(static_cast<uint32_t>(token_bytes_.size()));
  }
  num_tokens_ = static_cast<int32_t>(line_no);

  // Views into token_bytes_, which no longer changes.
  start_ids_.reserve(line_no);
  for (int32_t id = 0; id < num_tokens_; ++id) {
    const std::string_view t = token(id);
    if (auto [it, fresh] = start_ids_.emplace(t, id); !fresh)
      throw Error(ExitCode::data, detail::concat(where, ":", id + 1, ": token '", printable(t),
                                                 "' repeats line ", it->second + 1));
    max_start_bytes_ = std::max(max_start_bytes_, t.size());
    if (t.size() > 2 && t.substr(0, 2) == "##") {
      continuation_ids_.emplace(t.substr(2), id);
      max_continuation_bytes_ = std::max(max_continuation_bytes_, t.size() - 2);
    }
  }
  const auto unk = start_ids_.find("[UNK]");
  if (unk == start_ids_.end())
    throw Error(ExitCode::data,
                where + ": no [UNK] token (words the vocabulary cannot spell become [UNK])");
  unk_id_ = unk->second;
}

void WordPieceTokenizer::read_config(const std::filesystem::path& path) {
  const TokenizerConfig config(path);
  if (!config.flag("do_basic_tokenize", false).value_or(true))
    throw Error(ExitCode::data, config.where() +
                                    ": \"do_basic_tokenize\": false is not supported (Forge "
                                    "always cleans and splits text as BERT does)");
  options_.lower_case = config.flag("do_lower_case", false).value_or(true);
  options_.split_chinese = config.flag("tokenize_chinese_chars", false).value_or(true);
  options_.strip_accents = config.flag("strip_accents", true).value_or(options_.lower_case);
}

std::string_view WordPieceTokenizer::token(int32_t id) const {
  const auto i = static_cast<size_t>(id);
  return std::string_view(token_bytes_)
      .substr(token_offsets_[i], token_offsets_[i + 1] - token_offsets_[i]);
}

// Greedy longest match first: the longest vocabulary token the word starts with, then the longest
// "##" token continuing from there, and so on; a word that cannot be spelled that way is [UNK].
void WordPieceTokenizer::encode_word(std::string_view word, size_t chars,
                                     std::vector<int32_t>& out) const {
  if (chars > kMaxWordChars) {
    out.push_back(unk_id_);
    return;
  }
  const size_t first = out.size();
  for (size_t start = 0; start < word.size();) {
    const auto& ids = start == 0 ? start_ids_ : continuation_ids_;
    size_t end =
        std::min(word.size(), start + (start == 0 ? max_start_bytes_ : max_continuation_bytes_));
    while (end > start && end < word.size() && is_continuation_byte(word[end])) --end;
    int32_t id = -1;
    while (end > start) {
      if (const auto it = ids.find(word.substr(start, end - start)); it != ids.end()) {
        id = it->second;
        break;
      }
      do --end;
      while (end > start && is_continuation_byte(word[end]));
    }
    if (id < 0) {
      out.resize(first);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(id);
    start = end;
  }
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 16);
  std::string word;
  detail::split_specials(
      text, specials_,
      [&](std::string_view segment) {
        for_each_word(segment, options_, word,
                      [&](std::string_view w, size_t chars) { encode_word(w, chars, ids); });
      },
      [&](int32_t id) { ids.push_back(id); });
  return ids;
}

std::string WordPieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (k > 0) out.push_back(' ');
    if (id >= 0 && id < num_tokens_) {
      out += token(id);
    } else if (id >= num_tokens_ && id < vocab_size()) {
      out += specials_[static_cast<size_t>(id - num_tokens_) + specials_.size() -
                       static_cast<size_t>(num_extra_specials_)]
                 .first;
    } else {
      throw Error(ExitCode::data, detail::concat(name_, " tokenizer: token id ", id,
                                                 " is outside [0, ", vocab_size(), ")"));
    }
  }
  // Python's str.replace(" ##", ""): left to right, without overlaps.
  size_t w = 0;
  for (size_t r = 0; r < out.size();) {
    if (out.compare(r, 3, " ##") == 0) {
      r += 3;
      continue;
    }
    out[w++] = out[r++];
  }
  out.resize(w);
  return out;
}

}  // namespace forge
