// The Jinja interpreter of data/jinja.h in four parts: values (Python's printing, equality and
// JSON), the lexer (jinja2's whitespace rules with trim_blocks and lstrip_blocks), a recursive
// descent parser with jinja2's operator precedence, and a tree-walking renderer with the filters,
// tests and methods chat templates call. What jinja2 would refuse, this refuses with the line.
#include "data/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "data/unicode.h"

namespace forge::jinja {
namespace {

[[noreturn]] void fail(std::string message) { throw Failure{std::move(message)}; }

// The steps of work left to the running render (Renderer::run sets it): one per loop iteration,
// value walked or compared, 16 bytes of a string built and byte of a string split into characters,
// four per list item built or iterated, so that what a render allocates stays in the hundreds of
// megabytes. Thread-local because the free
// helpers below (equality, iteration, string building) charge it without a renderer at hand.
thread_local int64_t* steps_left = nullptr;

void charge(size_t steps) {
  if (steps_left && (*steps_left -= int64_t(steps)) < 0)
    fail("more than " + std::to_string(kMaxSteps) +
         " steps of work (the bound on what a template may do)");
}

// ---------------------------------------------------------------------------------------------
// Text: code points (lenient: a byte that is not UTF-8 counts as one code point of its own)
// ---------------------------------------------------------------------------------------------

std::vector<std::string_view> code_points(std::string_view s) {
  charge(s.size());  // a 16-byte view for each character, paid for by a step a byte
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = std::max(1, unicode::utf8_decode(s, i, cp));
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t first_code_point(std::string_view c) {
  uint32_t cp = 0;
  return unicode::utf8_decode(c, 0, cp) ? cp : static_cast<unsigned char>(c[0]);
}

// Python's str.isspace().
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

std::string map_case(std::string_view s, utf8proc_int32_t (*f)(utf8proc_int32_t)) {
  std::string out;
  for (std::string_view c : code_points(s)) {
    uint32_t cp;
    if (unicode::utf8_decode(c, 0, cp))
      unicode::append_utf8(uint32_t(f(utf8proc_int32_t(cp))), out);
    else
      out += c;
  }
  return out;
}
std::string upper(std::string_view s) { return map_case(s, utf8proc_toupper); }
std::string lower(std::string_view s) { return map_case(s, utf8proc_tolower); }

bool is_cased(uint32_t cp) {
  const auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// Python's str.title(): a cased character after an uncased one starts a word.
std::string title_case(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (std::string_view c : code_points(s)) {
    const uint32_t cp = first_code_point(c);
    out += previous_cased ? lower(c) : map_case(c, utf8proc_totitle);
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  auto cps = code_points(s);
  if (cps.empty()) return "";
  return map_case(cps[0], utf8proc_totitle) + lower(s.substr(cps[0].size()));
}

// str.strip(chars): whitespace when `chars` is None.
std::string strip(std::string_view s, const Value& chars, bool left, bool right) {
  auto cps = code_points(s);
  auto drop = [&](std::string_view c) {
    if (chars.is_none() || chars.is_undefined()) return is_space(first_code_point(c));
    if (!chars.is_string()) fail("strip arg must be None or str");
    return chars.as_string().find(c) != std::string::npos;
  };
  size_t b = 0, e = cps.size();
  while (left && b < e && drop(cps[b])) ++b;
  while (right && e > b && drop(cps[e - 1])) --e;
  if (b == e) return "";
  return std::string(cps[b].data(), size_t(cps[e - 1].data() + cps[e - 1].size() - cps[b].data()));
}

[[noreturn]] void too_long() {
  fail("a string longer than " + std::to_string(kMaxOutputBytes) +
       " bytes (the bound on what a template may build)");
}

[[noreturn]] void too_many() {
  fail("a list of more than " + std::to_string(kMaxItems) +
       " items (the bound on what a template may build)");
}

const std::string& limit(const std::string& s) {
  if (s.size() > kMaxOutputBytes) too_long();
  return s;
}

std::string checked(std::string s) {
  limit(s);
  charge(s.size() / 16 + 1);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponents outside [1e-4, 1e16)
    if (exp >= 0) {
      if (digits.size() < size_t(exp) + 1) digits.append(size_t(exp) + 1 - digits.size(), '0');
      std::string frac = digits.substr(size_t(exp) + 1);
      out += digits.substr(0, size_t(exp) + 1) + "." + (frac.empty() ? "0" : frac);
    } else {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const int a = std::abs(exp);
  return out + "e" + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
}

// A str quoted as Python's repr quotes it (json false: quote ' or ", \xNN, \uNNNN or \UNNNNNNNN for
// what is not printable) or as json.dumps does (quote ", \u00NN for control characters and, with
// ascii, \uNNNN (surrogate pairs past U+FFFF) for all that is not ASCII).
std::string quoted(std::string_view s, char q, bool json, bool ascii = false) {
  std::string out(1, q);
  auto hex = [&](const char* prefix, uint32_t cp, int digits) {
    out += prefix;
    for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4)
      out += "0123456789abcdef"[(cp >> shift) & 15];
  };
  for (std::string_view c : code_points(s)) {
    const uint32_t cp = first_code_point(c);
    const char* named = c == "\\"           ? "\\\\"
                        : c == "\n"         ? "\\n"
                        : c == "\r"         ? "\\r"
                        : c == "\t"         ? "\\t"
                        : json && c == "\b" ? "\\b"
                        : json && c == "\f" ? "\\f"
                                            : nullptr;
    const auto cat = utf8proc_category(utf8proc_int32_t(cp));
    const bool printable =
        json ? cp >= 0x20
             : cp == ' ' || !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                              cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                              cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                              cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
    if (c.size() == 1 && c[0] == q)
      out += '\\', out += q;
    else if (named)
      out += named;
    else if (!printable)
      json           ? hex("\\u", cp, 4)
      : cp < 0x100   ? hex("\\x", cp, 2)
      : cp < 0x10000 ? hex("\\u", cp, 4)
                     : hex("\\U", cp, 8);
    else if (ascii && cp >= 0x10000)
      hex("\\u", 0xD800 + ((cp - 0x10000) >> 10), 4),
          hex("\\u", 0xDC00 + ((cp - 0x10000) & 0x3FF), 4);
    else if (ascii && cp >= 0x80)
      hex("\\u", cp, 4);
    else
      out += c;
  }
  return out + q;
}

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string string_repr(std::string_view s) {
  const bool double_quotes = s.find('\'') != s.npos && s.find('"') == s.npos;
  return quoted(s, double_quotes ? '"' : '\'', false);
}

void check_depth(int depth) {
  if (depth > kMaxNesting)
    fail("values nested deeper than " + std::to_string(kMaxNesting) + " levels");
}

std::string repr_at(const Value& v, int depth);

std::string str_at(const Value& v, int depth) {
  check_depth(depth);
  charge(1);
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_bool() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_float());
  if (v.is_string()) return v.as_string();
  if (v.is_callable()) return "<function " + v.as_callable().name + ">";
  std::string out;
  if (v.is_list()) {
    const Array& a = v.as_list();
    out = a.tuple ? "(" : "[";
    for (size_t i = 0; i < a.items.size(); ++i)
      limit(out += (i ? ", " : "") + repr_at(a.items[i], depth + 1));
    if (a.tuple && a.items.size() == 1) out += ",";
    return checked(out + (a.tuple ? ")" : "]"));
  }
  const Object& o = v.as_dict();
  out = o.is_namespace ? "<Namespace {" : "{";
  for (size_t i = 0; i < o.items.size(); ++i)
    limit(out += (i ? ", " : "") + string_repr(o.items[i].first) + ": " +
                 repr_at(o.items[i].second, depth + 1));
  return checked(out + (o.is_namespace ? "}>" : "}"));
}

std::string repr_at(const Value& v, int depth) {
  if (v.is_undefined()) return "Undefined";
  return v.is_string() ? string_repr(v.as_string()) : str_at(v, depth);
}

// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys).
struct JsonStyle {
  bool ensure_ascii = false, sort_keys = false;
  std::optional<std::string> indent;
  std::string item_sep = ", ", key_sep = ": ";
};

void to_json(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  check_depth(depth);
  charge(1);
  limit(out);
  if (v.is_undefined() || v.is_callable())
    fail("Object of type " + v.type_name() + " is not JSON serializable");
  if (v.is_none()) return void(out += "null");
  if (v.is_bool()) return void(out += v.as_bool() ? "true" : "false");
  if (v.is_int()) return void(out += std::to_string(v.as_int()));
  if (v.is_string()) return void(out += quoted(v.as_string(), '"', true, style.ensure_ascii));
  if (v.is_float()) {
    const double d = v.as_float();
    return void(out += std::isnan(d)   ? "NaN"
                       : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                       : float_repr(d));
  }
  // A list's items or a dict's (key, value) pairs, one a line when indented.
  std::vector<std::pair<const std::string*, const Value*>> items;
  if (v.is_list())
    for (const Value& x : v.as_list().items) items.emplace_back(nullptr, &x);
  else
    for (const auto& [k, x] : v.as_dict().items) items.emplace_back(&k, &x);
  if (style.sort_keys && v.is_dict())
    std::stable_sort(items.begin(), items.end(),
                     [](auto& a, auto& b) { return *a.first < *b.first; });
  const char* brackets = v.is_list() ? "[]" : "{}";
  out += brackets[0];
  auto newline = [&](int level) {
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *style.indent;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += style.item_sep;
    newline(depth + 1);
    if (items[i].first)
      out += quoted(*items[i].first, '"', true, style.ensure_ascii) + style.key_sep;
    to_json(*items[i].second, style, depth + 1, out);
  }
  if (!items.empty()) newline(depth);
  out += brackets[1];
}

double to_double(const Value& v) {
  return v.is_float() ? v.as_float() : v.is_bool() ? double(v.as_bool()) : double(v.as_int());
}
int64_t to_int(const Value& v) { return v.is_bool() ? int64_t(v.as_bool()) : v.as_int(); }

bool equal(const Value& a, const Value& b, int depth = 0) {
  check_depth(depth);
  charge(1);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return to_double(a) == to_double(b);
    return to_int(a) == to_int(b);
  }
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.as_string() == b.as_string();
  if (a.is_list()) {
    const Array &x = a.as_list(), &y = b.as_list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!equal(x.items[i], y.items[i], depth + 1)) return false;
    return true;
  }
  if (a.is_dict()) {
    const Object &x = a.as_dict(), &y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !equal(v, *w, depth + 1)) return false;
    }
    return true;
  }
  return &a.as_callable() == &b.as_callable();
}

void require_defined(const Value& v) {
  if (v.is_undefined()) fail(v.as_undefined().hint);
}

// -1, 0, 1 for Python's <; fails where Python raises TypeError.
int compare(const Value& a, const Value& b, const char* op) {
  charge(1);
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = to_double(a), y = to_double(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = to_int(a), y = to_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equal(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(std::string("'") + op + "' not supported between instances of '" + a.type_name() +
       "' and '" + b.type_name() + "'");
}

// Python's len(): an undefined value has length 0.
int64_t length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) {
    int64_t n = 0;
    for (size_t i = 0; i < v.as_string().size(); ++n) {
      uint32_t cp;
      i += size_t(std::max(1, unicode::utf8_decode(v.as_string(), i, cp)));
    }
    return n;
  }
  if (v.is_list()) return int64_t(v.as_list().items.size());
  if (v.is_dict()) return int64_t(v.as_dict().items.size());
  fail("object of type '" + v.type_name() + "' has no len()");
}

// Python's iteration: a dict gives its keys, a string its characters, undefined nothing.
std::vector<Value> iterate(const Value& v) {
  if (v.is_undefined()) return {};
  charge(4 * size_t(length(v)));  // a value for each item
  if (v.is_list()) return v.as_list().items;
  std::vector<Value> out;
  if (v.is_dict())
    for (const auto& kv : v.as_dict().items) out.emplace_back(kv.first);
  else if (v.is_string())
    for (std::string_view c : code_points(v.as_string())) out.emplace_back(std::string(c));
  else
    fail("'" + v.type_name() + "' object is not iterable");
  return out;
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not " + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string());
  for (const Value& x : iterate(container))
    if (equal(x, item)) return true;
  return false;
}

Value make_list(std::vector<Value> items, bool tuple = false) {
  if (items.size() > kMaxItems) too_many();
  charge(4 * items.size());
  Value v = Value::list(std::move(items), tuple);
  check_depth(v.as_list().depth);
  return v;
}

// Keeps a container's depth and holds_reference (data/jinja.h) as `child` goes in.
void note_child(int& depth, bool& holds_reference, const Value& child) {
  holds_reference |= child.is_callable();
  if (child.is_list()) {
    depth = std::max(depth, child.as_list().depth + 1);
    holds_reference |= child.as_list().holds_reference;
  } else if (child.is_dict()) {
    const Object& o = child.as_dict();
    depth = std::max(depth, o.depth + 1);
    holds_reference |= o.is_namespace || o.holds_reference;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Value's members
// ---------------------------------------------------------------------------------------------

Value Value::list(std::vector<Value> items, bool tuple) {
  auto a = std::make_shared<Array>(Array{std::move(items), tuple});
  for (const Value& x : a->items) note_child(a->depth, a->holds_reference, x);
  return Value(std::move(a));
}

Value Value::dict(std::vector<std::pair<std::string, Value>> items) {
  auto o = std::make_shared<Object>();
  for (auto& [k, v] : items) o->set(k, std::move(v));
  return Value(std::move(o));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > uint64_t(INT64_MAX)) return Value(j.get<double>());
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& x : j) items.push_back(from_json(x));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      for (const auto& [k, x] : j.items()) items.emplace_back(k, from_json(x));
      return dict(std::move(items));
    }
    default:
      return Value(None{});
  }
}

bool Value::truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int() != 0;
  if (is_float()) return as_float() != 0.0;
  if (is_string()) return !as_string().empty();
  if (is_list()) return !as_list().items.empty();
  if (is_dict()) return !as_dict().items.empty();
  return true;
}

std::string Value::str() const { return str_at(*this, 0); }
std::string Value::repr() const { return repr_at(*this, 0); }

std::string Value::type_name() const {
  static const char* names[] = {"Undefined", "NoneType", "bool", "int",     "float",
                                "str",       "list",     "dict", "function"};
  if (is_list() && as_list().tuple) return "tuple";
  if (is_dict() && as_dict().is_namespace) return "Namespace";
  return names[v_.index()];
}

const Value* Object::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void Object::set(const std::string& key, Value value) {
  note_child(depth, holds_reference, value);
  for (auto& kv : items)
    if (kv.first == key) return void(kv.second = std::move(value));
  items.emplace_back(key, std::move(value));
}

namespace {

// ---------------------------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------------------------

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, number, op, eof };

struct Token {
  Tok kind;
  std::string text;
  int line;
  Value number;
};

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's "unicode-escape" decoding of a string literal's body, as jinja2 applies it.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hex = [&](size_t n) {
      uint32_t cp = 0;
      const std::string_view digits = s.substr(i + 1, n);
      if (digits.size() < n ||
          std::from_chars(digits.data(), digits.data() + n, cp, 16).ptr != digits.data() + n)
        fail("truncated \\" + std::string(1, c) + " escape in a string literal");
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        fail("illegal Unicode character in a string literal");
      i += n;
      unicode::append_utf8(cp, out);
    };
    static constexpr std::string_view from = "ntrbfva\\'\"", to = "\n\t\r\b\f\v\a\\'\"";
    if (const size_t k = from.find(c); k != from.npos) {
      out += to[k];
    } else if (c == '\n') {  // a backslash at a line's end joins the lines
    } else if (c == 'x' || c == 'u' || c == 'U') {
      hex(c == 'x' ? 2 : c == 'u' ? 4 : 8);
    } else if (c >= '0' && c <= '7') {
      uint32_t cp = uint32_t(c - '0');
      for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
        cp = cp * 8 + uint32_t(s[++i] - '0');
      unicode::append_utf8(cp, out);
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 normalises newlines and drops one trailing newline (keep_trailing_newline=False).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t t = pos_;
      while ((t = src_.find('{', t)) != std::string::npos &&
             (t + 1 >= src_.size() || std::string("{%#").find(src_[t + 1]) == std::string::npos))
        ++t;
      std::string text = src_.substr(pos_, (t == std::string::npos ? src_.size() : t) - pos_);
      const int text_line = line_;
      line_ += int(std::count(text.begin(), text.end(), '\n'));
      if (t == std::string::npos) {
        emit(Tok::text, std::move(text), text_line);
        break;
      }
      const char kind = src_[t + 1];
      const char sign =
          t + 2 < src_.size() && (src_[t + 2] == '-' || src_[t + 2] == '+') ? src_[t + 2] : 0;
      if (sign == '-') {
        text = strip(text, None{}, false, true);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes its indentation.
        const size_t l = text.rfind('\n') + 1;
        if ((l > 0 || line_starting) && std::all_of(text.begin() + long(l), text.end(), [](char c) {
              return c == ' ' || c == '\t' || c == '\f' || c == '\v';
            }))
          text.resize(l);
      }
      emit(Tok::text, std::move(text), text_line);
      pos_ = t + 2 + (sign ? 1 : 0);
      if (kind == '#')
        comment();
      else
        tag(kind == '%');
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({Tok::eof, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    throw Failure{"line " + std::to_string(line_) + ": " + what};
  }

  void emit(Tok kind, std::string text, int line, Value number = {}) {
    if (kind == Tok::text && text.empty()) return;
    tokens_.push_back({kind, std::move(text), line, std::move(number)});
  }

  void advance_to(size_t p) {
    line_ += int(std::count(src_.begin() + long(pos_), src_.begin() + long(p), '\n'));
    pos_ = p;
  }

  // What `-%}` and `-}}` strip: Python's \s*, which takes Unicode spaces too.
  void skip_space_after() {
    size_t p = pos_;
    for (uint32_t cp; p < src_.size(); p += size_t(unicode::utf8_decode(src_, p, cp)))
      if (!unicode::utf8_decode(src_, p, cp) || !is_space(cp)) break;
    advance_to(p);
  }

  void comment() {
    if (pos_ == src_.size()) return;  // jinja2 ignores a `{#` that ends the template
    const size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) error("missing end of comment tag");
    const char sign = e > pos_ ? src_[e - 1] : 0;
    advance_to(e + 2);
    if (sign == '-')
      skip_space_after();
    else if (sign != '+' && pos_ < src_.size() && src_[pos_] == '\n')
      advance_to(pos_ + 1);
  }

  void tag(bool block) {
    emit(block ? Tok::block_begin : Tok::var_begin, "", line_);
    int brackets = 0;
    for (;;) {
      size_t p = pos_;
      while (p < src_.size() && ascii_space(src_[p])) ++p;
      advance_to(p);
      if (pos_ >= src_.size())
        error(block ? "unexpected end of template, expected '%}'"
                    : "unexpected end of template, expected '}}'");
      const std::string_view rest = std::string_view(src_).substr(pos_);
      const std::string_view close = block ? "%}" : "}}";
      if (brackets == 0) {
        if (rest.substr(0, 1) == "-" && rest.substr(1, 2) == close) {
          emit(block ? Tok::block_end : Tok::var_end, "", line_);
          advance_to(pos_ + 3);
          skip_space_after();
          return;
        }
        if (block && rest.substr(0, 3) == "+%}") {
          emit(Tok::block_end, "", line_);
          return advance_to(pos_ + 3);
        }
        if (rest.substr(0, 2) == close) {
          emit(block ? Tok::block_end : Tok::var_end, "", line_);
          advance_to(pos_ + 2);
          // trim_blocks: the newline after a block tag goes.
          if (block && pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);
          return;
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        emit(Tok::name, std::string(rest.substr(0, n)), line_);
        advance_to(pos_ + n);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        // After a dot a number is an index (`t.1.0`), never a float, as jinja2's lexer has it.
        const bool after_dot =
            !tokens_.empty() && tokens_.back().kind == Tok::op && tokens_.back().text == ".";
        number(rest, !after_dot);
      } else if (c == '\'' || c == '"') {
        size_t n = 1;
        while (n < rest.size() && rest[n] != c) n += rest[n] == '\\' ? 2 : 1;
        if (n >= rest.size()) error("unterminated string literal");
        const int line = line_;
        try {
          emit(Tok::string, unescape(rest.substr(1, n - 1)), line);
        } catch (const Failure& f) {
          error(f.message);
        }
        advance_to(pos_ + n + 1);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                    "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                    ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : ops)
          if (rest.substr(0, std::strlen(o)) == o) {
            op = o;
            break;
          }
        if (!op) error("unexpected char '" + std::string(1, c) + "'");
        const std::string o(op);
        if (o == "(" || o == "[" || o == "{") ++brackets;
        if ((o == ")" || o == "]" || o == "}") && brackets > 0) --brackets;
        emit(Tok::op, o, line_);
        advance_to(pos_ + o.size());
      }
    }
  }

  // jinja2's number literals: floats with a fraction or an exponent, 0x/0o/0b integers, and
  // decimal integers without leading zeros (`05` is two numbers, as in Python); `_` may separate
  // digits.
  void number(std::string_view rest, bool may_be_float) {
    auto digits = [&](size_t n, int base) {
      auto digit = [&](char c) {
        return base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                          : c >= '0' && c < char('0' + base);
      };
      while (n < rest.size() &&
             (digit(rest[n]) || (rest[n] == '_' && n + 1 < rest.size() && digit(rest[n + 1]))))
        ++n;
      return n;
    };
    size_t n = digits(0, 10), skip = 0;
    int base = 10;
    bool is_float = false;
    if (may_be_float && n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1])))
      n = digits(n + 1, 10), is_float = true;
    if (may_be_float && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      const size_t m = n + 1 + (n + 1 < rest.size() && (rest[n + 1] == '+' || rest[n + 1] == '-'));
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m])))
        n = digits(m, 10), is_float = true;
    }
    if (!is_float && rest[0] == '0') {
      const char prefix = rest.size() > 1 ? char(rest[1] | 0x20) : 0;
      base = prefix == 'x' ? 16 : prefix == 'o' ? 8 : prefix == 'b' ? 2 : 10;
      skip = base == 10 ? 0 : 2;
      n = base == 10 ? digits(0, 1) : digits(2, base);
      if (n == skip) error("invalid integer literal");
    }
    std::string text(rest.substr(skip, n - skip));
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    Value v;
    if (is_float) {
      v = Value(std::strtod(text.c_str(), nullptr));
    } else {
      int64_t i = 0;
      auto r = std::from_chars(text.data(), text.data() + text.size(), i, base);
      if (r.ec != std::errc()) error("integer literal " + text + " out of range");
      v = Value(i);
    }
    emit(Tok::number, text, line_, v);
    advance_to(pos_ + n);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// Syntax tree and parser
// ---------------------------------------------------------------------------------------------

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    literal,
    name,
    list,
    tuple,
    dict,
    attr,
    item,
    slice,
    call,
    filter,
    test,
    neg,
    pos,
    not_,
    and_,
    or_,
    binary,
    compare,
    cond
  };
  K k;
  int line;
  Value value;                                       // literal
  std::string name;                                  // name, attribute, filter, test, operator
  std::vector<ExprP> a;                              // operands (nullptr: a slice bound left out)
  std::vector<std::pair<std::string, ExprP>> named;  // keyword arguments
  std::vector<std::string> ops;                      // compare's operators
  bool negated = false;                              // `is not`
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class K {
    text,
    print,
    if_,
    for_,
    set,
    set_block,
    macro,
    call_block,
    break_,
    continue_,
    generation
  };
  K k;
  int line;
  std::string text;                              // text; macro name; assigned attribute
  ExprP expr;                                    // printed, iterated, assigned or called
  ExprP filter;                                  // for ... if filter
  std::vector<std::string> targets;              // names assigned
  std::vector<std::pair<ExprP, Body>> branches;  // if/elif (cond) and else (nullptr)
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters and defaults
};

const char* const kFilters[] = {
    "abs",     "capitalize", "count",  "d",      "default",    "dictsort", "e",          "escape",
    "first",   "float",      "indent", "int",    "items",      "join",     "last",       "length",
    "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr", "replace",
    "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",     "sum",
    "title",   "tojson",     "trim",   "unique", "upper",      "wordcount"};
const char* const kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
    "<",       "<=",       ">",        ">="};

template <size_t N>
bool known(const char* const (&names)[N], const std::string& name) {
  return std::find_if(names, names + N, [&](const char* n) { return name == n; }) != names + N;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse() {
    Body body = body_until({});
    return body;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    throw Failure{"line " + std::to_string(cur().line) + ": " + what};
  }
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::name && cur().text == n; }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Tok::eof:
        return "end of template";
      case Tok::block_end:
        return "end of statement block";
      case Tok::var_end:
        return "end of print statement";
      case Tok::text:
        return "template text";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "', got " + describe(cur()));
    ++i_;
  }
  std::string expect_name() {
    if (cur().kind != Tok::name) error("expected a name, got " + describe(cur()));
    return t_[i_++].text;
  }
  void expect(Tok kind, const char* what) {
    if (cur().kind != kind) error(std::string("expected ") + what + ", got " + describe(cur()));
    ++i_;
  }

  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.error("template nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~Depth() { --p.depth_; }
  };

  ExprP make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  // Statements until `{% END` for END in `ends`; leaves the parser just past END's name.
  Body body_until(std::initializer_list<const char*> ends) {
    Depth depth(*this);
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.kind == Tok::eof) {
        if (ends.size())
          error(std::string("unexpected end of template, expected '") + *(ends.end() - 1) + "'");
        return body;
      }
      if (t.kind == Tok::text) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::text;
        n->line = t.line;
        n->text = t.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.kind == Tok::var_begin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::print;
        n->line = t.line;
        n->expr = tuple_expr(true);
        expect(Tok::var_end, "end of print statement");
        body.push_back(std::move(n));
      } else if (t.kind == Tok::block_begin) {
        const Token& name = peek();
        if (name.kind == Tok::name)
          for (const char* end : ends)
            if (name.text == end) {
              i_ += 2;
              return body;
            }
        ++i_;
        body.push_back(statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Node> statement() {
    auto n = std::make_unique<Node>();
    n->line = cur().line;
    const std::string word = expect_name();
    if (word == "if") {
      n->k = Node::K::if_;
      ++conditional_;
      ExprP cond = tuple_expr(false);  // jinja2: no `x if y else z` here
      for (;;) {
        expect(Tok::block_end, "end of statement block");
        Body b = body_until({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        const std::string end = t_[i_ - 1].text;
        if (end == "endif") break;
        if (end == "else") {
          expect(Tok::block_end, "end of statement block");
          n->branches.emplace_back(nullptr, body_until({"endif"}));
          break;
        }
        cond = tuple_expr(false);
      }
      --conditional_;
    } else if (word == "for") {
      n->k = Node::K::for_;
      n->targets = targets();
      if (!is_name("in")) error("expected 'in', got " + describe(cur()));
      ++i_;
      n->expr = tuple_expr(false);
      if (is_name("if")) {
        ++i_;
        n->filter = expr();
      }
      if (is_name("recursive")) error("recursive loops are not supported");
      expect(Tok::block_end, "end of statement block");
      ++loops_;
      n->body = body_until({"else", "endfor"});
      --loops_;
      if (t_[i_ - 1].text == "else") {
        expect(Tok::block_end, "end of statement block");
        n->else_body = body_until({"endfor"});
      }
    } else if (word == "set") {
      n->k = Node::K::set;
      n->targets = targets();
      if (n->targets.size() == 1 && is_op(".")) {
        ++i_;
        n->text = expect_name();
      }
      if (is_op("=")) {
        ++i_;
        n->expr = tuple_expr(true);
      } else {
        if (n->targets.size() != 1 || !n->text.empty()) error("expected '='");
        n->k = Node::K::set_block;
        expect(Tok::block_end, "end of statement block");
        n->body = body_until({"endset"});
      }
    } else if (word == "macro") {
      n->k = Node::K::macro;
      n->text = expect_name();
      n->params = parameters();
      expect(Tok::block_end, "end of statement block");
      const int loops = std::exchange(loops_, 0);
      n->body = body_until({"endmacro"});
      loops_ = loops;
    } else if (word == "call") {
      n->k = Node::K::call_block;
      if (is_op("(")) n->params = parameters();
      n->expr = expr();
      if (n->expr->k != Expr::K::call) error("expected a call after 'call'");
      expect(Tok::block_end, "end of statement block");
      n->body = body_until({"endcall"});
    } else if (word == "break" || word == "continue") {
      if (!loops_) error("'" + word + "' outside of a loop");
      n->k = word == "break" ? Node::K::break_ : Node::K::continue_;
    } else if (word == "generation") {
      n->k = Node::K::generation;
      expect(Tok::block_end, "end of statement block");
      n->body = body_until({"endgeneration"});
    } else {
      error("unknown tag '" + word + "'");
    }
    expect(Tok::block_end, "end of statement block");
    return n;
  }

  std::vector<std::string> targets() {
    std::vector<std::string> names;
    const bool parens = is_op("(");
    if (parens) ++i_;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      names.push_back(expect_name());
    }
    if (parens) expect_op(")");
    return names;
  }

  std::vector<std::pair<std::string, ExprP>> parameters() {
    std::vector<std::pair<std::string, ExprP>> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      std::string name = expect_name();
      ExprP def;
      if (is_op("=")) {
        ++i_;
        def = expr();
      }
      params.emplace_back(std::move(name), std::move(def));
    }
    ++i_;
    return params;
  }

  // A comma-separated list becomes a tuple (jinja2's parse_tuple).
  ExprP tuple_expr(bool with_condexpr) {
    const int line = cur().line;
    ExprP first = with_condexpr ? expr() : logical(true);
    if (!is_op(",")) return first;
    auto t = make(Expr::K::tuple, line);
    t->a.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().kind == Tok::block_end || cur().kind == Tok::var_end || is_op(")")) break;
      t->a.push_back(with_condexpr ? expr() : logical(true));
    }
    return t;
  }

  ExprP expr() {
    Depth depth(*this);
    ExprP e = logical(true);
    while (is_name("if")) {
      auto c = make(Expr::K::cond, cur().line);
      ++i_;
      ++conditional_;
      c->a.push_back(std::move(e));
      c->a.push_back(logical(true));
      c->a.push_back(nullptr);
      if (is_name("else")) {
        ++i_;
        c->a[2] = expr();
      }
      --conditional_;
      e = std::move(c);
    }
    return e;
  }

  // `or` over `and` over `not` expressions; the value is an operand's, as in Python.
  ExprP logical(bool is_or) {
    ExprP e = is_or ? logical(false) : not_expr();
    while (is_name(is_or ? "or" : "and")) {
      auto o = make(is_or ? Expr::K::or_ : Expr::K::and_, cur().line);
      ++i_;
      o->a.push_back(std::move(e));
      o->a.push_back(is_or ? logical(false) : not_expr());
      e = std::move(o);
    }
    return e;
  }

  ExprP not_expr() {
    if (is_name("not")) {
      Depth depth(*this);
      auto n = make(Expr::K::not_, cur().line);
      ++i_;
      n->a.push_back(not_expr());
      return n;
    }
    return compare_expr();
  }

  ExprP compare_expr() {
    const int line = cur().line;
    ExprP first = math(0);
    ExprP c;
    for (;;) {
      std::string op;
      if (cur().kind == Tok::op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().kind == Tok::name && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::K::compare, line);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(math(0));
    }
    return c ? std::move(c) : std::move(first);
  }

  // Left-associative operators from loosest to tightest, as jinja2 nests them: level 0 is + and -,
  // 1 is ~, 2 is * / // %, 3 is ** (over unary expressions).
  ExprP math(int level) {
    static const std::vector<std::string> ops[] = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    auto operand = [&] { return level == 3 ? unary(true) : math(level + 1); };
    ExprP e = operand();
    while (cur().kind == Tok::op &&
           std::find(ops[level].begin(), ops[level].end(), cur().text) != ops[level].end()) {
      auto b = make(Expr::K::binary, cur().line);
      b->name = t_[i_++].text;
      b->a.push_back(std::move(e));
      b->a.push_back(operand());
      e = std::move(b);
    }
    return e;
  }

  ExprP unary(bool with_filter) {
    Depth depth(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::K::neg : Expr::K::pos, cur().line);
      ++i_;
      e->a.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprP primary() {
    const Token& t = cur();
    if (t.kind == Tok::name) {
      ++i_;
      auto e = make(Expr::K::literal, t.line);
      if (t.text == "true" || t.text == "True")
        e->value = Value(true);
      else if (t.text == "false" || t.text == "False")
        e->value = Value(false);
      else if (t.text == "none" || t.text == "None")
        e->value = Value(None{});
      else
        e->k = Expr::K::name, e->name = t.text;
      return e;
    }
    if (t.kind == Tok::string) {
      auto e = make(Expr::K::literal, t.line);
      std::string s;
      while (cur().kind == Tok::string) s += t_[i_++].text;  // adjacent literals concatenate
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == Tok::number) {
      ++i_;
      auto e = make(Expr::K::literal, t.line);
      e->value = t.number;
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        return make(Expr::K::tuple, t.line);
      }
      ExprP e = tuple_expr(true);
      expect_op(")");
      return e;
    }
    if (is_op("[") || is_op("{")) {
      const bool dict = is_op("{");
      const char* close = dict ? "}" : "]";
      ++i_;
      auto e = make(dict ? Expr::K::dict : Expr::K::list, t.line);
      while (!is_op(close)) {
        if (!e->a.empty()) {
          expect_op(",");
          if (is_op(close)) break;
        }
        e->a.push_back(expr());
        if (dict) {
          expect_op(":");
          e->a.push_back(expr());
        }
      }
      ++i_;
      return e;
    }
    error("unexpected " + describe(t));
  }

  ExprP postfix(ExprP e) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++i_;
        auto a = make(Expr::K::attr, line);
        if (cur().kind == Tok::number && cur().number.is_int()) {
          a->k = Expr::K::item;
          a->a.push_back(std::move(e));
          auto index = make(Expr::K::literal, line);
          index->value = t_[i_++].number;
          a->a.push_back(std::move(index));
        } else {
          a->name = expect_name();
          a->a.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++i_;
        e = subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = call(std::move(e), Expr::K::call, "");
      } else {
        return e;
      }
    }
  }

  ExprP subscript(ExprP obj, int line) {
    ExprP bounds[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) bounds[k] = expr();
      if (k < 2 && is_op(":")) {
        slice = true;
        ++i_;
      } else {
        break;
      }
    }
    expect_op("]");
    auto e = make(slice ? Expr::K::slice : Expr::K::item, line);
    e->a.push_back(std::move(obj));
    if (!slice && !bounds[0]) error("expected an index");
    e->a.push_back(std::move(bounds[0]));
    if (slice) e->a.push_back(std::move(bounds[1])), e->a.push_back(std::move(bounds[2]));
    return e;
  }

  // Call arguments `(a, b, name=c)`; the callee or filtered value is a[0].
  ExprP call(ExprP first, Expr::K k, std::string name) {
    auto c = make(k, cur().line);
    c->name = std::move(name);
    if (first) c->a.push_back(std::move(first));
    if (!is_op("(")) return c;
    ++i_;
    bool any = false;
    while (!is_op(")")) {
      if (any) {
        expect_op(",");
        if (is_op(")")) break;
      }
      any = true;
      if (cur().kind == Tok::name && peek().kind == Tok::op && peek().text == "=") {
        std::string key = t_[i_].text;
        i_ += 2;
        c->named.emplace_back(std::move(key), expr());
      } else {
        if (!c->named.empty()) error("positional argument after a keyword argument");
        c->a.push_back(expr());
      }
    }
    ++i_;
    return c;
  }

  ExprP filters(ExprP e) {
    for (;;) {
      if (is_op("|")) {
        ++i_;
        const std::string name = expect_name();
        if (!conditional_ && !known(kFilters, name)) error("no filter named '" + name + "'");
        e = call(std::move(e), Expr::K::filter, name);
      } else if (is_name("is")) {
        ++i_;
        bool negated = false;
        if (is_name("not")) negated = true, ++i_;
        const Token& t = cur();
        std::string name;
        if (t.kind == Tok::name)
          name = expect_name();
        else if (t.kind == Tok::op && known(kTests, t.text))
          name = t_[i_++].text;
        else
          error("expected a test name, got " + describe(t));
        if (!conditional_ && !known(kTests, name)) error("no test named '" + name + "'");
        ExprP test;
        if (is_op("(")) {
          test = call(std::move(e), Expr::K::test, name);
        } else {
          test = make(Expr::K::test, t.line);
          test->name = name;
          test->a.push_back(std::move(e));
          const Token& n = cur();
          const bool arg = n.kind == Tok::string || n.kind == Tok::number || is_op("(") ||
                           is_op("[") || is_op("{") ||
                           (n.kind == Tok::name && n.text != "else" && n.text != "or" &&
                            n.text != "and" && n.text != "is");
          if (arg) test->a.push_back(postfix(primary()));
        }
        test->negated = negated;
        e = std::move(test);
      } else if (is_op("(")) {
        e = call(std::move(e), Expr::K::call, "");
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0, conditional_ = 0, loops_ = 0;
};

}  // namespace

struct Template::Parsed {
  Body body;
};

namespace {

// ---------------------------------------------------------------------------------------------
// Renderer
// ---------------------------------------------------------------------------------------------

// Named or positional argument `index` of a call, or `def`.
Value arg(Args& args, size_t index, const char* name, Value def = Value()) {
  for (auto& [k, v] : args.named)
    if (k == name) return v;
  return index < args.positional.size() ? args.positional[index] : def;
}

std::string need_string(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_string()) fail(std::string(what) + " expects a string, got " + v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_int() && !v.is_bool())
    fail(std::string(what) + " expects an integer, got " + v.type_name());
  return to_int(v);
}

Value slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
  require_defined(v);
  const bool is_str = v.is_string();
  std::vector<std::string_view> chars;
  if (is_str)
    chars = code_points(v.as_string());
  else if (!v.is_list())
    fail("'" + v.type_name() + "' object is not subscriptable");
  const int64_t n = is_str ? int64_t(chars.size()) : int64_t(v.as_list().items.size());
  const int64_t st = step.is_none() || step.is_undefined() ? 1 : need_int(step, "a slice");
  if (st == 0) fail("slice step cannot be zero");
  auto bound = [&](const Value& b, int64_t def) {
    if (b.is_none()) return def;
    int64_t i = need_int(b, "a slice");
    if (i < 0) i += n;
    return st > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : n - 1), e = bound(stop, st > 0 ? n : -1);
  std::string s;
  std::vector<Value> items;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (is_str)
      s += chars[size_t(i)];
    else
      items.push_back(v.as_list().items[size_t(i)]);
  }
  if (is_str) return Value(std::move(s));
  return make_list(std::move(items), v.as_list().tuple);
}

Value bound_method(const Value& self, const std::string& name);

// jinja2's getattr: a method or attribute first, then an item.
Value get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  Value m = bound_method(obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_dict())
    if (const Value* v = obj.as_dict().find(name)) return *v;
  const std::string what = obj.is_none() ? "'None'" : "'" + obj.type_name() + " object'";
  return Undefined{what + " has no attribute '" + name + "'"};
}

// jinja2's getitem: an item first, then an attribute.
Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = length(obj);
    int64_t i = to_int(key);
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return obj.as_list().items[size_t(i)];
      return Value(std::string(code_points(obj.as_string())[size_t(i)]));
    }
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Undefined{"'" + obj.type_name() + " object' has no attribute " + key.repr()};
}

std::vector<std::string> split(const std::string& s, const Value& sep, int64_t max) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    auto cps = code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_space(first_code_point(cps[i]))) ++i;
      if (i == cps.size()) break;
      if (max >= 0 && int64_t(out.size()) == max) {
        std::string rest;
        for (size_t k = i; k < cps.size(); ++k) rest += cps[k];
        out.push_back(strip(rest, Value(None{}), false, true));
        break;
      }
      std::string word;
      while (i < cps.size() && !is_space(first_code_point(cps[i]))) word += cps[i++];
      out.push_back(word);
    }
    return out;
  }
  const std::string d = need_string(sep, "split");
  if (d.empty()) fail("empty separator");
  size_t p = 0;
  for (size_t q; (max < 0 || int64_t(out.size()) < max) && (q = s.find(d, p)) != std::string::npos;
       p = q + d.size())
    out.push_back(s.substr(p, q - p));
  out.push_back(s.substr(p));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    auto cps = code_points(s);
    int64_t done = 0;
    for (std::string_view c : cps) {
      if (count < 0 || done++ < count) out += with;
      out += c;
      limit(out);
    }
    if (count < 0 || done < count) out += with;
    return checked(out);
  }
  size_t p = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t q = s.find(old, p);
    if (q == std::string::npos) break;
    out.append(s, p, q - p);
    out += with;
    p = q + old.size();
    limit(out);
  }
  out.append(s, p);
  return checked(out);
}

Value callable(std::string name, std::function<Value(Args&)> f) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(f)}));
}

bool affix(const std::string& s, const Value& which, bool prefix) {
  auto one = [&](const Value& p) {
    const std::string a = need_string(p, prefix ? "startswith" : "endswith");
    return s.size() >= a.size() && (prefix ? s.compare(0, a.size(), a) == 0
                                           : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (which.is_list() && which.as_list().tuple) {
    for (const Value& p : which.as_list().items)
      if (one(p)) return true;
    return false;
  }
  return one(which);
}

// The methods of str and dict that templates call; Undefined for any other name.
Value bound_method(const Value& self, const std::string& name) {
  if (self.is_string()) {
    const std::string s = self.as_string();
    static const char* names[] = {
        "strip", "lstrip",     "rstrip",  "split", "startswith", "endswith", "upper",   "lower",
        "title", "capitalize", "replace", "find",  "count",      "join",     "isdigit", "isspace"};
    if (std::find_if(std::begin(names), std::end(names),
                     [&](const char* n) { return name == n; }) == std::end(names))
      return Value();
    return callable("str." + name, [s, name](Args& a) -> Value {
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return strip(s, arg(a, 0, "chars", None{}), name != "rstrip", name != "lstrip");
      if (name == "split") {
        std::vector<Value> parts;
        for (auto& p :
             split(s, arg(a, 0, "sep", None{}), need_int(arg(a, 1, "maxsplit", -1), "split")))
          parts.emplace_back(std::move(p));
        return make_list(std::move(parts));
      }
      if (name == "startswith" || name == "endswith")
        return affix(s, arg(a, 0, "prefix"), name == "startswith");
      if (name == "upper") return upper(s);
      if (name == "lower") return lower(s);
      if (name == "title") return title_case(s);
      if (name == "capitalize") return capitalize(s);
      if (name == "replace")
        return replace(s, need_string(arg(a, 0, "old"), "replace"),
                       need_string(arg(a, 1, "new"), "replace"),
                       need_int(arg(a, 2, "count", -1), "replace"));
      if (name == "find" || name == "count") {
        const std::string sub = need_string(arg(a, 0, "sub"), name.c_str());
        if (name == "find") {
          const size_t p = s.find(sub);
          return p == std::string::npos ? int64_t(-1) : int64_t(code_points(s.substr(0, p)).size());
        }
        if (sub.empty()) return int64_t(code_points(s).size() + 1);
        int64_t n = 0;
        for (size_t p = 0; (p = s.find(sub, p)) != std::string::npos; p += sub.size()) ++n;
        return n;
      }
      if (name == "isdigit" || name == "isspace") {
        auto cps = code_points(s);
        return !cps.empty() && std::all_of(cps.begin(), cps.end(), [&](std::string_view c) {
          return name == "isspace"
                     ? is_space(first_code_point(c))
                     : (c.size() == 1 && std::isdigit(static_cast<unsigned char>(c[0])));
        });
      }
      std::string out;
      bool first = true;
      for (const Value& x : iterate(arg(a, 0, "iterable"))) {
        if (!first) out += s;
        first = false;
        out += need_string(x, "str.join");
        limit(out);
      }
      return checked(out);
    });
  }
  if (self.is_dict() && !self.as_dict().is_namespace &&
      (name == "items" || name == "keys" || name == "values" || name == "get")) {
    return callable("dict." + name, [self, name](Args& a) -> Value {
      const Object& d = self.as_dict();
      if (name == "get") {
        const Value key = arg(a, 0, "key");
        const Value* v = key.is_string() ? d.find(key.as_string()) : nullptr;
        return v ? *v : arg(a, 1, "default", None{});
      }
      std::vector<Value> out;
      for (const auto& [k, v] : d.items) {
        if (name == "items")
          out.push_back(make_list({Value(k), v}, true));
        else
          out.push_back(name == "keys" ? Value(k) : v);
      }
      return make_list(std::move(out));
    });
  }
  return Value();
}

// A namespace may hold anything but a namespace or a function: a namespace is the only value a
// template can change after putting it in a container, and a function (a macro, caller) keeps the
// scopes it was made in. Without these inside a namespace, no container can grow deeper behind the
// depth recorded when it was built, nor become a cycle of shared pointers that is never freed.
void assign_attribute(Object& ns, const std::string& name, const Value& v) {
  if (v.is_callable() ||
      (v.is_dict() && (v.as_dict().is_namespace || v.as_dict().holds_reference)) ||
      (v.is_list() && v.as_list().holds_reference))
    fail("a namespace cannot hold a namespace or a function");
  ns.set(name, v);
  check_depth(ns.depth);
}

// The parameters of each filter and test after the value, the first `required` of them mandatory,
// as jinja2 declares them (map, select, reject and their attr forms pass arguments on instead).
struct Signature {
  std::vector<std::string> params;
  size_t required = 0;
};

const Signature* signature(const std::string& name, bool is_test) {
  using S = std::vector<std::pair<std::vector<std::string>, Signature>>;
  static const S filters = {{{"default", "d"}, {{"default_value", "boolean"}}},
                            {{"dictsort"}, {{"case_sensitive", "by", "reverse"}}},
                            {{"float"}, {{"default"}}},
                            {{"indent"}, {{"width", "first", "blank"}}},
                            {{"int"}, {{"default", "base"}}},
                            {{"join"}, {{"d", "attribute"}}},
                            {{"max", "min", "unique"}, {{"case_sensitive", "attribute"}}},
                            {{"replace"}, {{"old", "new", "count"}, 2}},
                            {{"round"}, {{"precision", "method"}}},
                            {{"sort"}, {{"reverse", "case_sensitive", "attribute"}}},
                            {{"sum"}, {{"attribute", "start"}}},
                            {{"tojson"}, {{"ensure_ascii", "indent", "separators", "sort_keys"}}},
                            {{"trim"}, {{"chars"}}},
                            {{"map", "select", "reject", "selectattr", "rejectattr"}, {{"*"}}}};
  static const S tests = {{{"divisibleby"}, {{"num"}, 1}},
                          {{"eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le",
                            "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas"},
                           {{"other"}, 1}},
                          {{"in"}, {{"seq"}, 1}}};
  static const Signature none;
  for (const auto& [names, sig] : is_test ? tests : filters)
    if (std::find(names.begin(), names.end(), name) != names.end())
      return sig.params[0] == "*" ? nullptr : &sig;
  return &none;
}

// Python's checks of a call against `sig`: too many arguments, unknown or repeated keywords, a
// required one missing.
void check_arguments(const std::string& what, const Signature& sig, const Args& a) {
  if (a.positional.size() > sig.params.size())
    fail(what + " takes at most " + std::to_string(sig.params.size()) + " argument(s), got " +
         std::to_string(a.positional.size()));
  for (const auto& kv : a.named) {
    const auto it = std::find(sig.params.begin(), sig.params.end(), kv.first);
    if (it == sig.params.end())
      fail(what + " got an unexpected keyword argument '" + kv.first + "'");
    if (size_t(it - sig.params.begin()) < a.positional.size())
      fail(what + " got multiple values for argument '" + kv.first + "'");
  }
  for (size_t i = a.positional.size(); i < sig.required; ++i)
    if (std::none_of(a.named.begin(), a.named.end(),
                     [&](const auto& kv) { return kv.first == sig.params[i]; }))
      fail(what + " missing required argument '" + sig.params[i] + "'");
}

// Sets `slot` to `value` for a scope and puts the old value back however the scope ends.
template <class T>
struct Scoped {
  T& slot;
  T saved;
  Scoped(T& s, T value) : slot(s), saved(std::exchange(s, std::move(value))) {}
  ~Scoped() { slot = std::move(saved); }
};

class Renderer {
 public:
  Renderer(const std::string& origin, std::string& out) : origin_(origin), out_(&out) {}

  void run(const Body& body, const std::vector<std::pair<std::string, Value>>& variables) {
    frames_.emplace_back();
    auto& g = frames_.back();
    g["range"] = callable("range", [](Args& a) -> Value {
      int64_t start = 0, stop, step = 1;
      if (a.positional.size() == 1) {
        stop = need_int(a.positional[0], "range");
      } else if (a.positional.size() == 2 || a.positional.size() == 3) {
        start = need_int(a.positional[0], "range");
        stop = need_int(a.positional[1], "range");
        if (a.positional.size() == 3) step = need_int(a.positional[2], "range");
      } else {
        fail("range expected 1 to 3 arguments");
      }
      if (step == 0) fail("range() arg 3 must not be zero");
      const double n = std::ceil((double(stop) - double(start)) / double(step));
      // jinja2's sandbox refuses ranges of more than 100000 items the same way.
      if (n > 100000) fail("range too big, maximum size for range is 100000");
      std::vector<Value> out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
      return make_list(std::move(out));
    });
    g["dict"] = callable("dict", [](Args& a) -> Value {
      if (!a.positional.empty()) fail("dict() with positional arguments is not supported");
      Value d = Value::dict(a.named);
      check_depth(d.as_dict().depth);
      return d;
    });
    g["namespace"] = callable("namespace", [](Args& a) -> Value {
      auto o = std::make_shared<Object>();
      o->is_namespace = true;
      for (const Value& p : a.positional) {
        if (!p.is_dict()) fail("namespace() takes a dict or keyword arguments");
        for (const auto& kv : p.as_dict().items) assign_attribute(*o, kv.first, kv.second);
      }
      for (auto& kv : a.named) assign_attribute(*o, kv.first, kv.second);
      return Value(o);
    });
    g["raise_exception"] = callable("raise_exception", [](Args& a) -> Value {
      fail("raise_exception: " + arg(a, 0, "message").str());
    });
    g["strftime_now"] = callable("strftime_now", [](Args& a) -> Value {
      const std::string format = need_string(arg(a, 0, "format"), "strftime_now");
      if (format.size() > 256) fail("strftime_now: format longer than 256 bytes");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[4096];
      const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &tm);
      return std::string(buf, n);
    });
    for (const auto& [k, v] : variables) g[k] = v;
    int64_t steps = kMaxSteps;
    Scoped<int64_t*> budget(steps_left, &steps);
    exec(body);
  }

 private:
  enum class Flow { normal, break_, continue_ };
  using Frame = std::unordered_map<std::string, Value>;

  // A new innermost scope for the lifetime of this object.
  struct Push {
    std::vector<Frame>& frames;
    explicit Push(std::vector<Frame>& f) : frames(f) { frames.emplace_back(); }
    ~Push() { frames.pop_back(); }
  };

  Error error(int line, const std::string& message) const {
    return Error(ExitCode::data,
                 printable(origin_ + ": line " + std::to_string(line) + ": " + message));
  }

  void write(std::string_view s) {
    if (out_->size() + s.size() > kMaxOutputBytes)
      fail("output longer than " + std::to_string(kMaxOutputBytes) +
           " bytes (the bound on a template's output)");
    out_->append(s);
  }

  Value lookup(const std::string& name) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
      auto it = f->find(name);
      if (it != f->end()) return it->second;
    }
    return Undefined{"'" + name + "' is undefined"};
  }

  void assign(const std::vector<std::string>& names, const Value& v) {
    if (names.size() == 1) return void(frames_.back()[names[0]] = v);
    require_defined(v);
    std::vector<Value> items = iterate(v);
    if (items.size() != names.size())
      fail(std::string(items.size() < names.size() ? "not enough" : "too many") +
           " values to unpack (expected " + std::to_string(names.size()) + ", got " +
           std::to_string(items.size()) + ")");
    for (size_t i = 0; i < names.size(); ++i) frames_.back()[names[i]] = items[i];
  }

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      Flow f;
      try {
        f = exec(*n);
      } catch (const Failure& e) {
        throw error(n->line, e.message);
      }
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  std::string capture(const Body& body) {
    std::string buffer;
    {
      Scoped<std::string*> redirect(out_, &buffer);
      exec(body);
    }
    return buffer;
  }

  Flow exec(const Node& n) {
    switch (n.k) {
      case Node::K::text:
        write(n.text);
        break;
      case Node::K::print:
        write(eval(*n.expr).str());
        break;
      case Node::K::if_:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return exec(body);
        break;
      case Node::K::for_:
        return exec_for(n);
      case Node::K::set: {
        Value v = eval(*n.expr);
        if (n.text.empty()) {
          assign(n.targets, v);
        } else {
          Value ns = lookup(n.targets[0]);
          if (!ns.is_dict() || !ns.as_dict().is_namespace)
            fail("cannot assign attribute on non-namespace object");
          assign_attribute(ns.as_dict(), n.text, v);
        }
        break;
      }
      case Node::K::set_block:
        frames_.back()[n.targets[0]] = capture(n.body);
        break;
      case Node::K::macro:
        frames_.back()[n.text] = macro(n, n.text, std::nullopt);
        break;
      case Node::K::call_block: {
        const Value caller = macro(n, "caller", frames_);
        const Expr& c = *n.expr;
        Value f = callee(*c.a[0]);
        Args args = arguments(c);
        args.named.emplace_back("caller", caller);
        write(invoke(f, args).str());
        break;
      }
      case Node::K::break_:
        return Flow::break_;
      case Node::K::continue_:
        return Flow::continue_;
      case Node::K::generation:
        return exec(n.body);
    }
    return Flow::normal;
  }

  Flow exec_for(const Node& n) {
    const Value iterable = eval(*n.expr);
    std::vector<Value> items = iterate(iterable);
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        Push scope(frames_);
        assign(n.targets, item);
        if (eval(*n.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t count = int64_t(items.size());
    for (int64_t i = 0; i < count; ++i) {
      if (++iterations_ > kMaxLoopIterations)
        fail("more than " + std::to_string(kMaxLoopIterations) +
             " loop iterations (the bound on a template's loops)");
      charge(1);
      // Each iteration has its own scope, as in jinja2: what the body sets does not outlive it.
      Push scope(frames_);
      assign(n.targets, items[size_t(i)]);
      Value loop =
          Value::dict({{"index", i + 1},
                       {"index0", i},
                       {"revindex", count - i},
                       {"revindex0", count - i - 1},
                       {"first", i == 0},
                       {"last", i == count - 1},
                       {"length", count},
                       {"depth", 1},
                       {"depth0", 0},
                       {"previtem", i > 0 ? items[size_t(i - 1)]
                                          : Value(Undefined{"there is no previous item"})},
                       {"nextitem", i + 1 < count ? items[size_t(i + 1)]
                                                  : Value(Undefined{"there is no next item"})},
                       {"cycle", callable("loop.cycle", [i](Args& a) -> Value {
                          if (a.positional.empty()) fail("no items for cycling given");
                          return a.positional[size_t(i) % a.positional.size()];
                        })}});
      frames_.back()["loop"] = loop;
      const Flow f = exec(n.body);
      if (f == Flow::break_) break;
    }
    if (count == 0) return exec(n.else_body);
    return Flow::normal;
  }

  // A macro (or a call block's caller): renders its body with its parameters bound, over the
  // template's top-level names (a macro) or over the scopes where the call block stands (`scope`).
  Value macro(const Node& n, const std::string& name, std::optional<std::vector<Frame>> scope) {
    const Node* node = &n;
    return callable(name, [this, node, name, scope](Args& a) -> Value {
      if (a.positional.size() > node->params.size())
        fail("macro '" + name + "' takes not more than " + std::to_string(node->params.size()) +
             " argument(s)");
      for (const auto& kv : a.named)
        if (kv.first != "caller" &&
            std::none_of(node->params.begin(), node->params.end(),
                         [&](const auto& p) { return p.first == kv.first; }))
          fail("macro '" + name + "' takes no keyword argument '" + kv.first + "'");
      Scoped<int> depth(depth_, depth_ + 1);
      if (depth_ > kMaxNesting)
        fail("macros nested deeper than " + std::to_string(kMaxNesting) + " calls");
      Scoped<std::vector<Frame>> frames(frames_, scope ? *scope : std::vector<Frame>{frames_[0]});
      frames_.emplace_back();
      for (size_t i = 0; i < node->params.size(); ++i) {
        const auto& [param, def] = node->params[i];
        bool given = i < a.positional.size();
        Value v = given ? a.positional[i] : Value();
        for (auto& [k, x] : a.named)
          if (k == param) v = x, given = true;
        if (!given)
          v = def ? eval(*def) : Value(Undefined{"parameter '" + param + "' was not provided"});
        frames_.back()[param] = v;
      }
      for (auto& [k, x] : a.named)
        if (k == "caller") frames_.back()["caller"] = x;
      return capture(node->body);
    });
  }

  Value callee(const Expr& e) {
    Value f = eval(e);
    require_defined(f);
    if (!f.is_callable()) fail("'" + f.type_name() + "' object is not callable");
    return f;
  }

  Args arguments(const Expr& e, size_t first = 1) {
    Args args;
    for (size_t i = first; i < e.a.size(); ++i) args.positional.push_back(eval(*e.a[i]));
    for (const auto& [k, x] : e.named) args.named.emplace_back(k, eval(*x));
    return args;
  }

  Value invoke(const Value& f, Args& args) {
    Callable& c = f.as_callable();
    return c.call(args);
  }

 public:
  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const Failure& f) {
      throw error(e.line, f.message);
    }
  }

 private:
  Value eval_inner(const Expr& e) {
    switch (e.k) {
      case Expr::K::literal:
        return e.value;
      case Expr::K::name:
        return lookup(e.name);
      case Expr::K::list:
      case Expr::K::tuple: {
        std::vector<Value> items;
        for (const auto& x : e.a) items.push_back(eval(*x));
        return make_list(std::move(items), e.k == Expr::K::tuple);
      }
      case Expr::K::dict: {
        auto o = std::make_shared<Object>();
        for (size_t i = 0; i < e.a.size(); i += 2) {
          Value k = eval(*e.a[i]);
          if (!k.is_string()) fail("dict keys other than strings are not supported");
          o->set(k.as_string(), eval(*e.a[i + 1]));
        }
        check_depth(o->depth);
        return Value(o);
      }
      case Expr::K::attr:
        return get_attr(eval(*e.a[0]), e.name);
      case Expr::K::item:
        return get_item(eval(*e.a[0]), eval(*e.a[1]));
      case Expr::K::slice: {
        Value v = eval(*e.a[0]);
        auto opt = [&](size_t i) { return e.a[i] ? eval(*e.a[i]) : Value(None{}); };
        return slice(v, opt(1), opt(2), opt(3));
      }
      case Expr::K::call: {
        Value f = callee(*e.a[0]);
        Args args = arguments(e);
        return invoke(f, args);
      }
      case Expr::K::filter: {
        Value v = eval(*e.a[0]);
        Args args = arguments(e);
        return filter(e.name, v, args);
      }
      case Expr::K::test: {
        Value v = eval(*e.a[0]);
        Args args = arguments(e);
        return test(e.name, v, args) != e.negated;
      }
      case Expr::K::neg:
      case Expr::K::pos: {
        Value v = eval(*e.a[0]);
        require_defined(v);
        if (!v.is_number())
          fail("bad operand type for unary " + std::string(e.k == Expr::K::neg ? "-" : "+") +
               ": '" + v.type_name() + "'");
        if (e.k == Expr::K::pos) return v.is_bool() ? Value(to_int(v)) : v;
        if (v.is_float()) return -v.as_float();
        if (to_int(v) == INT64_MIN) fail("integer overflow");
        return -to_int(v);
      }
      case Expr::K::not_:
        return !eval(*e.a[0]).truthy();
      case Expr::K::and_: {
        Value l = eval(*e.a[0]);
        return l.truthy() ? eval(*e.a[1]) : l;
      }
      case Expr::K::or_: {
        Value l = eval(*e.a[0]);
        return l.truthy() ? l : eval(*e.a[1]);
      }
      case Expr::K::cond:
        if (eval(*e.a[1]).truthy()) return eval(*e.a[0]);
        return e.a[2] ? eval(*e.a[2])
                      : Value(Undefined{"the inline if expression evaluated to false and no else "
                                        "section was defined"});
      case Expr::K::binary:
        return binary(e.name, eval(*e.a[0]), eval(*e.a[1]));
      case Expr::K::compare: {
        Value l = eval(*e.a[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.a[i + 1]);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = equal(l, r);
          else if (op == "!=")
            ok = !equal(l, r);
          else if (op == "in")
            ok = contains(r, l);
          else if (op == "not in")
            ok = !contains(r, l);
          else {
            const int c = compare(l, r, op.c_str());
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return false;
          l = std::move(r);
        }
        return true;
      }
    }
    return Value();
  }

  static Value binary(const std::string& op, const Value& l, const Value& r) {
    if (op == "~") return checked(l.str() + r.str());
    require_defined(l);
    require_defined(r);
    auto unsupported = [&]() -> Value {
      fail("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" +
           r.type_name() + "'");
    };
    if (l.is_number() && r.is_number()) {
      if (op == "/") {
        if (to_double(r) == 0) fail("division by zero");
        return to_double(l) / to_double(r);
      }
      if (l.is_float() || r.is_float() || (op == "**" && to_int(r) < 0)) {
        const double x = to_double(l), y = to_double(r);
        if ((op == "//" || op == "%") && y == 0) fail("float division by zero");
        if (op == "+") return x + y;
        if (op == "-") return x - y;
        if (op == "*") return x * y;
        if (op == "//") return std::floor(x / y);
        if (op == "%") {
          const double m = std::fmod(x, y);
          return m != 0 && ((m < 0) != (y < 0)) ? m + y : m;
        }
        return std::pow(x, y);
      }
      const int64_t x = to_int(l), y = to_int(r);
      int64_t z = 0;
      bool overflow = false;
      if (op == "+")
        overflow = __builtin_add_overflow(x, y, &z);
      else if (op == "-")
        overflow = __builtin_sub_overflow(x, y, &z);
      else if (op == "*")
        overflow = __builtin_mul_overflow(x, y, &z);
      else if (op == "//" || op == "%") {
        if (y == 0) fail("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) fail("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;
        z = op == "//" ? q : m;
      } else {
        z = 1;  // by squaring: 1 ** (2 ** 62) must not take 2 ** 62 steps
        int64_t base = x;
        for (int64_t e = y; e > 0 && !overflow; e >>= 1) {
          if (e & 1) overflow = __builtin_mul_overflow(z, base, &z);
          if (e > 1 && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
        }
      }
      if (overflow) fail("integer overflow (values beyond 64 bits are not supported)");
      return z;
    }
    if (op == "+" && l.is_string() && r.is_string()) return checked(l.as_string() + r.as_string());
    if (op == "+" && l.is_list() && r.is_list()) {
      if (l.as_list().tuple != r.as_list().tuple) return unsupported();
      std::vector<Value> items = l.as_list().items;
      if (items.size() + r.as_list().items.size() > kMaxItems) too_many();
      items.insert(items.end(), r.as_list().items.begin(), r.as_list().items.end());
      return make_list(std::move(items), l.as_list().tuple);
    }
    if (op == "*" && (l.is_string() || l.is_list() || r.is_string() || r.is_list())) {
      const Value& seq = l.is_string() || l.is_list() ? l : r;
      const Value& times = &seq == &l ? r : l;
      if (!times.is_int() && !times.is_bool()) return unsupported();
      const int64_t n = std::max<int64_t>(0, to_int(times));
      if (seq.is_string()) {
        if (n > 0 && seq.as_string().size() > kMaxOutputBytes / size_t(n)) too_long();
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return checked(out);
      }
      const auto& items = seq.as_list().items;
      if (n > 0 && items.size() > kMaxItems / size_t(n)) too_many();
      std::vector<Value> out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      return make_list(std::move(out), seq.as_list().tuple);
    }
    if (l.is_string() && op == "+")
      fail("can only concatenate str (not \"" + r.type_name() + "\") to str");
    return unsupported();
  }

  // The value of filter `name` over `v` with `args` (select and friends call test()).
  Value filter(const std::string& name, const Value& v, Args& a) {
    if (const Signature* sig = signature(name, false))
      check_arguments("filter '" + name + "'", *sig, a);
    if (name == "default" || name == "d") {
      const bool boolean = arg(a, 1, "boolean", false).truthy();
      return v.is_undefined() || (boolean && !v.truthy()) ? arg(a, 0, "default_value", "") : v;
    }
    if (name == "length" || name == "count") return length(v);
    if (name == "string") return v.str();
    if (name == "safe" || name == "e" || name == "escape") {
      if (name == "safe") return v;
      static const std::pair<char, const char*> entities[] = {
          {'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&#34;"}, {'\'', "&#39;"}};
      std::string out;
      for (char c : v.str()) {
        auto it = std::find_if(std::begin(entities), std::end(entities),
                               [c](const auto& e) { return e.first == c; });
        it == std::end(entities) ? void(out += c) : void(out += it->second);
      }
      return checked(out);
    }
    if (name == "tojson") {
      JsonStyle style;
      style.ensure_ascii = arg(a, 0, "ensure_ascii", false).truthy();
      const Value indent = arg(a, 1, "indent", None{});
      if (indent.is_int())
        style.indent = std::string(size_t(std::clamp<int64_t>(indent.as_int(), 0, 64)), ' ');
      else if (indent.is_string())
        style.indent = indent.as_string();
      else if (!indent.is_none())
        fail("tojson: indent must be an integer or a string");
      if (style.indent) style.item_sep = ",";
      const Value seps = arg(a, 2, "separators", None{});
      if (seps.is_list() && seps.as_list().items.size() == 2) {
        style.item_sep = need_string(seps.as_list().items[0], "tojson separators");
        style.key_sep = need_string(seps.as_list().items[1], "tojson separators");
      } else if (!seps.is_none()) {
        fail("tojson: separators must be a pair of strings");
      }
      style.sort_keys = arg(a, 3, "sort_keys", false).truthy();
      std::string out;
      to_json(v, style, 0, out);
      return checked(out);
    }
    if (name == "int") {
      if (v.is_int()) return v;
      if (v.is_bool()) return to_int(v);
      if (v.is_float()) {
        if (std::isnan(v.as_float())) return arg(a, 0, "default", 0);
        if (!(std::abs(v.as_float()) < 9e18))
          fail("integer overflow (values beyond 64 bits are not supported)");
        return int64_t(v.as_float());
      }
      if (v.is_string()) {
        const std::string s = strip(v.as_string(), None{}, true, true);
        int64_t i;
        auto r = std::from_chars(s.data(), s.data() + s.size(), i);
        if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return i;
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);  // strtod reads hex, Python's float not
        if (!s.empty() && s.find_first_of("xX") == s.npos && end == s.c_str() + s.size() &&
            std::isfinite(d) && std::abs(d) < 9e18)
          return int64_t(d);
      }
      return arg(a, 0, "default", 0);
    }
    if (name == "float") {
      if (v.is_number()) return to_double(v);
      if (v.is_string()) {
        const std::string s = strip(v.as_string(), None{}, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return d;
      }
      return arg(a, 0, "default", 0.0);
    }
    if (name == "abs") {
      require_defined(v);
      if (v.is_float()) return std::abs(v.as_float());
      if (v.is_number() && to_int(v) != INT64_MIN) return std::abs(to_int(v));
      fail("bad operand type for abs(): '" + v.type_name() + "'");
    }
    if (name == "round") {
      require_defined(v);
      if (!v.is_number()) fail("round expects a number, got " + v.type_name());
      const int64_t precision = need_int(arg(a, 0, "precision", 0), "round");
      const std::string method = arg(a, 1, "method", "common").str();
      if (v.is_int() || v.is_bool()) {
        if (method == "common") return to_int(v);
      }
      const double scale = std::pow(10.0, double(std::clamp<int64_t>(precision, -300, 300)));
      const double x = to_double(v) * scale;
      double r = method == "ceil"    ? std::ceil(x)
                 : method == "floor" ? std::floor(x)
                                     : std::nearbyint(x);
      if (method != "common" && method != "ceil" && method != "floor")
        fail("method must be common, ceil or floor");
      return r / scale;
    }
    if (name == "first" || name == "last") {
      std::vector<Value> items = iterate(v);
      if (items.empty()) return Undefined{std::string("No ") + name + " item, sequence was empty."};
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return make_list(iterate(v));
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.as_string());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return out;
      }
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return make_list(std::move(items));
    }
    if (name == "items") {
      if (v.is_undefined()) return make_list({});
      if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, x] : v.as_dict().items) out.push_back(make_list({Value(k), x}, true));
      return make_list(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) fail("dictsort expects a mapping");
      auto items = v.as_dict().items;
      const bool by_value = arg(a, 1, "by", "key").str() == "value";
      const bool cs = arg(a, 0, "case_sensitive", false).truthy();
      auto key = [&](const std::pair<std::string, Value>& kv) {
        Value k = by_value ? kv.second : Value(kv.first);
        return !cs && k.is_string() ? Value(lower(k.as_string())) : k;
      };
      std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
        return compare(key(x), key(y), "<") < 0;
      });
      if (arg(a, 2, "reverse", false).truthy()) std::reverse(items.begin(), items.end());
      std::vector<Value> out;
      for (auto& [k, x] : items) out.push_back(make_list({Value(k), x}, true));
      return make_list(std::move(out));
    }
    if (name == "join") {
      const std::string sep = arg(a, 0, "d", "").str();
      const Value attribute = arg(a, 1, "attribute", None{});
      std::string out;
      bool first = true;
      for (const Value& x : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += (attribute.is_none() ? x : attribute_of(x, attribute)).str();
        limit(out);
      }
      return checked(out);
    }
    if (name == "sum" || name == "max" || name == "min" || name == "sort" || name == "unique") {
      const Value attribute = arg(a,
                                  name == "sum"    ? 0
                                  : name == "sort" ? 2
                                                   : 1,
                                  "attribute", None{});
      auto key = [&](const Value& x) {
        Value k = attribute.is_none() ? x : attribute_of(x, attribute);
        const bool cs = arg(a, name == "sort" ? 1 : 0, "case_sensitive", false).truthy();
        return !cs && k.is_string() ? Value(lower(k.as_string())) : k;
      };
      std::vector<Value> items = iterate(v);
      if (name == "sum") {
        Value total = arg(a, 1, "start", 0);
        for (const Value& x : items)
          total = binary("+", total, attribute.is_none() ? x : attribute_of(x, attribute));
        return total;
      }
      if (name == "unique") {
        std::vector<Value> out, seen;
        for (const Value& x : items) {
          Value k = key(x);
          if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); }))
            seen.push_back(k), out.push_back(x);
        }
        return make_list(std::move(out));
      }
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          return compare(key(x), key(y), "<") < 0;
        });
        if (arg(a, 0, "reverse", false).truthy()) std::reverse(items.begin(), items.end());
        return make_list(std::move(items));
      }
      if (items.empty()) return Undefined{"No aggregated item, sequence was empty."};
      Value best = items[0];
      for (const Value& x : items) {
        const int c = compare(key(x), key(best), "<");
        if (name == "max" ? c > 0 : c < 0) best = x;
      }
      return best;
    }
    if (name == "map") {
      std::vector<Value> out;
      const Value attribute = arg(a, size_t(-1), "attribute", None{});
      if (!attribute.is_none()) {
        const Value def = arg(a, size_t(-1), "default");
        for (const Value& x : iterate(v)) {
          Value y = attribute_of(x, attribute);
          out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
        }
        return make_list(std::move(out));
      }
      if (a.positional.empty()) fail("map requires a filter argument");
      const std::vector<Value> items = iterate(v);
      if (items.empty()) return make_list({});  // jinja2 looks the filter up at the first item
      const std::string f = need_string(a.positional[0], "map");
      if (!known(kFilters, f)) fail("no filter named '" + f + "'");
      Args rest{{a.positional.begin() + 1, a.positional.end()}, a.named};
      for (const Value& x : items) out.push_back(filter(f, x, rest));
      return make_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.size() > 6;
      const size_t t = by_attr ? 1 : 0;
      Value attribute = by_attr ? arg(a, 0, "attribute") : Value(None{});
      std::vector<Value> out;
      for (const Value& x : iterate(v)) {
        Value y = by_attr ? attribute_of(x, attribute) : x;
        bool ok;
        if (a.positional.size() <= t) {
          ok = y.truthy();
        } else {
          const std::string tname = need_string(a.positional[t], name.c_str());
          Args rest{{a.positional.begin() + long(t) + 1, a.positional.end()}, {}};
          ok = test(tname, y, rest);
        }
        if (ok == (name[0] == 's')) out.push_back(x);
      }
      return make_list(std::move(out));
    }
    if (name == "trim") return strip(v.str(), arg(a, 0, "chars", None{}), true, true);
    if (name == "upper") return upper(v.str());
    if (name == "lower") return lower(v.str());
    if (name == "capitalize") return capitalize(v.str());
    if (name == "title") {
      // jinja2's title: words start after a dash, whitespace or an opening bracket.
      const std::string text = v.str();
      std::string out;
      bool start = true;
      for (std::string_view c : code_points(text)) {
        const uint32_t cp = first_code_point(c);
        const bool sep = is_space(cp) || c == "-" || c == "(" || c == "{" || c == "[" || c == "<";
        out += sep ? std::string(c) : start ? upper(c) : lower(c);
        start = sep;
      }
      return out;
    }
    if (name == "replace") {
      return replace(v.str(), arg(a, 0, "old").str(), arg(a, 1, "new").str(),
                     need_int(arg(a, 2, "count", None{}).is_none() ? Value(-1) : arg(a, 2, "count"),
                              "replace"));
    }
    if (name == "wordcount") {  // runs of Python's \w: letters, digits and _
      int64_t words = 0;
      bool in_word = false;
      const std::string text = v.str();
      for (std::string_view c : code_points(text)) {
        const auto cat = utf8proc_category(utf8proc_int32_t(first_code_point(c)));
        const bool w = c == "_" || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                       (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
        words += w && !in_word;
        in_word = w;
      }
      return words;
    }
    if (name == "indent") {
      require_defined(v);  // jinja2 appends to the value before anything else
      const Value width = arg(a, 0, "width", 4);
      const std::string pad =
          width.is_string()
              ? width.as_string()
              : std::string(size_t(std::clamp<int64_t>(need_int(width, "indent"), 0, 1024)), ' ');
      const bool first = arg(a, 1, "first", false).truthy(),
                 blank = arg(a, 2, "blank", false).truthy();
      std::vector<std::string> lines = split_lines(v.str() + "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) out += "\n";
        if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
        out += lines[i];
        limit(out);
      }
      if (first && !blank && !lines.empty() && lines[0].empty()) out = pad + out;
      return checked(out);
    }
    fail("no filter named '" + name + "'");
  }

  // str.splitlines(): the line breaks Python knows, each ending one line.
  static std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> lines;
    std::string line;
    auto cps = code_points(s);
    for (size_t i = 0; i < cps.size(); ++i) {
      const uint32_t cp = first_code_point(cps[i]);
      if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
          cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
        if (cp == '\r' && i + 1 < cps.size() && cps[i + 1] == "\n") ++i;
        lines.push_back(std::move(line));
        line.clear();
      } else {
        line += cps[i];
      }
    }
    if (!line.empty()) lines.push_back(std::move(line));
    return lines;
  }

  // map(attribute="a.b"), selectattr("a"): a dotted path of attributes or indices.
  static Value attribute_of(const Value& x, const Value& attribute) {
    if (attribute.is_int()) return get_item(x, attribute);
    Value cur = x;
    for (const std::string& part : split(need_string(attribute, "attribute"), Value("."), -1)) {
      int64_t index;
      auto r = std::from_chars(part.data(), part.data() + part.size(), index);
      cur = r.ec == std::errc() && r.ptr == part.data() + part.size() ? get_item(cur, Value(index))
                                                                      : get_item(cur, Value(part));
    }
    return cur;
  }

  bool test(const std::string& name, const Value& v, Args& a) {
    if (const Signature* sig = signature(name, true))
      check_arguments("test '" + name + "'", *sig, a);
    auto other = [&] { return arg(a, 0, "other"); };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "callable") return v.is_callable();
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
    if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
    if (name == "escaped") return false;
    if (name == "odd" || name == "even")
      return (need_int(v, name.c_str()) % 2 != 0) == (name == "odd");
    if (name == "divisibleby") {
      const int64_t n = need_int(arg(a, 0, "num"), "divisibleby");
      if (n == 0) fail("integer division or modulo by zero");
      return need_int(v, "divisibleby") % n == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
    if (name == "ne" || name == "!=") return !equal(v, other());
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other(), "<") < 0;
    if (name == "le" || name == "<=") return compare(v, other(), "<=") <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other(), ">") > 0;
    if (name == "ge" || name == ">=") return compare(v, other(), ">=") >= 0;
    if (name == "in") return contains(arg(a, 0, "seq"), v);
    if (name == "lower")
      return v.is_string() && lower(v.as_string()) == v.as_string() &&
             upper(v.as_string()) != v.as_string();
    if (name == "upper")
      return v.is_string() && upper(v.as_string()) == v.as_string() &&
             lower(v.as_string()) != v.as_string();
    if (name == "sameas") {
      const Value o = other();
      if (v.storage().index() != o.storage().index()) return false;
      if (v.is_list()) return &v.as_list() == &o.as_list();
      if (v.is_dict()) return &v.as_dict() == &o.as_dict();
      return equal(v, o);
    }
    if (name == "filter") return known(kFilters, need_string(v, "filter"));
    if (name == "test") return known(kTests, need_string(v, "test"));
    fail("no test named '" + name + "'");
  }

  const std::string& origin_;
  std::string* out_;
  std::vector<Frame> frames_;
  int64_t iterations_ = 0;
  int depth_ = 0;
};

}  // namespace

Template::Template(std::string_view source, std::string origin)
    : parsed_(std::make_unique<Parsed>()), origin_(std::move(origin)) {
  try {
    parsed_->body = Parser(Lexer(source).run()).parse();
  } catch (const Failure& f) {
    throw Error(ExitCode::data, printable(origin_ + ": " + f.message));
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  std::string out;
  Renderer(origin_, out).run(parsed_->body, variables);
  return out;
}

}  // namespace forge::jinja
