// The typed field reads of data/jsonl.h that every record reader (SFT, preference, labelled)
// shares: each error is Error(data), one line, "<where>: field \"name\"..." with the element index
// for a list, and a value that passes comes back as it is.
#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"
#include "core/file_io.h"
#include "data/jsonl.h"
#include "tests/test_util.h"

namespace forge {
namespace {

JsonlObject record(const char* json) { return {nlohmann::json::parse(json), "'f.jsonl':4"}; }

// `read` must throw a one-line Error(data) holding `message`, which the tests give whole.
void expect_message(const std::string& message, const std::function<void()>& read) {
  testing::expect_error(ExitCode::data, message, read);
}

TEST(JsonlFields, FiniteNumbersAreReadOrRefusedNamingTheField) {
  const JsonlObject o = record(R"({"margin": 0.5, "bad": "1", "flag": true, "scores": [2, null]})");
  EXPECT_EQ(jsonl_finite_number(o, "margin"), 0.5);
  EXPECT_EQ(jsonl_finite_number(o, "scores", 0), 2.0);
  expect_message("'f.jsonl':4: field \"bad\" must be a finite number, got \"1\"",
                 [&] { jsonl_finite_number(o, "bad"); });
  expect_message("'f.jsonl':4: field \"flag\" must be a finite number, got true",
                 [&] { jsonl_finite_number(o, "flag"); });
  expect_message("'f.jsonl':4: field \"scores\"[1] must be a finite number, got null",
                 [&] { jsonl_finite_number(o, "scores", 1); });
  expect_message("'f.jsonl':4: missing field \"absent\"",
                 [&] { jsonl_finite_number(o, "absent"); });
}

TEST(JsonlFields, StringsAndRecordErrorsShareOneWording) {
  const JsonlObject o = record(R"({"prompt": "", "n": 3})");
  EXPECT_EQ(jsonl_string(o, "prompt"), "");
  expect_message("'f.jsonl':4: field \"prompt\" is empty",
                 [&] { jsonl_nonempty_string(o, "prompt"); });
  expect_message("'f.jsonl':4: field \"n\" must be a string, got number",
                 [&] { jsonl_string(o, "n"); });
  expect_message("'f.jsonl':4: field \"completions\"[2] must be a non-empty string",
                 [&] { o.fail_field("completions", 2, "must be a non-empty string"); });
  expect_message("'f.jsonl':4: no pairs", [&] { o.fail("no pairs"); });
}

// forge score keeps fields it does not know and writes them back: a field nested 100,000 deep
// must be refused at its line, not recursed into when the record is written.
TEST(JsonlFields, ARecordNestedBeyondTheLimitIsRefusedAtItsLine) {
  testing::TempDir dir;
  const std::filesystem::path file = dir.path() / "deep.jsonl";
  testing::write_file(file, "{\"text\": \"a\"}\n{\"text\": \"b\", \"x\": " +
                                std::string(100000, '[') + std::string(100000, ']') + "}\n");
  const JsonlSchema schema{"text", "a text record", {"text"}, int64_t{1} << 20, /*open=*/true};
  expect_message(quoted_path(file.string()) +
                     ":2: not valid JSON (arrays and objects nested deeper than 128 levels)",
                 [&] { read_jsonl_objects(file, schema); });
}

}  // namespace
}  // namespace forge
