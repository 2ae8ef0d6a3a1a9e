// BPE training: merges hand-checked on a tiny corpus (Sennrich et al.'s low/lower/newest/widest),
// byte-identical output run to run, the written vocabulary loading with make_tokenizer and round
// tripping any bytes, vocab_size respected, usage errors, and Tiny Shakespeare compressing.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>

#include "core/error.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using Merges = std::vector<std::pair<std::string, std::string>>;

// Sennrich et al.'s corpus: low x5, lower x2, newest x6, widest x3, one word per line.
std::string sennrich_corpus() {
  std::string text;
  for (int i = 0; i < 5; ++i) text += "low\n";
  for (int i = 0; i < 2; ++i) text += "lower\n";
  for (int i = 0; i < 6; ++i) text += "newest\n";
  for (int i = 0; i < 3; ++i) text += "widest\n";
  return text;
}

// Worked by hand: es and st both occur 9 times, (e,s) sorts first; then est (9); lo and ow tie at
// 7, (l,o) first; low (7); ne, ew, w+est tie at 6, (e,w) first; then (ew,est) before (n,ew);
// newest; then d+est, i+d, w+i tie at 3, (d,est) first.
TEST(BpeTrain, HandCheckedMerges) {
  const Merges expected = {{"e", "s"}, {"es", "t"},   {"l", "o"},     {"lo", "w"},
                           {"e", "w"}, {"ew", "est"}, {"n", "ewest"}, {"d", "est"}};
  const Merges got = learn_bpe_merges(sennrich_corpus(), 256 + 8 + 1);
  EXPECT_EQ(got, expected);
}

TEST(BpeTrain, LoadsAndEncodesWithLearnedMerges) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "corpus.txt", sennrich_corpus());
  train_bpe({dir.path() / "corpus.txt"}, 256 + 8 + 1, dir.path() / "tok");
  const std::string bpe = testing::read_file(dir.path() / "tok" / "vocab.bpe");
  EXPECT_EQ(bpe, "#version: 0.2\ne s\nes t\nl o\nlo w\ne w\new est\nn ewest\nd est\n");
  const std::string enc = testing::read_file(dir.path() / "tok" / "encoder.json");
  // The 256 byte tokens exactly as GPT-2's encoder.json spells and orders them.
  const std::string gpt2 = testing::read_file("data/tokenizers/gpt2/encoder.json");
  const size_t gpt2_bytes_end = gpt2.find("\"\\u0120t\": 256");
  ASSERT_NE(gpt2_bytes_end, std::string::npos);
  EXPECT_EQ(enc.substr(0, gpt2_bytes_end), gpt2.substr(0, gpt2_bytes_end));
  EXPECT_NE(enc.find("\"es\": 256, \"est\": 257, "), std::string::npos);
  EXPECT_NE(enc.find("\"<|endoftext|>\": 264}"), std::string::npos);

  const auto tok = make_tokenizer((dir.path() / "tok").string());
  EXPECT_EQ(tok->vocab_size(), 265);
  EXPECT_EQ(tok->special_id("<|endoftext|>"), std::optional<int32_t>(264));
  EXPECT_EQ(tok->encode("newest"), (std::vector<int32_t>{262}));
  EXPECT_EQ(tok->encode("lowest"), (std::vector<int32_t>{259, 257}));
  EXPECT_EQ(tok->encode("low<|endoftext|>"), (std::vector<int32_t>{259, 264}));
}

TEST(BpeTrain, DeterministicAndRoundTrips) {
  testing::TempDir dir;
  std::mt19937 rng(7);
  std::string text;
  const std::vector<std::string> words = {"the ", "cat ",  "sat ",   "on ",  "mat ",
                                          "\n",   "  ",    "don't ", "42 ",  "caf\xc3\xa9 ",
                                          "\xe4\xb8\xad\xe6\x96\x87 ", "!? "};
  for (int i = 0; i < 4000; ++i) text += words[rng() % words.size()];
  testing::write_file(dir.path() / "a.txt", text);
  testing::write_file(dir.path() / "b.txt", "the end<|endoftext|>");
  train_bpe({dir.path() / "a.txt", dir.path() / "b.txt"}, 300, dir.path() / "one");
  train_bpe({dir.path() / "a.txt", dir.path() / "b.txt"}, 300, dir.path() / "two");
  for (const char* f : {"encoder.json", "vocab.bpe"})
    EXPECT_EQ(testing::read_file(dir.path() / "one" / f),
              testing::read_file(dir.path() / "two" / f))
        << f;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "one" / "encoder.json.tmp"));

  const auto tok = make_tokenizer((dir.path() / "one").string());
  EXPECT_EQ(tok->vocab_size(), 300);
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  // Bytes never seen in training, invalid UTF-8 included.
  std::string random;
  for (int i = 0; i < 5000; ++i) random += static_cast<char>(rng() & 0xFF);
  EXPECT_EQ(tok->decode(tok->encode(random)), random);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(tok->decode(tok->encode(all)), all);
}

TEST(BpeTrain, VocabSizeRespectedAndStopsWhenNoPairsLeft) {
  const std::string text = sennrich_corpus();
  for (int32_t size : {257, 258, 262}) {
    const Merges m = learn_bpe_merges(text, size);
    EXPECT_EQ(static_cast<int32_t>(m.size()), size - 257) << size;
  }
  EXPECT_EQ(learn_bpe_merges(text, 258, {}).size(), 2u);
  // After d+est come i+dest, w+idest, e+r, low+er; then every word is one token and training
  // stops below a larger budget.
  const Merges all = learn_bpe_merges(text, 1000);
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(all.back(), (std::pair<std::string, std::string>{"low", "er"}));
}

TEST(BpeTrain, Errors) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "c.txt", "hello");
  EXPECT_EQ(testing::exit_code_of([&] { train_bpe({dir.path() / "missing.txt"}, 300, dir.path() / "t"); }),
            ExitCode::data);
  EXPECT_EQ(testing::exit_code_of([&] { train_bpe({dir.path() / "c.txt"}, 256, dir.path() / "t"); }),
            ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { train_bpe({}, 300, dir.path() / "t"); }), ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { train_bpe({dir.path() / "c.txt"}, 300, dir.path() / "t", {"x"}); }),
            ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] {
              train_bpe({dir.path() / "c.txt"}, 300, dir.path() / "t", {"[A]", "[A]"});
            }),
            ExitCode::usage);
  EXPECT_NO_THROW(train_bpe({dir.path() / "c.txt"}, 257, dir.path() / "t"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "t" / "encoder.json.tmp"));
}

TEST(BpeTrain, TinyShakespeareCompresses) {
  testing::TempDir dir;
  const std::filesystem::path corpus = "data/samples/tinyshakespeare.txt";
  const std::string text = testing::read_file(corpus);
  ASSERT_GT(text.size(), 1000000u);
  const auto t0 = std::chrono::steady_clock::now();
  train_bpe({corpus}, 512, dir.path());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ bpe train ] tinyshakespeare vocab 512: %.3f s\n", s);
  const auto tok = make_tokenizer(dir.path().string());
  EXPECT_EQ(tok->vocab_size(), 512);
  const std::vector<int32_t> ids = tok->encode(text);
  std::printf("[ bpe train ] %zu bytes -> %zu tokens (%.2f bytes/token)\n", text.size(), ids.size(),
              static_cast<double>(text.size()) / static_cast<double>(ids.size()));
  EXPECT_LT(static_cast<double>(ids.size()), static_cast<double>(text.size()) / 1.5);
  EXPECT_EQ(tok->decode(ids), text);
}

}  // namespace
}  // namespace forge
