// ChatTemplate (data/chat_template.h): the hub's chat template found in a model directory and
// rendered by data/jinja.h with the variables transformers' apply_chat_template passes (messages,
// add_generation_prompt, bos_token, eos_token, and tools and documents as None).
#include "data/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/jinja.h"

namespace forge {

struct ChatTemplate::Parsed {
  jinja::Template tmpl;
};

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::string bos_token,
                           std::string eos_token)
    : parsed_(std::make_unique<Parsed>(Parsed{jinja::Template(source, origin)})),
      origin_(std::move(origin)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::optional<ChatTemplate> ChatTemplate::from_directory(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  const bool has_config = std::filesystem::exists(config_path);
  // transformers writes the template to its own chat_template.jinja since 4.50 and prefers
  // that file over tokenizer_config.json's key when loading.
  if (!has_config && !std::filesystem::exists(jinja_path)) return std::nullopt;

  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  const std::string file = quoted_path(config_path.string());
  if (has_config) {
    try {
      config = parse_bounded_json<nlohmann::ordered_json>(
          read_input_file(config_path.string(), kTokenizerInput));
    } catch (const nlohmann::json::exception& e) {
      throw Error(ExitCode::data, file + ": not valid JSON: " + e.what());
    }
    if (!config.is_object()) throw Error(ExitCode::data, file + ": expected a JSON object");
  }
  auto token = [&](const char* key) -> std::string {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      return (*it)["content"].get<std::string>();
    throw Error(ExitCode::data,
                file + ": " + key + ": expected a string or an object with a string \"content\"");
  };
  const std::string bos = token("bos_token"), eos = token("eos_token");

  if (std::filesystem::exists(jinja_path)) {
    const std::string path = jinja_path.string();
    return ChatTemplate(read_input_file(path, kTokenizerInput), quoted_path(path), bos, eos);
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const std::string key = file + ": chat_template";
  if (it->is_string()) return ChatTemplate(it->get<std::string>(), key, bos, eos);
  if (!it->is_array())
    throw Error(ExitCode::data, key + ": expected a string or a list of {name, template}");
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string())
      throw Error(ExitCode::data,
                  key + ": expected each entry to be an object with string name and template");
    if (entry["name"] == "default")
      return ChatTemplate(entry["template"].get<std::string>(), key + "[default]", bos, eos);
  }
  throw Error(ExitCode::data, key + ": no template named \"default\"");
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  std::vector<jinja::Value> list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages)
    list.push_back(jinja::Value::dict({{"role", m.role}, {"content", m.content}}));
  return parsed_->tmpl.render({{"messages", jinja::Value::list(std::move(list))},
                               {"add_generation_prompt", add_generation_prompt},
                               {"bos_token", bos_token_},
                               {"eos_token", eos_token_},
                               {"tools", jinja::None{}},
                               {"documents", jinja::None{}}});
}

}  // namespace forge
