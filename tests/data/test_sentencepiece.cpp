// SentencePiece tokenizer.model through libsentencepiece: ids, byte spans and decodes identical to
// python3-sentencepiece on two models trained by spm_train (tests/golden/sentencepiece/, written by
// tests/golden/make_sentencepiece_goldens.sh) over CJK, emoji, combining marks, whitespace runs,
// digits, control characters and special-token strings (and as LlamaTokenizer with "legacy":
// false, written out by the golden script); BOS/EOS from tokenizer_config.json;
// special ids; appended specials; corrupt models and invalid UTF-8 refused; encoding from threads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

fs::path golden_dir() { return fs::path(FORGE_SOURCE_DIR) / "tests/golden/sentencepiece"; }

std::vector<nlohmann::json> expected_lines(const std::string& model) {
  std::ifstream in(golden_dir() / (model + "_expected.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  EXPECT_GE(lines.size(), 70u) << model;
  return lines;
}

// A hub-style directory holding `model` as tokenizer.model, and `config` as
// tokenizer_config.json when given.
fs::path model_dir(const testing::TempDir& dir, const std::string& model,
                   const std::string& config = "") {
  fs::copy_file(golden_dir() / (model + ".model"), dir.path() / "tokenizer.model");
  if (!config.empty()) testing::write_file(dir.path() / "tokenizer_config.json", config);
  return dir.path();
}

class SentencePieceParity : public ::testing::TestWithParam<const char*> {};

TEST_P(SentencePieceParity, MatchesPythonSentencePiece) {
  testing::TempDir dir;
  const std::string model = GetParam();
  // Both ways of naming it: the .model file, and a directory holding tokenizer.model.
  const auto by_file = make_tokenizer((golden_dir() / (model + ".model")).string());
  const auto by_dir = make_tokenizer(model_dir(dir, model).string());
  EXPECT_EQ(by_file->vocab_size(), 1000);
  EXPECT_EQ(by_file->name(), model + ".model");
  for (const auto& line : expected_lines(model)) {
    const std::string text = line["text"];
    const Ids ids = line["ids"].get<Ids>();
    SCOPED_TRACE(::testing::Message() << model << ": " << line["text"].dump());
    EXPECT_EQ(by_file->encode(text), ids);
    EXPECT_EQ(by_dir->encode(text), ids);
    const Encoding e = by_dir->encode_with_offsets(text);
    EXPECT_EQ(e.ids, ids);
    EXPECT_EQ(e.offsets, (line["offsets"].get<std::vector<std::pair<size_t, size_t>>>()));
    EXPECT_EQ(by_dir->decode(ids), line["decoded"].get<std::string>());
    EXPECT_EQ(by_dir->with_special_tokens(ids), line["ids_with_specials"].get<Ids>());
  }
}

// tokenizer_config.json's "legacy": false: LlamaTokenizer's other way with the text around special
// tokens (no "▁" after them), as the golden script writes its tokenize out over the model.
TEST_P(SentencePieceParity, MatchesLlamaTokenizerWithoutLegacy) {
  testing::TempDir dir;
  const std::string model = GetParam();
  const auto tok = make_tokenizer(model_dir(dir, model, R"({"legacy": false})").string());
  for (const auto& line : expected_lines(model)) {
    const std::string text = line["text"];
    SCOPED_TRACE(::testing::Message() << model << ": " << line["text"].dump());
    EXPECT_EQ(tok->encode(text), line["ids_nonlegacy"].get<Ids>());
    const Encoding e = tok->encode_with_offsets(text);
    EXPECT_EQ(e.ids, line["ids_nonlegacy"].get<Ids>());
    EXPECT_EQ(e.offsets,
              (line["offsets_nonlegacy"].get<std::vector<std::pair<size_t, size_t>>>()));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePieceParity, ::testing::Values("bpe", "unigram"));

TEST(SentencePiece, ControlUnknownAndUserDefinedSymbolsAreSpecial) {
  testing::TempDir dir;
  const auto bpe = make_tokenizer(model_dir(dir, "bpe").string());
  EXPECT_EQ(bpe->specials(),
            (std::vector<std::pair<std::string, int32_t>>{
                {"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"<sep>", 3}, {"<|user|>", 4}}));
  const auto unigram = make_tokenizer((golden_dir() / "unigram.model").string());
  EXPECT_EQ(unigram->special_id("<mask>"), 3);
  EXPECT_EQ(unigram->special_id("<sep>"), 4);
  EXPECT_EQ(unigram->special_id("<|user|>"), std::nullopt);  // bpe's, not unigram's
  // A control symbol in the text is its id, and decodes back to its text (sp.decode drops it).
  EXPECT_EQ(unigram->encode("<mask>"), (Ids{3}));
  EXPECT_EQ(unigram->decode({1, 3, 2}), "<s><mask></s>");
}

TEST(SentencePiece, BosAndEosFollowTokenizerConfig) {
  const Ids hello = {360, 458, 892};  // "Hello" in bpe.model
  testing::TempDir a, b, c;
  EXPECT_EQ(make_tokenizer(model_dir(a, "bpe", R"({"add_eos_token": true})").string())
                ->with_special_tokens(hello),
            (Ids{1, 360, 458, 892, 2}));
  EXPECT_EQ(
      make_tokenizer(model_dir(b, "bpe", R"({"add_bos_token": false, "legacy": true})").string())
          ->with_special_tokens(hello),
      hello);
  // null is as false for LlamaTokenizer (it tests add_bos_token's truth).
  testing::TempDir d;
  EXPECT_EQ(make_tokenizer(model_dir(d, "bpe", R"({"add_bos_token": null})").string())
                ->with_special_tokens(hello),
            hello);
  model_dir(c, "bpe", R"({"add_bos_token": "yes"})");
  testing::expect_error(ExitCode::data, "tokenizer_config.json: \"add_bos_token\" must be true",
                        [&] { make_tokenizer(c.path().string()); });
  testing::write_file(c.path() / "tokenizer_config.json", "[1]");
  testing::expect_error(ExitCode::data, "tokenizer_config.json: expected a JSON object",
                        [&] { make_tokenizer(c.path().string()); });
}

TEST(SentencePiece, AppendedSpecialsGetIdsAfterThePieces) {
  testing::TempDir dir;
  const auto tok = make_tokenizer(model_dir(dir, "bpe").string(), {"<|im_start|>", "<s>", "<sep>"});
  EXPECT_EQ(tok->vocab_size(), 1001);
  EXPECT_EQ(tok->special_id("<|im_start|>"), 1000);
  EXPECT_EQ(tok->special_id("<s>"), 1);
  EXPECT_EQ(tok->special_id("<sep>"), 3);
  const Ids ids = tok->encode("<|im_start|>Hello<s>");
  EXPECT_EQ(ids, (Ids{1000, 360, 458, 892, 1}));
  EXPECT_EQ(tok->decode(ids), "<|im_start|>Hello<s>");
  EXPECT_EQ(
      tok->encode_with_offsets("<|im_start|>Hello<s>").offsets,
      (std::vector<std::pair<size_t, size_t>>{{0, 12}, {12, 13}, {13, 16}, {16, 17}, {17, 20}}));
  testing::expect_error(ExitCode::data, "token id 1001 is outside [0, 1001)",
                        [&] { tok->decode({1001}); });
}

TEST(SentencePiece, CorruptModelsAreDataErrorsNamingTheFile) {
  testing::TempDir dir;
  const std::string model = testing::read_file(golden_dir() / "bpe.model");
  const fs::path file = dir.path() / "tokenizer.model";
  auto expect_refused = [&](const std::string& bytes, const std::string& why) {
    testing::write_file(file, bytes);
    testing::expect_error(ExitCode::data, "tokenizer.model: " + why,
                          [&] { make_tokenizer(dir.path().string()); });
    testing::expect_error(ExitCode::data, "tokenizer.model: " + why,
                          [&] { make_tokenizer(file.string()); });
  };
  expect_refused("", "empty file");
  expect_refused(model.substr(0, model.size() / 2), "not a SentencePiece model (its protobuf");
  expect_refused(std::string(4000, '\xff'), "not a SentencePiece model (its protobuf");
  // Well-formed protobuf that is no model: libsentencepiece's own reason.
  expect_refused(std::string("\x12\x00", 2), "not a SentencePiece model (libsentencepiece: ");
  testing::expect_error(ExitCode::data, "missing.model",
                        [&] { make_tokenizer((dir.path() / "missing.model").string()); });
}

TEST(SentencePiece, InvalidUtf8IsADataErrorNamingTheByte) {
  const auto tok = make_tokenizer((golden_dir() / "bpe.model").string());
  for (const char* text : {"ab\xff", "ab\xc3", "ab\xed\xa0\x80", "ab\xc0\xaf"}) {
    testing::expect_error(ExitCode::data, "bpe.model: invalid UTF-8 at byte 3 of the text",
                          [&] { tok->encode(text); });
    testing::expect_error(ExitCode::data, "invalid UTF-8 at byte 3",
                          [&] { tok->encode_with_offsets(text); });
  }
}

TEST(SentencePiece, EncodesFromManyThreadsAtOnce) {
  const auto tok = make_tokenizer((golden_dir() / "unigram.model").string());
  const auto lines = expected_lines("unigram");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (size_t t = 0; t < mismatches.size(); ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (const auto& line : lines)
          mismatches[t] += tok->encode(line["text"].get<std::string>()) != line["ids"].get<Ids>();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(SentencePiece, AContinuationKeepsTheSpaceItStartsWith) {
  // decode drops the "▁" a text starts with; after a prompt that "▁" is a space of the
  // continuation, which samples, completion records and rewards must keep.
  const auto bpe = make_tokenizer((golden_dir() / "bpe.model").string());
  const std::vector<int32_t> prompt = bpe->encode("To be");
  const std::vector<int32_t> whole = bpe->encode("To be or not");
  ASSERT_GT(whole.size(), prompt.size());
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), whole.begin()));
  const std::vector<int32_t> rest(whole.begin() + std::ptrdiff_t(prompt.size()), whole.end());
  EXPECT_EQ(bpe->decode(rest), "or not");
  EXPECT_EQ(bpe->decode_continuation(prompt, rest), " or not");
  // Byte-level tokenizers decode a continuation alike either way.
  const auto gpt2 = make_tokenizer("gpt2");
  EXPECT_EQ(gpt2->decode_continuation(gpt2->encode("To be"), gpt2->encode(" or not")), " or not");
}

}  // namespace
}  // namespace forge
