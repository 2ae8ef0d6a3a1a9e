// Chat templates: the Jinja `chat_template` a hub model ships in tokenizer_config.json, rendered by
// Forge's own Jinja interpreter (data/jinja.h) exactly as Hugging Face's apply_chat_template
// renders it with Python's jinja2, so a conversation becomes the text the model was tuned on.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace forge {

/// One turn of a conversation: role "system", "user" or "assistant" (templates may know others).
struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  /// `source` is the template's text; `origin` names where it came from for errors (a file, or
  /// "FILE: chat_template"). bos_token and eos_token are the strings tokenizer_config.json gives
  /// the template as variables of those names. Throws Error(data) (exit 3) with one line naming
  /// origin, line and what is wrong for a template that does not parse.
  ChatTemplate(std::string source, std::string origin, std::string bos_token,
               std::string eos_token);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  /// dir/tokenizer_config.json's chat_template (a string, or a list of {name, template} of which
  /// "default" is taken) with its bos_token and eos_token (strings or {"content": ...} objects);
  /// nullopt when the file or the key is absent. Throws Error(data) naming the file and key for a
  /// malformed one.
  static std::optional<ChatTemplate> from_directory(const std::filesystem::path& dir);

  /// The text of `messages` as apply_chat_template(messages, tokenize=False,
  /// add_generation_prompt=...) gives it. Throws Error(data) (exit 3) with one line naming origin
  /// and line for the template's raise_exception(message) or an undefined name it uses.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& origin() const { return origin_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
  std::string origin_, bos_token_, eos_token_;
};

}  // namespace forge
