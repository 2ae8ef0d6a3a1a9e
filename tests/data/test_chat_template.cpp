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

}  // namespace
}  // namespace forge
