// The tokenizer interface shared by data preparation, loaders and the CLI, and the factory that
// builds one by name: `bytes` (256 byte values plus configured special tokens), `gpt2` (the GPT-2
// byte-level BPE shipped in data/tokenizers/gpt2) or a directory holding Hugging Face's
// tokenizer.json, a SentencePiece model (tokenizer.model), a byte-level BPE (encoder.json +
// vocab.bpe, or Hugging Face's vocab.json + merges.txt) or a BERT WordPiece vocabulary (vocab.txt).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge {

/// Token ids and, for each, the bytes [begin, end) of the encoded text it stands for (a token of a
/// normalised or byte-fallback text may share its span with its neighbours; spans never go
/// backwards).
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, size_t>> offsets;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text` (any bytes, UTF-8 or not); special tokens in the text become their ids.
  /// Called from several threads at once (forge prepare encodes on every core).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  /// The text the ids stand for. Lossless for `bytes` and the byte-level BPEs: decode(encode(x))
  /// == x for every byte string x. WordPiece is lossy (case, accents, whitespace, unknown words):
  /// its decode gives the tokens joined by spaces. Throws Error(data) for an id outside
  /// [0, vocab_size()).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// encode() with each id's span of `text`: how a chat conversation's assistant turns, found as
  /// character ranges of the rendered text, become a loss mask over tokens. The default serves
  /// tokenizers whose decode() of each id concatenates back to the text (bytes, byte-level BPE);
  /// others override it.
  virtual Encoding encode_with_offsets(std::string_view text) const;
  /// `ids` (a whole text's encode()) with the special tokens the tokenizer's post-processor adds
  /// around a text, e.g. Llama's BOS (tokenizer.json's post_processor, tokenizer_config.json's
  /// add_bos_token). The default adds none.
  virtual std::vector<int32_t> with_special_tokens(std::vector<int32_t> ids) const { return ids; }
  /// Increasing positions in `text`, each at least `every` bytes after the one before, where the
  /// text may be cut and its parts encoded apart: their ids, concatenated, are encode(text)'s.
  /// How forge prepare spreads one large document over cores. None by default.
  virtual std::vector<size_t> independent_cuts(std::string_view /*text*/, size_t /*every*/) const {
    return {};
  }
  /// Number of ids, special tokens included.
  virtual int32_t vocab_size() const = 0;
  /// What the tokenizer is, e.g. "bytes" or "gpt2" (recorded in prepared datasets).
  virtual std::string name() const = 0;

  /// The text `ids` add after `prompt_ids`: decode(prompt + ids) past decode(prompt), or
  /// decode(ids) when the first does not start with the second. How a sampled continuation is
  /// printed or scored: SentencePiece drops the "▁" a decoded text starts with, which after a
  /// prompt is the space the continuation starts with.
  std::string decode_continuation(const std::vector<int32_t>& prompt_ids,
                                  const std::vector<int32_t>& ids) const;
  /// Id of a special token such as "<|endoftext|>" or "[PAD]", if this tokenizer has it.
  std::optional<int32_t> special_id(std::string_view token) const;
  /// Special tokens in id order, with their ids.
  const std::vector<std::pair<std::string, int32_t>>& specials() const { return specials_; }

 protected:
  /// Registers a special token (subclasses call this while building; ids must be unique).
  void add_special(std::string token, int32_t id);
  std::vector<std::pair<std::string, int32_t>> specials_;
};

/// Bytes 0..255 are ids 0..255; special tokens get ids 256, 257, ... in the order given.
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(const std::vector<std::string>& specials = {});
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return 256 + static_cast<int32_t>(specials_.size()); }
  std::string name() const override { return "bytes"; }
};

/// Where Forge's shipped tokenizer `name` ("gpt2") lives: data/tokenizers/NAME of the source tree
/// the binary was built from, recorded at build time (CMakeLists.txt), so the name works from any
/// working directory.
std::filesystem::path shipped_tokenizer_dir(const std::string& name);

/// "bytes", "gpt2" (shipped_tokenizer_dir), a path to a tokenizer.json file (TokenizerJson), a
/// SentencePiece model file NAME.model (SentencePieceTokenizer) or a directory, named after it,
/// with encoder.json + vocab.bpe (BpeTokenizer), else tokenizer.json (TokenizerJson), else
/// tokenizer.model (SentencePieceTokenizer), else vocab.json + merges.txt (BpeTokenizer), or else
/// vocab.txt (WordPieceTokenizer). `specials` are extra special tokens appended after the
/// vocabulary (tokens the vocabulary already has as specials, like "<|endoftext|>" in gpt2, keep
/// their id).
/// Throws Error(data) naming the path for an unknown name, a missing directory or a corrupt file.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name_or_dir,
                                          const std::vector<std::string>& specials = {});

/// 16 hex digits identifying the vocabulary (every id's bytes and the special tokens): prepared
/// datasets record it so that data tokenized one way is never read with another tokenizer.
std::string vocabulary_hash(const Tokenizer& tokenizer);

namespace detail {
/// independent_cuts for byte-level BPEs whose pre-tokenizer splits as GPT-2's or Llama 3's pattern
/// does: after a line that ends in a visible ASCII character, before a line that starts with an
/// ASCII letter, every such pattern ends a piece (the newline is its own piece or ends a
/// punctuation run, and a letter run cannot take a newline in front of it), so the parts encode
/// apart to the same ids. Cuts within the length of one of `avoid` (the added tokens) of a cut are
/// skipped, so no token is split or loses the whitespace it strips.
std::vector<size_t> line_start_cuts(std::string_view text, size_t every,
                                    const std::vector<std::string_view>& avoid);

/// Splits `text` at special-token occurrences (leftmost first; at equal positions the earlier
/// registered token wins), calling on_text(piece) for text between them and on_special(id).
template <class OnText, class OnSpecial>
void split_specials(std::string_view text,
                    const std::vector<std::pair<std::string, int32_t>>& specials, OnText&& on_text,
                    OnSpecial&& on_special) {
  // next[k]: position of special k's next occurrence at or after `start`, refreshed only when
  // passed, so text with many specials stays linear.
  std::vector<size_t> next(specials.size(), 0);
  for (size_t k = 0; k < specials.size(); ++k) next[k] = text.find(specials[k].first);
  size_t start = 0;
  while (true) {
    size_t best = specials.size();
    for (size_t k = 0; k < specials.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < start)
        next[k] = text.find(specials[k].first, start);
      if (next[k] != std::string_view::npos && (best == specials.size() || next[k] < next[best]))
        best = k;
    }
    if (best == specials.size()) {
      if (start < text.size()) on_text(text.substr(start));
      return;
    }
    if (next[best] > start) on_text(text.substr(start, next[best] - start));
    on_special(specials[best].second);
    start = next[best] + specials[best].first.size();
  }
}
}  // namespace detail

}  // namespace forge
