// TokenizerConfig: tokenizer_config.json through Forge's input-file checks and bounded JSON parser.
#include "data/tokenizer_config.h"

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/file_io.h"

namespace forge {

TokenizerConfig::TokenizerConfig(const std::filesystem::path& path)
    : where_(quoted_path(path.string())) {
  try {
    j_ = parse_bounded_json(read_input_file(path.string(), kTokenizerInput));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ExitCode::data,
                detail::concat(where_, ": not valid JSON (", printable(e.what()), ")"));
  }
  if (!j_.is_object())
    throw Error(ExitCode::data,
                detail::concat(where_, ": expected a JSON object, got ", j_.type_name()));
}

std::optional<bool> TokenizerConfig::flag(const char* key, bool null_allowed) const {
  const auto it = j_.find(key);
  if (it == j_.end() || (null_allowed && it->is_null())) return std::nullopt;
  if (!it->is_boolean())
    throw Error(ExitCode::data,
                detail::concat(where_, ": \"", key, "\" must be true or false",
                               null_allowed ? " or null" : "", ", got ", it->type_name()));
  return it->get<bool>();
}

}  // namespace forge
