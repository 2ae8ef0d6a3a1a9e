// The one way Forge parses JSON it did not write itself (records, config.json, tokenizer files,
// safetensors headers, a run's metrics): nlohmann-json's parser with the nesting depth bounded, so
// that nothing recursive over the value (dump, copy, comparison, destruction) can exhaust the stack
// on a hostile file. docs/reliability.md, "Bounds on untrusted sizes", states the limit.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace forge {

/// Deepest nesting of arrays and objects a parsed value may have. Real files nest a few levels;
/// the limit is far from any of them and far from a stack's worth of recursion.
inline constexpr int kMaxJsonDepth = 128;

/// Thrown by parse_bounded_json when the text nests deeper than kMaxJsonDepth. A
/// nlohmann::json::exception, so a reader that already words nlohmann's errors words this one too;
/// what() is "arrays and objects nested deeper than 128 levels".
class JsonTooDeep : public nlohmann::json::exception {
 public:
  JsonTooDeep() : exception(0, message().c_str()) {}

 private:
  static const std::string& message() {
    static const std::string m =
        "arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return m;
  }
};

/// Json::parse(text, nullptr, allow_exceptions), except that it throws JsonTooDeep (whatever
/// allow_exceptions says) as soon as the parser opens an array or object deeper than
/// kMaxJsonDepth, before the value grows further.
template <class Json = nlohmann::json>
Json parse_bounded_json(std::string_view text, bool allow_exceptions = true) {
  using Event = typename Json::parse_event_t;
  return Json::parse(
      text.begin(), text.end(),
      [](int depth, Event event, Json&) {
        // `depth` counts the arrays and objects around the one that opens.
        if ((event == Event::object_start || event == Event::array_start) &&
            depth >= kMaxJsonDepth)
          throw JsonTooDeep();
        return true;
      },
      allow_exceptions);
}

}  // namespace forge
