// The stages of a Hugging Face tokenizer.json around its model: normalizers, pre-tokenizers,
// decoders and post-processors, each built from its JSON object with the semantics of Hugging
// Face's `tokenizers` library. Text keeps, byte by byte, the span of the original text it came
// from, so that token offsets point into what the user passed (data/tokenizer_json.cpp runs the
// whole pipeline; docs/data.md lists the components read).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
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
/// original text it stands for. Inserted text (a Prepend, a Metaspace's "▁") takes the span of
/// its neighbour, as Hugging Face's alignments do.
struct NormalizedText {
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> origin;  // origin.size() == text.size()

  /// `text` as it stands at byte `base` of the original, unchanged.
  static NormalizedText original(std::string_view text, size_t base = 0);
  /// Bytes [begin, end) of the text with their origins.
  NormalizedText slice(size_t begin, size_t end) const;
  /// The original span of the whole text: from the first byte's start to the last byte's end.
  std::pair<uint32_t, uint32_t> span() const;
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

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// A single sequence's ids with the special tokens added around them (offsets (0, 0) for
  /// added ones, like Hugging Face's).
  virtual void process(Encoding& encoding) const = 0;
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
