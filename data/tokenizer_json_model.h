// The models of tokenizer.json (Hugging Face's BPE and WordPiece), which turn one pre-tokenized
// piece into tokens, and the small JSON readers the loaders share. Internal to
// data/tokenizer_json.cpp and data/tokenizer_json_model.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer_pipeline.h"

namespace forge::tokenizer_json {

/// Most tokens a vocabulary (or the added tokens) may have: far more than any published one
/// (Gemma's 256k), and ids stay well inside int32.
inline constexpr size_t kMaxVocab = size_t{1} << 24;

/// obj[key] if `obj` has it and it is not null, else nullptr.
const nlohmann::json* field(const nlohmann::json& obj, const char* key);
/// obj[key] as a string, or `fallback` when absent or null; another type fails at place.key.
std::string string_field(const nlohmann::json& obj, const char* key, const JsonPlace& place,
                         std::string fallback = {});
/// obj[key] as a bool, or `fallback` when absent or null; another type fails at place.key.
bool bool_field(const nlohmann::json& obj, const char* key, const JsonPlace& place, bool fallback);

class Model {
 public:
  virtual ~Model() = default;
  /// Appends the tokens of `piece` and, for each, how many bytes of the piece it covers (Hugging
  /// Face's token offsets within the piece, laid end to end).
  virtual void tokenize(std::string_view piece, std::vector<int32_t>& ids,
                        std::vector<uint32_t>& lens) const = 0;

  /// Token strings by id: the vocabulary's ids are exactly 0..size-1.
  const std::vector<std::string>& tokens() const { return tokens_; }
  std::optional<int32_t> id_of(std::string_view token) const;

 protected:
  /// Reads node.vocab (an object of token -> id) into tokens_ and ids_.
  void read_vocab(const nlohmann::json& node, const JsonPlace& place);
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
};

/// The model of tokenizer.json's "model" object (BPE or WordPiece; anything else fails at
/// place.type).
std::unique_ptr<Model> make_model(const nlohmann::json& node, const JsonPlace& place);

}  // namespace forge::tokenizer_json
