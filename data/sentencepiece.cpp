// SentencePieceTokenizer over libsentencepiece's SentencePieceProcessor: the model is read with
// Forge's input-file checks and handed to the library as bytes; Forge only cuts special tokens out
// of the text, checks it is UTF-8, widens byte-fallback spans and adds BOS/EOS. Encode and Decode
// are const in the library and keep no state between calls (python3-sentencepiece's batch encode
// runs one processor from many threads), so one tokenizer serves many threads.
#include "data/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"
#include "data/tokenizer_config.h"
#include "data/unicode.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// The protobuf wire format, just enough to read each piece's type (sentencepiece_model.proto:
// ModelProto.pieces = 1, SentencePiece.type = 3, USER_DEFINED = 4).
bool read_varint(std::string_view s, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < s.size(); shift += 7) {
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Calls on_field(field, wire_type, varint, bytes) for each field of the message `s`; false if its
// framing is broken (a length past the end, an unknown wire type).
template <class OnField>
bool for_each_field(std::string_view s, OnField&& on_field) {
  for (size_t at = 0; at < s.size();) {
    uint64_t key = 0, v = 0;
    if (!read_varint(s, at, key)) return false;
    std::string_view bytes;
    switch (key & 7) {
      case 0:
        if (!read_varint(s, at, v)) return false;
        break;
      case 1:
        if (s.size() - at < 8) return false;
        at += 8;
        break;
      case 2:
        if (!read_varint(s, at, v) || v > s.size() - at) return false;
        bytes = s.substr(at, v);
        at += v;
        break;
      case 5:
        if (s.size() - at < 4) return false;
        at += 4;
        break;
      default:
        return false;
    }
    if (!on_field(key >> 3, key & 7, v, bytes)) return false;
  }
  return true;
}

// Ids of the model's USER_DEFINED pieces: the library's header (Debian installs no ModelProto
// header) has IsControl and IsByte but no IsUserDefined. nullopt for broken framing.
std::optional<std::vector<int32_t>> user_defined_ids(std::string_view proto) {
  std::vector<int32_t> ids;
  int32_t id = 0;
  const bool ok =
      for_each_field(proto, [&](uint64_t field, uint64_t wire, uint64_t, std::string_view piece) {
        if (field != 1) return true;
        if (wire != 2) return false;
        uint64_t type = 1;  // NORMAL, the default a piece omits
        const bool piece_ok =
            for_each_field(piece, [&](uint64_t f, uint64_t w, uint64_t v, std::string_view) {
              if (f == 3 && w == 0) type = v;
              return true;
            });
        if (type == 4) ids.push_back(id);
        ++id;
        return piece_ok;
      });
  if (!ok) return std::nullopt;
  return ids;
}

void check(const sentencepiece::util::Status& status, const std::string& name) {
  if (!status.ok())
    throw Error(ExitCode::data,
                detail::concat("tokenizer ", printable(name),
                               ": libsentencepiece: ", printable(status.error_message())));
}

// The pieces of `spt` from the `skip`th on, with their spans moved back by `shift` bytes (what was
// put in front of the run) and on by `begin` (where the run starts); a piece with an empty span
// takes the span of the piece after it that starts at the same byte, so every byte piece of a
// byte-fallback character spans the character.
void append_pieces(const sentencepiece::ImmutableSentencePieceText& spt, size_t skip, size_t shift,
                   size_t begin, Encoding& out) {
  const size_t first = out.ids.size();
  for (size_t k = skip; k < spt.pieces_size(); ++k) {
    const auto piece = spt.pieces(static_cast<int>(k));
    out.ids.push_back(static_cast<int32_t>(piece.id()));
    out.offsets.emplace_back(begin + std::max<size_t>(piece.begin(), shift) - shift,
                             begin + std::max<size_t>(piece.end(), shift) - shift);
  }
  // From the back, so that each empty span sees the widened span after it.
  for (size_t k = out.ids.size(); k-- > first + 1;) {
    auto& prev = out.offsets[k - 1];
    if (prev.first == prev.second && prev.first == out.offsets[k].first) prev = out.offsets[k];
  }
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const fs::path& model_file, std::string name,
                                               const std::vector<std::string>& specials)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), name_(std::move(name)) {
  const std::string where = quoted_path(model_file.string());
  const std::string proto = read_input_file(model_file.string(), kTokenizerInput);
  if (proto.empty())
    throw Error(ExitCode::data, where + ": empty file (expected a SentencePiece model)");
  const std::optional<std::vector<int32_t>> user_defined = user_defined_ids(proto);
  if (!user_defined)
    throw Error(ExitCode::data,
                where +
                    ": not a SentencePiece model (its protobuf framing is broken: truncated "
                    "or not a model file)");
  if (const auto status = sp_->LoadFromSerializedProto(proto); !status.ok())
    throw Error(ExitCode::data,
                detail::concat(where, ": not a SentencePiece model (libsentencepiece: ",
                               printable(status.error_message()), ")"));
  num_pieces_ = sp_->GetPieceSize();
  written_as_text_.assign(static_cast<size_t>(num_pieces_), false);
  for (int32_t id = 0; id < num_pieces_; ++id) {
    const bool user = std::binary_search(user_defined->begin(), user_defined->end(), id);
    if (!user && !sp_->IsControl(id) && !sp_->IsUnknown(id)) continue;
    add_special(sp_->IdToPiece(id), id);
    if (!user) cut_specials_.emplace_back(sp_->IdToPiece(id), id);
    written_as_text_[static_cast<size_t>(id)] = !user;
  }
  for (const std::string& s : specials) {
    if (special_id(s)) continue;
    const int32_t piece = sp_->PieceToId(s);
    const bool in_model = piece >= 0 && sp_->IdToPiece(piece) == s;
    const int32_t id = in_model ? piece : num_pieces_ + num_extra_specials_++;
    add_special(s, id);
    cut_specials_.emplace_back(s, id);
    if (!in_model) written_as_text_.push_back(true);
  }
  const fs::path config = model_file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) read_config(config);
  if (legacy_) return;
  // LlamaTokenizer turns the model's add_dummy_prefix off by merging a NormalizerSpec into the
  // ModelProto; appended to the serialized message, the same field (normalizer_spec = 3, its
  // add_dummy_prefix = 3, false) merges the same way.
  plain_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  check(plain_->LoadFromSerializedProto(proto + std::string("\x1a\x02\x18\x00", 4)), name_);
  std::vector<int> unk_ids;
  check(plain_->Encode(sp_->IdToPiece(sp_->unk_id()), &unk_ids), name_);
  unk_pieces_ = unk_ids.size();
  const int32_t meta = sp_->PieceToId("\xE2\x96\x81");
  meta_id_ = sp_->IdToPiece(meta) == "\xE2\x96\x81" ? meta : -1;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::read_config(const fs::path& path) {
  const TokenizerConfig config(path);
  // LlamaTokenizer adds BOS when add_bos_token is truthy: null adds none, as false does.
  auto flag = [&](const char* key, bool fallback) {
    const bool null = config.json().contains(key) && config.json()[key].is_null();
    return null ? false : config.flag(key, false).value_or(fallback);
  };
  add_bos_ = flag("add_bos_token", true);
  add_eos_ = flag("add_eos_token", false);
  legacy_ = config.flag("legacy", true).value_or(true);  // null is LlamaTokenizer's default
}

void SentencePieceTokenizer::check_utf8(std::string_view text) const {
  // libsentencepiece takes any bytes and encodes a malformed sequence as if it were U+FFFD, which
  // would silently train on text that is not there.
  if (const size_t bad = unicode::first_invalid_utf8(text); bad != std::string_view::npos)
    throw Error(ExitCode::data,
                detail::concat("tokenizer ", printable(name_), ": invalid UTF-8 at byte ", bad + 1,
                               " of the text"));
}

template <class OnRun, class OnSpecial>
void SentencePieceTokenizer::split(std::string_view text, OnRun&& on_run,
                                   OnSpecial&& on_special) const {
  size_t at = 0;
  detail::split_specials(
      text, cut_specials_,
      [&](std::string_view run) {
        at = static_cast<size_t>(run.data() - text.data());
        on_run(run, at);
        at += run.size();
      },
      [&](int32_t id) {
        size_t length = 0;
        for (const auto& [token, token_id] : cut_specials_)
          if (token_id == id) length = token.size();
        on_special(id, at, at + length);
        at += length;
      });
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  if (plain_) return encode_with_offsets(text).ids;
  check_utf8(text);
  std::vector<int32_t> ids;
  std::vector<int> run_ids;
  split(
      text,
      [&](std::string_view run, size_t) {
        check(sp_->Encode(run, &run_ids), name_);
        ids.insert(ids.end(), run_ids.begin(), run_ids.end());
      },
      [&](int32_t id, size_t, size_t) { ids.push_back(id); });
  return ids;
}

Encoding SentencePieceTokenizer::encode_with_offsets(std::string_view text) const {
  check_utf8(text);
  if (plain_) return encode_without_legacy(text);
  Encoding out;
  split(
      text,
      [&](std::string_view run, size_t begin) {
        sentencepiece::ImmutableSentencePieceText spt;
        check(sp_->Encode(run, spt.mutable_proto()), name_);
        append_pieces(spt, 0, 0, begin, out);
      },
      [&](int32_t id, size_t begin, size_t end) {
        out.ids.push_back(id);
        out.offsets.emplace_back(begin, end);
      });
  return out;
}

// LlamaTokenizer's tokenize and _tokenize when tokenizer_config.json says "legacy": false: "▁" in
// the text becomes a space and one "▁" goes in front of the whole text, the model runs without its
// own "▁" prefix (so a run after a special token gets none), a run that starts with a space is
// encoded behind the unknown token's text, whose pieces are then dropped (so that the model cannot
// strip the space), and a lone leading "▁" before a special token is dropped.
Encoding SentencePieceTokenizer::encode_without_legacy(std::string_view text) const {
  Encoding out;
  if (text.empty()) return out;
  constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space
  std::string shifted(kMeta);
  std::vector<size_t> origin(kMeta.size(), 0);  // byte of `text` each byte of `shifted` comes from
  for (size_t i = 0; i < text.size();) {
    const bool meta = text.substr(i, kMeta.size()) == kMeta;
    shifted += meta ? ' ' : text[i];
    origin.push_back(i);
    i += meta ? kMeta.size() : 1;
  }
  origin.push_back(text.size());
  const std::string& unk = sp_->IdToPiece(sp_->unk_id());
  split(
      shifted,
      [&](std::string_view run, size_t begin) {
        const bool spaced = run.front() == ' ' || run.substr(0, kMeta.size()) == kMeta;
        sentencepiece::ImmutableSentencePieceText spt;
        check(
            plain_->Encode(spaced ? unk + std::string(run) : std::string(run), spt.mutable_proto()),
            name_);
        const bool cut = spaced && spt.pieces_size() >= unk_pieces_;
        append_pieces(spt, cut ? unk_pieces_ : 0, spaced ? unk.size() : 0, begin, out);
      },
      [&](int32_t id, size_t begin, size_t end) {
        out.ids.push_back(id);
        out.offsets.emplace_back(begin, end);
      });
  if (out.ids.size() > 1 && out.ids[0] == meta_id_ &&
      std::any_of(cut_specials_.begin(), cut_specials_.end(),
                  [&](const auto& special) { return special.second == out.ids[1]; })) {
    out.ids.erase(out.ids.begin());
    out.offsets.erase(out.offsets.begin());
  }
  for (auto& [begin, end] : out.offsets) begin = origin[begin], end = origin[end];
  return out;
}

std::vector<int32_t> SentencePieceTokenizer::with_special_tokens(std::vector<int32_t> ids) const {
  if (add_bos_ && sp_->bos_id() >= 0) ids.insert(ids.begin(), sp_->bos_id());
  if (add_eos_ && sp_->eos_id() >= 0) ids.push_back(sp_->eos_id());
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out, piece;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    check(sp_->Decode(run, &piece), name_);
    out += piece;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error(ExitCode::data, detail::concat("tokenizer ", printable(name_), ": token id ", id,
                                                 " is outside [0, ", vocab_size(), ")"));
    if (!written_as_text_[static_cast<size_t>(id)]) {
      run.push_back(id);
      continue;
    }
    flush();
    for (const auto& [token, token_id] : specials_)
      if (token_id == id) out += token;
  }
  flush();
  return out;
}

}  // namespace forge
