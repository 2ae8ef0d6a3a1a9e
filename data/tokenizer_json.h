// Hugging Face's tokenizer.json as a Forge tokenizer: the normalizer, pre-tokenizer, model (BPE or
// WordPiece), post-processor and decoder it names, and its added tokens, with the semantics of
// Hugging Face's `tokenizers` library (ids, offsets and decoded text identical; docs/data.md,
// "tokenizer.json", lists what is read and what is refused).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace forge {
namespace tokenizer_json {
class Normalizer;
class PreTokenizer;
class Decoder;
class PostProcessor;
class Model;
struct NormalizedText;
}  // namespace tokenizer_json

class TokenizerJson final : public Tokenizer {
 public:
  /// Loads `file`; name() reports `name`. `specials` not already added tokens become special
  /// added tokens after the vocabulary. Throws Error(data) "FILE: JSON.PATH: what" for anything
  /// unreadable, inconsistent or not supported.
  TokenizerJson(const std::filesystem::path& file, std::string name,
                const std::vector<std::string>& specials = {});
  ~TokenizerJson() override;

  /// Hugging Face's encode(text, add_special_tokens=False). Throws Error(data) naming the byte
  /// where `text` stops being UTF-8.
  std::vector<int32_t> encode(std::string_view text) const override;
  /// Hugging Face's decode(ids, skip_special_tokens=False).
  std::string decode(const std::vector<int32_t>& ids) const override;
  /// Offsets are bytes of `text`, through the normalizer's alignments.
  Encoding encode_with_offsets(std::string_view text) const override;
  /// The post_processor's template for a single sequence.
  std::vector<int32_t> with_special_tokens(std::vector<int32_t> ids) const override;
  /// Line starts (detail::line_start_cuts) when the pipeline is a byte-level BPE behind GPT-2's,
  /// Llama 3's or Qwen2's pattern with no normalizer but NFC; none for any other pipeline.
  std::vector<size_t> independent_cuts(std::string_view text, size_t every) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::string name() const override { return name_; }

 private:
  struct AddedToken {
    std::string content;
    std::string decoded;  // how decode spells it: the normalized content when normalized
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
  };
  /// Leftmost-longest matching of added tokens' patterns (Hugging Face's Aho-Corasick tries).
  class Matcher {
   public:
    void add(std::string_view pattern, size_t token);
    /// The token whose pattern is the longest starting at text[at], or -1; sets `end`.
    int64_t longest_at(std::string_view text, size_t at, size_t& end) const;
    bool empty() const { return nodes_.size() <= 1; }

   private:
    struct Node {
      std::vector<std::pair<uint8_t, uint32_t>> children;
      int64_t token = -1;
    };
    std::vector<Node> nodes_ = std::vector<Node>(1);
    bool first_byte_[256] = {};
  };
  struct Split;

  void read_added_tokens(const nlohmann::json& root, const std::vector<std::string>& specials);
  /// Hugging Face's AddedVocabulary::find_matches: `text` cut at the matches of `matcher`.
  void find_matches(tokenizer_json::NormalizedText text, const Matcher& matcher,
                    std::vector<Split>& out) const;
  /// The string Hugging Face's Encoding holds for token `id` (its offset trimming reads it).
  std::string_view token_text(int32_t id) const;
  /// The whole pipeline; `offsets` may be null.
  void run(std::string_view text, std::vector<int32_t>& ids,
           std::vector<std::pair<size_t, size_t>>* offsets) const;

  std::string file_, name_;
  std::unique_ptr<tokenizer_json::Normalizer> normalizer_;
  std::unique_ptr<tokenizer_json::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer_json::Model> model_;
  std::unique_ptr<tokenizer_json::PostProcessor> post_processor_;
  std::unique_ptr<tokenizer_json::Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::vector<int32_t> added_of_id_;  // index into added_ by id, or -1
  Matcher raw_matcher_, normalized_matcher_;
  int32_t vocab_size_ = 0;
  bool line_cuts_ = false;  // independent_cuts may cut at line starts
};

}  // namespace forge
