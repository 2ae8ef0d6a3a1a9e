// Tokenizers: GPT-2 BPE ids against a fixture from OpenAI's reference encoder (js-tiktoken, see
// tests/golden/make_gpt2_token_fixture.mjs), exact round trips on any bytes, the bytes tokenizer,
// special tokens, the gpt2 files found from any working directory, errors for missing or corrupt
// vocabularies, encoding from several threads at once, and a speed print (not asserted).
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "tests/test_util.h"

namespace forge {
namespace {

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tok = make_tokenizer("gpt2");
  return *tok;
}

// The JSON string literal at the start of `line` (as JSON.stringify writes it), as UTF-8; sets
// `end`.
std::string parse_json_string(const std::string& line, size_t& end) {
  std::string out;
  size_t i = 1;
  auto hex4 = [&](size_t at) {
    return static_cast<uint32_t>(std::stoul(line.substr(at, 4), nullptr, 16));
  };
  while (line.at(i) != '"') {
    if (line[i] != '\\') {
      out.push_back(line[i++]);
      continue;
    }
    const char e = line.at(i + 1);
    i += 2;
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'u': {
        uint32_t cp = hex4(i);
        i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && line.compare(i, 2, "\\u") == 0) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(i + 2) - 0xDC00);
          i += 6;
        }
        unicode::append_utf8(cp, out);
        break;
      }
      default:
        out.push_back(e);
    }
  }
  end = i + 1;
  return out;
}

TEST(Tokenizer, Gpt2MatchesReferenceEncoderFixture) {
  std::istringstream lines(testing::read_file("tests/golden/gpt2_tokens.txt"));
  int cases = 0;
  for (std::string line; std::getline(lines, line);) {
    size_t end = 0;
    const std::string text = parse_json_string(line, end);
    ASSERT_EQ(line.at(end), '\t') << line;
    std::istringstream ids_field(line.substr(end + 1));
    std::vector<int32_t> expected;
    for (int32_t id; ids_field >> id;) expected.push_back(id);
    EXPECT_EQ(gpt2().encode(text), expected) << "text: " << line.substr(0, end);
    EXPECT_EQ(gpt2().decode(expected), text);
    ++cases;
  }
  EXPECT_GE(cases, 80);
}

TEST(Tokenizer, Gpt2RoundTripsAnyBytes) {
  std::mt19937 rng(7);
  // Mostly-ASCII strings with spaces, quotes and multi-byte characters, plus raw random bytes
  // (invalid UTF-8: lone continuation bytes, truncated sequences, surrogates, overlongs).
  const std::vector<std::string> atoms = {"a",        "Z",
                                          "7",        " ",
                                          "  ",       "\n",
                                          "\t",       "'",
                                          "'s",       "é",
                                          "中",       "👋",
                                          "\xff",     "\x80",
                                          "\xe4\xb8", "\xed\xa0\x80",
                                          "\xc0\xaf", "<|endoftext|>",
                                          "<|",       "!",
                                          "\r\n",     "\xc2\xa0"};
  for (int trial = 0; trial < 400; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % (trial % 10 == 0 ? 1000 : 60));
    for (int k = 0; k < n; ++k) {
      if (trial % 2 == 0)
        s += atoms[rng() % atoms.size()];
      else
        s.push_back(static_cast<char>(rng() & 0xFF));
    }
    const std::vector<int32_t> ids = gpt2().encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < gpt2().vocab_size());
    ASSERT_EQ(gpt2().decode(ids), s) << "trial " << trial;
  }
  // Pre-tokenisation tiles the text (no byte lost or repeated).
  std::string joined;
  const std::string text = "it's  \n\n 12ab\xff\xfe  x   ";
  for (std::string_view piece : gpt2_pretokenize(text)) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(Tokenizer, Gpt2PreTokenisesLikeTheRegex) {
  auto pieces = [](std::string_view s) {
    std::vector<std::string> out;
    for (std::string_view p : gpt2_pretokenize(s)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("I'll go  now\n\n"), (V{"I", "'ll", " go", " ", " now", "\n\n"}));
  EXPECT_EQ(pieces("x\xff\xfey"), (V{"x", "\xff\xfe", "y"}));
  EXPECT_EQ(pieces("a\n b 3.14"), (V{"a", "\n", " b", " 3", ".", "14"}));
}

TEST(Tokenizer, Gpt2VocabularyAndSpecials) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().name(), "gpt2");
  EXPECT_EQ(gpt2().special_id("<|endoftext|>"), 50256);
  EXPECT_FALSE(gpt2().special_id("[PAD]").has_value());
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));

  auto bert = make_tokenizer("gpt2", {"[PAD]", "[CLS]", "<|endoftext|>", "[SEP]", "[MASK]"});
  EXPECT_EQ(bert->vocab_size(), 50261);
  EXPECT_EQ(bert->special_id("[PAD]"), 50257);
  EXPECT_EQ(bert->special_id("[MASK]"), 50260);
  EXPECT_EQ(bert->special_id("<|endoftext|>"), 50256);
  const std::vector<int32_t> ids = bert->encode("[CLS]hi[SEP][PAD]");
  EXPECT_EQ(ids, (std::vector<int32_t>{50258, 5303, 50259, 50257}));
  EXPECT_EQ(bert->decode(ids), "[CLS]hi[SEP][PAD]");
  EXPECT_THROW(bert->decode({50261}), Error);
  EXPECT_THROW(gpt2().decode({-1}), Error);
}

// The shipped vocabulary is found from any working directory, not only the repository root.
TEST(Tokenizer, Gpt2IsFoundFromAnyWorkingDirectory) {
  testing::TempDir dir;
  const std::filesystem::path here = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  std::unique_ptr<Tokenizer> elsewhere;
  try {
    elsewhere = make_tokenizer("gpt2");
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  std::filesystem::current_path(here);
  ASSERT_NE(elsewhere, nullptr);
  EXPECT_EQ(elsewhere->encode("hello world"), gpt2().encode("hello world"));
  EXPECT_TRUE(std::filesystem::is_regular_file(shipped_tokenizer_dir("gpt2") / "encoder.json"));
}

TEST(Tokenizer, BytesTokenizerIdsAndSpecials) {
  auto t = make_tokenizer("bytes", {"[PAD]", "[CLS]", "[SEP]", "[MASK]"});
  EXPECT_EQ(t->name(), "bytes");
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->special_id("[CLS]"), 257);
  EXPECT_EQ(t->special_id("[MASK]"), 259);
  EXPECT_FALSE(t->special_id("<|endoftext|>").has_value());
  const std::vector<int32_t> ids = t->encode("[CLS]a\xff[SEP][PAD][PA");
  EXPECT_EQ(ids, (std::vector<int32_t>{257, 'a', 255, 258, 256, '[', 'P', 'A'}));
  EXPECT_EQ(t->decode(ids), "[CLS]a\xff[SEP][PAD][PA");
  EXPECT_THROW(t->decode({260}), Error);
  EXPECT_EQ(make_tokenizer("bytes")->vocab_size(), 256);
  EXPECT_THROW(make_tokenizer("bytes", {"[PAD]", "[PAD]"}), Error);
}

// A trained vocabulary with BERT's specials after its merges (as `forge tokenizer train` writes
// it): they load as special tokens, keep their ids when asked for again, and split out of text.
TEST(Tokenizer, TrainedVocabularyWithSpecialsAfterTheMerges) {
  testing::TempDir dir;
  testing::write_file(dir.path() / "corpus.txt", "hi hi hi there there hi\n");
  train_bpe({dir.path() / "corpus.txt"}, 256 + 3 + 4, dir.path() / "tok",
            {"[PAD]", "[CLS]", "[SEP]", "[MASK]"});
  EXPECT_NE(testing::read_file(dir.path() / "tok" / "encoder.json")
                .find("\"[PAD]\": 259, \"[CLS]\": 260, \"[SEP]\": 261, \"[MASK]\": 262}"),
            std::string::npos);

  const auto tok = make_tokenizer((dir.path() / "tok").string(), {"[MASK]", "[EXTRA]"});
  EXPECT_EQ(tok->vocab_size(), 264);
  EXPECT_EQ(tok->special_id("[PAD]"), 259);
  EXPECT_EQ(tok->special_id("[CLS]"), 260);
  EXPECT_EQ(tok->special_id("[SEP]"), 261);
  EXPECT_EQ(tok->special_id("[MASK]"), 262);
  EXPECT_EQ(tok->special_id("[EXTRA]"), 263);
  EXPECT_FALSE(tok->special_id("<|endoftext|>").has_value());

  const std::string text = "[CLS] hi [SEP][MASK]";
  const std::vector<int32_t> ids = tok->encode(text);
  std::vector<int32_t> want = {260};
  for (int32_t id : tok->encode(" hi ")) want.push_back(id);
  want.insert(want.end(), {261, 262});
  EXPECT_EQ(ids, want);
  for (size_t i = 1; i + 2 < ids.size(); ++i) EXPECT_LT(ids[i], 259) << i;
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->decode({259, 263}), "[PAD][EXTRA]");

  // Dropping the last merge would turn its token into a "special"; that is caught, not loaded.
  std::string merges = testing::read_file(dir.path() / "tok" / "vocab.bpe");
  merges.erase(merges.rfind('\n', merges.size() - 2) + 1);
  testing::write_file(dir.path() / "tok" / "vocab.bpe", merges);
  try {
    make_tokenizer((dir.path() / "tok").string());
    ADD_FAILURE() << "a truncated vocab.bpe loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

void expect_data_error(const std::string& name_or_dir, const std::string& mentions) {
  try {
    make_tokenizer(name_or_dir);
    ADD_FAILURE() << "no error for " << name_or_dir;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, MissingOrCorruptVocabularyIsADataError) {
  testing::TempDir dir;
  const auto d = dir.path();
  expect_data_error((d / "nope").string(), "nope");
  expect_data_error(d.string(), "encoder.json");
  testing::write_file(d / "encoder.json", "{\"a\": 0, \"b\": ");
  expect_data_error(d.string(), "encoder.json");
  testing::write_file(d / "encoder.json", testing::read_file("data/tokenizers/gpt2/encoder.json"));
  expect_data_error(d.string(), "vocab.bpe");
  std::string merges = testing::read_file("data/tokenizers/gpt2/vocab.bpe");
  testing::write_file(d / "vocab.bpe", merges.substr(0, merges.size() / 2));
  expect_data_error(d.string(), "vocab.bpe");
  testing::write_file(d / "vocab.bpe", merges);
  auto ok = make_tokenizer(d.string());
  EXPECT_EQ(ok->encode("hello world"), gpt2().encode("hello world"));
}

TEST(Tokenizer, Gpt2ShakespeareRoundTripAndSpeed) {
  const std::string text = testing::read_file("data/samples/tinyshakespeare.txt");
  ASSERT_GT(text.size(), 1000000u);
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto fresh = make_tokenizer("gpt2");
  auto t1 = Clock::now();
  const std::vector<int32_t> ids = fresh->encode(text);
  auto t2 = Clock::now();
  EXPECT_EQ(fresh->decode(ids), text);
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double enc_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf(
      "gpt2: vocabulary load %.0f ms; encode %.2f MB/s (%zu bytes -> %zu tokens, cold cache)\n",
      load_s * 1e3, static_cast<double>(text.size()) / enc_s / 1e6, text.size(), ids.size());
}

// forge prepare encodes a large document in parts cut at independent_cuts: the parts' ids,
// concatenated, are the whole text's, over Shakespeare, indented code and blank lines (the end of
// a part would join "\n\n" into one piece), the parity texts and special tokens at line starts.
TEST(Tokenizer, IndependentCutsKeepTheIds) {
  std::string text = testing::read_file("data/samples/tinyshakespeare.txt").substr(0, 300000);
  for (int i = 0; i < 200; ++i)
    text += "def f(x):\n    return x  \n  \n  y = 1\n\tz\n\n\nclass A:\n  pass\n";
  std::istringstream lines(testing::read_file("tests/golden/tokenizers/texts.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const size_t begin = line.find(':') + 1;  // {"text": "..."}: the JSON string kept as text
    text += line.substr(begin) + "\n" + (line.size() % 3 ? "<|endoftext|>" : "") + "Next\n";
  }
  // A special token that holds a cut's pattern ("x\nG") is never cut.
  for (int i = 0; i < 200; ++i) text += "word\n<|endoftext|>Word\nX<|endoftext|>\nstop.\nGo\n";
  // gpt2's hand-written pattern, and tokenizer.json pipelines with Llama 3's pattern and with
  // Qwen2's behind NFC (the fixtures of tests/golden/tokenizers).
  for (const std::string name : {"gpt2", "tests/golden/tokenizers/llama3",
                                 "tests/golden/tokenizers/chatml"}) {
    const auto tok = make_tokenizer(
        name == "gpt2" ? name : (std::filesystem::path(FORGE_SOURCE_DIR) / name).string(),
        {"stop.\nGo"});
    const std::vector<int32_t> whole = tok->encode(text);
    for (size_t every : {1u, 37u, 1000u}) {
      const std::vector<size_t> cuts = tok->independent_cuts(text, every);
      EXPECT_GT(cuts.size() * every * 100, text.size()) << name << " " << every;
      std::vector<int32_t> joined;
      size_t begin = 0;
      for (size_t cut : cuts) {
        ASSERT_GE(cut, begin + every);
        const std::vector<int32_t> part =
            tok->encode(std::string_view(text).substr(begin, cut - begin));
        joined.insert(joined.end(), part.begin(), part.end());
        begin = cut;
      }
      const std::vector<int32_t> last = tok->encode(std::string_view(text).substr(begin));
      joined.insert(joined.end(), last.begin(), last.end());
      EXPECT_TRUE(joined == whole) << name << " " << every;
    }
  }
  // Pipelines that act on where a text starts (a Prepend, Metaspace) or normalise across lines
  // are never cut.
  EXPECT_TRUE(make_tokenizer("bytes")->independent_cuts(text, 1000).empty());
  for (const char* name : {"sp_bpe", "metaspace", "wordpiece"})
    EXPECT_TRUE(make_tokenizer((std::filesystem::path(FORGE_SOURCE_DIR) /
                                "tests/golden/tokenizers" / name).string())
                    ->independent_cuts(text, 1000)
                    .empty())
        << name;
}

// forge prepare calls encode() from every core at once: threads sharing one tokenizer (and its
// piece caches, one per concurrent caller) get the ids one thread gets. Made-up words are no
// token, so their merges go through the caches.
TEST(Tokenizer, Gpt2EncodesConcurrently) {
  std::mt19937 rng(3);
  std::vector<std::string> lines(6000);
  for (std::string& line : lines)
    for (int w = 0; w < 8; ++w) {
      line += ' ';
      for (uint32_t k = 0, n = 3 + rng() % 9; k < n; ++k) line += char('a' + rng() % 26);
    }
  std::vector<std::vector<int32_t>> expected;
  {
    const auto fresh = make_tokenizer("gpt2");
    for (const std::string& line : lines) expected.push_back(fresh->encode(line));
  }
  const auto shared = make_tokenizer("gpt2");
  std::vector<std::thread> threads;
  std::vector<int64_t> mismatches(4, 0);
  for (size_t t = 0; t < mismatches.size(); ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        for (size_t i = t; i < lines.size(); i += 1 + (t + round) % 3)
          mismatches[t] += shared->encode(lines[i]) != expected[i];
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int64_t>(4, 0));
}

}  // namespace
}  // namespace forge
