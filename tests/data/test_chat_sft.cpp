// Multi-turn SFT data: the loss mask of a ChatML and a Llama-3 conversation covers exactly the
// assistant replies and the end-of-turn text after each (bytes and gpt2 tokenizers), every JSONL
// error names file:line and the JSON path, a template error or a template whose renders are not
// prefixes of each other names the line, a missing template names the key that supplies one, and
// a generated reply ends at the template's end-of-turn text and the hub's end-of-turn ids; packed
// batches score what padded ones do.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/chat_sft.h"
#include "data/lm_data.h"
#include "data/packing.h"
#include "tests/data/record_checks.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

const char* kChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Llama 3's published template.
const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

const std::vector<ChatMessage> kConversation{
    {"system", "You answer in one line."},
    {"user", "Name a colour."},
    {"assistant", "Blue, like the sea."},
    {"user", "And another? Caf\xc3\xa9 au lait?"},
    {"assistant", "Brown \xe2\x80\x94 caf\xc3\xa9 au lait."},
};

// The scored tokens of row 0, decoded run by run (a run: consecutive scored tokens).
std::vector<std::string> scored_runs(const SFTDataset& d, const Tokenizer& tokenizer) {
  std::vector<std::string> runs;
  std::vector<int32_t> run;
  const std::vector<int32_t>& row = d.tokens[0];
  for (size_t t = 0; t <= row.size(); ++t) {
    if (t < row.size() && d.scored[0][t]) {
      run.push_back(row[t]);
    } else if (!run.empty()) {
      runs.push_back(tokenizer.decode(run));
      run.clear();
    }
  }
  return runs;
}

// The batch's targets, decoded where they are scored: what the loss actually trains on.
std::string batch_targets(const SFTDataset& d, const Tokenizer& tokenizer) {
  const SFTBatch batch = SFTLoader::make_batch(d, {0});
  std::vector<int32_t> ids;
  for (int64_t t : batch.targets.to_vector<int64_t>())
    if (t != LMWindows::kIgnoreTarget) ids.push_back(int32_t(t));
  EXPECT_EQ(int64_t(ids.size()), batch.num_targets);
  return tokenizer.decode(ids);
}

void expect_mask(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                 const std::string& end_of_turn) {
  const SFTDataset d = tokenize_chat({{kConversation, "conversation"}}, chat_template, tokenizer,
                                     1000);
  ASSERT_EQ(d.size(), 1);
  const std::string a = kConversation[2].content + end_of_turn;
  const std::string b = kConversation[4].content + end_of_turn;
  EXPECT_EQ(scored_runs(d, tokenizer), (std::vector<std::string>{a, b})) << tokenizer.name();
  EXPECT_EQ(batch_targets(d, tokenizer), a + b) << tokenizer.name();
  EXPECT_EQ(tokenizer.decode(d.tokens[0]), chat_template.render(kConversation, false));
  EXPECT_TRUE(d.scored[0][size_t(d.prompt_len[0])]);
  EXPECT_EQ(end_of_turn_text(chat_template), end_of_turn);
}

TEST(ChatSFT, ChatMLMaskIsTheAssistantRepliesAndTheirEndOfTurn) {
  const ChatTemplate chat_template(kChatML, "chatml", "", "<|im_end|>");
  const std::vector<std::string> specials{"<|im_start|>", "<|im_end|>"};
  for (const char* name : {"bytes", "gpt2"})
    expect_mask(chat_template, *make_tokenizer(name, specials), "<|im_end|>\n");
}

TEST(ChatSFT, Llama3MaskIsTheAssistantRepliesAndTheirEndOfTurn) {
  const ChatTemplate chat_template(kLlama3, "llama3", "<|begin_of_text|>", "<|eot_id|>");
  const std::vector<std::string> specials{"<|begin_of_text|>", "<|start_header_id|>",
                                          "<|end_header_id|>", "<|eot_id|>"};
  for (const char* name : {"bytes", "gpt2"}) {
    auto tokenizer = make_tokenizer(name, specials);
    expect_mask(chat_template, *tokenizer, "<|eot_id|>");
    // The template writes bos_token once, and nothing adds another.
    const SFTDataset d = tokenize_chat({{kConversation, "c"}}, chat_template, *tokenizer, 1000);
    EXPECT_EQ(d.tokens[0][0], *tokenizer->special_id("<|begin_of_text|>"));
    EXPECT_NE(d.tokens[0][1], *tokenizer->special_id("<|begin_of_text|>"));
  }
}

// Packed rows (data/packing.h) score exactly the tokens the padded batch scores: the mask travels
// with the record.
TEST(ChatSFT, PackedBatchesScoreWhatPaddedBatchesScore) {
  const ChatTemplate chat_template(kChatML, "chatml", "", "<|im_end|>");
  auto bytes = make_tokenizer("bytes", {"<|im_start|>", "<|im_end|>"});
  const std::vector<ChatMessage> short_chat{{"user", "hi"}, {"assistant", "yo"}};
  auto d = std::make_shared<const SFTDataset>(tokenize_chat(
      {{kConversation, "a"}, {short_chat, "b"}}, chat_template, *bytes, 1000));
  PackedSFTLoader packed(d, /*rows=*/1, /*context=*/400, /*seed=*/1, /*shuffle=*/false);
  const SFTBatch batch = packed.next();
  ASSERT_EQ(batch.ids.size(0), 1);  // both conversations in one row
  std::vector<int32_t> ids;
  for (int64_t t : batch.targets.to_vector<int64_t>())
    if (t != LMWindows::kIgnoreTarget) ids.push_back(int32_t(t));
  EXPECT_EQ(batch.num_targets, int64_t(ids.size()));
  EXPECT_EQ(bytes->decode(ids), kConversation[2].content + "<|im_end|>\n" +
                                    kConversation[4].content + "<|im_end|>\nyo<|im_end|>\n");
}

TEST(ChatSFT, RowsAreCutAtMaxLenAndARowWithNothingToScoreNamesItsLine) {
  const ChatTemplate chat_template(kChatML, "chatml", "", "");
  auto bytes = make_tokenizer("bytes", {"<|im_start|>", "<|im_end|>"});
  const std::vector<ChatMessage> short_chat{{"user", "hi"}, {"assistant", "yo"}};
  // <|im_start|> "user\nhi" <|im_end|> "\n" <|im_start|> "assistant\n" = 21 tokens, then "yo".
  const SFTDataset d = tokenize_chat({{short_chat, "x"}}, chat_template, *bytes, 22);
  EXPECT_EQ(d.tokens[0].size(), 22u);
  EXPECT_EQ(d.prompt_len[0], 21);
  EXPECT_EQ(SFTLoader::make_batch(d, {0}).num_targets, 1);
  testing::expect_error(ExitCode::data, "c.jsonl:7: nothing to score", [&] {
    tokenize_chat({{short_chat, "c.jsonl:7"}}, chat_template, *bytes, 21);
  });
  EXPECT_EQ(testing::exit_code_of([&] { tokenize_chat({}, chat_template, *bytes, 1); }),
            ExitCode::usage);
}

TEST(ChatSFT, ReadsConversationsAndDetectsTheFormat) {
  testing::TempDir dir;
  const fs::path chat = dir.path() / "chat.jsonl", sft = dir.path() / "sft.jsonl";
  testing::write_file(chat,
                      "\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                      "{\"content\": \"b\\u00e9\", \"role\": \"assistant\"}]}\n");
  testing::write_file(sft, "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  EXPECT_TRUE(is_chat_jsonl(chat));
  EXPECT_FALSE(is_chat_jsonl(sft));
  EXPECT_FALSE(is_chat_jsonl(dir.path() / "missing.jsonl"));
  const std::vector<ChatRecord> r = read_chat_jsonl(chat);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].messages.size(), 2u);
  EXPECT_EQ(r[0].messages[1].role, "assistant");
  EXPECT_EQ(r[0].messages[1].content, "b\xc3\xa9");
  EXPECT_NE(r[0].where.find("chat.jsonl:2"), std::string::npos) << r[0].where;
}

TEST(ChatSFT, EachJsonlErrorNamesFileLineAndPath) {
  const std::string user = "{\"role\": \"user\", \"content\": \"q\"}";
  const std::string bot = "{\"role\": \"assistant\", \"content\": \"a\"}";
  const std::string good = "{\"messages\": [" + user + ", " + bot + "]}\n";
  auto line = [](const std::string& messages) { return "{\"messages\": " + messages + "}\n"; };
  testing::expect_jsonl_errors(
      {
          {good + line("[" + user + ", " + user + ", " + bot + ", {\"role\": \"bot\", "
                       "\"content\": \"x\"}]"),
           ":2:", "messages[3].role: unknown role \"bot\""},
          {good + good + line("[" + user + ", {\"role\": \"assistant\", \"content\": 7}]"), ":3:",
           "messages[1].content: must be a string, got number"},
          {line("[{\"role\": null, \"content\": \"x\"}, " + bot + "]"), ":1:",
           "messages[0].role: must be a string, got null"},
          {line("[]"), ":1:", "messages: is empty"},
          {line("[" + user + "]"), ":1:", "messages: no assistant turn"},
          {line("{\"role\": \"user\"}"), ":1:", "messages: must be a list, got object"},
          {line("[\"hi\", " + bot + "]"), ":1:", "messages[0]: must be an object"},
          {line("[{\"role\": \"user\"}, " + bot + "]"), ":1:",
           "messages[0]: missing field \"content\""},
          {line("[" + user + ", {\"role\": \"assistant\", \"content\": \"a\", \"name\": \"x\"}]"),
           ":1:", "messages[1]: unknown field \"name\""},
          {good + "{\"messages\": [" + user + ", " + bot + "], \"id\": 3}\n", ":2:",
           "unknown field \"id\""},
          {good + "{\"prompt\": \"a\", \"completion\": \"b\"}\n", ":2:",
           "unknown field \"completion\""},
          {good + "{}\n", ":2:", "missing field \"messages\""},
      },
      "chat", [](const fs::path& file) { read_chat_jsonl(file); });
}

TEST(ChatSFT, TemplateErrorsNameTheLineAndTheTurn) {
  auto bytes = make_tokenizer("bytes");
  const std::vector<ChatMessage> chat{{"user", "q"}, {"assistant", "a"}};
  // The one-line data error of tokenizing `chat`, line 4 of c.jsonl, rendered by `source`.
  auto error_of = [&](const std::string& source) {
    try {
      tokenize_chat({{chat, "c.jsonl:4"}}, ChatTemplate(source, "t.jinja", "", ""), *bytes, 100);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for " << source;
    return std::string();
  };
  const std::string raised = error_of(
      "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message comes "
      "first') }}{% endif %}");
  EXPECT_EQ(raised.rfind("c.jsonl:4: ", 0), 0u) << raised;
  EXPECT_NE(raised.find("a system message comes first"), std::string::npos) << raised;
  // The number of turns up front: every longer render rewrites the start of the shorter one.
  const std::string counts =
      error_of("{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}");
  EXPECT_EQ(counts.rfind("c.jsonl:4: messages[1]: the render up to this assistant turn", 0), 0u)
      << counts;
  // The generation prompt differs from how the template writes an assistant turn.
  const std::string prompt_differs =
      error_of("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
               "{% if add_generation_prompt %}<bot>{% endif %}");
  EXPECT_EQ(prompt_differs.rfind("c.jsonl:4: messages[1]: the render up to this", 0), 0u)
      << prompt_differs;
}

TEST(ChatSFT, FindsTheTemplateOfAFileOrADirectoryAndNamesTheKeyWhenThereIsNone) {
  testing::TempDir dir;
  const fs::path hub = dir.path() / "hub", file = dir.path() / "t.jinja";
  fs::create_directories(hub);
  testing::write_file(hub / "tokenizer_config.json",
                      "{\"chat_template\": \"{{ bos_token }}hub\", \"bos_token\": \"<s>\", "
                      "\"eos_token\": \"</s>\"}");
  testing::write_file(file, "{{ bos_token }}file{{ eos_token }}");
  const std::vector<ChatMessage> none;
  EXPECT_EQ(find_chat_template("", {dir.path(), hub}, "data.chat_template").render(none, false),
            "<s>hub");
  EXPECT_EQ(find_chat_template(file.string(), {hub}, "k").render(none, false), "<s>file</s>");
  EXPECT_EQ(find_chat_template(file.string(), {}, "k").render(none, false), "file");
  testing::expect_error(ExitCode::usage, "set data.chat_template to a .jinja file", [&] {
    find_chat_template("", {dir.path(), "bytes"}, "data.chat_template");
  });
  testing::expect_error(ExitCode::data, "missing.jinja", [&] {
    find_chat_template((dir.path() / "missing.jinja").string(), {hub}, "k");
  });
}

TEST(ChatSFT, AReplyEndsAtTheEndOfTurnTextTheEosTokenAndGenerationConfigIds) {
  const ChatTemplate chat_template(kChatML, "chatml", "", "<|im_end|>");
  auto bytes = make_tokenizer("bytes", {"<|im_start|>", "<|im_end|>"});
  testing::TempDir dir;
  ReplyEnd end = reply_end(chat_template, *bytes, dir.path());
  EXPECT_EQ(end.text, "<|im_end|>");  // the newline after it is not waited for
  EXPECT_EQ(end.ids, (std::vector<int64_t>{257}));
  testing::write_file(dir.path() / "generation_config.json", "{\"eos_token_id\": [1, 2]}");
  EXPECT_EQ(reply_end(chat_template, *bytes, dir.path()).ids, (std::vector<int64_t>{257, 1, 2}));
  testing::write_file(dir.path() / "generation_config.json", "{\"eos_token_id\": 7}");
  EXPECT_EQ(reply_end(chat_template, *bytes, dir.path()).ids, (std::vector<int64_t>{257, 7}));
  testing::write_file(dir.path() / "generation_config.json", "{\"eos_token_id\": 258}");
  testing::expect_error(ExitCode::data, "generation_config.json: eos_token_id: 258", [&] {
    reply_end(chat_template, *bytes, dir.path());
  });
  const ChatTemplate newline("{% for m in messages %}{{ m['content'] }}\n{% endfor %}", "nl", "",
                             "");
  EXPECT_EQ(reply_end(newline, *bytes, "").text, "\n");  // all whitespace: kept whole
}

}  // namespace
}  // namespace forge
