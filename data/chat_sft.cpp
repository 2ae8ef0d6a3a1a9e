// Multi-turn SFT (data/chat_sft.h): conversations read strictly, each rendered once in full and
// once per assistant turn around it to find the turn's span, tokenized once with byte offsets, and
// scored where a token starts inside a span.
#include "data/chat_sft.h"

#include <fstream>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/jsonl.h"

namespace forge {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_chat_jsonl(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return false;
  std::ifstream in(file, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const json j = parse_bounded_json(line, /*allow_exceptions=*/false);
      return j.is_object() && j.contains("messages");
    } catch (const json::exception&) {
      return false;
    }
  }
  return false;
}

namespace {

ChatMessage read_message(const JsonlObject& o, size_t i) {
  const json& m = o.value["messages"][i];
  const std::string at = detail::concat("messages[", i, "]");
  if (!m.is_object())
    o.fail(at + ": must be an object with \"role\" and \"content\", got " + m.type_name());
  for (const auto& item : m.items())
    if (item.key() != "role" && item.key() != "content")
      o.fail(at + ": unknown field \"" + item.key() +
             "\" (a message has \"role\" and \"content\")");
  ChatMessage out;
  for (const char* field : {"role", "content"}) {
    const auto it = m.find(field);
    if (it == m.end()) o.fail(at + ": missing field \"" + field + "\"");
    if (!it->is_string()) o.fail(at + "." + field + ": must be a string, got " + it->type_name());
    (field[0] == 'r' ? out.role : out.content) = it->get<std::string>();
  }
  if (out.role != "system" && out.role != "user" && out.role != "assistant")
    o.fail(at + ".role: unknown role " + json(out.role).dump() +
           " (a message is by \"system\", \"user\" or \"assistant\")");
  return out;
}

// The "messages" of a record: a non-empty list of messages.
std::vector<ChatMessage> read_messages(const JsonlObject& o) {
  const auto it = o.value.find("messages");
  if (it == o.value.end()) o.fail("missing field \"messages\"");
  if (!it->is_array()) o.fail(std::string("messages: must be a list, got ") + it->type_name());
  if (it->empty()) o.fail("messages: is empty");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) messages.push_back(read_message(o, i));
  return messages;
}

}  // namespace

std::vector<ChatRecord> read_chat_jsonl(const fs::path& file) {
  const JsonlSchema schema{"chat", "a chat record", {"messages"}, kMaxSFTFileBytes};
  std::vector<ChatRecord> records;
  for (const JsonlObject& o : read_jsonl_objects(file, schema)) {
    ChatRecord record{read_messages(o), o.where};
    bool assistant = false;
    for (const ChatMessage& m : record.messages) assistant = assistant || m.role == "assistant";
    if (!assistant) o.fail("messages: no assistant turn, nothing to train on");
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<ChatMessage> read_chat_json(const fs::path& file) {
  const std::string where = quoted_path(file.string());
  const std::string text =
      read_input_file(file.string(), {"conversation file", 64 * kMiB, ExitCode::data});
  JsonlObject o{{}, where};
  try {
    o.value = parse_bounded_json(text);
  } catch (const json::exception& e) {
    o.fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!o.value.is_object())
    o.fail(std::string("expected an object {\"messages\": [...]}, got ") + o.value.type_name());
  for (const auto& item : o.value.items())
    if (item.key() != "messages")
      o.fail("unknown field \"" + item.key() + "\" (a conversation has \"messages\")");
  return read_messages(o);
}

namespace {

// The template's render with `where` in front of its error, so a raise_exception names the line.
std::string render_at(const ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                      bool add_generation_prompt, const std::string& where) {
  try {
    return chat_template.render(messages, add_generation_prompt);
  } catch (const Error& e) {
    throw Error(e.code(), where + ": " + e.what());
  }
}

}  // namespace

RenderedChat render_chat(const ChatTemplate& chat_template,
                         const std::vector<ChatMessage>& messages, const std::string& where) {
  RenderedChat out;
  out.text = render_at(chat_template, messages, false, where);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const std::vector<ChatMessage> before(messages.begin(), messages.begin() + ptrdiff_t(i));
    const std::vector<ChatMessage> through(messages.begin(), messages.begin() + ptrdiff_t(i + 1));
    const std::string prompt = render_at(chat_template, before, true, where);
    const std::string turn = render_at(chat_template, through, false, where);
    // A template that rewrites earlier turns as the conversation grows (one that drops old
    // reasoning, say) has no span to give; scoring a guess would train on the wrong text.
    auto refuse = [&](const char* what) {
      throw Error(ExitCode::data,
                  detail::concat(where, ": messages[", i, "]: ", what, " (chat template ",
                                 chat_template.origin(), "), so the turn has no span to score"));
    };
    if (turn.compare(0, prompt.size(), prompt) != 0)
      refuse(
          "the render up to this assistant turn does not start with the render before it "
          "with the generation prompt");
    if (out.text.compare(0, turn.size(), turn) != 0)
      refuse("the whole conversation's render does not start with the render up to this turn");
    if (turn.size() > prompt.size()) out.assistant.emplace_back(prompt.size(), turn.size());
  }
  return out;
}

SFTDataset tokenize_chat(const std::vector<ChatRecord>& records, const ChatTemplate& chat_template,
                         const Tokenizer& tokenizer, int64_t max_len) {
  if (max_len < 2)
    throw Error(ExitCode::usage, detail::concat("SFT max_len must be at least 2, got ", max_len));
  SFTDataset out;
  for (const ChatRecord& record : records) {
    const RenderedChat chat = render_chat(chat_template, record.messages, record.where);
    Encoding enc = tokenizer.encode_with_offsets(chat.text);
    const size_t total = enc.ids.size(), n = std::min(total, size_t(max_len));
    enc.ids.resize(n);
    std::vector<uint8_t> scored(n, 0);
    int64_t first = 0;
    size_t span = 0;  // spans and token starts both ascend
    for (size_t t = 1; t < n; ++t) {
      const size_t begin = enc.offsets[t].first;
      while (span < chat.assistant.size() && chat.assistant[span].second <= begin) ++span;
      if (span < chat.assistant.size() && chat.assistant[span].first <= begin) {
        scored[t] = 1;
        if (first == 0) first = int64_t(t);
      }
    }
    if (first == 0)
      throw Error(ExitCode::data,
                  detail::concat(record.where, ": nothing to score: no assistant token among the ",
                                 n, " of its ", total, " tokens that fit a row of ", max_len));
    out.tokens.push_back(std::move(enc.ids));
    out.prompt_len.push_back(first);
    out.scored.push_back(std::move(scored));
  }
  return out;
}

ChatTemplate find_chat_template(const std::string& template_file,
                                const std::vector<fs::path>& directories,
                                const std::string& template_key) {
  std::optional<ChatTemplate> found;
  std::string searched;
  for (const fs::path& dir : directories) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    searched +=
        (searched.empty() ? "" : ", ") + quoted_path((dir / "tokenizer_config.json").string());
    if ((found = ChatTemplate::from_directory(dir))) break;
  }
  if (!template_file.empty()) {
    const InputKind kind{"chat template", 16 * kMiB, ExitCode::data};
    return ChatTemplate(read_input_file(template_file, kind), quoted_path(template_file),
                        found ? found->bos_token() : "", found ? found->eos_token() : "");
  }
  if (!found)
    throw Error(ExitCode::usage,
                detail::concat("no chat template for the conversations: ",
                               searched.empty() ? std::string("the tokenizer is not a directory")
                                                : "no chat_template in " + searched,
                               "; set ", template_key, " to a .jinja file"));
  return std::move(*found);
}

std::string end_of_turn_text(const ChatTemplate& chat_template) {
  // A reply no template writes by itself, so it is found where the template put it.
  const std::string reply = "\x01reply\x02";
  const std::vector<ChatMessage> probe{{"user", "hi"}, {"assistant", reply}};
  const std::string prompt = chat_template.render({probe[0]}, true);
  const std::string turn = chat_template.render(probe, false);
  if (turn.compare(0, prompt.size(), prompt) != 0 ||
      turn.compare(prompt.size(), reply.size(), reply) != 0)
    return "";
  return turn.substr(prompt.size() + reply.size());
}

ReplyEnd reply_end(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                   const fs::path& model_dir) {
  ReplyEnd out;
  out.text = end_of_turn_text(chat_template);
  // The model writes the end-of-turn marker and then, say, ChatML's newline: the marker ends it.
  const size_t last = out.text.find_last_not_of(" \t\r\n");
  if (last != std::string::npos) out.text.resize(last + 1);
  if (auto id = tokenizer.special_id(chat_template.eos_token())) out.ids.push_back(*id);
  const fs::path file = model_dir / "generation_config.json";
  std::error_code ec;
  if (model_dir.empty() || !fs::is_regular_file(file, ec)) return out;
  json j;
  try {
    j = parse_bounded_json(
        read_input_file(file.string(), {"generation config", kMiB, ExitCode::data}));
  } catch (const json::exception& e) {
    throw Error(ExitCode::data, quoted_path(file.string()) + ": not valid JSON (" + e.what() + ")");
  }
  const json eos = j.is_object() && j.contains("eos_token_id") ? j["eos_token_id"] : json();
  for (const json& id : eos.is_array() ? eos : json::array({eos})) {
    if (id.is_null()) continue;
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= tokenizer.vocab_size())
      throw Error(ExitCode::data, quoted_path(file.string()) + ": eos_token_id: " + id.dump() +
                                      " is not a token id of the tokenizer");
    out.ids.push_back(id.get<int64_t>());
  }
  return out;
}

}  // namespace forge
