// Text inputs (data/jsonl.h read_texts), as forge generate --prompts and forge predict read them:
// plain lines kept as they are, strict JSONL records, every JSONL error one line naming file:line
// and the field (exit 3), and files without texts refused by name.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/jsonl.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Strings = std::vector<std::string>;

// What forge generate reads its --prompts FILE with.
Strings read_prompts(const fs::path& file) {
  return read_texts(file, {"prompt", "a prompt record", {"prompt"}}, "prompt");
}

TEST(TextInputs, PlainLinesKeepTheirTextAndSkipBlankLines) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "prompts.txt";
  testing::write_file(file, "ROMEO:\n\n  \nJULIET: {\"prompt\": 1} \r\n\tlast");
  EXPECT_EQ(read_prompts(file), (Strings{"ROMEO:", "JULIET: {\"prompt\": 1} ", "\tlast"}));
}

TEST(TextInputs, JsonlRecordsMayHoldNewlines) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "prompts.jsonl";
  testing::write_file(file, "{\"prompt\": \"Q: 1+1?\\nA:\"}\n\n{\"prompt\": \"caf\\u00e9\"}\n");
  EXPECT_EQ(read_prompts(file), (Strings{"Q: 1+1?\nA:", "café"}));
}

TEST(TextInputs, EachJsonlErrorNamesFileLineAndField) {
  const std::string good = "{\"prompt\": \"a\"}\n";
  struct Case {
    std::string text, line, says;
  };
  const std::vector<Case> cases = {
      {good + "\n{\"prompt\": }\n", ":3:", "not JSON (byte 12"},
      {good + "[\"a\"]\n", ":2:", "expected an object with \"prompt\", got array"},
      {good + good + "{}\n", ":3:", "missing field \"prompt\""},
      {"{\"prompt\": 7}\n", ":1:", "field \"prompt\" must be a string, got number"},
      {good + "{\"prompt\": \"\"}\n", ":2:", "field \"prompt\" is empty"},
      {good + "{\"prompt\": \"a\", \"completion\": \"b\"}\n", ":2:",
       "unknown field \"completion\" (a prompt record has \"prompt\")"},
  };
  for (const Case& c : cases) {
    testing::TempDir dir;
    const fs::path file = dir.path() / "prompts.jsonl";
    testing::write_file(file, c.text);
    try {
      read_prompts(file);
      ADD_FAILURE() << "no error for:\n" << c.text;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ExitCode::data) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_NE(what.find(file.string() + c.line + " " + c.says), std::string::npos) << what;
    }
  }
}

TEST(TextInputs, AFileWithoutTextsIsADataErrorNamingIt) {
  testing::TempDir dir;
  for (const std::string& text : {std::string(), std::string("\n \r\n")}) {
    const fs::path file = dir.path() / "empty.txt";
    testing::write_file(file, text);
    try {
      read_prompts(file);
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data);
      EXPECT_NE(std::string(e.what()).find(file.string() + ": "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("no prompt records"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(read_prompts(dir.path() / "missing.txt"), Error);
}

}  // namespace
}  // namespace forge
