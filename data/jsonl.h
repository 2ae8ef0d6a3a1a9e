// Strict JSON Lines for record files (SFT instructions, labelled texts, preference pairs, prompts):
// one object a line, blank lines skipped, and every problem one line naming "file:line" and the
// field. Unknown fields are errors rather than ignored, so a typo ("completon") cannot silently
// train on nothing. Parsing is nlohmann-json's. Text inputs may also be one text a line.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace forge {

/// One line's object and where it came from ("'file':line"), for messages about its fields.
struct JsonlObject {
  nlohmann::json value;
  std::string where;
  /// Throws Error(data) "<where>: <what>".
  [[noreturn]] void fail(const std::string& what) const;
  /// Throws Error(data) "<where>: field \"<field>\" <what>".
  [[noreturn]] void fail_field(const char* field, const std::string& what) const;
  /// Throws Error(data) "<where>: field \"<field>\"[<index>] <what>", about an element of a list.
  [[noreturn]] void fail_field(const char* field, size_t index, const std::string& what) const;
};

/// What a file's records are, for messages ("SFT file", "no SFT records", "an SFT record has
/// \"prompt\" and \"completion\""). `fields` are every field a record may have.
struct JsonlSchema {
  std::string kind;      ///< "SFT"
  std::string a_record;  ///< "an SFT record"
  std::vector<std::string> fields;
  int64_t max_bytes = int64_t{1} << 30;
  /// Fields outside `fields` are kept instead of refused: for tools that add to records of other
  /// tools (forge score adds a reward to forge generate's records).
  bool open = false;
};

/// The objects of `file`. Throws Error(data) naming "file:line" for a line that is not JSON (with
/// the parser's byte position) or not an object or has a field outside schema.fields; naming the
/// file when it is missing, not a regular file, larger than schema.max_bytes or has no records.
std::vector<JsonlObject> read_jsonl_objects(const std::filesystem::path& file,
                                            const JsonlSchema& schema);

/// The texts of `file`, for inputs that are one text a line or JSONL records (prompts to sample,
/// texts to classify): field `field` of each record of a .jsonl file, read as read_jsonl_objects
/// reads it, or each non-blank line of any other file as it is (a final '\r' dropped). Throws as
/// read_jsonl_objects, and Error(data) naming a record whose `field` is missing, not a string or
/// empty (a text is never empty, as a blank line is skipped).
std::vector<std::string> read_texts(const std::filesystem::path& file, const JsonlSchema& schema,
                                    const char* field);

/// The string field `name`. Throws Error(data) naming object.where and the field when it is
/// missing or not a string.
std::string jsonl_string(const JsonlObject& object, const char* name);

/// jsonl_string, and Error(data) naming object.where and the field when the string is empty.
std::string jsonl_nonempty_string(const JsonlObject& object, const char* name);

/// The number field `name`. Throws Error(data) naming object.where and the field when it is
/// missing, or not a finite number (quoting what it is).
double jsonl_finite_number(const JsonlObject& object, const char* name);

/// Element `index` of list field `name` (the caller checked the list's length), as
/// jsonl_finite_number reads a field; the error names the element ("\"scores\"[2]").
double jsonl_finite_number(const JsonlObject& object, const char* name, size_t index);

}  // namespace forge
