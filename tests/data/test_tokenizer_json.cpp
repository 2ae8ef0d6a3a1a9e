// tokenizer.json (data/tokenizer_json.h): loading errors that name the JSON path, Hugging Face's
// BPE (byte fallback, unk, ignore_merges, prefix and suffix) and WordPiece, added tokens and their
// flags, byte offsets, decoding, and parity with Hugging Face's own `tokenizers` on the fixtures
// of tests/golden/tokenizers (made by tests/golden/tokenizers' script with the npm package).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;
using Spans = std::vector<std::pair<size_t, size_t>>;

// A tokenizer.json with no normalizer, pre-tokenizer, post-processor or decoder around `model`.
json with_model(json model, json added = json::array()) {
  return {{"version", "1.0"},         {"added_tokens", std::move(added)}, {"normalizer", nullptr},
          {"pre_tokenizer", nullptr}, {"post_processor", nullptr},        {"decoder", nullptr},
          {"model", std::move(model)}};
}

json bpe(json vocab, json merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

json added_token(int id, const std::string& content, bool special, bool lstrip = false,
                 bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

std::unique_ptr<TokenizerJson> load(const testing::TempDir& dir, const json& config,
                                    const std::vector<std::string>& specials = {}) {
  testing::write_file(dir.path() / "tokenizer.json", config.dump());
  return std::make_unique<TokenizerJson>(dir.path() / "tokenizer.json", "test", specials);
}

void expect_load_error(const json& config, const std::string& part) {
  testing::TempDir dir;
  testing::expect_error(ExitCode::data, part, [&] { load(dir, config); });
}

const json kAbcVocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {" ", 5}};

TEST(TokenizerJson, LoadingErrorsNameTheJsonPath) {
  {
    testing::TempDir dir;
    testing::write_file(dir.path() / "tokenizer.json", "{\"model\": [1, 2");
    testing::expect_error(ExitCode::data, "tokenizer.json: not valid JSON",
                          [&] { TokenizerJson tok(dir.path() / "tokenizer.json", "t"); });
  }
  expect_load_error(json{{"version", "1.0"}}, "model: missing");
  json unigram = bpe(kAbcVocab, json::array());
  unigram["type"] = "Unigram";
  expect_load_error(with_model(unigram), "model.type: model type \"Unigram\" is not supported");
  expect_load_error(with_model(bpe(kAbcVocab, json::array({"a b", "x c"}))),
                    "model.merges[1]: token \"x\" is not in the vocabulary");
  expect_load_error(with_model(bpe(kAbcVocab, json::array({"a b", "b c"}))),
                    "model.merges[1]: the merged token \"bc\" is not in the vocabulary");
  expect_load_error(with_model(bpe(kAbcVocab, json::array({"a  b"}))),
                    "model.merges[0]: expected two tokens separated by one space");
  expect_load_error(with_model(bpe({{"a", 0}, {"b", 7}}, json::array())),
                    "model.vocab: token \"b\" has id 7; ids must be 0..1");
  expect_load_error(with_model(bpe({{"a", 0}, {"b", 0}}, json::array())),
                    "model.vocab: tokens \"a\" and \"b\" share id 0");
  json dropout = bpe(kAbcVocab, json::array());
  dropout["dropout"] = 0.1;
  expect_load_error(with_model(dropout), "model.dropout: BPE dropout makes tokenization random");
  // The first added token not in the vocabulary takes the id after it (6), as in Hugging Face.
  expect_load_error(
      with_model(bpe(kAbcVocab, json::array()), json::array({added_token(7, "<s>", true)})),
      "added_tokens[0].id: id 7, but this token's id is 6");
  expect_load_error(
      with_model(bpe(kAbcVocab, json::array()), json::array({added_token(4, "<s>", true)})),
      "added_tokens[0].id: id 4, but this token's id is 6");
  expect_load_error(
      with_model(bpe(kAbcVocab, json::array()),
                 json::array({added_token(6, "<s>", true), added_token(7, "<s>", false)})),
      "added_tokens[1].content: token <s> is added twice");
}

TEST(TokenizerJson, BpeMergesByRankAndIgnoreMerges) {
  testing::TempDir dir;
  json model = bpe(kAbcVocab, json::array({"a b"}));
  EXPECT_EQ(load(dir, with_model(model))->encode("abc"), (Ids{3, 2}));
  // Llama 3's ignore_merges: a piece that is itself a token is that token.
  model["ignore_merges"] = true;
  EXPECT_EQ(load(dir, with_model(model))->encode("abc"), (Ids{4}));
  EXPECT_EQ(load(dir, with_model(model))->encode("abca"), (Ids{3, 2, 0}));
  // "[a, b]" pairs read like "a b" strings; a pair given twice keeps its last rank.
  json pairs =
      bpe({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}},
          json::array({json::array({"a", "b"}), json::array({"b", "c"}), json::array({"a", "b"})}));
  EXPECT_EQ(load(dir, with_model(pairs))->encode("abc"), (Ids{0, 4}));
}

TEST(TokenizerJson, BpeByteFallbackAndUnknowns) {
  testing::TempDir dir;
  json vocab = {{"<unk>", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}, {"\xe2\x96\x81", 3}, {"a", 4}};
  json model = bpe(vocab, json::array());
  model["unk_token"] = "<unk>";
  model["byte_fallback"] = true;
  auto tok = load(dir, with_model(model));
  // "é" is C3 A9: both byte tokens exist; "ü" is C3 BC: 0xBC has none, so unk.
  EXPECT_EQ(tok->encode("a\xc3\xa9\xc3\xbc\xc3\xbc"
                        "a"),
            (Ids{4, 1, 2, 0, 0, 4}));
  const Encoding e = tok->encode_with_offsets(
      "a\xc3\xa9\xc3\xbc"
      "a");
  // Each byte of a character stands for the whole character, as in Hugging Face's alignments.
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {1, 3}, {1, 3}, {3, 5}, {5, 6}}));
  model["fuse_unk"] = true;
  EXPECT_EQ(load(dir, with_model(model))
                ->encode("a\xc3\xbc\xc3\xbc"
                         "a"),
            (Ids{4, 0, 4}));
  EXPECT_EQ(load(dir, with_model(model))->encode_with_offsets("a\xc3\xbc\xc3\xbc").offsets,
            (Spans{{0, 1}, {1, 5}}));
  // Without unk_token a character with no token is dropped, as Hugging Face does.
  model["unk_token"] = nullptr;
  EXPECT_EQ(load(dir, with_model(model))
                ->encode("a\xc3\xbc"
                         "a"),
            (Ids{4, 4}));
  // An unk_token missing from the vocabulary fails when it is needed.
  model["unk_token"] = "<missing>";
  testing::expect_error(ExitCode::data, "model.unk_token: \"<missing>\" is not in the vocabulary",
                        [&] { load(dir, with_model(model))->encode("\xc3\xbc"); });
}

TEST(TokenizerJson, BpeContinuingPrefixAndEndOfWordSuffix) {
  testing::TempDir dir;
  json prefixed = bpe({{"a", 0}, {"##b", 1}, {"ab", 2}, {"##c", 3}, {"##bc", 4}},
                      json::array({"##b ##c", "a ##b"}));
  prefixed["continuing_subword_prefix"] = "##";
  EXPECT_EQ(load(dir, with_model(prefixed))->encode("ab"), (Ids{2}));
  EXPECT_EQ(load(dir, with_model(prefixed))->encode("abc"), (Ids{0, 4}));
  json suffixed = bpe({{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}, {"b", 3}}, json::array({"a b</w>"}));
  suffixed["end_of_word_suffix"] = "</w>";
  EXPECT_EQ(load(dir, with_model(suffixed))->encode("ab"), (Ids{2}));
  EXPECT_EQ(load(dir, with_model(suffixed))->encode("abb"), (Ids{0, 3, 1}));
}

TEST(TokenizerJson, WordPieceGreedyLongestMatch) {
  testing::TempDir dir;
  json model = {{"type", "WordPiece"},
                {"unk_token", "[UNK]"},
                {"continuing_subword_prefix", "##"},
                {"max_input_chars_per_word", 8},
                {"vocab",
                 {{"[UNK]", 0},
                  {"un", 1},
                  {"##aff", 2},
                  {"##able", 3},
                  {"u", 4},
                  {"##n", 5},
                  {"\xc3\xa9", 6},
                  {"##\xc3\xa9", 7}}}};
  auto tok = load(dir, with_model(model));
  EXPECT_EQ(tok->encode("unaffable"), (Ids{0}));  // 9 characters: more than 8
  EXPECT_EQ(tok->encode("unaff"), (Ids{1, 2}));
  EXPECT_EQ(tok->encode_with_offsets("\xc3\xa9\xc3\xa9").offsets, (Spans{{0, 2}, {2, 4}}));
  EXPECT_EQ(tok->encode("unx"), (Ids{0}));  // one unknown piece makes the whole word [UNK]
  EXPECT_EQ(tok->encode_with_offsets("unx").offsets, (Spans{{0, 3}}));
  // No decoder: Hugging Face joins the tokens with spaces.
  EXPECT_EQ(tok->decode({1, 2, 0}), "un ##aff [UNK]");
}

TEST(TokenizerJson, AddedTokensFlags) {
  testing::TempDir dir;
  const json model = bpe(kAbcVocab, json::array({"a b"}));
  auto tok =
      load(dir, with_model(model, json::array({added_token(6, "<s>", true),
                                               added_token(7, "<L>", false, true, false),
                                               added_token(8, "<R>", false, false, true),
                                               added_token(9, "x", false, false, false, true)})));
  EXPECT_EQ(tok->special_id("<s>"), 6);
  EXPECT_FALSE(tok->special_id("<L>"));
  EXPECT_EQ(tok->vocab_size(), 10);
  EXPECT_EQ(tok->encode("ab<s>a"), (Ids{3, 6, 0}));
  // lstrip takes the spaces before the token, rstrip those after it.
  EXPECT_EQ(tok->encode("a  <L> a"), (Ids{0, 7, 5, 0}));
  EXPECT_EQ(tok->encode_with_offsets("a  <L> a").offsets, (Spans{{0, 1}, {1, 6}, {6, 7}, {7, 8}}));
  EXPECT_EQ(tok->encode("a <R>  a"), (Ids{0, 5, 8, 0}));
  EXPECT_EQ(tok->encode_with_offsets("a <R>  a").offsets, (Spans{{0, 1}, {1, 2}, {2, 7}, {7, 8}}));
  // single_word: "x" is the added token only between non-word characters; inside a word it
  // stays text, which the model drops (it has no token for it).
  EXPECT_EQ(tok->encode("x abx x"), (Ids{9, 5, 3, 5, 9}));
  EXPECT_EQ(tok->decode({6, 3, 9}), "<s> ab x");
  // Tokens matched in the raw text go first: "<s>" inside a normalized token's text wins.
  auto ordered = load(
      dir, with_model(model, json::array({added_token(6, "a<s", false, false, false, false, true),
                                          added_token(7, "<s>", true)})));
  EXPECT_EQ(ordered->encode("a<s>"), (Ids{0, 7}));
  // Configured specials are added after the vocabulary; ones the file has keep their id.
  auto extra =
      load(dir, with_model(model, json::array({added_token(6, "<s>", true)})), {"<s>", "<pad>"});
  EXPECT_EQ(extra->special_id("<pad>"), 7);
  EXPECT_EQ(extra->special_id("<s>"), 6);
  EXPECT_EQ(extra->encode("a<pad>"), (Ids{0, 7}));
}

TEST(TokenizerJson, InvalidUtf8AndBadIdsAreDataErrors) {
  testing::TempDir dir;
  auto tok = load(dir, with_model(bpe(kAbcVocab, json::array())));
  testing::expect_error(ExitCode::data, "not valid UTF-8 at byte 2",
                        [&] { tok->encode("ab\xff"); });
  testing::expect_error(ExitCode::data, "token id 6 is outside [0, 6)", [&] { tok->decode({6}); });
}

TEST(TokenizerJson, MakeTokenizerFindsTokenizerJson) {
  testing::TempDir dir;
  const auto sub = dir.path() / "mytok";
  std::filesystem::create_directories(sub);
  testing::write_file(sub / "tokenizer.json",
                      with_model(bpe(kAbcVocab, json::array({"a b"}))).dump());
  // tokenizer.json comes before a hub directory's other files.
  testing::write_file(sub / "vocab.txt", "[UNK]\n");
  testing::write_file(sub / "merges.txt", "#version: 0.2\n");
  auto tok = make_tokenizer(sub.string());
  EXPECT_EQ(tok->name(), "mytok");
  EXPECT_EQ(tok->encode("ab"), (Ids{3}));
  auto direct = make_tokenizer((sub / "tokenizer.json").string());
  EXPECT_EQ(direct->name(), "mytok");
  EXPECT_EQ(direct->encode("abc"), (Ids{3, 2}));
  testing::expect_error(ExitCode::data, "a tokenizer.json file or a directory with tokenizer.json",
                        [&] { make_tokenizer((dir.path() / "absent").string()); });
}

// A byte-level family gives back any text it encodes, with offsets inside the text and in order
// (not tiling it: the ByteLevel post-processor trims spaces off them).
TEST(TokenizerJson, ByteLevelRoundTripsRandomText) {
  TokenizerJson tok(
      std::filesystem::path(FORGE_SOURCE_DIR) / "tests/golden/tokenizers/llama3" / "tokenizer.json",
      "llama3");
  const std::vector<std::string> alphabet = {"a",
                                             "b",
                                             "the",
                                             " ",
                                             "  ",
                                             "\n",
                                             "\t",
                                             "1",
                                             "23",
                                             "'s",
                                             "\xc3\xa9",          // é
                                             "e\xcc\x81",         // e + U+0301
                                             "\xe4\xb8\xad",      // 中
                                             "\xf0\x9f\x98\x80",  // 😀
                                             "<|begin_of_text|>",
                                             "!!",
                                             "\x01"};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int parts = static_cast<int>(rng() % 40);
    for (int k = 0; k < parts; ++k) text += alphabet[rng() % alphabet.size()];
    const Encoding e = tok.encode_with_offsets(text);
    ASSERT_EQ(tok.decode(e.ids), text);
    size_t last_end = 0;
    for (const auto& [begin, end] : e.offsets) {
      EXPECT_LE(begin, end);
      EXPECT_LE(end, text.size());
      EXPECT_GE(end, last_end) << text;
      last_end = end;
    }
  }
}

// GPT-2's vocabulary in Hugging Face's layout (ByteLevel with GPT-2's regex) gives the ids of
// Forge's gpt2 tokenizer, itself checked against OpenAI's; the speed print is what `scripts/bench
// tokenizer` compares with Hugging Face's library (not asserted: the machine is shared).
TEST(TokenizerJson, Gpt2LayoutMatchesGpt2AndSpeed) {
  const auto gpt2_dir = shipped_tokenizer_dir("gpt2");
  json merges = json::array();
  std::istringstream lines(testing::read_file(gpt2_dir / "vocab.bpe"));
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  json config = with_model(bpe(json::parse(testing::read_file(gpt2_dir / "encoder.json")), merges),
                           json::array({added_token(50256, "<|endoftext|>", true)}));
  config["pre_tokenizer"] = byte_level;
  config["decoder"] = byte_level;
  testing::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  auto tok = load(dir, config);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const auto gpt2 = make_tokenizer("gpt2");
  const std::string text = testing::read_file(std::filesystem::path(FORGE_SOURCE_DIR) /
                                              "data/samples/tinyshakespeare.txt");
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok->encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ids, gpt2->encode(text));
  EXPECT_EQ(tok->decode(ids), text);
  std::printf("tokenizer.json gpt2: load %.0f ms; encode %.2f MB/s (%zu bytes -> %zu tokens)\n",
              load_ms, text.size() / s / 1e6, text.size(), ids.size());
}

// Every family of tests/golden/tokenizers: ids, ids with the post-processor's specials, byte
// offsets and decoded text exactly as Hugging Face's tokenizers gives them.
TEST(TokenizerJson, ParityWithHuggingFaceFixtures) {
  const std::filesystem::path root =
      std::filesystem::path(FORGE_SOURCE_DIR) / "tests/golden/tokenizers";
  std::vector<std::filesystem::path> families;
  for (const auto& entry : std::filesystem::directory_iterator(root))
    if (entry.is_directory()) families.push_back(entry.path());
  std::sort(families.begin(), families.end());
  ASSERT_GE(families.size(), 4u);
  for (const auto& family : families) {
    TokenizerJson tok(family / "tokenizer.json", family.filename().string());
    std::istringstream lines(testing::read_file(family / "expected.jsonl"));
    size_t n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
      const json want = json::parse(line);
      const std::string text = want.at("text").get<std::string>();
      SCOPED_TRACE(family.filename().string() + " line " + std::to_string(n + 1) + ": " +
                   want.at("text").dump());
      const Ids ids = want.at("ids").get<Ids>();
      const Encoding got = tok.encode_with_offsets(text);
      EXPECT_EQ(tok.encode(text), ids);
      EXPECT_EQ(got.ids, ids);
      EXPECT_EQ(got.offsets, want.at("offsets").get<Spans>());
      EXPECT_EQ(tok.with_special_tokens(tok.encode(text)), want.at("ids_with_specials").get<Ids>());
      EXPECT_EQ(tok.decode(ids), want.at("decoded").get<std::string>());
    }
    EXPECT_GE(n, 40u) << family;
  }
}

}  // namespace
}  // namespace forge
