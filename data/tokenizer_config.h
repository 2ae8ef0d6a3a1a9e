// A hub tokenizer directory's tokenizer_config.json, read once for every tokenizer that takes
// settings from it (WordPiece's casing, SentencePiece's BOS/EOS): a bounded JSON object whose
// typed reads name the file and the key when a value is not what they expect.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace forge {

class TokenizerConfig {
 public:
  /// Reads `path`; throws Error(data) naming it when it is unreadable, not JSON or not an object.
  explicit TokenizerConfig(const std::filesystem::path& path);

  /// The boolean `key`: nullopt when absent, or null where `null_allowed`; Error(data) naming the
  /// file and key for any other value.
  std::optional<bool> flag(const char* key, bool null_allowed) const;
  const nlohmann::json& json() const { return j_; }
  /// The file, as errors name it.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
  nlohmann::json j_;
};

}  // namespace forge
