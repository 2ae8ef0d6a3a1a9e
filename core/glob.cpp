// glob_match: greedy with one backtrack point, linear in practice, no recursion.
#include "core/glob.h"

namespace forge {

bool glob_match(const std::string& pattern, const std::string& name) {
  // On a mismatch after a '*', let that star swallow one more character.
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = n;
    } else if (star != std::string::npos) {
      p = star + 1, n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool glob_match_any(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns)
    if (glob_match(p, name)) return true;
  return false;
}

}  // namespace forge
