// SFT data: every JSONL error names file:line and the field, tokenization keeps the prompt and
// appends end-of-text, batches score exactly the completion and its end-of-text, the loader resumes
// onto the uninterrupted stream and refuses a cursor of other data, and the shipped fortunes file
// parses and fits the byte-level GPT's context.
#include <gtest/gtest.h>

#include <set>

#include "core/checksum.h"
#include "core/error.h"
#include "data/lm_data.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "tests/data/record_checks.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;

// n rows; row i is {i, i, ..., i} (i % 4 + 2 tokens) with prompt_len i % 2, so a row names itself.
std::shared_ptr<const SFTDataset> numbered(int64_t n) {
  auto d = std::make_shared<SFTDataset>();
  for (int64_t i = 0; i < n; ++i) {
    d->tokens.emplace_back(static_cast<size_t>(i % 4 + 2), static_cast<int32_t>(i));
    d->prompt_len.push_back(i % 2);
  }
  return d;
}

void expect_same_batch(const SFTBatch& a, const SFTBatch& b, const std::string& where) {
  EXPECT_EQ(a.indices, b.indices) << where;
  EXPECT_EQ(a.ids.shape(), b.ids.shape()) << where;
  EXPECT_EQ(a.ids.to_vector<int64_t>(), b.ids.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.targets.to_vector<int64_t>(), b.targets.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.mask.to_vector<int64_t>(), b.mask.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.num_targets, b.num_targets) << where;
}

TEST(SFT, ReadsRecordsSkippingBlankLines) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "ok.jsonl";
  testing::write_file(file,
                      "{\"prompt\": \"Q: 1+1?\\n\", \"completion\": \"2\"}\n"
                      "\n   \r\n"
                      "{\"completion\": \"caf\\u00e9 \\\"x\\\"\", \"prompt\": \"\"}");  // no final \n
  const std::vector<SFTRecord> r = read_sft_jsonl(file);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Q: 1+1?\n");
  EXPECT_EQ(r[0].completion, "2");
  EXPECT_EQ(r[1].prompt, "");
  EXPECT_EQ(r[1].completion, "café \"x\"");
}

TEST(SFT, EachJsonlErrorNamesFileLineAndField) {
  const std::string good = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  testing::expect_jsonl_errors(
      {
          {good + "\n{\"prompt\": \"a\", \"completion\": }\n", ":3:", "not JSON (byte 31"},
          {good + "[\"a\", \"b\"]\n", ":2:", "got array"},
          {good + good + "{\"prompt\": \"a\"}\n", ":3:", "missing field \"completion\""},
          {"{\"completion\": \"b\"}\n", ":1:", "missing field \"prompt\""},
          {good + "{\"prompt\": 7, \"completion\": \"b\"}\n", ":2:",
           "field \"prompt\" must be a string, got number"},
          {"{\"prompt\": \"a\", \"completion\": null}\n", ":1:",
           "field \"completion\" must be a string, got null"},
          {good + "{\"prompt\": \"a\", \"completion\": \"b\", \"response\": \"c\"}\n", ":2:",
           "unknown field \"response\""},
      },
      "SFT", [](const fs::path& file) { read_sft_jsonl(file); });
}

TEST(SFT, TokenizeKeepsThePromptAppendsEndOfTextAndTruncates) {
  const auto bytes = make_tokenizer("bytes");
  const std::vector<int32_t> eot = end_of_text_ids(*bytes, "\n");
  EXPECT_EQ(eot, (V{'\n'}));
  const std::vector<SFTRecord> records = {{"ab: ", "xyz"}, {"", "q"}, {"p: ", "0123456789"}};
  const SFTDataset d = tokenize_sft(records, *bytes, eot, 8);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.tokens[0], (V{'a', 'b', ':', ' ', 'x', 'y', 'z', '\n'}));
  EXPECT_EQ(d.tokens[1], (V{'q', '\n'}));
  EXPECT_EQ(d.tokens[2], (V{'p', ':', ' ', '0', '1', '2', '3', '4'}));  // cut at 8, eot lost
  EXPECT_EQ(d.prompt_len, (std::vector<int64_t>{4, 0, 3}));

  // The prompt plus one completion token must fit; record 1's prompt does not.
  EXPECT_EQ(tokenize_sft({{"ab", "c"}, {"abcd", "e"}}, *bytes, eot, 5).tokens[1],
            (V{'a', 'b', 'c', 'd', 'e'}));
  try {
    tokenize_sft({{"ab", "c"}, {"abcde", "f"}}, *bytes, eot, 5);
    ADD_FAILURE() << "a prompt filling max_len was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("record 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(testing::exit_code_of([&] { tokenize_sft({{"", ""}}, *bytes, eot, 8); }),
            ExitCode::data);  // one token: nothing to predict
  EXPECT_EQ(testing::exit_code_of([&] { tokenize_sft(records, *bytes, {}, 8); }), ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { tokenize_sft(records, *bytes, eot, 1); }), ExitCode::usage);
}

TEST(SFT, EndOfTextIsTheSpecialWhenTheTokenizerHasIt) {
  const auto gpt2 = make_tokenizer("gpt2");
  EXPECT_EQ(end_of_text_ids(*gpt2, "<|endoftext|>"), (V{50256}));
  const auto bytes = make_tokenizer("bytes", {"[PAD]", "<eot>"});
  EXPECT_EQ(end_of_text_ids(*bytes, "<eot>"), (V{257}));
  EXPECT_EQ(end_of_text_ids(*bytes, "\n\n"), (V{'\n', '\n'}));
}

TEST(SFT, BatchScoresExactlyTheCompletionAndEndOfText) {
  // Row 0: prompt {10, 11}, completion {12, 13}, eot {1}; row 1: prompt {20}, completion {21}, eot.
  SFTDataset d;
  d.tokens = {{10, 11, 12, 13, 1}, {20, 21, 1}};
  d.prompt_len = {2, 1};
  const SFTBatch b = SFTLoader::make_batch(d, {0, 1});
  constexpr int64_t I = LMWindows::kIgnoreTarget;
  ASSERT_EQ(I, -100);
  ASSERT_EQ(b.ids.shape(), (Shape{2, 4}));
  ASSERT_EQ(b.targets.shape(), (Shape{2, 4}));
  ASSERT_EQ(b.mask.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.ids.dtype(), DType::i64);
  EXPECT_EQ(b.targets.dtype(), DType::i64);
  EXPECT_EQ(b.ids.to_vector<int64_t>(), (std::vector<int64_t>{10, 11, 12, 13, 20, 21, 0, 0}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (std::vector<int64_t>{I, 12, 13, 1, 21, 1, I, I}));
  EXPECT_EQ(b.mask.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(b.num_targets, 5);
  EXPECT_EQ(b.indices, (std::vector<int64_t>{0, 1}));

  // An empty prompt scores every next token; batch_at serves dataset order, clipped at the end.
  d.prompt_len = {0, 1};
  auto shared = std::make_shared<const SFTDataset>(d);
  const SFTBatch tail = SFTLoader(shared, 4, 0).batch_at(1, 5);
  EXPECT_EQ(tail.indices, (std::vector<int64_t>{1}));
  EXPECT_EQ(tail.targets.to_vector<int64_t>(), (std::vector<int64_t>{21, 1}));
  const SFTBatch all = SFTLoader(shared, 4, 0).batch_at(0, 2);
  EXPECT_EQ(all.targets.to_vector<int64_t>(), (std::vector<int64_t>{11, 12, 13, 1, 21, 1, I, I}));
  EXPECT_EQ(all.num_targets, 6);
  EXPECT_EQ(testing::exit_code_of([&] { SFTLoader(shared, 4, 0).batch_at(2, 1); }),
            ExitCode::usage);
}

TEST(SFT, SplitIsSeededDisjointAndCovering) {
  const auto d = numbered(50);
  const SFTSplit s = split_sft_by_fraction(*d, 0.2, 3);
  ASSERT_EQ(s.val->size(), 10);
  ASSERT_EQ(s.train->size(), 40);
  std::set<int32_t> seen;
  for (const SFTDataset* side : {s.train.get(), s.val.get()})
    for (int64_t i = 0; i < side->size(); ++i) {
      const int32_t id = side->tokens[static_cast<size_t>(i)][0];
      EXPECT_TRUE(seen.insert(id).second) << id;
      EXPECT_EQ(side->prompt_len[static_cast<size_t>(i)], id % 2);  // rows keep their prompt_len
    }
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(split_sft_by_fraction(*d, 0.2, 3).val->tokens, s.val->tokens);
  EXPECT_NE(split_sft_by_fraction(*d, 0.2, 4).val->tokens, s.val->tokens);
  EXPECT_EQ(testing::exit_code_of([&] { split_sft_by_fraction(*d, 1.0, 3); }), ExitCode::usage);
}

TEST(SFT, RestoredLoaderContinuesTheUninterruptedStreamAcrossEpochs) {
  const auto d = numbered(10);
  testing::expect_restored_stream([&] { return SFTLoader(d, 4, 5); }, expect_same_batch);
}

TEST(SFT, FingerprintMismatchOnRestoreIsACheckpointError) {
  const auto d = numbered(10);
  EXPECT_EQ(fingerprint(*numbered(10)), fingerprint(*d));
  for (int part = 0; part < 3; ++part) {
    SFTDataset changed = *d;
    if (part == 0) changed.tokens[4][1] = 0;
    if (part == 1) changed.prompt_len[9] = 0;
    if (part == 2) changed.tokens.push_back({1, 2}), changed.prompt_len.push_back(1);
    EXPECT_NE(fingerprint(changed), fingerprint(*d)) << part;
  }
  EXPECT_EQ(SFTLoader(d, 4, 5).fingerprint(), fingerprint(*d));
  auto changed = std::make_shared<SFTDataset>(*d);
  changed->prompt_len[0] = 1;
  testing::expect_other_data_refused(SFTLoader(d, 4, 5), SFTLoader(changed, 4, 5));
}

TEST(SFT, Fnv1a64MatchesTheReferenceValues) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  EXPECT_EQ(fnv1a64("bar", 3, fnv1a64("foo", 3)), fnv1a64("foobar", 6));
}

TEST(SFT, ShippedFortunesParseAndFitTheByteContext) {
  const std::vector<SFTRecord> records = read_sft_jsonl("data/samples/fortunes_sft.jsonl");
  EXPECT_GT(records.size(), 1000u);
  std::set<std::string> categories;
  for (const SFTRecord& r : records) {
    ASSERT_GE(r.prompt.size(), 3u);
    EXPECT_EQ(r.prompt.substr(r.prompt.size() - 2), ": ") << r.prompt;
    categories.insert(r.prompt.substr(0, r.prompt.size() - 2));
    EXPECT_FALSE(r.completion.empty());
    EXPECT_LE(r.prompt.size() + r.completion.size() + 1, 64u) << r.prompt << r.completion;
  }
  EXPECT_TRUE(categories.count("science"));
  EXPECT_GE(categories.size(), 10u);

  const auto bytes = make_tokenizer("bytes");
  const SFTDataset d = tokenize_sft(records, *bytes, end_of_text_ids(*bytes, "\n"), 64);
  for (const auto& row : d.tokens) EXPECT_EQ(row.back(), '\n');  // nothing was cut
}

}  // namespace
}  // namespace forge
