// Whole-name glob matching for dotted names. Parameter and module names drive optimizer groups,
// freezing and LoRA targeting in nn, optim and recipes alike, so the one matcher lives in core.
#pragma once

#include <string>
#include <vector>

namespace forge {

/// fnmatch-style match of the whole name: '*' any run of characters (dots included), '?' one.
bool glob_match(const std::string& pattern, const std::string& name);

/// Whether any of `patterns` matches `name` (glob_match).
bool glob_match_any(const std::vector<std::string>& patterns, const std::string& name);

}  // namespace forge
