// TokenizerJson: loads tokenizer.json (components from data/tokenizer_pipeline.h, the model from
// data/tokenizer_json_model.h) and runs Hugging Face's encode: added tokens cut out of the raw
// text, the rest normalized and cut at normalized added tokens, pre-tokenized, and each piece
// tokenized by the model, with offsets carried back to the input through the normalized text.
#include "data/tokenizer_json.h"

#include <utf8proc.h>

#include <algorithm>
#include <unordered_map>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/tokenizer_json_model.h"
#include "data/tokenizer_pipeline.h"
#include "data/unicode.h"

namespace forge {

using nlohmann::json;
using tokenizer_json::JsonPlace;
using tokenizer_json::NormalizedText;

namespace {

// Rust's regex \w (Hugging Face tests single_word tokens' boundaries with it): letters, marks,
// decimal digits, connector punctuation and the joiners.
bool is_word_char(uint32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;
  }
}


// The code point of the character ending at s[end - 1] and where it starts.
uint32_t char_before(std::string_view s, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  uint32_t cp = 0;
  if (unicode::utf8_decode(s, start, cp) == 0) start = end - 1, cp = 0xFFFD;
  return cp;
}

uint32_t char_at(std::string_view s, size_t at, size_t& len) {
  uint32_t cp = 0;
  const int n = unicode::utf8_decode(s, at, cp);
  len = n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 ? cp : 0xFFFD;
}

}  // namespace

struct TokenizerJson::Split {
  NormalizedText text;
  int64_t added;  // index into added_, or -1 for text still to tokenize
};

void TokenizerJson::Matcher::add(std::string_view pattern, size_t token) {
  uint32_t node = 0;
  for (unsigned char c : pattern) {
    auto& children = nodes_[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [&](const auto& child) { return child.first == c; });
    if (it != children.end()) {
      node = it->second;
      continue;
    }
    children.emplace_back(c, static_cast<uint32_t>(nodes_.size()));
    node = static_cast<uint32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[node].token = static_cast<int64_t>(token);
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

int64_t TokenizerJson::Matcher::longest_at(std::string_view text, size_t at, size_t& end) const {
  if (!first_byte_[static_cast<unsigned char>(text[at])]) return -1;
  int64_t best = -1;
  uint32_t node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    const auto& children = nodes_[node].children;
    const unsigned char c = static_cast<unsigned char>(text[i]);
    auto it = std::find_if(children.begin(), children.end(),
                           [&](const auto& child) { return child.first == c; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = nodes_[node].token, end = i + 1;
  }
  return best;
}

namespace {

// Whether every piece boundary that GPT-2's pattern has at a line start is one of this pipeline:
// BPE after GPT-2's pattern (ByteLevel's regex) or Llama 3's or Qwen2's (a Split, then ByteLevel
// without its regex), nothing that acts on where a text starts (add_prefix_space), and no
// normalizer other than NFC, which composes nothing across a newline.
bool cuts_at_line_starts(const json& root) {
  auto is = [](const json& node, const char* key, const json& value) {
    return node.is_object() && node.contains(key) && node.at(key) == value;
  };
  const json none;
  auto part = [&](const char* key) -> const json& {
    return root.contains(key) ? root.at(key) : none;
  };
  if (!part("normalizer").is_null() && !is(part("normalizer"), "type", "NFC")) return false;
  if (!is(part("model"), "type", "BPE")) return false;
  auto byte_level = [&](const json& node, bool regex) {
    return is(node, "type", "ByteLevel") && is(node, "use_regex", regex) &&
           !is(node, "add_prefix_space", true);
  };
  const json& pre = part("pre_tokenizer");
  if (byte_level(pre, true)) return true;
  static const std::string kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const std::string kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (!is(pre, "type", "Sequence") || !pre.contains("pretokenizers")) return false;
  const json& steps = pre.at("pretokenizers");
  if (!steps.is_array() || steps.size() != 2 || !byte_level(steps[1], false)) return false;
  const json& split = steps[0];
  return is(split, "type", "Split") && is(split, "behavior", "Isolated") &&
         !is(split, "invert", true) &&
         (is(split, "pattern", json{{"Regex", kLlama3}}) ||
          is(split, "pattern", json{{"Regex", kQwen2}}));
}

}  // namespace

TokenizerJson::TokenizerJson(const std::filesystem::path& file, std::string name,
                             const std::vector<std::string>& specials)
    : file_(file.string()), name_(std::move(name)) {
  json root;
  try {
    root = parse_bounded_json(read_input_file(file_, kTokenizerInput));
  } catch (const json::exception& e) {
    throw Error(ExitCode::data,
                detail::concat(quoted_path(file_), ": not valid JSON (", printable(e.what()), ")"));
  }
  if (!root.is_object())
    throw Error(ExitCode::data, detail::concat(quoted_path(file_), ": expected a JSON object, got ",
                                               root.type_name()));
  auto part = [&](const char* key) -> const json& {
    static const json null;
    const json* node = tokenizer_json::field(root, key);
    return node == nullptr ? null : *node;
  };
  const JsonPlace model_place{file_, "model"};
  if (tokenizer_json::field(root, "model") == nullptr) model_place.fail("missing");
  normalizer_ = tokenizer_json::make_normalizer(part("normalizer"), {file_, "normalizer"});
  pre_tokenizer_ =
      tokenizer_json::make_pre_tokenizer(part("pre_tokenizer"), {file_, "pre_tokenizer"});
  model_ = tokenizer_json::make_model(part("model"), model_place);
  post_processor_ =
      tokenizer_json::make_post_processor(part("post_processor"), {file_, "post_processor"});
  decoder_ = tokenizer_json::make_decoder(part("decoder"), {file_, "decoder"});
  read_added_tokens(part("added_tokens"), specials);
  line_cuts_ = cuts_at_line_starts(root);
}

std::vector<size_t> TokenizerJson::independent_cuts(std::string_view text, size_t every) const {
  if (!line_cuts_) return {};
  std::vector<std::string_view> avoid;
  for (const AddedToken& token : added_) avoid.push_back(token.content);
  return detail::line_start_cuts(text, every, avoid);
}

TokenizerJson::~TokenizerJson() = default;

// Ids follow Hugging Face's AddedVocabulary::add_tokens, which ignores the file's ids: a token
// the model has keeps the model's id, the others take the ids after the vocabulary in file order.
// A file whose ids say otherwise would tokenize differently here and there, so it is refused.
void TokenizerJson::read_added_tokens(const json& node, const std::vector<std::string>& specials) {
  const JsonPlace place{file_, "added_tokens"};
  if (!node.is_null() && !node.is_array()) place.fail("expected an array");
  if (node.size() > tokenizer_json::kMaxVocab)
    place.fail(detail::concat(node.size(), " added tokens; at most ", tokenizer_json::kMaxVocab,
                              " are read"));
  const auto model_size = static_cast<int32_t>(model_->tokens().size());
  int32_t next_id = model_size;
  std::unordered_map<std::string, size_t> seen;
  auto add = [&](AddedToken token, const JsonPlace& at) {
    if (token.content.empty()) at.at("content").fail("an added token cannot be empty");
    if (!seen.emplace(token.content, added_.size()).second)
      at.at("content").fail(detail::concat("token ", printable(token.content), " is added twice"));
    token.id = model_->id_of(token.content).value_or(next_id);
    if (token.id == next_id) ++next_id;
    token.decoded = token.content;
    if (token.normalized && normalizer_) {
      NormalizedText text = NormalizedText::original(token.content);
      normalizer_->normalize(text);
      if (text.text.empty()) at.at("content").fail("the normalizer leaves nothing of this token");
      token.decoded = std::move(text.text);
    }
    added_.push_back(std::move(token));
    return added_.back().id;
  };
  for (size_t i = 0; i < node.size(); ++i) {
    const json& entry = node[i];
    const JsonPlace at = place.at(i);
    if (!entry.is_object()) at.fail("expected an object");
    const json* content = tokenizer_json::field(entry, "content");
    if (content == nullptr || !content->is_string()) at.at("content").fail("expected a string");
    const json* id = tokenizer_json::field(entry, "id");
    if (id == nullptr || !id->is_number_unsigned()) at.at("id").fail("expected a token id");
    AddedToken token;
    token.content = content->get<std::string>();
    token.special = tokenizer_json::bool_field(entry, "special", at, false);
    token.single_word = tokenizer_json::bool_field(entry, "single_word", at, false);
    token.lstrip = tokenizer_json::bool_field(entry, "lstrip", at, false);
    token.rstrip = tokenizer_json::bool_field(entry, "rstrip", at, false);
    token.normalized = tokenizer_json::bool_field(entry, "normalized", at, !token.special);
    const int32_t given = add(std::move(token), at);
    if (id->get<uint64_t>() != static_cast<uint64_t>(given))
      at.at("id").fail(detail::concat(
          "id ", id->dump(), ", but this token's id is ", given,
          " (the model's id for it, or else the next id after the vocabulary, in file order)"));
  }
  for (const std::string& s : specials) {
    if (seen.count(s)) continue;
    AddedToken token{};
    token.content = s;
    token.special = true;
    add(std::move(token), JsonPlace{file_, "(configured special tokens)"});
  }

  vocab_size_ = std::max(model_size, next_id);
  added_of_id_.assign(static_cast<size_t>(vocab_size_), -1);
  std::vector<std::pair<int32_t, std::string>> special_ids;
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& t = added_[k];
    added_of_id_[static_cast<size_t>(t.id)] = static_cast<int32_t>(k);
    if (t.special) special_ids.emplace_back(t.id, t.content);
    Matcher& matcher = t.normalized ? normalized_matcher_ : raw_matcher_;
    const std::string& pattern = t.normalized ? t.decoded : t.content;
    size_t end = 0;
    // Hugging Face's trie refuses a pattern given twice, and so the whole file.
    if (matcher.longest_at(pattern, 0, end) >= 0 && end == pattern.size())
      place.at(k).at("content").fail(detail::concat(
          "token ", printable(t.content), " matches the same text as another added token"));
    matcher.add(pattern, k);
  }
  std::sort(special_ids.begin(), special_ids.end());
  for (auto& [id, content] : special_ids) add_special(std::move(content), id);
}

// Matches are found on the whole text first and filtered after, as Hugging Face's Aho-Corasick
// iterator does: a single_word match that is refused still hides the matches it overlaps.
void TokenizerJson::find_matches(NormalizedText text, const Matcher& matcher,
                                 std::vector<Split>& out) const {
  const std::string& s = text.text;
  struct Cut {
    size_t begin, end;  // the match, as lstrip and rstrip extend it
    int64_t token;
  };
  std::vector<Cut> cuts;
  size_t start_offset = 0;
  for (size_t pos = 0; !matcher.empty() && pos < s.size();) {
    size_t stop = 0;
    const int64_t k = matcher.longest_at(s, pos, stop);
    if (k < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, len = 0;
    pos = stop;
    const AddedToken& token = added_[static_cast<size_t>(k)];
    if (token.single_word) {
      size_t before = 0;
      const bool word_before = start > 0 && is_word_char(char_before(s, start, before));
      const bool word_after = stop < s.size() && is_word_char(char_at(s, stop, len));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t at = start;
      while (at > 0) {
        size_t prev = 0;
        if (!unicode::is_white_space(char_before(s, at, prev))) break;
        at = prev;
      }
      start = std::max(at, start_offset);
    }
    if (token.rstrip)
      while (stop < s.size() && unicode::is_white_space(char_at(s, stop, len))) stop += len;
    cuts.push_back({start, stop, k});
    start_offset = stop;
  }
  // Text without matches, the common case, moves on whole instead of being copied.
  if (cuts.empty()) {
    if (!s.empty()) out.push_back({std::move(text), -1});
    return;
  }
  auto emit = [&](size_t begin, size_t end, int64_t added) {
    if (begin < end) out.push_back({text.slice(begin, end), added});
  };
  start_offset = 0;
  for (const Cut& cut : cuts) {
    emit(start_offset, cut.begin, -1);
    emit(cut.begin, cut.end, cut.token);
    start_offset = cut.end;
  }
  emit(start_offset, s.size(), -1);
}

void TokenizerJson::run(std::string_view text, std::vector<int32_t>& ids,
                        std::vector<std::pair<size_t, size_t>>* offsets) const {
  if (const size_t bad = unicode::first_invalid_utf8(text); bad != std::string_view::npos)
    throw Error(ExitCode::data,
                detail::concat(name_, " tokenizer: the text is not valid UTF-8 at byte ", bad,
                               " (tokenizer.json tokenizers read text, not bytes)"));
  std::vector<Split> raw, splits;
  find_matches(NormalizedText::original(text), raw_matcher_, raw);
  for (Split& split : raw) {
    if (split.added >= 0) {
      splits.push_back(std::move(split));
      continue;
    }
    if (normalizer_) normalizer_->normalize(split.text);
    find_matches(std::move(split.text), normalized_matcher_, splits);
  }
  tokenizer_json::Pieces pieces;
  std::vector<uint32_t> lens;
  for (Split& split : splits) {
    if (split.added >= 0) {
      ids.push_back(added_[static_cast<size_t>(split.added)].id);
      if (offsets) offsets->push_back(split.text.span());
      continue;
    }
    pieces.clear();
    pieces.push_back(std::move(split.text));
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const NormalizedText& piece : pieces) {
      lens.clear();
      model_->tokenize(piece.text, ids, lens);
      if (!offsets) continue;
      // Byte-fallback tokens spelled with a continuing prefix count the prefix's bytes too, so
      // they can claim more bytes than the piece has (Hugging Face's offsets for them are
      // meaningless); they stop at its end.
      size_t at = 0;
      for (uint32_t len : lens) {
        const size_t begin = std::min(at, piece.text.size() - 1);
        at = std::min(at + len, piece.text.size());
        offsets->push_back(piece.span(begin, std::max(at, begin + 1)));
      }
    }
  }
}

std::vector<int32_t> TokenizerJson::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 16);
  run(text, ids, nullptr);
  return ids;
}

std::string_view TokenizerJson::token_text(int32_t id) const {
  const int32_t added = added_of_id_[static_cast<size_t>(id)];
  return added >= 0 ? std::string_view(added_[static_cast<size_t>(added)].content)
                    : std::string_view(model_->tokens()[static_cast<size_t>(id)]);
}

// Hugging Face runs the post-processor on every encode: without special tokens it changes no id,
// but ByteLevel's trim_offsets moves offsets, so only encode_with_offsets needs it.
Encoding TokenizerJson::encode_with_offsets(std::string_view text) const {
  Encoding out;
  out.ids.reserve(text.size() / 3 + 16);
  out.offsets.reserve(text.size() / 3 + 16);
  run(text, out.ids, &out.offsets);
  if (post_processor_)
    post_processor_->process(out, false, [this](int32_t id) { return token_text(id); });
  return out;
}

std::vector<int32_t> TokenizerJson::with_special_tokens(std::vector<int32_t> ids) const {
  if (!post_processor_) return ids;
  Encoding encoding;
  encoding.offsets.assign(ids.size(), {0, 0});
  encoding.ids = std::move(ids);
  post_processor_->process(encoding, true, [this](int32_t id) { return token_text(id); });
  return std::move(encoding.ids);
}

std::string TokenizerJson::decode(const std::vector<int32_t>& ids) const {
  const std::vector<std::string>& model_tokens = model_->tokens();
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_)
      throw Error(ExitCode::data, detail::concat(name_, " tokenizer: token id ", id,
                                                 " is outside [0, ", vocab_size_, ")"));
    const int32_t added = added_of_id_[static_cast<size_t>(id)];
    tokens.push_back(added >= 0 ? added_[static_cast<size_t>(added)].decoded
                                : model_tokens[static_cast<size_t>(id)]);
  }
  if (decoder_) {
    decoder_->decode_chain(tokens);
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }
  // Without a decoder Hugging Face joins the tokens with spaces.
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  return out;
}

}  // namespace forge
