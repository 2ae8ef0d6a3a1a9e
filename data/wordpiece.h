// BERT's WordPiece tokenizer, equal to Hugging Face's BertTokenizer (the Python one): vocab.txt
// holds one token a line (id = line index); text is cleaned, split at whitespace, around
// punctuation and CJK ideographs, optionally lowercased and stripped of accents, and each word is
// cut greedily into the longest vocabulary pieces ("##" marks a piece that continues a word).
// Lossy: decode gives the normalised pieces joined by spaces, not the text that was encoded.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace forge {

/// How BERT's basic tokenisation normalises text, as tokenizer_config.json's keys say.
struct BertTextOptions {
  bool lower_case = true;     // "do_lower_case"
  bool strip_accents = true;  // "strip_accents"; null or absent: the same as do_lower_case
  bool split_chinese = true;  // "tokenize_chinese_chars"
};

/// The words BERT's basic tokenisation makes of `text`, which WordPiece then cuts: U+0000, U+FFFD,
/// invalid UTF-8 and other (C*) characters dropped, split at whitespace and around punctuation and
/// CJK ideographs, lowercased and stripped of accents as `options` say. Special tokens are not
/// recognised here: the tokenizer cuts them out of the text first.
std::vector<std::string> bert_basic_tokenize(std::string_view text, const BertTextOptions& options);

class WordPieceTokenizer final : public Tokenizer {
 public:
  /// Loads dir/vocab.txt and, when it exists, dir/tokenizer_config.json ("do_lower_case",
  /// "strip_accents", "tokenize_chinese_chars"). [PAD] [UNK] [CLS] [SEP] [MASK] found in the
  /// vocabulary are special tokens; `specials` the vocabulary has keep their ids, the others get
  /// ids after it. Throws Error(data) naming the file (and line) for a bad file or no [UNK].
  WordPieceTokenizer(const std::filesystem::path& dir, std::string name,
                     const std::vector<std::string>& specials = {});

  std::vector<int32_t> encode(std::string_view text) const override;
  /// Hugging Face's convert_tokens_to_string: the tokens joined by spaces, then " ##" removed.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return num_tokens_ + num_extra_specials_; }
  std::string name() const override { return name_; }

  /// Words longer than this many characters become [UNK] (max_input_chars_per_word).
  static constexpr size_t kMaxWordChars = 100;

 private:
  void read_vocabulary(const std::filesystem::path& path);
  void read_config(const std::filesystem::path& path);
  void encode_word(std::string_view word, size_t chars, std::vector<int32_t>& out) const;
  std::string_view token(int32_t id) const;

  std::string name_;
  BertTextOptions options_;
  int32_t num_tokens_ = 0;          // lines of vocab.txt
  int32_t num_extra_specials_ = 0;  // configured specials appended after them
  int32_t unk_id_ = -1;
  std::string token_bytes_;  // bytes of token i: [token_offsets_[i], token_offsets_[i + 1])
  std::vector<uint32_t> token_offsets_;
  // Views into token_bytes_: every token, and the "##" tokens without their "##", so that a piece
  // inside a word is looked up as a view of the word itself.
  std::unordered_map<std::string_view, int32_t> start_ids_, continuation_ids_;
  size_t max_start_bytes_ = 0, max_continuation_bytes_ = 0;
};

}  // namespace forge
