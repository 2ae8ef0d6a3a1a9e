// tokenizer.json's models with the semantics of Hugging Face's `tokenizers`: BPE (merge ranks
// from the merges list, unk_token and fuse_unk, byte_fallback to "<0xNN>" tokens, ignore_merges,
// continuing_subword_prefix, end_of_word_suffix) over the shared merge loop of data/bpe_merge.h,
// and WordPiece (greedy longest match with the continuing prefix, unk for unknown words).
#include "data/tokenizer_json_model.h"

#include <atomic>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "data/bpe_merge.h"
#include "data/unicode.h"

namespace forge::tokenizer_json {
namespace {

using nlohmann::json;

// `s` as a JSON string literal: quoted, escaped, one line whatever it holds.
std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Bytes of the UTF-8 character at s[i] (1 for a byte that starts none).
size_t char_len(std::string_view s, size_t i) {
  uint32_t cp = 0;
  const int n = unicode::utf8_decode(s, i, cp);
  return n > 0 ? static_cast<size_t>(n) : 1;
}

class BpeModel final : public Model {
 public:
  BpeModel(const json& node, const JsonPlace& place);
  void tokenize(std::string_view piece, std::vector<int32_t>& ids,
                std::vector<uint32_t>& lens) const override;

 private:
  void read_merges(const json& node, const JsonPlace& place);
  // Hugging Face's merge_word: one part per character (with the prefix and suffix), unknown
  // characters to their bytes' "<0xNN>" tokens or to unk.
  void split_word(std::string_view word, std::vector<int32_t>& parts,
                  std::vector<uint32_t>& lens) const;
  int32_t unk_id() const;
  bpe::PieceCache& cache() const;

  bpe::MergeTable merges_;
  std::optional<std::string> unk_, prefix_, suffix_;
  std::optional<int32_t> unk_id_;
  JsonPlace unk_place_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256] = {};  // "<0xNN>" tokens for byte_fallback, -1 where absent
  uint64_t instance_;           // names this model's per-thread caches
};

BpeModel::BpeModel(const json& node, const JsonPlace& place) {
  static std::atomic<uint64_t> instances{0};
  instance_ = ++instances;
  if (const json* dropout = field(node, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0))
    place.at("dropout").fail("BPE dropout makes tokenization random; only null or 0 is read");
  read_vocab(node, place);
  if (field(node, "unk_token")) {
    unk_ = string_field(node, "unk_token", place);
    unk_id_ = id_of(*unk_);
    unk_place_ = place.at("unk_token");
  }
  if (field(node, "continuing_subword_prefix"))
    prefix_ = string_field(node, "continuing_subword_prefix", place);
  if (field(node, "end_of_word_suffix")) suffix_ = string_field(node, "end_of_word_suffix", place);
  fuse_unk_ = bool_field(node, "fuse_unk", place, false);
  byte_fallback_ = bool_field(node, "byte_fallback", place, false);
  ignore_merges_ = bool_field(node, "ignore_merges", place, false);
  for (int b = 0; b < 256; ++b) {
    char code[8];
    std::snprintf(code, sizeof code, "<0x%02X>", b);
    byte_ids_[b] = id_of(code).value_or(-1);
  }
  read_merges(node, place);
}

void BpeModel::read_merges(const json& node, const JsonPlace& place) {
  const json* merges = field(node, "merges");
  if (merges == nullptr || !merges->is_array())
    place.at("merges").fail("expected an array of merges");
  std::vector<bpe::Merge> table;
  table.reserve(merges->size());
  const size_t prefix_len = prefix_ ? prefix_->size() : 0;
  std::string made;
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    const JsonPlace at = place.at("merges").at(i);
    std::string left, right;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      // Hugging Face skips "#version" lines of a merges.txt copied in, and counts ranks without
      // them.
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        at.fail("expected two tokens separated by one space");
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      at.fail("expected \"left right\" or [left, right]");
    }
    const auto a = id_of(left), b = id_of(right);
    if (!a) at.fail(detail::concat("token ", quote(left), " is not in the vocabulary"));
    if (!b) at.fail(detail::concat("token ", quote(right), " is not in the vocabulary"));
    // The merged token drops the right part's continuing_subword_prefix.
    if (right.compare(0, prefix_len, prefix_.value_or("")) != 0)
      at.fail(detail::concat("token ", quote(right), " does not start with the continuing prefix ",
                             quote(*prefix_)));
    made = left + right.substr(prefix_len);
    const auto c = id_of(made);
    if (!c) at.fail(detail::concat("the merged token ", quote(made), " is not in the vocabulary"));
    table.push_back({*a, *b, static_cast<int32_t>(table.size()), *c});
  }
  merges_.build(table);
}

int32_t BpeModel::unk_id() const {
  if (!unk_id_) unk_place_.fail(detail::concat(quote(*unk_), " is not in the vocabulary"));
  return *unk_id_;
}

void BpeModel::split_word(std::string_view word, std::vector<int32_t>& parts,
                          std::vector<uint32_t>& lens) const {
  parts.clear();
  lens.clear();
  std::optional<std::pair<int32_t, uint32_t>> unk;  // pending, fused with unknowns that follow
  std::string spelled;
  for (size_t i = 0; i < word.size();) {
    const size_t n = char_len(word, i);
    std::string_view s = word.substr(i, n);
    const bool add_prefix = prefix_ && i > 0, add_suffix = suffix_ && i + n == word.size();
    if (add_prefix || add_suffix) {
      spelled = add_prefix ? *prefix_ : std::string();
      spelled += s;
      if (add_suffix) spelled += *suffix_;
      s = spelled;
    }
    i += n;
    if (auto it = ids_.find(s); it != ids_.end()) {
      if (unk) parts.push_back(unk->first), lens.push_back(unk->second), unk.reset();
      parts.push_back(it->second);
      lens.push_back(static_cast<uint32_t>(n));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : s) parts.push_back(byte_ids_[b]), lens.push_back(1);
        continue;
      }
    }
    if (!unk_) continue;  // Hugging Face drops a character it has no token for
    if (unk && fuse_unk_) {
      unk->second += static_cast<uint32_t>(n);
    } else {
      if (unk) parts.push_back(unk->first), lens.push_back(unk->second);
      unk.emplace(unk_id(), static_cast<uint32_t>(n));
    }
  }
  if (unk) parts.push_back(unk->first), lens.push_back(unk->second);
}

// One cache per thread, as Hugging Face keeps, so that `forge prepare`'s threads never wait on
// each other; the last few models a thread used keep theirs.
bpe::PieceCache& BpeModel::cache() const {
  thread_local std::vector<std::pair<uint64_t, bpe::PieceCache>> caches;
  for (auto& [owner, cache] : caches)
    if (owner == instance_) return cache;
  if (caches.size() == 4) caches.erase(caches.begin());
  caches.emplace_back(instance_, bpe::PieceCache());
  return caches.back().second;
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& ids,
                        std::vector<uint32_t>& lens) const {
  if (piece.empty()) return;
  if (ignore_merges_)
    if (auto it = ids_.find(piece); it != ids_.end()) {
      ids.push_back(it->second);
      lens.push_back(static_cast<uint32_t>(piece.size()));
      return;
    }
  bpe::PieceCache& cached = cache();
  if (cached.append(piece, ids, &lens)) return;
  thread_local std::vector<int32_t> parts, ranks;
  thread_local std::vector<uint32_t> part_lens;
  split_word(piece, parts, part_lens);
  merges_.merge(parts, &part_lens, ranks);
  ids.insert(ids.end(), parts.begin(), parts.end());
  lens.insert(lens.end(), part_lens.begin(), part_lens.end());
  cached.insert(piece, parts, &part_lens);
}

class WordPieceModel final : public Model {
 public:
  WordPieceModel(const json& node, const JsonPlace& place)
      : unk_(string_field(node, "unk_token", place, "[UNK]")),
        prefix_(string_field(node, "continuing_subword_prefix", place, "##")),
        unk_place_(place.at("unk_token")) {
    read_vocab(node, place);
    unk_id_ = id_of(unk_);
    if (const json* max = field(node, "max_input_chars_per_word")) {
      if (!max->is_number_unsigned())
        place.at("max_input_chars_per_word").fail("expected a non-negative integer");
      max_chars_ = max->get<uint64_t>();
    }
  }

  void tokenize(std::string_view piece, std::vector<int32_t>& ids,
                std::vector<uint32_t>& lens) const override {
    if (piece.empty()) return;
    const size_t first = ids.size(), first_len = lens.size();
    auto unknown = [&] {
      if (!unk_id_) unk_place_.fail(detail::concat(quote(unk_), " is not in the vocabulary"));
      ids.resize(first);
      lens.resize(first_len);
      ids.push_back(*unk_id_);
      lens.push_back(static_cast<uint32_t>(piece.size()));
    };
    size_t chars = 0;
    for (size_t i = 0; i < piece.size(); i += char_len(piece, i)) ++chars;
    if (chars > max_chars_) return unknown();
    std::string spelled;
    for (size_t start = 0; start < piece.size();) {
      size_t end = piece.size();
      std::optional<int32_t> found;
      while (start < end) {
        std::string_view sub = piece.substr(start, end - start);
        if (start > 0) {
          spelled = prefix_;
          spelled += sub;
          sub = spelled;
        }
        if (auto it = ids_.find(sub); it != ids_.end()) {
          found = it->second;
          break;
        }
        do --end;  // back over the last character of the candidate
        while (end > start && (static_cast<unsigned char>(piece[end]) & 0xC0) == 0x80);
      }
      if (!found) return unknown();
      ids.push_back(*found);
      lens.push_back(static_cast<uint32_t>(end - start));
      start = end;
    }
  }

 private:
  std::string unk_, prefix_;
  JsonPlace unk_place_;
  std::optional<int32_t> unk_id_;
  uint64_t max_chars_ = 100;
};

}  // namespace

const json* field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string string_field(const json& obj, const char* key, const JsonPlace& place,
                         std::string fallback) {
  const json* v = field(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) place.at(key).fail("expected a string");
  return v->get<std::string>();
}

bool bool_field(const json& obj, const char* key, const JsonPlace& place, bool fallback) {
  const json* v = field(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) place.at(key).fail("expected true or false");
  return v->get<bool>();
}

std::optional<int32_t> Model::id_of(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void Model::read_vocab(const json& node, const JsonPlace& place) {
  const JsonPlace at = place.at("vocab");
  const json* vocab = field(node, "vocab");
  if (vocab == nullptr || !vocab->is_object()) at.fail("expected an object of token -> id");
  if (vocab->empty()) at.fail("the vocabulary is empty");
  if (vocab->size() > kMaxVocab)
    at.fail(detail::concat(vocab->size(), " tokens; at most ", kMaxVocab, " are read"));
  // Ids are exactly 0..N-1 so that decoding indexes one array.
  const size_t n = vocab->size();
  tokens_.assign(n, std::string());
  std::vector<uint8_t> seen(n, 0);
  ids_.reserve(n);
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= n)
      at.fail(detail::concat("token ", quote(token), " has id ", id.dump(), "; ids must be 0..",
                             n - 1));
    const size_t i = id.get<size_t>();
    if (seen[i])
      at.fail(detail::concat("tokens ", quote(tokens_[i]), " and ", quote(token), " share id ", i));
    seen[i] = 1;
    tokens_[i] = token;
    ids_.emplace(token, static_cast<int32_t>(i));
  }
}

std::unique_ptr<Model> make_model(const json& node, const JsonPlace& place) {
  if (!node.is_object()) place.fail("expected the model's object");
  std::string type = string_field(node, "type", place);
  // Files written before the type field existed are told apart by their fields, as Hugging Face
  // does.
  if (type.empty()) type = field(node, "merges") ? "BPE" : "WordPiece";
  if (type == "BPE") return std::make_unique<BpeModel>(node, place);
  if (type == "WordPiece") return std::make_unique<WordPieceModel>(node, place);
  place.at("type").fail(
      detail::concat("model type ", quote(type), " is not supported (BPE and WordPiece are)"));
}

}  // namespace forge::tokenizer_json
