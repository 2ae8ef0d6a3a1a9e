// tokenizer.json's normalizers, pre-tokenizers, decoders and post-processors against what Hugging
// Face's own library makes of the same JSON (tests/golden/tokenizer_pipeline.jsonl, written by
// tests/golden/make_tokenizer_pipeline_goldens.mjs with the npm `tokenizers`): normalized text,
// pieces and, through a model with one token per character, every character's offsets; decoded
// text; post-processed ids and offsets. Then the errors, each naming its JSON path, and
// NormalizedText's implicit identity origin against a materialised one.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <fstream>
#include <map>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_pipeline.h"
#include "data/tokenizer_unicode_tables.h"
#include "data/unicode.h"

namespace forge::tokenizer_json {
namespace {

using nlohmann::json;
using Offsets = std::vector<std::pair<size_t, size_t>>;

const JsonPlace kPlace{"tokenizer.json", ""};

std::vector<json> goldens(const std::string& kind) {
  std::ifstream in(std::string(FORGE_SOURCE_DIR) + "/tests/golden/tokenizer_pipeline.jsonl");
  EXPECT_TRUE(in) << "missing tests/golden/tokenizer_pipeline.jsonl";
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j["kind"] == kind) out.push_back(std::move(j));
  }
  EXPECT_FALSE(out.empty());
  return out;
}

Offsets offsets_of(const json& j) {
  Offsets out;
  for (const json& o : j) out.push_back({o[0].get<size_t>(), o[1].get<size_t>()});
  return out;
}

// Hugging Face's encode with a model that makes each character of each piece a token: the text
// split at special tokens, each part normalized and pre-tokenized.
struct CharTokens {
  std::vector<std::string> tokens;
  Offsets offsets;
};

CharTokens char_tokens(const Normalizer* normalizer, const PreTokenizer* pre_tokenizer,
                       const std::vector<std::string>& specials, const std::string& text) {
  std::vector<std::pair<std::string, int32_t>> ids;
  for (size_t k = 0; k < specials.size(); ++k) ids.push_back({specials[k], int32_t(k)});
  CharTokens out;
  size_t at = 0;
  detail::split_specials(
      text, ids,
      [&](std::string_view part) {
        const size_t base = static_cast<size_t>(part.data() - text.data());
        at = base + part.size();
        Pieces pieces{NormalizedText::original(part, base)};
        if (normalizer) normalizer->normalize(pieces[0]);
        if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
        for (const NormalizedText& piece : pieces)
          for (size_t i = 0; i < piece.text.size();) {
            uint32_t cp = 0;
            const int n = unicode::utf8_decode(piece.text, i, cp);
            const size_t len = n > 0 ? static_cast<size_t>(n) : 1;
            out.tokens.push_back(piece.text.substr(i, len));
            const auto [b, e] = piece.span(i, i + len);
            out.offsets.push_back({b, e});
            i += len;
          }
      },
      [&](int32_t id) {
        const std::string& s = specials[static_cast<size_t>(id)];
        const size_t begin = text.find(s, at);
        out.tokens.push_back(s);
        out.offsets.push_back({begin, begin + s.size()});
        at = begin + s.size();
      });
  return out;
}

std::string where(const json& g) {
  return "normalizer " + g["normalizer"].dump() + "\npre_tokenizer " + g["pre_tokenizer"].dump() +
         "\nspecials " + g["specials"].dump() + "\ntext " + g["text"].dump();
}

TEST(TokenizerPipeline, EncodeMatchesHuggingFace) {
  size_t checked = 0;
  for (const json& g : goldens("encode")) {
    const auto normalizer = make_normalizer(g["normalizer"], kPlace.at("normalizer"));
    const auto pre_tokenizer = make_pre_tokenizer(g["pre_tokenizer"], kPlace.at("pre_tokenizer"));
    const std::string text = g["text"];
    const CharTokens got = char_tokens(normalizer.get(), pre_tokenizer.get(), g["specials"], text);
    EXPECT_EQ(got.tokens, g["tokens"].get<std::vector<std::string>>()) << where(g);
    EXPECT_EQ(got.offsets, offsets_of(g["offsets"])) << where(g);
    if (g.contains("normalized")) {
      NormalizedText t = NormalizedText::original(text);
      if (normalizer) normalizer->normalize(t);
      EXPECT_EQ(t.text, g["normalized"].get<std::string>()) << where(g);
    }
    if (g.contains("pieces")) {
      Pieces pieces{NormalizedText::original(text)};
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
      json got_pieces = json::array();
      for (const NormalizedText& p : pieces) {
        const auto [b, e] = p.span();
        got_pieces.push_back({p.text, {b, e}});
      }
      EXPECT_EQ(got_pieces, g["pieces"]) << where(g);
    }
    ++checked;
  }
  EXPECT_GT(checked, 900u);
}

TEST(TokenizerPipeline, DecodeMatchesHuggingFace) {
  for (const json& g : goldens("decode")) {
    const auto decoder = make_decoder(g["decoder"], kPlace.at("decoder"));
    std::vector<std::string> tokens = g["tokens"];
    decoder->decode_chain(tokens);
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    EXPECT_EQ(joined, g["decoded"].get<std::string>())
        << g["decoder"].dump() << " " << g["tokens"].dump();
  }
}

TEST(TokenizerPipeline, PostProcessMatchesHuggingFace) {
  for (const json& g : goldens("post")) {
    const auto pre_tokenizer = make_pre_tokenizer(g["pre_tokenizer"], kPlace.at("pre_tokenizer"));
    const auto processor = make_post_processor(g["post_processor"], kPlace.at("post_processor"));
    std::map<int32_t, std::string> token_of;
    for (const auto& [token, id] : g["vocab"].items()) token_of[id.get<int32_t>()] = token;
    Pieces pieces{NormalizedText::original(g["text"].get<std::string>())};
    pre_tokenizer->pre_tokenize(pieces);
    Encoding encoding;
    for (const NormalizedText& p : pieces) {
      encoding.ids.push_back(g["vocab"][p.text].get<int32_t>());
      const auto [b, e] = p.span();
      encoding.offsets.push_back({b, e});
    }
    processor->process(encoding, g["add_special_tokens"], [&](int32_t id) -> std::string_view {
      const auto it = token_of.find(id);
      return it == token_of.end() ? std::string_view() : std::string_view(it->second);
    });
    const std::string context = g["post_processor"].dump() + " " + g["pre_tokenizer"].dump() + " " +
                                g["text"].dump() + " " + g["add_special_tokens"].dump();
    EXPECT_EQ(encoding.ids, g["ids"].get<std::vector<int32_t>>()) << context;
    EXPECT_EQ(encoding.offsets, offsets_of(g["offsets"])) << context;
  }
}

// NFC of every character the normalisation tables decompose gives the character back, unless
// Unicode excludes it from composition (utf8proc's own NFC says which): decomposition, canonical
// ordering and the composition lookup all take part.
TEST(TokenizerPipeline, NfcRecomposesEveryDecomposableCharacter) {
  const auto nfc = make_normalizer(json{{"type", "NFC"}}, kPlace.at("normalizer"));
  const auto nfd = make_normalizer(json{{"type", "NFD"}}, kPlace.at("normalizer"));
  size_t checked = 0;
  for (const auto& r : hf_unicode::kDecomposable)
    for (uint32_t c = r.lo; c <= r.hi; ++c) {
      std::string s;
      unicode::append_utf8(c, s);
      uint8_t* reference = utf8proc_NFC(reinterpret_cast<const uint8_t*>(s.c_str()));
      const bool stable = s == reinterpret_cast<const char*>(reference);
      free(reference);
      NormalizedText t = NormalizedText::original(s);
      nfd->normalize(t);
      if (!stable || t.text == s) continue;  // excluded, or a compatibility decomposition only
      nfc->normalize(t);
      ASSERT_EQ(t.text, s) << std::hex << c;
      ++checked;
    }
  EXPECT_GT(checked, 12000u);
}

TEST(TokenizerPipeline, IdentityOriginMatchesMaterialised) {
  const std::string text = "a\u00e9\xff\u4e2d\U0001F44B\x80z";
  const NormalizedText identity = NormalizedText::original(text, 7);
  NormalizedText table = identity;
  table.materialize();
  ASSERT_FALSE(table.is_identity());
  const std::vector<size_t> boundaries = {0, 1, 3, 4, 7, 11, 12, 13};  // of each character
  for (size_t b : boundaries)
    for (size_t e : boundaries) {
      if (e <= b) continue;
      EXPECT_EQ(identity.span(b, e), table.span(b, e)) << b << " " << e;
      const NormalizedText x = identity.slice(b, e), y = table.slice(b, e);
      EXPECT_EQ(x.text, y.text);
      EXPECT_EQ(x.base, y.base);
      EXPECT_EQ(x.span(), y.span());
    }
  EXPECT_EQ(identity.span(1, 3), (std::pair<uint32_t, uint32_t>{8, 10}));   // é
  EXPECT_EQ(identity.span(2, 3), (std::pair<uint32_t, uint32_t>{8, 10}));   // é's second byte
  EXPECT_EQ(identity.span(3, 4), (std::pair<uint32_t, uint32_t>{10, 11}));  // a stray byte alone
  EXPECT_EQ(NormalizedText::original("", 5).span(), (std::pair<uint32_t, uint32_t>{5, 5}));
}

// Each refusal is Error(data) naming the file and the JSON path of the offending value.
TEST(TokenizerPipeline, ErrorsNameTheJsonPath) {
  struct Case {
    const char* stage;
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {"normalizer", R"({"type": "Nope"})",
       "tokenizer.json: normalizer.type: unknown normalizer \"Nope\""},
      {"normalizer", R"([1])", "tokenizer.json: normalizer: expected an object, got array"},
      {"normalizer", R"({"kind": "NFC"})", "tokenizer.json: normalizer.type: missing"},
      {"normalizer", R"({"type": 3})",
       "tokenizer.json: normalizer.type: expected a string, got number"},
      {"normalizer", R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "X"}]})",
       "tokenizer.json: normalizer.normalizers[1].type: unknown normalizer \"X\""},
      {"normalizer", R"({"type": "Sequence", "normalizers": [null]})",
       "tokenizer.json: normalizer.normalizers[0]: expected an object, got null"},
      {"normalizer", R"({"type": "Sequence"})", "tokenizer.json: normalizer.normalizers: missing"},
      {"normalizer", R"({"type": "Sequence", "normalizers": {}})",
       "tokenizer.json: normalizer.normalizers: expected an array, got object"},
      {"normalizer", R"({"type": "Precompiled", "precompiled_charsmap": "AAAA"})",
       "tokenizer.json: normalizer.type: Precompiled is not supported: it applies a "
       "SentencePiece normalisation charsmap"},
      {"normalizer", R"({"type": "Replace", "pattern": {"Regex": "(a"}, "content": ""})",
       "tokenizer.json: normalizer.pattern.Regex: invalid regex \"(a\": end pattern with "
       "unmatched parenthesis"},
      {"normalizer", R"({"type": "Replace", "pattern": {"Glob": "*"}, "content": ""})",
       "tokenizer.json: normalizer.pattern: expected {\"String\": ...} or {\"Regex\": ...}"},
      {"normalizer", R"({"type": "Replace", "pattern": {"String": 1}, "content": ""})",
       "tokenizer.json: normalizer.pattern.String: expected a string, got number"},
      {"normalizer", R"({"type": "Replace", "pattern": {"String": " "}})",
       "tokenizer.json: normalizer.content: missing"},
      {"normalizer", R"({"type": "Prepend", "prepend": null})",
       "tokenizer.json: normalizer.prepend: expected a string, got null"},
      {"normalizer", R"({"type": "Strip", "strip_left": true, "strip_right": "yes"})",
       "tokenizer.json: normalizer.strip_right: expected true or false, got string"},
      {"normalizer",
       R"({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
           "strip_accents": 1, "lowercase": true})",
       "tokenizer.json: normalizer.strip_accents: expected true or false, got number"},
      {"normalizer",
       R"({"type": "BertNormalizer", "handle_chinese_chars": true, "lowercase": true})",
       "tokenizer.json: normalizer.clean_text: missing"},
      {"pre_tokenizer", R"({"type": "UnicodeScripts"})",
       "tokenizer.json: pre_tokenizer.type: unknown pre-tokenizer \"UnicodeScripts\""},
      {"pre_tokenizer",
       R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"},
           "behavior": "Dropped", "invert": false}]})",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: unknown behavior \"Dropped\""},
      {"pre_tokenizer",
       R"({"type": "Split", "pattern": {"Regex": "[a"}, "behavior": "Isolated", "invert": false})",
       "tokenizer.json: pre_tokenizer.pattern.Regex: invalid regex \"[a\": premature end of "
       "char-class"},
      {"pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated"})",
       "tokenizer.json: pre_tokenizer.invert: missing"},
      {"pre_tokenizer", R"({"type": "ByteLevel", "add_prefix_space": false})",
       "tokenizer.json: pre_tokenizer.trim_offsets: missing"},
      {"pre_tokenizer",
       R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": 0})",
       "tokenizer.json: pre_tokenizer.use_regex: expected true or false, got number"},
      {"pre_tokenizer", R"({"type": "Metaspace", "replacement": "__"})",
       "tokenizer.json: pre_tokenizer.replacement: expected a single character, got \"__\""},
      {"pre_tokenizer", R"({"type": "Metaspace", "replacement": "_", "prepend_scheme": "once"})",
       "tokenizer.json: pre_tokenizer.prepend_scheme: unknown prepend_scheme \"once\""},
      {"pre_tokenizer",
       R"({"type": "Metaspace", "replacement": "_", "prepend_scheme": "always",
           "add_prefix_space": false})",
       "tokenizer.json: pre_tokenizer.add_prefix_space: false does not match prepend_scheme"},
      {"pre_tokenizer", R"({"type": "Digits"})",
       "tokenizer.json: pre_tokenizer.individual_digits: missing"},
      {"pre_tokenizer", R"({"type": "Punctuation", "behavior": 2})",
       "tokenizer.json: pre_tokenizer.behavior: expected a string, got number"},
      {"decoder", R"({"type": "CTC", "pad_token": "<pad>"})",
       "tokenizer.json: decoder.type: CTC is not supported"},
      {"decoder", R"({"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Bogus"}]})",
       "tokenizer.json: decoder.decoders[1].type: unknown decoder \"Bogus\""},
      {"decoder", R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})",
       "tokenizer.json: decoder.start: expected an integer from 0 to 4294967295, got -1"},
      {"decoder", R"({"type": "Strip", "content": "", "start": 1, "stop": 0})",
       "tokenizer.json: decoder.content: expected a single character, got \"\""},
      {"decoder", R"({"type": "WordPiece", "prefix": "##"})",
       "tokenizer.json: decoder.cleanup: missing"},
      {"decoder", R"({"type": "BPEDecoder"})", "tokenizer.json: decoder.suffix: missing"},
      {"decoder", R"({"type": "Metaspace", "replacement": 5})",
       "tokenizer.json: decoder.replacement: expected a string, got number"},
      {"decoder", R"({"type": "ByteLevel", "add_prefix_space": true})",
       "tokenizer.json: decoder.trim_offsets: missing"},
      {"post_processor", R"({"type": "Nope"})",
       "tokenizer.json: post_processor.type: unknown post-processor \"Nope\""},
      {"post_processor", R"({"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]"]})",
       "tokenizer.json: post_processor.cls: expected [token, id]"},
      {"post_processor",
       R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", -1],
           "trim_offsets": true, "add_prefix_space": true})",
       "tokenizer.json: post_processor.cls[1]: expected an integer from 0 to 2147483647, got -1"},
      {"post_processor", R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})",
       "tokenizer.json: post_processor.trim_offsets: missing"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
           "pair": [], "special_tokens": {}})",
       "tokenizer.json: post_processor.single[0].SpecialToken.id: \"<s>\" is not in "
       "special_tokens"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}],
           "pair": [], "special_tokens": {}})",
       "tokenizer.json: post_processor.single[0].Sequence.id: the single template cannot use "
       "sequence B"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"Seq": {}}], "special_tokens": {}})",
       "tokenizer.json: post_processor.pair[0]: expected {\"Sequence\": ...} or "
       "{\"SpecialToken\": ...}"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}], "pair": [],
           "special_tokens": {}})",
       "tokenizer.json: post_processor.single[0].Sequence.type_id: missing"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1, 2], "tokens": ["<s>"]}}})",
       "tokenizer.json: post_processor.special_tokens.<s>: ids and tokens must be of the same "
       "length"},
      {"post_processor",
       R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
           "pair": []})",
       "tokenizer.json: post_processor.special_tokens: missing"},
      {"post_processor", R"({"type": "ByteLevel", "add_prefix_space": true})",
       "tokenizer.json: post_processor.trim_offsets: missing"},
  };
  for (const Case& c : cases) {
    const json node = json::parse(c.json);
    const JsonPlace place = kPlace.at(c.stage);
    const std::string stage = c.stage;
    try {
      if (stage == "normalizer") make_normalizer(node, place);
      if (stage == "pre_tokenizer") make_pre_tokenizer(node, place);
      if (stage == "decoder") make_decoder(node, place);
      if (stage == "post_processor") make_post_processor(node, place);
      ADD_FAILURE() << "accepted " << c.json;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data) << c.json;
      EXPECT_EQ(std::string(e.what()).substr(0, std::string(c.message).size()), c.message)
          << c.json;
    }
  }
}

// Hugging Face loads a pair template that names a token special_tokens lacks.
TEST(TokenizerPipeline, PairTemplateMayNameAnAbsentToken) {
  const json node = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<x>", "type_id": 1}},
               {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {}})");
  Encoding encoding{{4, 5}, {{0, 1}, {1, 2}}};
  make_post_processor(node, kPlace.at("post_processor"))
      ->process(encoding, true, [](int32_t) { return std::string_view(); });
  EXPECT_EQ(encoding.ids, (std::vector<int32_t>{4, 5}));
}

TEST(TokenizerPipeline, NullIsNoStage) {
  EXPECT_EQ(make_normalizer(nullptr, kPlace), nullptr);
  EXPECT_EQ(make_pre_tokenizer(nullptr, kPlace), nullptr);
  EXPECT_EQ(make_decoder(nullptr, kPlace), nullptr);
  EXPECT_EQ(make_post_processor(nullptr, kPlace), nullptr);
}

}  // namespace
}  // namespace forge::tokenizer_json
