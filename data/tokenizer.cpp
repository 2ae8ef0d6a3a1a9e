// The byte tokenizer, special-token bookkeeping shared by all tokenizers, and the factory that
// resolves a tokenizer name or directory (GPT-2 BPE lives in data/bpe.cpp, BERT's WordPiece in
// data/wordpiece.cpp).
#include "data/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "data/bpe.h"
#include "data/sentencepiece.h"
#include "data/tokenizer_json.h"
#include "data/wordpiece.h"

namespace forge {

std::optional<int32_t> Tokenizer::special_id(std::string_view token) const {
  for (const auto& [text, id] : specials_)
    if (text == token) return id;
  return std::nullopt;
}

void Tokenizer::add_special(std::string token, int32_t id) {
  if (token.empty()) throw Error(ExitCode::usage, "tokenizer: a special token cannot be empty");
  for (const auto& [text, existing] : specials_)
    if (text == token || existing == id)
      throw Error(ExitCode::usage, detail::concat("tokenizer: special token '", token, "' (id ", id,
                                                  ") given twice"));
  specials_.emplace_back(std::move(token), id);
}

std::string Tokenizer::decode_continuation(const std::vector<int32_t>& prompt_ids,
                                           const std::vector<int32_t>& ids) const {
  std::vector<int32_t> whole = prompt_ids;
  whole.insert(whole.end(), ids.begin(), ids.end());
  const std::string head = decode(prompt_ids), all = decode(whole);
  return all.compare(0, head.size(), head) == 0 ? all.substr(head.size()) : decode(ids);
}

Encoding Tokenizer::encode_with_offsets(std::string_view text) const {
  Encoding out;
  out.ids = encode(text);
  out.offsets.reserve(out.ids.size());
  std::vector<int32_t> one(1);
  size_t at = 0;
  for (int32_t id : out.ids) {
    one[0] = id;
    const size_t end = std::min(text.size(), at + decode(one).size());
    out.offsets.emplace_back(at, end);
    at = end;
  }
  return out;
}

std::vector<size_t> detail::line_start_cuts(std::string_view text, size_t every,
                                            const std::vector<std::string_view>& avoid) {
  size_t longest = 0;
  for (std::string_view token : avoid) longest = std::max(longest, token.size());
  auto near_avoided = [&](size_t cut) {
    const size_t begin = cut >= longest ? cut - longest : 0;
    const std::string_view window = text.substr(begin, 2 * longest);
    for (std::string_view token : avoid)
      if (window.find(token) != std::string_view::npos) return true;
    return false;
  };
  std::vector<size_t> cuts;
  for (size_t from = std::max<size_t>(every, 1); from < text.size();) {
    const size_t line_end = text.find('\n', from - 1);
    if (line_end == std::string_view::npos || line_end + 1 >= text.size()) break;
    const size_t cut = line_end + 1;
    const char c = text[cut];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool visible_before =
        line_end > 0 && text[line_end - 1] > ' ' && text[line_end - 1] < 0x7F;
    if (!letter || !visible_before || near_avoided(cut)) {
      from = cut + 1;
      continue;
    }
    cuts.push_back(cut);
    from = cut + std::max<size_t>(every, 1);
  }
  return cuts;
}

ByteTokenizer::ByteTokenizer(const std::vector<std::string>& specials) {
  for (const auto& s : specials) add_special(s, 256 + static_cast<int32_t>(specials_.size()));
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  detail::split_specials(
      text, specials_,
      [&](std::string_view piece) {
        for (unsigned char c : piece) ids.push_back(c);
      },
      [&](int32_t id) { ids.push_back(id); });
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (id >= 256 && id < vocab_size()) {
      out += specials_[static_cast<size_t>(id - 256)].first;
    } else {
      throw Error(ExitCode::data, detail::concat("bytes tokenizer: token id ", id,
                                                 " is outside [0, ", vocab_size(), ")"));
    }
  }
  return out;
}

std::string vocabulary_hash(const Tokenizer& tokenizer) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over length-prefixed entries
  auto mix = [&h](std::string_view bytes) {
    for (unsigned char c : std::to_string(bytes.size()) + ":") h = (h ^ c) * 1099511628211ull;
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  };
  std::vector<int32_t> one(1);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    one[0] = id;
    mix(tokenizer.decode(one));
  }
  for (const auto& [token, id] : tokenizer.specials()) mix(token + "=" + std::to_string(id));
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

std::filesystem::path shipped_tokenizer_dir(const std::string& name) {
  return std::filesystem::path(FORGE_SOURCE_DIR) / "data" / "tokenizers" / name;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name_or_dir,
                                          const std::vector<std::string>& specials) {
  if (name_or_dir == "bytes") return std::make_unique<ByteTokenizer>(specials);
  namespace fs = std::filesystem;
  const fs::path dir =
      name_or_dir == "gpt2" ? shipped_tokenizer_dir("gpt2") : fs::path(name_or_dir);
  constexpr const char* kLookedFor =
      "\"bytes\", \"gpt2\", a SentencePiece .model file, a tokenizer.json file or a directory "
      "with tokenizer.json, tokenizer.model (SentencePiece), vocab.txt (WordPiece), encoder.json + "
      "vocab.bpe or vocab.json + merges.txt (byte-level BPE)";
  if (dir.extension() == ".json" && fs::is_regular_file(dir))  // named after its directory
    return std::make_unique<TokenizerJson>(
        dir, fs::absolute(dir).lexically_normal().parent_path().filename().string(), specials);
  if (dir.extension() == ".model" && !fs::is_directory(dir))
    return std::make_unique<SentencePieceTokenizer>(dir, dir.filename().string(), specials);
  if (!fs::is_directory(dir))
    throw Error(ExitCode::data, detail::concat(quoted_path(dir.string()),
                                               ": not a tokenizer (expected ", kLookedFor, ")"));
  std::string name = name_or_dir == "gpt2" ? "gpt2" : dir.lexically_normal().filename().string();
  if (name.empty()) name = dir.lexically_normal().parent_path().filename().string();
  // Either file of a pair picks that format, so that a missing partner is named in the error.
  // encoder.json + vocab.bpe come first: forge tokenizer train writes a tokenizer.json beside them
  // for other tools, and BpeTokenizer encodes any bytes, where tokenizer.json takes only UTF-8.
  auto has = [&](const char* file) { return fs::exists(dir / file); };
  if (has("encoder.json") || has("vocab.bpe"))
    return std::make_unique<BpeTokenizer>(dir / "encoder.json", dir / "vocab.bpe", name, specials);
  // A hub directory's vocab.json + merges.txt or vocab.txt say less than its tokenizer.json (the
  // normalizer, pre-tokenizer, added tokens).
  if (has("tokenizer.json"))
    return std::make_unique<TokenizerJson>(dir / "tokenizer.json", name, specials);
  if (has("tokenizer.model"))
    return std::make_unique<SentencePieceTokenizer>(dir / "tokenizer.model", name, specials);
  if (has("vocab.json") || has("merges.txt"))
    return std::make_unique<BpeTokenizer>(dir / "vocab.json", dir / "merges.txt", name, specials);
  if (has("vocab.txt")) return std::make_unique<WordPieceTokenizer>(dir, name, specials);
  throw Error(ExitCode::data, detail::concat(quoted_path(dir.string()),
                                             ": no tokenizer files (expected ", kLookedFor, ")"));
}

}  // namespace forge
