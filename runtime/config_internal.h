// What the config_*.cpp files share and nobody else needs: the schema index (names under each
// section prefix), dotted-path helpers, scalar parsing and formatting, "did you mean", and where
// recipe sections sit. The public API is config.h and registry.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config.h"

namespace forge::config_detail {

// Which names live under each section prefix ("" = top level), in schema order.
struct SchemaIndex {
  std::map<std::string, std::vector<std::string>> children;
  std::map<std::string, const ConfigKey*> by_path;
};
const SchemaIndex& schema_index();

std::string join(const std::string& prefix, const std::string& name);
std::string parent_of(const std::string& path);
std::string leaf_of(const std::string& path);
/// A section of the schema (a prefix with keys under it), not a key.
bool is_section(const std::string& path);

/// The recipe section (registry.h) a key path lies in, or "" for a common key.
std::string recipe_section_of(const std::string& path);
/// Whether the active recipe of `config` reads recipe section `section` (false for an unknown
/// recipe).
bool recipe_reads(const RunConfig& config, const std::string& section);

// ---- scalars (config_values.cpp) ----
bool is_number_text(const std::string& s);
std::optional<int64_t> parse_integer(const std::string& s);
std::optional<double> parse_number(const std::string& s);
std::optional<bool> parse_bool(const std::string& s);
/// Shortest text that reads back as the same double, always with a '.'.
std::string format_number(double x);

// ---- did you mean (config_values.cpp) ----
/// The closest of `candidates` to `name`, or "".
std::string closest(const std::string& name, const std::vector<std::string>& candidates);
/// Full path of the key the user probably meant by `name` under section `prefix`, or "".
std::string suggest_key(const std::string& prefix, const std::string& name);

}  // namespace forge::config_detail
