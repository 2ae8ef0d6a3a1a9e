// A SentencePiece model (Llama 2's, TinyLlama's and Mistral 7B v0.1's tokenizer.model) read and run
// by Debian's libsentencepiece, the library python3-sentencepiece wraps: ids are sp.encode's, text
// is sp.decode's. Forge adds what Hugging Face's LlamaTokenizer (the slow one) adds around it: BOS
// and EOS from tokenizer_config.json, control symbols written in the text taken as their ids, and
// byte spans for every id. docs/data.md, "SentencePiece", says what is and is not followed.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace forge {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `model_file` and, when the directory holding it has one, tokenizer_config.json
  /// ("add_bos_token", default true; "add_eos_token", default false; "legacy", default true).
  /// Control symbols (<s>, </s>), <unk> and user-defined symbols are special tokens; `specials`
  /// the model has keep their ids, the others get ids after its pieces. Throws Error(data) naming
  /// the file for a model that does not load or a bad tokenizer_config.json.
  SentencePieceTokenizer(const std::filesystem::path& model_file, std::string name,
                         const std::vector<std::string>& specials = {});
  ~SentencePieceTokenizer() override;

  /// sp.encode(text) for text between special tokens, each run encoded on its own (a run after a
  /// control symbol gets its own "▁" prefix), as LlamaTokenizer does in its default legacy mode;
  /// with "legacy": false, as it does then (encode_without_legacy). Throws Error(data) naming the
  /// byte for text that is not UTF-8.
  std::vector<int32_t> encode(std::string_view text) const override;
  /// The spans libsentencepiece reports; a piece with an empty span (the leading bytes of a
  /// byte-fallback character) takes the span of the piece that completes the character.
  Encoding encode_with_offsets(std::string_view text) const override;
  /// BOS before and EOS after `ids`, as tokenizer_config.json's add_bos_token / add_eos_token say
  /// (and only if the model has them).
  std::vector<int32_t> with_special_tokens(std::vector<int32_t> ids) const override;
  /// sp.decode of the ids between special tokens; control symbols, <unk> and appended specials
  /// are written as their text, as LlamaTokenizer's decode does (sp.decode drops control symbols
  /// and writes <unk> as " ⁇ "), so decode(encode(x)) keeps them.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return num_pieces_ + num_extra_specials_; }
  std::string name() const override { return name_; }

 private:
  void read_config(const std::filesystem::path& path);
  /// Throws Error(data) naming the first byte of `text` that is not UTF-8.
  void check_utf8(std::string_view text) const;
  /// LlamaTokenizer's encoding with "legacy": false, spans included.
  Encoding encode_without_legacy(std::string_view text) const;
  /// Calls on_run(text, begin) for runs of plain text and on_special(id, begin, end) for special
  /// tokens, in order.
  template <class OnRun, class OnSpecial>
  void split(std::string_view text, OnRun&& on_run, OnSpecial&& on_special) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  // With "legacy": false: the model without its "▁" prefix, how many pieces the unknown token's
  // text encodes to, and the id of the piece "▁" (-1 if the model has none).
  std::unique_ptr<sentencepiece::SentencePieceProcessor> plain_;
  size_t unk_pieces_ = 0;
  int32_t meta_id_ = -1;
  std::string name_;
  int32_t num_pieces_ = 0;
  int32_t num_extra_specials_ = 0;
  bool add_bos_ = true, add_eos_ = false, legacy_ = true;
  // The specials Forge cuts out of the text itself: all but user-defined symbols, which
  // libsentencepiece matches in the text on its own (and cutting them out would change the "▁"
  // prefixes of the text around them).
  std::vector<std::pair<std::string, int32_t>> cut_specials_;
  std::vector<bool> written_as_text_;  // by id: decode writes the special's text
};

}  // namespace forge
