// BPE training: merges hand-checked on a tiny corpus (Sennrich et al.'s low/lower/newest/widest),
// byte-identical output run to run, the written vocabulary loading with make_tokenizer and round
// tripping any bytes, vocab_size respected, usage errors, Tiny Shakespeare compressing, and the
// written tokenizer.json giving Forge's ids in Hugging Face's own `tokenizers` and in Forge's
// tokenizer.json reader.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
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

  // tokenizer.json: the same ids and merges (no token here splits two ways), the special token
  // added, and whole pieces that are tokens taken as one id.
  const nlohmann::json hf =
      nlohmann::json::parse(testing::read_file(dir.path() / "tok" / "tokenizer.json"));
  EXPECT_EQ(hf["model"]["merges"],
            nlohmann::json({"e s", "es t", "l o", "lo w", "e w", "ew est", "n ewest", "d est"}));
  EXPECT_EQ(hf["model"]["vocab"].size(), 265u);
  EXPECT_EQ(hf["model"]["vocab"]["est"], 257);
  EXPECT_EQ(hf["model"]["vocab"]["\u0120"], 220);  // the space byte, as GPT-2 spells and numbers it
  EXPECT_EQ(hf["model"]["ignore_merges"], true);
  EXPECT_EQ(hf["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(hf["pre_tokenizer"]["use_regex"], true);
  EXPECT_EQ(hf["decoder"]["type"], "ByteLevel");
  ASSERT_EQ(hf["added_tokens"].size(), 1u);
  EXPECT_EQ(hf["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(hf["added_tokens"][0]["id"], 264);
  EXPECT_EQ(hf["added_tokens"][0]["special"], true);

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
  for (const char* f : {"encoder.json", "vocab.bpe", "tokenizer.json"})
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

// A vocabulary where "abc" is reachable two ways: vocab.bpe makes it from "ab" + "c", but "b c"
// ranks before "a b", so "abcx" reaches "a" + "bc", which Forge (like tiktoken) also merges.
std::filesystem::path write_two_split_vocabulary(const std::filesystem::path& dir) {
  std::string encoder = "{";
  for (int b = 0; b < 256; ++b)
    encoder += nlohmann::json(gpt2_spelling(std::string(1, static_cast<char>(b)))).dump() + ": " +
               std::to_string(b) + ", ";
  encoder += "\"bc\": 256, \"ab\": 257, \"abc\": 258}";
  std::filesystem::create_directories(dir);
  testing::write_file(dir / "encoder.json", encoder);
  testing::write_file(dir / "vocab.bpe", "#version: 0.2\nb c\na b\nab c\n");
  return dir;
}

TEST(BpeTrain, TokenizerJsonListsEverySplitOfAToken) {
  testing::TempDir dir;
  const auto path = write_two_split_vocabulary(dir.path() / "tok");
  const BpeTokenizer tok(path / "encoder.json", path / "vocab.bpe", "two-split");
  EXPECT_EQ(tok.encode("abcx"), (std::vector<int32_t>{258, 'x'}));
  const std::vector<std::string> pairs = {"b c", "a b", "ab c", "a bc"};
  EXPECT_EQ(tok.spelled_merge_pairs(), pairs);
  const nlohmann::json hf = nlohmann::json::parse(bpe_tokenizer_json(tok));
  EXPECT_EQ(hf["model"]["merges"], nlohmann::json(pairs));
  EXPECT_EQ(hf["model"]["vocab"]["abc"], 258);
  EXPECT_TRUE(hf["added_tokens"].empty());
}

// Tiny Shakespeare and the parity texts (tests/golden/tokenizers/texts.jsonl: CJK, emoji, control
// characters, whitespace runs, special tokens inside text).
struct ParityCorpus {
  std::filesystem::path source = FORGE_SOURCE_DIR;
  std::string shakespeare = testing::read_file(source / "data/samples/tinyshakespeare.txt");
  std::vector<std::string> texts;
  ParityCorpus() {
    std::istringstream lines(testing::read_file(source / "tests/golden/tokenizers/texts.jsonl"));
    for (std::string line; std::getline(lines, line);)
      texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  }
  /// Trains on `shakespeare_bytes` of Shakespeare then the parity texts twenty times over, so
  /// merges reach inside multi-byte characters.
  void train(size_t shakespeare_bytes, int32_t vocab_size, const std::filesystem::path& dir,
             const std::vector<std::string>& specials = {"<|endoftext|>"}) const {
    std::string corpus = shakespeare.substr(0, shakespeare_bytes);
    for (int repeat = 0; repeat < 20; ++repeat)
      for (const std::string& t : texts) corpus += t + "\n";
    testing::write_file(dir / "corpus.txt", corpus);
    train_bpe({dir / "corpus.txt"}, vocab_size, dir / "tok", specials);
  }
};

// Forge reads the tokenizer.json it writes back to the same ids (TokenizerJson, Hugging Face's
// semantics); the directory itself still loads as BpeTokenizer, which takes any bytes.
TEST(BpeTrain, ForgeReadsTheTokenizerJsonItWrites) {
  testing::TempDir dir;
  const ParityCorpus parity;
  parity.train(200000, 1500, dir.path(), {"<|endoftext|>", "[PAD]"});
  std::vector<std::string> texts = parity.texts;
  texts.push_back(parity.shakespeare.substr(500000, 30000));
  texts.push_back("a[PAD]b<|endoftext|>[PAD]");

  const BpeTokenizer bpe(dir.path() / "tok/encoder.json", dir.path() / "tok/vocab.bpe", "tok");
  const TokenizerJson json(dir.path() / "tok/tokenizer.json", "tok");
  EXPECT_EQ(json.vocab_size(), bpe.vocab_size());
  EXPECT_EQ(json.specials(), bpe.specials());
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = bpe.encode(text);
    EXPECT_EQ(json.encode(text), ids) << nlohmann::json(text).dump();
    EXPECT_EQ(json.decode(ids), text);
  }
  const auto loaded = make_tokenizer((dir.path() / "tok").string());
  EXPECT_NE(dynamic_cast<const BpeTokenizer*>(loaded.get()), nullptr);
  EXPECT_EQ(loaded->decode(loaded->encode("\xff\xfe bytes")), "\xff\xfe bytes");
}

// NODE_PATH (or, failing that, the directory scripts/bench tokenizer installs npm packages into)
// when node there finds Hugging Face's `tokenizers`; empty otherwise.
std::string hf_tokenizers_node_path() {
  std::vector<std::string> dirs;
  if (const char* p = std::getenv("NODE_PATH")) dirs.emplace_back(p);
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (cache || home)
    dirs.push_back(std::string(cache ? cache : std::string(home) + "/.cache") +
                   "/forge-bench-npm/node_modules");
  for (const std::string& d : dirs) {
    const std::string probe =
        "NODE_PATH='" + d + "' node -e \"require('tokenizers')\" >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return d;
  }
  return "";
}

// {"ids", "decoded"} of each text from Hugging Face's library under `tokenizer_json`
// (tests/golden/hf_encode.mjs); files go to `scratch`.
std::vector<nlohmann::json> hf_encode(const std::string& node_path,
                                      const std::filesystem::path& tokenizer_json,
                                      const std::vector<std::string>& texts,
                                      const std::filesystem::path& scratch) {
  std::string jsonl;
  for (const std::string& t : texts) jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
  testing::write_file(scratch / "texts.jsonl", jsonl);
  const std::string command = "NODE_PATH='" + node_path + "' node " + FORGE_SOURCE_DIR +
                              "/tests/golden/hf_encode.mjs " + tokenizer_json.string() + " " +
                              (scratch / "texts.jsonl").string() + " > " +
                              (scratch / "hf.jsonl").string();
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::vector<nlohmann::json> out;
  std::istringstream lines(testing::read_file(scratch / "hf.jsonl"));
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line));
  EXPECT_EQ(out.size(), texts.size());
  return out;
}

// Hugging Face's own library reads the tokenizer.json training writes and gives encode()'s ids
// and text back: on the parity texts (CJK, emoji, control characters, whitespace runs, special
// tokens inside text) and Shakespeare under a vocabulary with merges inside multi-byte characters,
// and on a token that only a second split reaches.
TEST(BpeTrain, TokenizerJsonGivesForgesIdsInHuggingFaceTokenizers) {
  const std::string node_path = hf_tokenizers_node_path();
  if (node_path.empty())
    GTEST_SKIP() << "no node with the npm package tokenizers (NODE_PATH, or run scripts/bench "
                    "tokenizer once): tokenizer.json is not checked against Hugging Face here";
  testing::TempDir dir;
  const ParityCorpus parity;
  ASSERT_GT(parity.texts.size(), 40u);
  parity.train(300000, 2000, dir.path());
  std::vector<std::string> texts = parity.texts;
  for (size_t start : {0u, 400000u, 900000u})
    texts.push_back(parity.shakespeare.substr(start, 20000));
  texts.push_back("the end<|endoftext|>next<|endoftext|>");
  const BpeTokenizer tok(dir.path() / "tok/encoder.json", dir.path() / "tok/vocab.bpe", "trained");
  const std::vector<nlohmann::json> hf =
      hf_encode(node_path, dir.path() / "tok/tokenizer.json", texts, dir.path());
  size_t merged_multibyte = 0;
  for (size_t n = 0; n < std::min(hf.size(), texts.size()); ++n) {
    const std::vector<int32_t> ids = tok.encode(texts[n]);
    EXPECT_EQ(hf[n]["ids"].get<std::vector<int32_t>>(), ids) << nlohmann::json(texts[n]).dump();
    EXPECT_EQ(hf[n]["decoded"].get<std::string>(), texts[n]);
    for (int32_t id : ids) {
      const std::string bytes = tok.decode({id});
      merged_multibyte += bytes.size() > 1 && static_cast<unsigned char>(bytes[0]) >= 0xC0;
    }
  }
  EXPECT_GT(merged_multibyte, 10u);

  const auto two = write_two_split_vocabulary(dir.path() / "two");
  const BpeTokenizer two_split(two / "encoder.json", two / "vocab.bpe", "two-split");
  testing::write_file(two / "tokenizer.json", bpe_tokenizer_json(two_split));
  const std::vector<std::string> words = {"abcx", "xabcabc abc bcab"};
  const std::vector<nlohmann::json> two_hf =
      hf_encode(node_path, two / "tokenizer.json", words, two);
  for (size_t n = 0; n < std::min(two_hf.size(), words.size()); ++n)
    EXPECT_EQ(two_hf[n]["ids"].get<std::vector<int32_t>>(), two_split.encode(words[n])) << words[n];
}

}  // namespace
}  // namespace forge
