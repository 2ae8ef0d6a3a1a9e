// WordPiece (BERT) tokenizer: the cases of Hugging Face's BertTokenizer test suite
// (tests/models/bert/test_tokenization_bert.py in the transformers repository) with their inputs,
// vocabularies and expected tokens; Unicode cases whose expected text is Python's str.lower and
// unicodedata (what BertTokenizer runs on), every code point included; specials, decode,
// vocab.txt and tokenizer_config.json errors, and make_tokenizer picking WordPiece or BPE by the
// files a directory holds.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/bert_data.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "data/wordpiece.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using Words = std::vector<std::string>;

// The vocabulary of BertTokenizationTest.setUp.
const Words kHfVocab = {"[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "want", "##want", "##ed",
                        "wa",    "un",    "runn",  "##ing", ",",      "low",  "lowest"};

// A tokenizer directory with `tokens` as vocab.txt and `config` (if any) as tokenizer_config.json.
std::unique_ptr<Tokenizer> wordpiece(const testing::TempDir& dir, const Words& tokens,
                                     const std::string& config = "", const Words& specials = {}) {
  std::string vocab;
  for (const std::string& t : tokens) vocab += t + "\n";
  testing::write_file(dir.path() / "vocab.txt", vocab);
  if (!config.empty()) testing::write_file(dir.path() / "tokenizer_config.json", config);
  return make_tokenizer(dir.path().string(), specials);
}

// The tokens `text` encodes to, as strings (BertTokenizer.tokenize).
Words tokenize(const Tokenizer& tok, std::string_view text) {
  Words out;
  for (int32_t id : tok.encode(text)) out.push_back(tok.decode({id}));
  return out;
}

Words basic(std::string_view text, bool lower_case = true, std::optional<bool> strip = {},
            bool split_chinese = true) {
  return bert_basic_tokenize(text, {lower_case, strip.value_or(lower_case), split_chinese});
}

TEST(WordPiece, FullTokenizerMatchesHuggingFace) {  // test_full_tokenizer
  testing::TempDir dir;
  const auto tok = wordpiece(dir, kHfVocab);
  EXPECT_EQ(tokenize(*tok, "UNwant\u00E9d,running"),
            (Words{"un", "##want", "##ed", ",", "runn", "##ing"}));
  EXPECT_EQ(tok->encode("UNwant\u00E9d,running"), (std::vector<int32_t>{9, 6, 7, 12, 10, 11}));
  // convert_tokens_to_string; HF's decode() would also apply clean_up_tokenization_spaces.
  EXPECT_EQ(tok->decode(tok->encode("UNwant\u00E9d,running")), "unwanted , running");
}

TEST(WordPiece, BasicTokenizerMatchesHuggingFace) {
  const std::string text = " \tHeLLo!how  \n Are yoU?  ";
  const std::string accented = " \tH\u00E4LLo!how  \n Are yoU?  ";
  // test_chinese
  EXPECT_EQ(basic("ah\u535A\u63A8zz"), (Words{"ah", "\u535A", "\u63A8", "zz"}));
  // test_basic_tokenizer_lower and _lower_strip_accents_default
  EXPECT_EQ(basic(text), (Words{"hello", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(basic("H\u00E9llo"), Words{"hello"});
  EXPECT_EQ(basic(accented), (Words{"hallo", "!", "how", "are", "you", "?"}));
  // test_basic_tokenizer_lower_strip_accents_false
  EXPECT_EQ(basic(accented, true, false), (Words{"h\u00E4llo", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(basic("H\u00E9llo", true, false), Words{"h\u00E9llo"});
  // test_basic_tokenizer_lower_strip_accents_true
  EXPECT_EQ(basic(accented, true, true), (Words{"hallo", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(basic("H\u00E9llo", true, true), Words{"hello"});
  // test_basic_tokenizer_no_lower, _no_lower_strip_accents_false and _true
  EXPECT_EQ(basic(text, false), (Words{"HeLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(basic(accented, false, false), (Words{"H\u00E4LLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(basic(accented, false, true), (Words{"HaLLo", "!", "how", "Are", "yoU", "?"}));
  // test_basic_tokenizer_splits_on_punctuation
  EXPECT_EQ(basic("a\n'll !!to?'d of, can't."), (Words{"a", "'", "ll", "!", "!", "to", "?", "'",
                                                       "d", "of", ",", "can", "'", "t", "."}));
  // test_basic_tokenizer_remove_control_chars_true (left-to-right and right-to-left marks)
  EXPECT_EQ(basic("\u200E\u200F"), Words{});
  // test_is_whitespace, test_is_control, test_is_punctuation
  EXPECT_EQ(basic("a b\tc\rd\ne\u00A0f"), (Words{"a", "b", "c", "d", "e", "f"}));
  EXPECT_EQ(basic(std::string("a") + '\x05' + "b"), Words{"ab"});
  EXPECT_EQ(basic("a-b$c`d.e"), (Words{"a", "-", "b", "$", "c", "`", "d", ".", "e"}));
}

TEST(WordPiece, WordPieceMatchesHuggingFace) {  // test_wordpiece_tokenizer
  testing::TempDir dir;
  const auto tok = wordpiece(
      dir, {"[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing"},
      R"({"do_lower_case": false})");
  EXPECT_EQ(tokenize(*tok, ""), Words{});
  EXPECT_EQ(tokenize(*tok, "unwanted running"), (Words{"un", "##want", "##ed", "runn", "##ing"}));
  EXPECT_EQ(tokenize(*tok, "unwantedX running"), (Words{"[UNK]", "runn", "##ing"}));
}

TEST(WordPiece, CleanTextMatchesHuggingFace) {  // test_clean_text
  testing::TempDir dir;
  const auto tok = wordpiece(dir, kHfVocab);
  EXPECT_EQ(tokenize(*tok, "Test"), Words{"[UNK]"});
  EXPECT_EQ(tokenize(*tok, "\u00AD"), Words{});
  EXPECT_EQ(tokenize(*tok, "test"), Words{"[UNK]"});
}

// test_offsets_with_special_characters (its bert-base-uncased and cased token lists) and
// test_basic_tokenizer_respects_never_split_tokens, on a vocabulary holding the pieces they name.
TEST(WordPiece, SpecialTokensStayWhole) {
  const Words vocab = {"[PAD]",    "[UNK]", "[CLS]", "[SEP]",    "[MASK]", "a",    ",",
                       "na",       "naive", "##ve",  "##\u00EF", "allen",  "##nl", "##p",
                       "sentence", ".",     "A",     "Allen",    "##NL",   "##P",  "HeLLo",
                       "!",        "how",   "Are",   "yoU",      "?"};
  const std::string sentence = "A, na\u00EFve [MASK] AllenNLP sentence.";
  testing::TempDir uncased_dir, cased_dir;
  const auto uncased = wordpiece(uncased_dir, vocab, R"({"do_lower_case": true})");
  EXPECT_EQ(tokenize(*uncased, sentence),
            (Words{"a", ",", "naive", "[MASK]", "allen", "##nl", "##p", "sentence", "."}));
  const auto cased = wordpiece(cased_dir, vocab, R"({"do_lower_case": false})");
  EXPECT_EQ(tokenize(*cased, sentence), (Words{"A", ",", "na", "##\u00EF", "##ve", "[MASK]",
                                               "Allen", "##NL", "##P", "sentence", "."}));
  EXPECT_EQ(tokenize(*cased, " \tHeLLo!how  \n Are yoU? [UNK]"),
            (Words{"HeLLo", "!", "how", "Are", "yoU", "?", "[UNK]"}));
  EXPECT_EQ(cased->encode("[CLS]a[SEP][PAD]"), (std::vector<int32_t>{2, 5, 3, 0}));
  // Only the exact spelling is special: a lowercased one is punctuation and a word.
  EXPECT_EQ(tokenize(*uncased, "[mask]"), (Words{"[UNK]", "[UNK]", "[UNK]"}));
  EXPECT_EQ(uncased->special_id("[MASK]"), 4);
  EXPECT_EQ(uncased->special_id("[UNK]"), 1);
  const BertSpecialIds ids = bert_special_ids(*uncased);
  EXPECT_EQ(std::vector<int32_t>({ids.pad, ids.cls, ids.sep, ids.mask}),
            (std::vector<int32_t>{0, 2, 3, 4}));
}

TEST(WordPiece, ChineseCharactersSplitUnlessConfiguredOff) {  // test_change_tokenize_chinese_chars
  const Words vocab = {"[UNK]", "\u7684", "\u4EBA", "\u6709", "##\u4EBA", "##\u6709"};
  testing::TempDir on_dir, off_dir;
  const auto on = wordpiece(on_dir, vocab, R"({"tokenize_chinese_chars": true})");
  EXPECT_EQ(tokenize(*on, "\u7684\u4EBA\u6709"), (Words{"\u7684", "\u4EBA", "\u6709"}));
  const auto off = wordpiece(off_dir, vocab, R"({"tokenize_chinese_chars": false})");
  EXPECT_EQ(tokenize(*off, "\u7684\u4EBA\u6709"), (Words{"\u7684", "##\u4EBA", "##\u6709"}));
}

// Expected words are what Python gives: BertTokenizer lowercases one character at a time with
// str.lower and strips accents with unicodedata.normalize("NFD") minus category Mn.
TEST(WordPiece, UnicodeLowercaseAndAccentsFollowPython) {
  // U+0130 lowercases to i + U+0307 (a mark that stripping drops).
  EXPECT_EQ(basic("\u0130x"), Words{"ix"});
  EXPECT_EQ(basic("\u0130x", true, false), Words{"i\u0307x"});
  // Per character, so no final sigma: "ΟΔΟΣ" is "οδοσ", not str.lower's "οδος".
  EXPECT_EQ(basic("\u039F\u0394\u039F\u03A3"), Words{"\u03BF\u03B4\u03BF\u03C3"});
  EXPECT_EQ(basic("\u01C4", false, true), Words{"\u01C4"});  // a compatibility decomposition only
  EXPECT_EQ(basic("\u01C4"), Words{"\u01C6"});
  // Hangul syllables decompose into their jamo when stripping, and stay whole otherwise.
  EXPECT_EQ(basic("\uD55C\uAC01"), Words{"\u1112\u1161\u11AB\u1100\u1161\u11A8"});
  EXPECT_EQ(basic("\uD55C\uAC01", false), Words{"\uD55C\uAC01"});
  // U+1FEF (a symbol) strips to '`', which is punctuation: split after the mapping.
  EXPECT_EQ(basic("a\u1FEFb"), (Words{"a", "`", "b"}));
  // A CJK compatibility ideograph stands alone and strips to its unified ideograph.
  EXPECT_EQ(basic("x\uF900y"), (Words{"x", "\u8C48", "y"}));
  EXPECT_EQ(basic("x\uF900y", false), (Words{"x", "\uF900", "y"}));
  // Unicode punctuation (Pd, Ps, Pe, Po) splits; a currency symbol (Sc) does not.
  EXPECT_EQ(basic("a\u2014b\u300Cc\u300D\u00A1d\u20ACe"),
            (Words{"a", "\u2014", "b", "\u300C", "c", "\u300D", "\u00A1", "d\u20ACe"}));
  // Whitespace: Zs and U+2028 split; NEL (Cc), soft hyphen (Cf), U+FFFD, private use and
  // unassigned code points are dropped, as is a byte that is not UTF-8.
  EXPECT_EQ(basic("a\u3000b\u2028c"), (Words{"a", "b", "c"}));
  EXPECT_EQ(basic(std::string("a\u0085b\u00ADc\uFFFDd\uE000e\U000E0080f\xFFg") + '\0' + "h"),
            Words{"abcdefgh"});
}

// Every code point, with and without lowercasing and accent stripping, against Python's answer
// (tests/golden/make_bert_unicode_fixture.py): the generated tables, the Hangul formula and the
// one-pass order of cleaning, splitting and mapping agree with str.lower and unicodedata.
TEST(WordPiece, EveryCodePointMatchesPython) {
  std::istringstream lines(testing::read_file("tests/golden/bert_unicode.txt"));
  std::string header;
  std::getline(lines, header);
  EXPECT_NE(header.find(std::string("(Unicode ") + unicode::kUnicodeVersion + ")"),
            std::string::npos)
      << "the fixture and data/unicode_tables.h come from different Unicode versions: " << header;
  int blocks = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    int lower = 0, strip = 0;
    uint32_t block = 0;
    std::string expected;
    fields >> lower >> strip >> block >> expected;
    std::string text;
    for (uint32_t cp = block * 4096; cp < (block + 1) * 4096; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      text += 'a';
      unicode::append_utf8(cp, text);
      text += "b ";
    }
    uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a of the words joined by U+001F
    const Words words = bert_basic_tokenize(text, {lower == 1, strip == 1, true});
    for (size_t i = 0; i < words.size(); ++i) {
      if (i > 0) h = (h ^ 0x1F) * 0x100000001B3ull;
      for (unsigned char c : words[i]) h = (h ^ c) * 0x100000001B3ull;
    }
    char got[17];
    std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(got, expected) << "lower " << lower << ", strip " << strip << ": U+" << std::hex
                             << block * 4096 << " to U+" << (block + 1) * 4096 - 1;
    ++blocks;
  }
  EXPECT_EQ(blocks, 4 * 0x110000 / 4096);
}

TEST(WordPiece, LongAndUnknownWordsBecomeUnk) {
  testing::TempDir dir;
  const auto tok =
      wordpiece(dir, {"[UNK]", "a", "##a", "\u00E9", "##\u00E9"}, R"({"do_lower_case": false})");
  EXPECT_EQ(tok->encode(std::string(100, 'a')).size(), 100u);
  EXPECT_EQ(tok->encode(std::string(101, 'a')), std::vector<int32_t>{0});
  EXPECT_EQ(tok->encode(std::string(101, 'a') + " a"), (std::vector<int32_t>{0, 1}));
  // The limit counts characters, not bytes.
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\u00E9";
  EXPECT_EQ(tok->encode(accents).size(), 100u);
  EXPECT_EQ(tok->encode(accents + "\u00E9"), std::vector<int32_t>{0});
  // A word spelled only partly is one [UNK], not its pieces.
  EXPECT_EQ(tok->encode("aab a"), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(tok->encode("ba"), std::vector<int32_t>{0});
}

TEST(WordPiece, ExtraSpecialsAndDecode) {
  testing::TempDir dir;
  const auto tok = wordpiece(dir, kHfVocab, "", {"[MASK]", "<extra>", "lowest", "<extra>"});
  EXPECT_EQ(tok->vocab_size(), 16);
  EXPECT_EQ(tok->special_id("[MASK]"), 4);
  EXPECT_EQ(tok->special_id("<extra>"), 15);
  EXPECT_EQ(tok->special_id("lowest"), 14);  // a vocabulary token asked for keeps its id
  EXPECT_EQ(tok->encode("running<extra>unwanted"), (std::vector<int32_t>{10, 11, 15, 9, 6, 7}));
  EXPECT_EQ(tok->decode({1, 10, 11, 15, 9, 6, 7, 2}), "[CLS] running <extra> unwanted [SEP]");
  EXPECT_EQ(tok->decode({7}), "##ed");
  EXPECT_EQ(tok->decode({}), "");
  EXPECT_THROW(tok->decode({16}), Error);
  EXPECT_THROW(tok->decode({-1}), Error);
  // Specials come in id order.
  std::vector<int32_t> order;
  for (const auto& s : tok->specials()) order.push_back(s.second);
  EXPECT_EQ(order, (std::vector<int32_t>{0, 1, 2, 3, 4, 14, 15}));
  EXPECT_EQ(vocabulary_hash(*tok).size(), 16u);
  testing::TempDir other;
  EXPECT_NE(vocabulary_hash(*tok), vocabulary_hash(*wordpiece(other, kHfVocab)));
}

void expect_data_error(const std::filesystem::path& dir, const std::string& mentions) {
  testing::expect_error(ExitCode::data, mentions, [&] { make_tokenizer(dir.string()); });
}

TEST(WordPiece, BadVocabularyNamesFileAndLine) {
  testing::TempDir dir;
  const auto vocab = dir.path() / "vocab.txt";
  testing::write_file(vocab, "");
  expect_data_error(dir.path(), "vocab.txt:1: empty file");
  testing::write_file(vocab, "[UNK]\na\n\nb\n");
  expect_data_error(dir.path(), "vocab.txt:3: empty line");
  testing::write_file(vocab, "[UNK]\na\nb\na\n");
  expect_data_error(dir.path(), "vocab.txt:4: token 'a' repeats line 2");
  testing::write_file(vocab, "[UNK]\na\xC3\n");
  expect_data_error(dir.path(), "vocab.txt:2: invalid UTF-8 at byte 2");
  testing::write_file(vocab, "a\nb\n");
  expect_data_error(dir.path(), "vocab.txt: no [UNK] token");
  // Windows line ends and a last line without one are fine.
  testing::write_file(vocab, "[UNK]\r\nab\r\n##c");
  EXPECT_EQ(make_tokenizer(dir.path().string())->encode("abc ab"), (std::vector<int32_t>{1, 2, 1}));

  testing::write_file(dir.path() / "tokenizer_config.json", "{\"do_lower_case\": tru");
  expect_data_error(dir.path(), "tokenizer_config.json: not valid JSON");
  testing::write_file(dir.path() / "tokenizer_config.json", "[]");
  expect_data_error(dir.path(), "tokenizer_config.json: expected a JSON object, got array");
  testing::write_file(dir.path() / "tokenizer_config.json", R"({"do_lower_case": "yes"})");
  expect_data_error(dir.path(), "\"do_lower_case\" must be true or false, got string");
  testing::write_file(dir.path() / "tokenizer_config.json", R"({"do_lower_case": null})");
  expect_data_error(dir.path(), "\"do_lower_case\" must be true or false, got null");
  testing::write_file(dir.path() / "tokenizer_config.json", R"({"strip_accents": 1})");
  expect_data_error(dir.path(), "\"strip_accents\" must be true or false or null, got number");
  testing::write_file(dir.path() / "tokenizer_config.json", R"({"do_basic_tokenize": false})");
  expect_data_error(dir.path(), "\"do_basic_tokenize\": false is not supported");
}

// A real tokenizer_config.json (bert-base-cased style) with keys Forge does not read.
TEST(WordPiece, ConfigKeysAndDefaults) {
  testing::TempDir plain, cased, accents;
  const Words vocab = {"[UNK]", "hello", "Hello", "h\u00E9llo", "H\u00E9llo"};
  EXPECT_EQ(tokenize(*wordpiece(plain, vocab), "H\u00E9llo"), Words{"hello"});
  EXPECT_EQ(tokenize(*wordpiece(cased, vocab, R"({"do_lower_case": false, "model_max_length": 512,
                                                 "strip_accents": null, "unk_token": "[UNK]"})"),
                     "H\u00E9llo"),
            Words{"H\u00E9llo"});
  EXPECT_EQ(tokenize(*wordpiece(accents, vocab, R"({"strip_accents": false})"), "H\u00E9llo"),
            Words{"h\u00E9llo"});
}

TEST(WordPiece, MakeTokenizerPicksTheFormatByFiles) {
  testing::TempDir root;
  const auto bert = root.path() / "bert-tiny";
  std::filesystem::create_directories(bert);
  testing::write_file(bert / "vocab.txt", "[PAD]\n[UNK]\nhi\n");
  const auto tok = make_tokenizer(bert.string() + "/", {"[MASK]"});
  EXPECT_EQ(tok->name(), "bert-tiny");
  EXPECT_EQ(tok->vocab_size(), 4);
  EXPECT_EQ(tok->encode("Hi [MASK] there"), (std::vector<int32_t>{2, 3, 1}));

  // Hugging Face's names for GPT-2's two files load with the BPE loader.
  const auto hf_gpt2 = root.path() / "hf-gpt2";
  std::filesystem::create_directories(hf_gpt2);
  testing::write_file(hf_gpt2 / "vocab.json",
                      testing::read_file("data/tokenizers/gpt2/encoder.json"));
  expect_data_error(hf_gpt2, "merges.txt");
  testing::write_file(hf_gpt2 / "merges.txt", testing::read_file("data/tokenizers/gpt2/vocab.bpe"));
  const auto hf = make_tokenizer(hf_gpt2.string());
  const auto gpt2 = make_tokenizer("gpt2");
  EXPECT_EQ(hf->name(), "hf-gpt2");
  EXPECT_EQ(hf->vocab_size(), gpt2->vocab_size());
  EXPECT_EQ(vocabulary_hash(*hf), vocabulary_hash(*gpt2));
  for (const char* text : {"Hello world<|endoftext|>", "it's  \n\n 12ab \xff", "na\u00EFve \u4E2D"})
    EXPECT_EQ(hf->encode(text), gpt2->encode(text)) << text;

  expect_data_error(root.path() / "missing", "not a tokenizer");
  const auto empty = root.path() / "empty";
  std::filesystem::create_directories(empty);
  for (const char* file :
       {"no tokenizer files", "vocab.txt", "encoder.json + vocab.bpe", "vocab.json + merges.txt"})
    expect_data_error(empty, file);
}

TEST(WordPiece, ShakespeareSpeed) {
  const std::string text = testing::read_file("data/samples/tinyshakespeare.txt");
  ASSERT_GT(text.size(), 1000000u);
  // Every word of three characters or less, the longer ones less their last two letters, and
  // "##" pieces of one or two letters.
  Words vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  std::set<std::string> seen;
  for (const std::string& w : bert_basic_tokenize(text, {})) {
    const std::string start = w.size() > 3 ? w.substr(0, w.size() - 2) : w;
    if (seen.insert(start).second) vocab.push_back(start);
  }
  for (char a = 'a'; a <= 'z'; ++a) {
    vocab.push_back(std::string("##") + a);
    for (char b = 'a'; b <= 'z'; ++b) vocab.push_back(std::string("##") + a + b);
  }
  testing::TempDir dir;
  const auto tok = wordpiece(dir, vocab);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const std::vector<int32_t> ids = tok->encode(text);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GT(ids.size(), text.size() / 8);
  std::printf("wordpiece: encode %.2f MB/s (%zu bytes -> %zu tokens, %zu-token vocabulary)\n",
              static_cast<double>(text.size()) / s / 1e6, text.size(), ids.size(), vocab.size());
}

}  // namespace
}  // namespace forge
