// ChatTemplate against Python's jinja2: every template of tests/golden/chat_templates/ rendered
// over every conversation there must match, byte for byte, what transformers' environment gave
// (tests/golden/make_chat_template_goldens.py), raise_exception included; and from_directory's
// reading of tokenizer_config.json with its errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "data/chat_template.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using nlohmann::json;

std::vector<ChatMessage> messages_of(const json& conversation) {
  std::vector<ChatMessage> out;
  for (const auto& m : conversation["messages"]) out.push_back({m["role"], m["content"]});
  return out;
}

TEST(ChatTemplate, MatchesJinja2OnPublishedTemplates) {
  const json setup =
      json::parse(testing::read_file("tests/golden/chat_templates/conversations.json"));
  std::map<std::string, std::vector<ChatMessage>> conversations;
  for (const auto& c : setup["conversations"]) conversations[c["name"]] = messages_of(c);
  int renders = 0, errors = 0;
  for (const auto& [family, info] : setup["families"].items()) {
    SCOPED_TRACE(family);
    const std::string dir = "tests/golden/chat_templates/";
    const ChatTemplate tmpl(testing::read_file(dir + family + ".jinja"), family + ".jinja",
                            info["bos_token"], info["eos_token"]);
    std::istringstream lines(testing::read_file(dir + family + ".expected.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const json want = json::parse(line);
      SCOPED_TRACE(want["conversation"].get<std::string>() +
                   (want["add_generation_prompt"] ? " +generation prompt" : ""));
      const auto& messages = conversations.at(want["conversation"]);
      const bool prompt = want["add_generation_prompt"];
      if (want.contains("error")) {
        testing::expect_error(ExitCode::data, want["error"].get<std::string>(),
                              [&] { tmpl.render(messages, prompt); });
        ++errors;
      } else {
        EXPECT_EQ(tmpl.render(messages, prompt), want["output"].get<std::string>());
        ++renders;
      }
    }
  }
  EXPECT_GE(setup["families"].size(), 6u);
  EXPECT_GT(renders, 100);
  EXPECT_GT(errors, 10);
}

TEST(ChatTemplate, FromDirectoryReadsTokenizerConfig) {
  testing::TempDir dir;
  EXPECT_FALSE(ChatTemplate::from_directory(dir.path()));
  testing::write_file(dir.path() / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_FALSE(ChatTemplate::from_directory(dir.path()));

  const std::vector<ChatMessage> hi = {{"user", "hi"}};
  testing::write_file(dir.path() / "tokenizer_config.json", R"({
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"})");
  auto tmpl = ChatTemplate::from_directory(dir.path());
  ASSERT_TRUE(tmpl);
  EXPECT_EQ(tmpl->render(hi, false), "<s>hi</s>");
  EXPECT_EQ(tmpl->bos_token(), "<s>");

  testing::write_file(dir.path() / "tokenizer_config.json", R"({"chat_template": [
    {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default"}]})");
  EXPECT_EQ(ChatTemplate::from_directory(dir.path())->render(hi, false), "default");

  // transformers saves the template to chat_template.jinja and prefers that file.
  testing::write_file(dir.path() / "chat_template.jinja", "{{ messages[0].role }}\n");
  EXPECT_EQ(ChatTemplate::from_directory(dir.path())->render(hi, true), "user");
}

TEST(ChatTemplate, MalformedConfigsNameFileAndKey) {
  testing::TempDir dir;
  const auto config = dir.path() / "tokenizer_config.json";
  const std::pair<const char*, const char*> cases[] = {
      {"{", "tokenizer_config.json: not valid JSON"},
      {"[]", "tokenizer_config.json: expected a JSON object"},
      {R"({"chat_template": 3})",
       "tokenizer_config.json: chat_template: expected a string or a list"},
      {R"({"chat_template": [{"name": "x", "template": "t"}]})",
       "tokenizer_config.json: chat_template: no template named \"default\""},
      {R"({"chat_template": [{"name": "default"}]})",
       "tokenizer_config.json: chat_template: expected each entry"},
      {R"({"chat_template": "x", "eos_token": 7})",
       "tokenizer_config.json: eos_token: expected a string"},
      {R"({"chat_template": "{% for m in messages %}\n{{ m.content + }}"})",
       "tokenizer_config.json: chat_template: line 2: unexpected end of print statement"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    testing::write_file(config, text);
    testing::expect_error(ExitCode::data, message,
                          [&] { ChatTemplate::from_directory(dir.path()); });
  }
  testing::write_file(config, R"({"chat_template": "{{ raise_exception('no system role') }}"})");
  const auto tmpl = ChatTemplate::from_directory(dir.path());
  testing::expect_error(
      ExitCode::data,
      "tokenizer_config.json: chat_template: line 1: raise_exception: no system role",
      [&] { tmpl->render({}, false); });
}

}  // namespace
}  // namespace forge
