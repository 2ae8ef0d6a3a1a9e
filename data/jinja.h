// Forge's own Jinja interpreter: the subset of Python's jinja2 that published chat templates use
// (data/chat_template.h), with Hugging Face's settings (trim_blocks, lstrip_blocks, loop controls)
// and Python's printing of values, so a template renders byte for byte as it does in
// transformers. Untrusted templates are bounded: output size, loop iterations and nesting.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace forge::jinja {

/// Bounds on what one render may do (a template from a hub repository is untrusted input).
inline constexpr size_t kMaxOutputBytes = size_t(1) << 24;  // any string built, output included
inline constexpr int64_t kMaxLoopIterations = 1'000'000;    // summed over all loops of a render
inline constexpr size_t kMaxItems = 1'000'000;              // elements of any list built
inline constexpr int kMaxNesting = 200;           // parser nesting, value nesting, macro call depth
inline constexpr int64_t kMaxSteps = 20'000'000;  // loop iterations, values walked, bytes / 64

class Value;
struct Array;
struct Object;
struct Callable;

/// jinja2's Undefined: prints as empty and is falsy, but using it (attributes, calls,
/// arithmetic) fails with `hint` ("'x' is undefined").
struct Undefined {
  std::string hint;
};
struct None {};

/// A value of the template language: Python's None, bool, int, float, str, list (and tuple),
/// dict (string keys, insertion order) and callables. Lists and dicts are shared, as in Python.
class Value {
 public:
  using Storage =
      std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                   std::shared_ptr<Object>, std::shared_ptr<Callable>>;
  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::shared_ptr<Array> a) : v_(std::move(a)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  Value(std::shared_ptr<Callable> c) : v_(std::move(c)) {}

  static Value list(std::vector<Value> items = {}, bool tuple = false);
  static Value dict(std::vector<std::pair<std::string, Value>> items = {});
  /// A JSON value as Python's json.loads gives it (objects keep their order).
  static Value from_json(const nlohmann::ordered_json& json);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  Array& as_list() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& as_dict() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Callable& as_callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(v_); }
  const Storage& storage() const { return v_; }

  /// Python's truth value (an undefined value is false).
  bool truthy() const;
  /// str(value) as jinja2 prints it: "" for undefined, "None", "True", Python's float repr,
  /// lists and dicts as Python's repr of them.
  std::string str() const;
  /// Python's repr(value).
  std::string repr() const;
  /// Python's type name ("str", "dict", "NoneType") for error messages.
  std::string type_name() const;

 private:
  Storage v_;
};

/// A list or tuple. `depth` (1 + the deepest container inside) and `holds_reference` (a namespace
/// or a function somewhere inside) are kept as items go in, so that a template cannot nest values
/// deeper than the recursion over them (printing, comparing, freeing) can go, nor make a cycle.
struct Array {
  std::vector<Value> items;
  bool tuple = false;
  int depth = 1;
  bool holds_reference = false;
};

/// A dict, or a namespace() whose attributes a template may assign.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  int depth = 1;
  bool holds_reference = false;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

/// A function a template may call: a global (range, namespace, raise_exception), a bound method
/// ("a b".split) or a macro. It throws forge::Error, or Failure for the caller to place.
struct Callable {
  std::string name;
  std::function<Value(Args&)> call;
};

/// What a built-in function throws; the interpreter adds origin and template line.
struct Failure {
  std::string message;
};

class Template {
 public:
  /// Parses `source` as jinja2 does with trim_blocks and lstrip_blocks. Throws Error(data) with
  /// one line "ORIGIN: line N: what" for a template that does not parse.
  Template(std::string_view source, std::string origin);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  /// Renders with `variables` (plus the globals range, dict, namespace, raise_exception and
  /// strftime_now). Throws Error(data) "ORIGIN: line N: what" for raise_exception, the use of an
  /// undefined value, a type error or a bound exceeded.
  std::string render(const std::vector<std::pair<std::string, Value>>& variables) const;

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
  std::string origin_;
};

}  // namespace forge::jinja
