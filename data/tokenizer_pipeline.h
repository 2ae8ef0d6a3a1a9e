// The stages of a Hugging Face tokenizer.json around its model: normalizers, pre-tokenizers,
// decoders and post-processors, each built from its JSON object with the semantics of Hugging
// Face's `tokenizers` library. Text keeps, byte by byte, the span of the original text it came
// from, so that token offsets point into what the user passed (data/tokenizer_json.cpp runs the
// whole pipeline; docs/data.md lists the components read).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace forge::tokenizer_json {

/// Where a component sits in its file, for errors: the file and the JSON path, e.g.
/// "tokenizer.json" and "pre_tokenizer.pretokenizers[1]".
struct JsonPlace {
  std::string file, path;
  JsonPlace at(std::string_view key) const;  // path + "." + key
  JsonPlace at(size_t index) const;          // path + "[index]"
  /// Error(data) "FILE: PATH: what".
  [[noreturn]] void fail(std::string_view what) const;
};

/// Text under normalisation: `text` and, for each of its bytes, the bytes [first, second) of the
/// original text it stands for (every byte of a character carries the whole character's span, as
/// Hugging Face's alignments do). Inserted text (a Prepend, a Metaspace's "▁") takes the span of
/// its neighbour. While the text is still a verbatim copy of the original from `base` on, `origin`
/// stays empty and spans are computed from the text itself: the common path (no normalizer, a
/// pre-tokenizer that only splits) builds no table.
struct NormalizedText {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> origin;  // empty, or origin.size() == text.size()
  /// Where the original text this stands for starts (Hugging Face's original_shift): the span of
  /// text inserted before the first byte, and what Metaspace's prepend_scheme "first" tests.
  uint32_t base = 0;

  /// `text` as it stands at byte `base` of the original, unchanged.
  static NormalizedText original(std::string_view text, size_t base = 0);
  /// Bytes [begin, end) of the text with their origins.
  NormalizedText slice(size_t begin, size_t end) const;
  /// The original span of bytes [begin, end) (begin < end): from byte begin's start to byte
  /// end - 1's end, which is how Hugging Face maps a token back to the original.
  std::pair<uint32_t, uint32_t> span(size_t begin, size_t end) const;
  /// The original span of the whole text; (base, base) for empty text.
  std::pair<uint32_t, uint32_t> span() const;
  /// Whether `origin` is implicit (the text is its original unchanged).
  bool is_identity() const { return origin.empty(); }
  /// Fills `origin` from the identity mapping, before a change to the text.
  void materialize();
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormalizedText& text) const = 0;
};

/// The pieces a text is split into before the model sees them, in order.
using Pieces = std::vector<NormalizedText>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces each piece by the pieces it splits into, which may rewrite their text (ByteLevel
  /// maps bytes to its alphabet, Metaspace spaces to "▁").
  virtual void pre_tokenize(Pieces& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Hugging Face's decode_chain: token strings in, strings out; the result is their
  /// concatenation.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

/// The string of token `id` as Hugging Face's Encoding holds it (the vocabulary's spelling, e.g.
/// "Ġhello"): what ByteLevel's offset trimming reads.
using TokenText = std::function<std::string_view(int32_t id)>;

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// A single sequence's encoding after the model: with `add_special_tokens`, the special tokens
  /// added around it (offsets (0, 0), like Hugging Face's). Hugging Face runs the post-processor on
  /// every encode, so ByteLevel's and RobertaProcessing's offset trimming applies either way.
  virtual void process(Encoding& encoding, bool add_special_tokens,
                       const TokenText& token_text) const = 0;
};

/// Builders from a component's JSON object; a null node gives nullptr (no such stage). Unknown
/// types, missing or mistyped fields and unsupported options (which would tokenize differently
/// from Hugging Face's) are Error(data) naming the place.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& node, const JsonPlace& place);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& node,
                                                 const JsonPlace& place);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& node, const JsonPlace& place);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& node,
                                                   const JsonPlace& place);

}  // namespace forge::tokenizer_json
