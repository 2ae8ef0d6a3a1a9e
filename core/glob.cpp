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

}  // namespace forge
