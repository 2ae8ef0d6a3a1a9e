// Multi-turn SFT data: JSONL conversations {"messages": [{"role", "content"}, ...]} read strictly,
// rendered by the model's chat template and tokenized into SFT rows whose loss mask covers the
// assistant turns only. The mask comes from character spans of the rendered text mapped to tokens
// through their byte offsets, so it is exact for any template whose renders of a conversation's
// prefixes are prefixes of each other. Also what `forge generate --chat` needs of a template.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/chat_template.h"
#include "data/sft.h"
#include "data/tokenizer.h"

namespace forge {

/// One conversation and where it came from ("'file':line"), for errors about it.
struct ChatRecord {
  std::vector<ChatMessage> messages;
  std::string where;
};

/// Whether `file` holds conversations rather than {"prompt", "completion"} records: its first
/// non-blank line is a JSON object with a "messages" field. Anything else (no such line, a line
/// that is not JSON) is left to the record reader to report.
bool is_chat_jsonl(const std::filesystem::path& file);

/// The conversations of a JSONL file, one object {"messages": [...]} a line (blank lines skipped);
/// each message an object {"role": "system"|"user"|"assistant", "content": string}. Throws
/// Error(data) naming "file:line" and the JSON path (`messages[3].role: unknown role "bot"`) for
/// a line that is not such an object, an unknown field, empty messages or none by the assistant;
/// naming the file as read_sft_jsonl does.
std::vector<ChatRecord> read_chat_jsonl(const std::filesystem::path& file);

/// The conversation of a JSON file {"messages": [...]} (what `forge generate --chat` answers):
/// messages as read_chat_jsonl reads them, no assistant turn needed. Throws Error(data) naming the
/// file and the JSON path.
std::vector<ChatMessage> read_chat_json(const std::filesystem::path& file);

/// A conversation's full render (add_generation_prompt false) and the byte spans in it that
/// belong to assistant turns: for assistant message i, where render(messages[:i+1]) extends
/// render(messages[:i], add_generation_prompt=true), so the end-of-turn text the template writes
/// after the reply is in the span and the assistant header is not.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> assistant;
};

/// Throws Error(data) "<where>: ..." for a template error (raise_exception, an undefined name) and
/// naming the turn when a shorter render is not a prefix of the longer one.
RenderedChat render_chat(const ChatTemplate& chat_template,
                         const std::vector<ChatMessage>& messages, const std::string& where);

/// Rows of the rendered conversations, tokenized once with encode_with_offsets and without the
/// tokenizer's post-processor specials (a template writes bos_token itself, as apply_chat_template
/// tokenizes with add_special_tokens=False). scored[t] = 1 when token t's byte span starts inside
/// an assistant span; prompt_len is the first scored token. Rows longer than max_len are cut at
/// max_len. Throws Error(usage) for max_len < 2, Error(data) naming the record's line when its
/// cut row scores nothing.
SFTDataset tokenize_chat(const std::vector<ChatRecord>& records, const ChatTemplate& chat_template,
                         const Tokenizer& tokenizer, int64_t max_len);

/// The template a model's conversations are rendered with: the .jinja file `template_file` when it
/// is not empty, else the first of `directories` whose tokenizer_config.json has a chat_template.
/// A file's template gets the bos_token and eos_token of that directory template when there is
/// one (else empty strings). Throws Error(usage) naming `template_key` when there is none, and
/// Error(data) for an unreadable or malformed file.
ChatTemplate find_chat_template(const std::string& template_file,
                                const std::vector<std::filesystem::path>& directories,
                                const std::string& template_key);

/// The text the template writes after an assistant reply (ChatML's "<|im_end|>\n", Llama 3's
/// "<|eot_id|>"), found by rendering a probe conversation; empty when the template writes the
/// reply otherwise than verbatim.
std::string end_of_turn_text(const ChatTemplate& chat_template);

/// What ends a generated reply: `ids`, the tokenizer's id of the template's eos_token when it has
/// it as a special, and the ids of generation_config.json's eos_token_id (a number or a list, e.g.
/// Llama 3's <|eot_id|>) when `model_dir` has one; `text`, end_of_turn_text without its trailing
/// whitespace. Throws Error(data) naming generation_config.json for an id outside the vocabulary.
struct ReplyEnd {
  std::vector<int64_t> ids;
  std::string text;
};
ReplyEnd reply_end(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                   const std::filesystem::path& model_dir);

}  // namespace forge
