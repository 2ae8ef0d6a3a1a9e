// Config values as text: YAML 1.2 scalars parsed strictly (no .inf, no yes/no), values printed so
// that they read back identically (and as the same type in YAML 1.1 readers), and "did you mean"
// for misspelled keys and choices.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "core/error.h"
#include "runtime/config_internal.h"

namespace forge {
namespace config_detail {
namespace {

bool is_integer_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

}  // namespace

// YAML 1.2 core-schema floats without .inf/.nan: [-+]? (d+ [. d*] | . d+) [e [-+]? d+]
bool is_number_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == s.size();
}

std::optional<int64_t> parse_integer(const std::string& s) {
  if (!is_integer_text(s)) return std::nullopt;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(const std::string& s) {
  if (!is_number_text(s)) return std::nullopt;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  double v = 0;
  auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

// Shortest text that reads back as the same double, always with a '.' so that it reads as a
// float in YAML 1.1 readers too (PyYAML wants "1.0e-08", not "1e-08").
std::string format_number(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  FORGE_CHECK(ec == std::errc(), "config: cannot format ", x);
  std::string s(buf, end);
  if (s.find_first_of(".ni") != std::string::npos) return s;
  size_t e = s.find('e');
  if (e == std::string::npos) return s + ".0";
  return s.substr(0, e) + ".0" + s.substr(e);
}

namespace {

// Plain YAML only for strings that cannot read back as anything else; everything else quoted.
std::string format_string(const std::string& s) {
  static const std::set<std::string> reserved = {
      "null",  "Null", "NULL", "~",   "true", "True", "TRUE", "false", "False",
      "FALSE", "yes",  "Yes",  "YES", "no",   "No",   "NO",   "on",    "On",
      "ON",    "off",  "Off",  "OFF", "y",    "n",    "Y",    "N"};
  bool plain = !s.empty() && s[0] != '-' && s[0] != '.' && !reserved.count(s) &&
               !is_number_text(s) && std::all_of(s.begin(), s.end(), [](char c) {
                 return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                        c == '/' || c == '-';
               });
  if (plain) return s;
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

struct ValueFormatter {
  std::string operator()(int64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const { return format_number(v); }
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(const std::string& v) const { return format_string(v); }
  std::string operator()(const std::vector<double>& v) const { return list(v, format_number); }
  std::string operator()(const std::vector<std::string>& v) const { return list(v, format_string); }
  std::string operator()(const std::vector<int64_t>& v) const {
    return list(v, [](int64_t x) { return std::to_string(x); });
  }
  template <class X, class F>
  static std::string list(const std::vector<X>& xs, F format) {
    std::string out = "[";
    for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + format(xs[i]);
    return out + "]";
  }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions ("rl" -> "lr").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// Close enough to be a typo: one edit for short names, up to three for long ones.
bool close_enough(const std::string& a, const std::string& b, size_t* distance) {
  size_t len = std::max(a.size(), b.size());
  size_t allowed = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  *distance = edit_distance(lower(a), lower(b));
  return *distance <= allowed;
}

}  // namespace

// The closest of `candidates` to `name`, or "".
std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = 0;
    if (close_enough(name, c, &d) && d < best_d) best = c, best_d = d;
  }
  return best;
}

// Full path of the key the user probably meant by `name` under section `prefix`, or "". Looks at
// siblings (and their aliases) first, then the same name in another section.
std::string suggest_key(const std::string& prefix, const std::string& name) {
  const SchemaIndex& ix = schema_index();
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  auto consider = [&](const std::string& candidate, const std::string& path) {
    size_t d = 0;
    if (close_enough(name, candidate, &d) && d < best_d) best = path, best_d = d;
  };
  if (auto it = ix.children.find(prefix); it != ix.children.end()) {
    for (const auto& child : it->second) {
      std::string path = join(prefix, child);
      consider(child, path);
      if (auto k = ix.by_path.find(path); k != ix.by_path.end())
        for (const auto& alias : k->second->aliases) consider(alias, path);
    }
  }
  // A sibling's exact alias beats the same name elsewhere ("model.eps" is norm_eps, not
  // optimizer.eps), which beats a sibling that is only close ("lr" at the top is optimizer.lr,
  // not the section lora).
  if (!best.empty() && best_d == 0) return best;
  for (const ConfigKey& key : config_schema())
    if (lower(leaf_of(key.path)) == lower(name)) return key.path;
  if (!best.empty()) return best;
  for (const ConfigKey& key : config_schema())
    for (const auto& alias : key.aliases)
      if (alias == lower(name)) return key.path;
  std::string path = join(prefix, name);
  for (const ConfigKey& key : config_schema()) {
    size_t d = 0;
    if (close_enough(path, key.path, &d) && d < best_d) best = key.path, best_d = d;
  }
  return best;
}

}  // namespace config_detail

std::string format_config_value(const ConfigValue& value) {
  return std::visit(config_detail::ValueFormatter{}, value);
}

}  // namespace forge
