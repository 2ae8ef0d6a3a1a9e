// Strict JSON Lines (data/jsonl.h): the one reader of record files and the one place that words
// what is wrong with a record ("'file':line: field \"x\" ..."), so every record kind says it alike.
#include "data/jsonl.h"

#include <cmath>
#include <functional>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/file_io.h"

namespace forge {

namespace {

// The reason in a nlohmann parse error, without its "[json.exception...] parse error at line 1,
// column 7: " prefix (the line is ours to name, the byte comes from e.byte).
std::string parse_reason(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  const size_t column = what.find("column ");
  const size_t colon = column == std::string::npos ? what.find(": ") : what.find(": ", column);
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

// "\"prompt\" and \"completion\"", "\"a\", \"b\" and \"c\"".
std::string field_list(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) out += i + 1 == fields.size() ? " and " : ", ";
    out += "\"" + fields[i] + "\"";
  }
  return out;
}

JsonlObject parse_line(std::string_view line, std::string where, const JsonlSchema& schema) {
  nlohmann::json j;
  try {
    j = parse_bounded_json(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ExitCode::data, detail::concat(where, ": not JSON (byte ", e.byte, ": ",
                                               parse_reason(e), ")"));
  } catch (const nlohmann::json::exception& e) {  // a number beyond double's range, JsonTooDeep
    throw Error(ExitCode::data, detail::concat(where, ": not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object())
    throw Error(ExitCode::data, detail::concat(where, ": expected an object with ",
                                               field_list(schema.fields), ", got ", j.type_name()));
  for (const auto& item : j.items()) {
    if (schema.open) break;
    bool known = false;
    for (const std::string& f : schema.fields) known = known || item.key() == f;
    if (!known)
      throw Error(ExitCode::data, detail::concat(where, ": unknown field \"", item.key(), "\" (",
                                                 schema.a_record, " has ",
                                                 field_list(schema.fields), ")"));
  }
  return {std::move(j), std::move(where)};
}

// Calls fn(line, number) for each non-blank line of `file`, a schema.kind file; Error(data) naming
// the file when it has none.
void for_each_line(const std::filesystem::path& file, const JsonlSchema& schema,
                   const std::function<void(std::string_view, int64_t)>& fn) {
  const std::string kind_file = schema.kind + " file";
  const std::string text = read_input_file(
      file.string(), {kind_file.c_str(), uint64_t(schema.max_bytes), ExitCode::data});
  size_t start = 0;
  int64_t lines = 0;
  for (int64_t line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    fn(line, line_no);
    ++lines;
  }
  if (lines == 0)
    throw Error(ExitCode::data,
                detail::concat(quoted_path(file.string()), text.empty() ? ": empty file, no " : ": no ",
                               schema.kind, " records", text.empty() ? "" : " (blank lines only)"));
}

}  // namespace

std::vector<JsonlObject> read_jsonl_objects(const std::filesystem::path& file,
                                            const JsonlSchema& schema) {
  std::vector<JsonlObject> objects;
  for_each_line(file, schema, [&](std::string_view line, int64_t line_no) {
    objects.push_back(
        parse_line(line, detail::concat(quoted_path(file.string()), ":", line_no), schema));
  });
  return objects;
}

std::vector<std::string> read_texts(const std::filesystem::path& file, const JsonlSchema& schema,
                                    const char* field) {
  std::vector<std::string> texts;
  if (file.extension() == ".jsonl") {
    for (const JsonlObject& o : read_jsonl_objects(file, schema))
      texts.push_back(jsonl_nonempty_string(o, field));
    return texts;
  }
  for_each_line(file, schema, [&](std::string_view line, int64_t) {
    if (line.back() == '\r') line.remove_suffix(1);
    texts.emplace_back(line);
  });
  return texts;
}

void JsonlObject::fail(const std::string& what) const {
  throw Error(ExitCode::data, where + ": " + what);
}

void JsonlObject::fail_field(const char* field, const std::string& what) const {
  fail(detail::concat("field \"", field, "\" ", what));
}

void JsonlObject::fail_field(const char* field, size_t index, const std::string& what) const {
  fail(detail::concat("field \"", field, "\"[", index, "] ", what));
}

namespace {

const nlohmann::json& field_of(const JsonlObject& object, const char* name) {
  const auto it = object.value.find(name);
  if (it == object.value.end()) object.fail(detail::concat("missing field \"", name, "\""));
  return *it;
}

bool is_finite_number(const nlohmann::json& v) {
  return v.is_number() && std::isfinite(v.get<double>());
}

}  // namespace

std::string jsonl_string(const JsonlObject& object, const char* name) {
  const nlohmann::json& v = field_of(object, name);
  if (!v.is_string())
    object.fail_field(name, detail::concat("must be a string, got ", v.type_name()));
  return v.get<std::string>();
}

std::string jsonl_nonempty_string(const JsonlObject& object, const char* name) {
  std::string s = jsonl_string(object, name);
  if (s.empty()) object.fail_field(name, "is empty");
  return s;
}

double jsonl_finite_number(const JsonlObject& object, const char* name) {
  const nlohmann::json& v = field_of(object, name);
  if (!is_finite_number(v)) object.fail_field(name, "must be a finite number, got " + v.dump());
  return v.get<double>();
}

double jsonl_finite_number(const JsonlObject& object, const char* name, size_t index) {
  const nlohmann::json& v = field_of(object, name).at(index);
  if (!is_finite_number(v))
    object.fail_field(name, index, "must be a finite number, got " + v.dump());
  return v.get<double>();
}

}  // namespace forge
