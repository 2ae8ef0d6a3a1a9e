// Preference data: every JSONL error names file:line and the field, tokenization keeps the prompt's
// own ids and truncates as TRL's DPOTrainer does (prompt from the left, then responses from the
// right), batches put the chosen rows first and score only response tokens, the split keeps pairs
// whole, and the loader resumes onto the uninterrupted stream and refuses a cursor of other data.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "data/lm_data.h"
#include "data/preference.h"
#include "data/tokenizer.h"
#include "tests/data/record_checks.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using V = std::vector<int32_t>;
using I64 = std::vector<int64_t>;
constexpr int64_t kIgnore = LMWindows::kIgnoreTarget;

// n pairs; pair i has prompt_len i % 2 and rows of i's: chosen i % 4 + 2 long, rejected i % 3 + 2
// long and ending in 1000 + i, so a row names its pair and side.
std::shared_ptr<const PreferenceDataset> numbered(int64_t n) {
  auto d = std::make_shared<PreferenceDataset>();
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    d->chosen.emplace_back(static_cast<size_t>(i % 4 + 2), id);
    d->rejected.emplace_back(static_cast<size_t>(i % 3 + 2), id);
    d->rejected.back().back() = 1000 + id;
    d->prompt_len.push_back(i % 2);
  }
  return d;
}

void expect_same_batch(const PreferenceBatch& a, const PreferenceBatch& b,
                       const std::string& where) {
  EXPECT_EQ(a.indices, b.indices) << where;
  EXPECT_EQ(a.ids.shape(), b.ids.shape()) << where;
  EXPECT_EQ(a.ids.to_vector<int64_t>(), b.ids.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.targets.to_vector<int64_t>(), b.targets.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.mask.to_vector<int64_t>(), b.mask.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.target_counts.to_vector<int64_t>(), b.target_counts.to_vector<int64_t>()) << where;
}

TEST(PreferenceData, ReadsRecordsSkippingBlankLines) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "ok.jsonl";
  testing::write_file(file,
                      "{\"prompt\": \"Q: 2+2?\\n\", \"chosen\": \"4\", \"rejected\": \"5\"}\n"
                      "\n  \r\n"
                      "{\"rejected\": \"no\", \"prompt\": \"\", \"chosen\": \"caf\\u00e9\"}");
  const std::vector<PreferenceRecord> r = read_preference_jsonl(file);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].prompt, "Q: 2+2?\n");
  EXPECT_EQ(r[0].chosen, "4");
  EXPECT_EQ(r[0].rejected, "5");
  EXPECT_EQ(r[1].prompt, "");  // an empty prompt is allowed: the response is scored from token 1
  EXPECT_EQ(r[1].chosen, "café");
  EXPECT_EQ(r[1].rejected, "no");
}

TEST(PreferenceData, EachJsonlErrorNamesFileLineAndField) {
  const std::string good = "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n";
  const std::vector<testing::BadFile> cases = {
      {good + "\n{\"prompt\": \"p\", \"chosen\": }\n", ":3:", "not JSON (byte 27"},
      {good + "\"p\"\n", ":2:", "got string"},
      {good + "{\"chosen\": \"a\", \"rejected\": \"b\"}\n", ":2:", "missing field \"prompt\""},
      {"{\"prompt\": \"p\", \"rejected\": \"b\"}\n", ":1:", "missing field \"chosen\""},
      {good + good + "{\"prompt\": \"p\", \"chosen\": \"a\"}\n", ":3:",
       "missing field \"rejected\""},
      {"{\"prompt\": 1, \"chosen\": \"a\", \"rejected\": \"b\"}\n", ":1:",
       "field \"prompt\" must be a string, got number"},
      {good + "{\"prompt\": \"p\", \"chosen\": [\"a\"], \"rejected\": \"b\"}\n", ":2:",
       "field \"chosen\" must be a string, got array"},
      {"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": null}\n", ":1:",
       "field \"rejected\" must be a string, got null"},
      {good + "{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n", ":2:",
       "field \"chosen\" is empty"},
      {"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"\"}\n", ":1:",
       "field \"rejected\" is empty"},
      {good + "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"score\": 1}\n", ":2:",
       "unknown field \"score\""},
      {good + "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"margin\": \"1\"}\n",
       ":2:", "field \"margin\" must be a finite number, got \"1\""},
      {"{\"prompt\": \"p\", \"completions\": [\"a\", \"b\"]}\n", ":1:",
       "missing field \"scores\""},
      {"{\"prompt\": \"p\", \"completions\": [\"a\"], \"scores\": [1]}\n", ":1:",
       "field \"completions\" must be a list of at least 2 strings"},
      {"{\"prompt\": \"p\", \"completions\": [\"a\", \"b\"], \"scores\": [1]}\n", ":1:",
       "field \"scores\" must be a list of 2 numbers"},
      {"{\"prompt\": \"p\", \"completions\": [\"a\", \"\"], \"scores\": [1, 2]}\n", ":1:",
       "field \"completions\"[1] must be a non-empty string"},
      {"{\"prompt\": \"p\", \"completions\": [\"a\", \"b\"], \"scores\": [1, true]}\n", ":1:",
       "field \"scores\"[1] must be a finite number, got true"},
      {"{\"prompt\": \"p\", \"completions\": [\"a\", \"b\"], \"scores\": [1, 2], \"chosen\": \"a\"}\n",
       ":1:", "field \"chosen\" does not go with \"completions\""},
  };
  testing::expect_jsonl_errors(cases, "preference",
                               [](const fs::path& file) { read_preference_jsonl(file); });
}

// A ranked record stands for every two of its completions that score differently, the higher
// chosen, in (i, j) order; a margin rides on a pair record only.
TEST(PreferenceData, RankedRecordsExpandIntoTheirPairsAndMarginsAreRead) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "ranked.jsonl";
  testing::write_file(file,
                      "{\"prompt\": \"p\", \"completions\": [\"a\", \"b\", \"c\", \"d\"], "
                      "\"scores\": [0, 2, 0, -1.5]}\n"
                      "{\"prompt\": \"q\", \"chosen\": \"x\", \"rejected\": \"y\", \"margin\": 2.5}\n"
                      "{\"prompt\": \"r\", \"completions\": [\"e\", \"f\"], \"scores\": [1, 1]}\n");
  const std::vector<PreferenceRecord> r = read_preference_jsonl(file);
  std::vector<std::string> got;
  for (const PreferenceRecord& x : r)
    got.push_back(x.prompt + ":" + x.chosen + ">" + x.rejected + "@" + std::to_string(x.margin));
  EXPECT_EQ(got, (std::vector<std::string>{"p:b>a@0.000000", "p:a>d@0.000000", "p:b>c@0.000000",
                                           "p:b>d@0.000000", "p:c>d@0.000000",
                                           "q:x>y@2.500000"}));
  // A file whose every ranking ties holds no pair.
  const fs::path ties = dir.path() / "ties.jsonl";
  testing::write_file(ties, "{\"prompt\": \"r\", \"completions\": [\"e\", \"f\"], \"scores\": [1, 1]}\n");
  testing::expect_error(ExitCode::data, "ties.jsonl: no pairs",
                        [&] { read_preference_jsonl(ties); });
}

// A ranked record's pairs grow as the square of its completions: the completions of a record, the
// pairs of the file and their text are bounded, each refusal naming the record that passes the
// bound, before any pair is built.
TEST(PreferenceData, RankedRecordsAreBoundedBeforeTheyExpand) {
  testing::TempDir dir;
  auto ranked = [](int completions) {
    std::string texts, scores;
    for (int i = 0; i < completions; ++i) {
      texts += std::string(i ? ", " : "") + "\"c" + std::to_string(i) + "\"";
      scores += std::string(i ? ", " : "") + std::to_string(i);
    }
    return "{\"prompt\": \"p\", \"completions\": [" + texts + "], \"scores\": [" + scores + "]}\n";
  };
  const fs::path wide = dir.path() / "wide.jsonl";
  testing::write_file(wide, ranked(64) + ranked(65));
  testing::expect_error(ExitCode::data,
                        "wide.jsonl:2: field \"completions\" holds 65 completions, more than "
                        "the 64 a ranked record may have",
                        [&] { read_preference_jsonl(wide); });
  // Four completions that all differ are six pairs: the second record brings the file to 12.
  const fs::path many = dir.path() / "many.jsonl";
  testing::write_file(many, ranked(4) + ranked(4));
  testing::expect_error(ExitCode::data,
                        "many.jsonl:2: the file's pairs pass 10, the most one preference file "
                        "may expand to",
                        [&] { read_preference_jsonl(many, {.pairs = 10}); });
  EXPECT_EQ(read_preference_jsonl(many, {.pairs = 12}).size(), 12u);
  // Each pair of a record holds the prompt and two completions: 6 pairs of 1 + 2 + 2 bytes.
  testing::expect_error(ExitCode::data,
                        "many.jsonl:2: the text of the file's pairs passes 59 bytes",
                        [&] { read_preference_jsonl(many, {.text_bytes = 59}); });
  EXPECT_EQ(read_preference_jsonl(many, {.text_bytes = 60}).size(), 12u);
}

TEST(PreferenceData, TokenizeKeepsThePromptAndAppendsEndOfTextToEachResponse) {
  const auto bytes = make_tokenizer("bytes", {"<eot>"});
  const V eot = {256};
  const PreferenceDataset d =
      tokenize_preferences({{"Q: ", "yes", "no"}, {"", "ok", "bad"}}, *bytes, eot);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.chosen[0], (V{'Q', ':', ' ', 'y', 'e', 's', 256}));
  EXPECT_EQ(d.rejected[0], (V{'Q', ':', ' ', 'n', 'o', 256}));
  EXPECT_EQ(d.chosen[1], (V{'o', 'k', 256}));
  EXPECT_EQ(d.rejected[1], (V{'b', 'a', 'd', 256}));
  EXPECT_EQ(d.prompt_len, (I64{3, 0}));
  // Without an end-of-text the responses are their own ids only.
  EXPECT_EQ(tokenize_preferences({{"Q: ", "yes", "no"}}, *bytes, {}).chosen[0],
            (V{'Q', ':', ' ', 'y', 'e', 's'}));
}

TEST(PreferenceData, TruncationCutsThePromptFromTheLeftThenTheResponsesFromTheRight) {
  const auto bytes = make_tokenizer("bytes");
  const V eot = {'\n'};
  auto one = [&](PreferenceRecord r, int64_t max_length, int64_t max_prompt_length) {
    const PreferenceDataset d =
        tokenize_preferences({r}, *bytes, eot, {max_length, max_prompt_length});
    auto text = [](const V& ids) { return std::string(ids.begin(), ids.end()); };
    return std::vector<std::string>{text(d.chosen[0]), text(d.rejected[0]),
                                    std::to_string(d.prompt_len[0])};
  };
  using S = std::vector<std::string>;
  // Fits exactly (prompt + longer response == max_length): nothing is cut.
  EXPECT_EQ(one({"abcdef", "xyz", "q"}, 10, 2), (S{"abcdefxyz\n", "abcdefq\n", "6"}));
  // The prompt alone: it keeps its last max_prompt_length ids, after which the pair fits.
  EXPECT_EQ(one({"abcdefgh", "xy", "z"}, 10, 4), (S{"efghxy\n", "efghz\n", "4"}));
  // The responses alone (the prompt is within max_prompt_length): each keeps its first
  // max_length - max_prompt_length ids, so the chosen row loses its end-of-text and the rejected
  // row, within that budget, is whole. As in TRL the budget ignores the room the short prompt
  // leaves (the chosen row is 7 long, not 8).
  EXPECT_EQ(one({"ab", "0123456789", "xyz"}, 8, 3), (S{"ab01234", "abxyz\n", "2"}));
  // Both: the prompt is cut first, then the responses.
  EXPECT_EQ(one({"abcdefgh", "0123456789", "uvw"}, 8, 3), (S{"fgh01234", "fghuvw\n", "3"}));
  // The longer response decides: a rejected response too long cuts the prompt and the chosen one
  // is left alone when it fits the budget.
  EXPECT_EQ(one({"abcdefgh", "ok", "0123456789"}, 8, 3), (S{"fghok\n", "fgh01234", "3"}));

  const std::vector<PreferenceRecord> r = {{"p", "a", "b"}};
  testing::expect_error(ExitCode::usage, "max_prompt_length 8 and max_length 8",
                        [&] { tokenize_preferences(r, *bytes, eot, {8, 8}); });
  testing::expect_error(ExitCode::usage, "max_prompt_length 0",
                        [&] { tokenize_preferences(r, *bytes, eot, {8, 0}); });
  // An empty prompt and a one-token response: a row's first token is never a target.
  const std::vector<PreferenceRecord> empty_prompt = {{"p", "a", "b"}, {"", "ab", "c"}};
  testing::expect_error(ExitCode::data, "preference record 1: an empty prompt and a one-token "
                                        "rejected response leave nothing to predict",
                        [&] { tokenize_preferences(empty_prompt, *bytes, {}); });
  testing::expect_error(ExitCode::data, "preference record 0: the chosen response encodes to no",
                        [&] { tokenize_preferences({{"p", "", "b"}}, *bytes, {}); });
}

TEST(PreferenceData, BatchPutsChosenRowsFirstAndScoresOnlyResponses) {
  // Pair 0: prompt {10, 11}, chosen {12, 13, 1}, rejected {14, 1}; pair 1: prompt {20},
  // chosen {21, 1}, rejected {22, 23, 24, 1}.
  PreferenceDataset d;
  d.chosen = {{10, 11, 12, 13, 1}, {20, 21, 1}};
  d.rejected = {{10, 11, 14, 1}, {20, 22, 23, 24, 1}};
  d.prompt_len = {2, 1};
  d.margin = {0.5, 2.0};
  const PreferenceBatch b = PreferenceLoader::make_batch(d, {1, 0});
  constexpr int64_t I = kIgnore;
  ASSERT_EQ(I, -100);
  EXPECT_EQ(b.pairs(), 2);
  EXPECT_EQ(b.indices, (I64{1, 0}));
  ASSERT_EQ(b.ids.shape(), (Shape{4, 4}));
  ASSERT_EQ(b.targets.shape(), (Shape{4, 4}));
  ASSERT_EQ(b.mask.shape(), (Shape{4, 4}));
  EXPECT_EQ(b.ids.to_vector<int64_t>(), (I64{20, 21, 0, 0,  10, 11, 12, 13,     // chosen 1, 0
                                             20, 22, 23, 24,  10, 11, 14, 0}));  // rejected 1, 0
  EXPECT_EQ(b.targets.to_vector<int64_t>(), (I64{21, 1, I, I,  I, 12, 13, 1,
                                                 22, 23, 24, 1,  I, 14, 1, I}));
  EXPECT_EQ(b.mask.to_vector<int64_t>(), (I64{1, 1, 0, 0,  1, 1, 1, 1,
                                              1, 1, 1, 1,  1, 1, 1, 0}));
  EXPECT_EQ(b.target_counts.dtype(), DType::i64);
  EXPECT_EQ(b.target_counts.to_vector<int64_t>(), (I64{2, 3, 4, 2}));
  // A reward model's view: whole rows, the same order, padded to the longest (5).
  ASSERT_EQ(b.rows.shape(), (Shape{4, 5}));
  EXPECT_EQ(b.rows.to_vector<int64_t>(), (I64{20, 21, 1, 0, 0,    10, 11, 12, 13, 1,
                                              20, 22, 23, 24, 1,  10, 11, 14, 1, 0}));
  EXPECT_EQ(b.row_mask.to_vector<int64_t>(), (I64{1, 1, 1, 0, 0,  1, 1, 1, 1, 1,
                                                  1, 1, 1, 1, 1,  1, 1, 1, 1, 0}));
  EXPECT_EQ(b.margins.to_vector<float>(), (std::vector<float>{2.0f, 0.5f}));
}

TEST(PreferenceData, NoPromptTokenIsEverATarget) {
  // Prompts of 0 to 9 bytes, some cut from the left: every target of a row is one of its response
  // ids, and every response id after the first position is a target.
  const auto bytes = make_tokenizer("bytes");
  std::vector<PreferenceRecord> records;
  for (int i = 0; i < 10; ++i)
    records.push_back({std::string(static_cast<size_t>(i), 'P'), std::string(i % 4 + 1, 'c'),
                       std::string(7 - i % 5, 'r')});
  const auto d = std::make_shared<const PreferenceDataset>(
      tokenize_preferences(records, *bytes, {'\n'}, {10, 4}));
  const PreferenceBatch b = PreferenceLoader(d, 10, 0).batch_at(0, 10);
  const int64_t width = b.targets.size(1);
  const std::vector<int64_t> targets = b.targets.to_vector<int64_t>();
  const std::vector<int64_t> counts = b.target_counts.to_vector<int64_t>();
  for (int64_t row = 0; row < 20; ++row) {
    const int64_t pair = row % 10;
    const V& tokens = row < 10 ? d->chosen[size_t(pair)] : d->rejected[size_t(pair)];
    const int64_t prompt_len = d->prompt_len[size_t(pair)];
    int64_t scored = 0;
    for (int64_t j = 0; j < width; ++j) {
      const int64_t t = targets[size_t(row * width + j)];
      const bool response = j + 1 >= std::max<int64_t>(prompt_len, 1) &&
                            j + 1 < static_cast<int64_t>(tokens.size());
      EXPECT_EQ(t, response ? tokens[size_t(j + 1)] : kIgnore) << "row " << row << ", j " << j;
      EXPECT_NE(t, 'P') << "row " << row << ", j " << j;
      scored += response;
    }
    EXPECT_EQ(counts[size_t(row)], scored) << row;
  }
}

TEST(PreferenceData, SplitIsSeededDisjointCoveringAndKeepsPairsWhole) {
  const auto d = numbered(40);
  const PreferenceSplit s = split_preferences_by_fraction(*d, 0.25, 3);
  ASSERT_EQ(s.val->size(), 10);
  ASSERT_EQ(s.train->size(), 30);
  std::set<int32_t> seen;
  for (const PreferenceDataset* side : {s.train.get(), s.val.get()})
    for (int64_t i = 0; i < side->size(); ++i) {
      const int32_t id = side->chosen[size_t(i)][0];
      EXPECT_TRUE(seen.insert(id).second) << id;
      EXPECT_EQ(side->rejected[size_t(i)].back(), 1000 + id);  // its own rejected row
      EXPECT_EQ(side->prompt_len[size_t(i)], id % 2);           // and prompt length
    }
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(split_preferences_by_fraction(*d, 0.25, 3).val->chosen, s.val->chosen);
  EXPECT_NE(split_preferences_by_fraction(*d, 0.25, 4).val->chosen, s.val->chosen);
  EXPECT_EQ(testing::exit_code_of([&] { split_preferences_by_fraction(*d, 1.0, 3); }),
            ExitCode::usage);
}

TEST(PreferenceData, BatchAtServesDatasetOrderClippedAtTheEnd) {
  const auto d = numbered(5);
  const PreferenceLoader loader(d, 2, 0);
  EXPECT_EQ(loader.batch_at(3, 4).indices, (I64{3, 4}));
  EXPECT_EQ(loader.batch_at(0, 2).indices, (I64{0, 1}));
  testing::expect_error(ExitCode::usage, "preference loader: no batch of 1 at row 5 of 5",
                        [&] { loader.batch_at(5, 1); });
  EXPECT_EQ(testing::exit_code_of([&] { loader.batch_at(0, 0); }), ExitCode::usage);
  testing::expect_error(ExitCode::data, "preference loader: the dataset has no records",
                        [] { PreferenceLoader(nullptr, 2, 0); });
}

TEST(PreferenceData, RestoredLoaderContinuesTheUninterruptedStreamAcrossEpochs) {
  const auto d = numbered(10);
  testing::expect_restored_stream([&] { return PreferenceLoader(d, 4, 5); }, expect_same_batch);
}

TEST(PreferenceData, ChangedDataIsRefusedByFingerprint) {
  const auto d = numbered(10);
  EXPECT_EQ(fingerprint(*numbered(10)), fingerprint(*d));
  for (int part = 0; part < 4; ++part) {
    PreferenceDataset changed = *d;
    if (part == 0) changed.chosen[4][1] = 0;
    if (part == 1) changed.rejected[7][0] = 0;
    if (part == 2) changed.prompt_len[9] = 0;
    if (part == 3) std::swap(changed.chosen, changed.rejected);
    EXPECT_NE(fingerprint(changed), fingerprint(*d)) << part;
  }
  EXPECT_EQ(PreferenceLoader(d, 4, 5).fingerprint(), fingerprint(*d));
  auto changed = std::make_shared<PreferenceDataset>(*d);
  changed->rejected[0][0] = 7;
  testing::expect_other_data_refused(PreferenceLoader(d, 4, 5), PreferenceLoader(changed, 4, 5));
}

}  // namespace
}  // namespace forge
