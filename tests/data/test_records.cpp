// Record datasets: labels from file names (temp files and the shipped fortunes), [CLS]/[SEP]
// framing and truncation, the seeded split, the loader's per-epoch shuffles, end-of-epoch rule,
// padding and mask, and resuming from a saved cursor onto exactly the uninterrupted batch stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "core/error.h"
#include "data/records.h"
#include "data/tokenizer.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// n rows; row i is {i, i, ...} (i % 3 + 1 tokens long) with label i / per_label, so a row names
// itself and its place in the original order.
std::shared_ptr<const RecordDataset> numbered(int64_t n, int64_t per_label = 10) {
  auto d = std::make_shared<RecordDataset>();
  for (int64_t i = 0; i < (n + per_label - 1) / per_label; ++i)
    d->label_names.push_back(std::to_string(i));
  for (int64_t i = 0; i < n; ++i) {
    d->tokens.emplace_back(static_cast<size_t>(i % 3 + 1), static_cast<int32_t>(i));
    d->labels.push_back(static_cast<int32_t>(i / per_label));
  }
  return d;
}

std::vector<int64_t> identities(const RecordDataset& d) {
  std::vector<int64_t> out;
  for (const auto& row : d.tokens) out.push_back(row.at(0));
  return out;
}

void expect_same_batch(const RecordBatch& a, const RecordBatch& b, const std::string& where) {
  EXPECT_EQ(a.indices, b.indices) << where;
  EXPECT_EQ(a.ids.shape(), b.ids.shape()) << where;
  EXPECT_EQ(a.ids.to_vector<int64_t>(), b.ids.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.mask.to_vector<int64_t>(), b.mask.to_vector<int64_t>()) << where;
  EXPECT_EQ(a.labels.to_vector<int64_t>(), b.labels.to_vector<int64_t>()) << where;
}

TEST(Records, LabelsComeFromFileNames) {
  testing::TempDir dir;
  const fs::path d = dir.path();
  testing::write_file(d / "b_cat.txt", "meow\n%\npurr\n%\n");
  testing::write_file(d / "a_dog.txt", "woof\n%\n\n%\n");  // the blank record is dropped
  testing::write_file(d / "README", "not a record file\n");
  testing::write_file(d / "notes.md", "nor this\n");

  const std::vector<TextRecord> from_dir = read_labeled_records({d}, RecordFormat::percent);
  ASSERT_EQ(from_dir.size(), 3u);
  EXPECT_EQ(from_dir[0].label, "a_dog");  // a directory's files in name order
  EXPECT_EQ(from_dir[0].text, "woof\n");
  EXPECT_EQ(from_dir[1].label, "b_cat");
  EXPECT_EQ(from_dir[1].text, "meow\n");
  EXPECT_EQ(from_dir[2].text, "purr\n");

  const auto listed = read_labeled_records({d / "b_cat.txt", d / "a_dog.txt"}, RecordFormat::lines);
  ASSERT_EQ(listed.size(), 7u);         // meow % purr % woof % % (the blank line dropped)
  EXPECT_EQ(listed[0].label, "b_cat");  // listed files keep the given order
  EXPECT_EQ(listed[0].text, "meow");
  EXPECT_EQ(listed[4].label, "a_dog");
  EXPECT_EQ(listed[4].text, "woof");

  testing::TempDir empty;
  for (const fs::path& bad : {d / "missing.txt", empty.path()}) {
    try {
      read_labeled_records({bad}, RecordFormat::percent);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data);
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
    }
  }
}

TEST(Records, FortunesHaveOneLabelPerCategoryFile) {
  const auto records = read_labeled_records({"data/samples/fortunes"}, RecordFormat::percent);
  const auto tok = make_tokenizer("bytes", {"[PAD]", "[CLS]", "[SEP]"});
  const RecordDataset d = tokenize_records(records, *tok, {{"[CLS]"}, {"[SEP]"}, 128});
  ASSERT_EQ(d.label_names.size(), 43u);
  EXPECT_EQ(std::count(d.label_names.begin(), d.label_names.end(), "COPYRIGHT"), 0);
  const auto love = std::find(d.label_names.begin(), d.label_names.end(), "love");
  ASSERT_NE(love, d.label_names.end());
  const auto love_id = static_cast<int32_t>(love - d.label_names.begin());
  EXPECT_GT(std::count(d.labels.begin(), d.labels.end(), love_id), 10);
  EXPECT_GT(d.size(), 10000);
  for (const auto& row : d.tokens) ASSERT_LE(row.size(), 128u);
}

TEST(Records, TokenizeFramesWithSpecialsAndTruncatesTheText) {
  const auto tok = make_tokenizer("bytes", {"[PAD]", "[CLS]", "[SEP]"});
  const std::vector<TextRecord> records = {{"hello", "zebra"}, {"a", "ant"}, {"bc", "zebra"}};
  const RecordDataset d = tokenize_records(records, *tok, {{"[CLS]"}, {"[SEP]"}, 4});
  using V = std::vector<int32_t>;
  EXPECT_EQ(d.label_names, (std::vector<std::string>{"ant", "zebra"}));
  EXPECT_EQ(d.labels, (V{1, 0, 1}));
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.tokens[0], (V{257, 'h', 'e', 258}));
  EXPECT_EQ(d.tokens[1], (V{257, 'a', 258}));
  EXPECT_EQ(d.tokens[2], (V{257, 'b', 'c', 258}));
  EXPECT_EQ(tokenize_records(records, *tok).tokens[0], (V{'h', 'e', 'l', 'l', 'o'}));

  EXPECT_EQ(testing::exit_code_of([&] {
              tokenize_records(records, *tok, {{"[CLS]"}, {"[MASK]"}, 0});
            }),
            ExitCode::data);
  EXPECT_EQ(testing::exit_code_of([&] {
              tokenize_records(records, *tok, {{"[CLS]"}, {"[SEP]"}, 2});
            }),
            ExitCode::usage);
}

TEST(Records, SplitIsSeededDisjointAndCovering) {
  const auto d = numbered(100);  // ten labels in blocks of ten rows
  const RecordSplit s = split_records_by_fraction(*d, 0.2, 7);
  ASSERT_EQ(s.val->size(), 20);
  ASSERT_EQ(s.train->size(), 80);
  EXPECT_EQ(s.val->label_names, d->label_names);
  EXPECT_EQ(s.train->label_names, d->label_names);
  std::vector<int64_t> all = identities(*s.train), val = identities(*s.val);
  EXPECT_TRUE(std::is_sorted(val.begin(), val.end()));
  all.insert(all.end(), val.begin(), val.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(100);
  std::iota(want.begin(), want.end(), int64_t{0});
  EXPECT_EQ(all, want);                    // disjoint and covering
  for (size_t i = 0; i < val.size(); ++i)  // rows keep their labels
    EXPECT_EQ(s.val->labels[i], val[i] / 10);
  std::vector<int> per_label(10, 0);  // stratified: a fifth of every label
  for (int32_t l : s.val->labels) ++per_label[size_t(l)];
  EXPECT_EQ(per_label, std::vector<int>(10, 2));

  EXPECT_EQ(identities(*split_records_by_fraction(*d, 0.2, 7).val), val);
  EXPECT_NE(identities(*split_records_by_fraction(*d, 0.2, 8).val), val);
  EXPECT_EQ(split_records_by_fraction(*d, 0.0, 7).train->size(), 100);
  EXPECT_EQ(split_records_by_fraction(*numbered(3), 0.01, 7).val->size(), 1);
  EXPECT_EQ(testing::exit_code_of([&] { split_records_by_fraction(*d, 1.0, 7); }), ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { split_records_by_fraction(*numbered(1), 0.5, 7); }), ExitCode::data);
  // A label with one row trains; no label with two is nothing to hold out.
  EXPECT_EQ(testing::exit_code_of([&] { split_records_by_fraction(*numbered(3, 1), 0.5, 7); }),
            ExitCode::data);
  EXPECT_EQ(split_records_by_fraction(*numbered(12), 0.5, 7).val->size(), 6);  // 5 of 10, 1 of 2
}

TEST(Records, ALabelsSplitDependsOnlyOnItsOwnRows) {
  // "b" among other labels, in another position, holds out the same rows of its own.
  const std::vector<std::string> alone = {"b", "b", "b", "b", "b", "b", "b", "b"};
  std::vector<std::string> mixed = {"c", "c", "c"};
  mixed.insert(mixed.end(), alone.begin(), alone.end());
  mixed.insert(mixed.end(), {"a", "a", "a", "a"});
  const auto [train_alone, val_alone] = split_rows_stratified(alone, 0.25, 5);
  const auto [train_mixed, val_mixed] = split_rows_stratified(mixed, 0.25, 5);
  ASSERT_EQ(val_alone.size(), 2u);
  std::vector<int64_t> b_val;
  for (int64_t r : val_mixed)
    if (mixed[size_t(r)] == "b") b_val.push_back(r - 3);
  EXPECT_EQ(b_val, val_alone);
  EXPECT_EQ(val_mixed.size(), 2u + 1u + 1u);  // round(0.75) = 1 of "c", 1 of "a"
  EXPECT_NE(split_rows_stratified(alone, 0.25, 6).second, val_alone);
}

TEST(Records, LabelledJsonlRecordsAndTheirErrors) {
  testing::TempDir dir;
  const fs::path f = dir.path() / "labelled.jsonl";
  testing::write_file(f, "{\"text\": \"good film\", \"label\": \"pos\"}\n\n"
                         "{\"label\": 3, \"text\": \"meh\"}\n");
  const std::vector<TextRecord> records = read_labeled_records({f}, RecordFormat::percent);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].text, "good film");
  EXPECT_EQ(records[0].label, "pos");
  EXPECT_EQ(records[1].label, "3");  // an integer label is its decimal text

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\"}\n", ":2: missing field \"label\""},
      {"{\"text\": \"a\", \"label\": 1.5}\n", ":1: field \"label\" must be a string or an integer"},
      {"{\"text\": 7, \"label\": \"x\"}\n", ":1: field \"text\" must be a string"},
      {"{\"text\": \"a\", \"lable\": \"x\"}\n", ":1: unknown field \"lable\""},
      {"{\"text\": \"a\", \"label\": \"\"}\n", ":1: field \"label\" is empty"},
      {"{\"text\": \"\", \"label\": \"x\"}\n", ":1: field \"text\" is empty"},
      {"\n\n{\"text\": \"a\",\n", ":3: not JSON"},
      {"[1, 2]\n", ":1: expected an object with \"text\" and \"label\""},
  };
  for (const auto& [text, want] : bad) {
    testing::write_file(f, text);
    try {
      read_labeled_records({f}, RecordFormat::percent);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::data) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.string() + want), std::string::npos) << e.what();
    }
  }
}

TEST(Records, KeepLabelsSelectsAndNamesAMissingLabel) {
  const std::vector<TextRecord> records = {{"a", "x"}, {"b", "y"}, {"c", "x"}, {"d", "z"}};
  const std::vector<TextRecord> kept = keep_labels(records, {"z", "x"});
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].text, "a");  // record order, not the order of the labels asked for
  EXPECT_EQ(kept[2].text, "d");
  try {
    keep_labels(records, {"x", "w"});
    ADD_FAILURE() << "no error for a missing label";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("'w' (the data has: x, y, z)"), std::string::npos)
        << e.what();
  }
}

TEST(Records, EachEpochIsASeededPermutation) {
  const auto d = numbered(50);
  RecordLoader a(d, 8, 1), same(d, 8, 1), other(d, 8, 2);
  const std::vector<int64_t> e0 = a.epoch_order(0), e1 = a.epoch_order(1);
  std::vector<int64_t> sorted = e0, want(50);
  std::sort(sorted.begin(), sorted.end());
  std::iota(want.begin(), want.end(), int64_t{0});
  EXPECT_EQ(sorted, want);
  EXPECT_NE(e0, want);
  EXPECT_EQ(same.epoch_order(0), e0);
  EXPECT_EQ(same.epoch_order(1), e1);
  EXPECT_NE(other.epoch_order(0), e0);
  EXPECT_NE(e1, e0);
  EXPECT_EQ(RecordLoader(d, 8, 1, {.shuffle = false}).epoch_order(3), want);

  // Serving an epoch hands out its order, every row once.
  ASSERT_EQ(a.batches_per_epoch(), 7);
  std::vector<int64_t> served;
  for (int64_t b = 0; b < 7; ++b) {
    const RecordBatch batch = a.next();
    served.insert(served.end(), batch.indices.begin(), batch.indices.end());
  }
  EXPECT_EQ(served, e0);
  EXPECT_EQ(a.cursor(), (LoaderCursor{1, 0, fingerprint(*d)}));
  EXPECT_EQ(a.next().indices, std::vector<int64_t>(e1.begin(), e1.begin() + 8));
}

TEST(Records, LastBatchOfAnEpochIsShortOrDropped) {
  const auto d = numbered(10);
  RecordLoader keep(d, 4, 3);
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  std::vector<int64_t> sizes;
  for (int b = 0; b < 4; ++b) sizes.push_back(keep.next().labels.numel());
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2, 4}));
  EXPECT_EQ(keep.cursor(), (LoaderCursor{1, 4, fingerprint(*d)}));

  RecordLoader drop(d, 4, 3, {.drop_last = true});
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  drop.next();
  EXPECT_EQ(drop.next().indices.size(), 4u);
  EXPECT_EQ(drop.cursor(), (LoaderCursor{1, 0, fingerprint(*d)}));  // rows 8 and 9 of epoch 0's order skipped
  const std::vector<int64_t> e1 = drop.epoch_order(1);
  EXPECT_EQ(drop.next().indices, std::vector<int64_t>(e1.begin(), e1.begin() + 4));
}

TEST(Records, PadsEachBatchToItsLongestRowWithAMask) {
  auto d = std::make_shared<RecordDataset>();
  d->label_names = {"x", "y"};
  d->tokens = {{5, 6, 7}, {8}, {9, 10}, {11}};
  d->labels = {1, 0, 1, 1};
  RecordLoader loader(d, 3, 0, {.shuffle = false, .pad_id = 99});
  const RecordBatch b = loader.next();
  ASSERT_EQ(b.ids.shape(), (Shape{3, 3}));
  ASSERT_EQ(b.mask.shape(), (Shape{3, 3}));
  ASSERT_EQ(b.labels.shape(), (Shape{3}));
  EXPECT_EQ(b.ids.dtype(), DType::i64);
  EXPECT_EQ(b.ids.to_vector<int64_t>(), (std::vector<int64_t>{5, 6, 7, 8, 99, 99, 9, 10, 99}));
  EXPECT_EQ(b.mask.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(b.indices, (std::vector<int64_t>{0, 1, 2}));
  const RecordBatch last = loader.next();  // the short tail: one row of width 1
  EXPECT_EQ(last.ids.shape(), (Shape{1, 1}));
  EXPECT_EQ(last.ids.to_vector<int64_t>(), (std::vector<int64_t>{11}));
  EXPECT_EQ(last.mask.to_vector<int64_t>(), (std::vector<int64_t>{1}));
}

TEST(Records, RestoredCursorContinuesTheUninterruptedStream) {
  const auto d = numbered(10);
  for (bool drop_last : {false, true}) {
    const RecordLoaderOptions options{.drop_last = drop_last};
    RecordLoader reference(d, 4, 11, options);
    std::vector<RecordBatch> stream;
    for (int b = 0; b < 9; ++b) stream.push_back(reference.next());
    // Stops inside an epoch, just before and just after an epoch boundary, a few epochs on.
    for (int k : {0, 1, 2, 3, 5, 6}) {
      RecordLoader first(d, 4, 11, options);
      for (int b = 0; b < k; ++b) first.next();
      const auto counters = first.cursor().to_counters("data.");
      ASSERT_EQ(counters.size(), 3u);
      ASSERT_TRUE(counters.count("data.epoch") && counters.count("data.position") &&
                  counters.count("data.fingerprint"));
      RecordLoader resumed(d, 4, 11, options);
      resumed.restore(LoaderCursor::from_counters(counters, "data.", fingerprint(*d)));
      EXPECT_EQ(resumed.cursor(), first.cursor());
      for (int b = k; b < 9; ++b)
        expect_same_batch(resumed.next(), stream[static_cast<size_t>(b)],
                          "drop_last " + std::to_string(drop_last) + ", resumed after " +
                              std::to_string(k) + ", batch " + std::to_string(b));
    }
  }
}

TEST(Records, FingerprintNamesTheDataAndGuardsResume) {
  const auto d = numbered(10);
  const uint64_t f = fingerprint(*d);
  EXPECT_EQ(fingerprint(*numbered(10)), f);
  // Each part of the data changes it: a token, a label, a label name, a row moved between rows.
  for (int part = 0; part < 4; ++part) {
    RecordDataset changed = *d;
    if (part == 0) changed.tokens[3][0] = 99;
    if (part == 1) changed.labels[9] = 1;
    if (part == 2) changed.label_names[0] = "zero";
    if (part == 3) changed.tokens[1].push_back(changed.tokens[2][0]), changed.tokens[2].pop_back();
    EXPECT_NE(fingerprint(changed), f) << part;
  }
  EXPECT_NE(fingerprint(*numbered(9)), f);

  RecordLoader loader(d, 4, 0);
  loader.next();
  const auto counters = loader.cursor().to_counters("data.");
  EXPECT_EQ(static_cast<uint64_t>(counters.at("data.fingerprint")), f);
  try {
    LoaderCursor::from_counters(counters, "data.", fingerprint(*numbered(11)));
    ADD_FAILURE() << "restored a cursor of other data";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::checkpoint);
    EXPECT_NE(std::string(e.what()).find("the training data changed since this checkpoint"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.resume: never"), std::string::npos) << e.what();
  }
  RecordLoader other(numbered(11), 4, 0);
  EXPECT_EQ(testing::exit_code_of([&] { other.restore(loader.cursor()); }), ExitCode::checkpoint);
}

TEST(Records, BadCursorsAndLoaderArgumentsAreRejected) {
  const auto d = numbered(10);
  const uint64_t f = fingerprint(*d);
  RecordLoader loader(d, 4, 0);
  for (const LoaderCursor& bad : {LoaderCursor{0, 10, f}, LoaderCursor{-1, 0, f},
                                  LoaderCursor{0, -1, f}, LoaderCursor{0, 0, f + 1}})
    EXPECT_EQ(testing::exit_code_of([&] { loader.restore(bad); }), ExitCode::checkpoint)
        << bad.epoch << " " << bad.position;
  EXPECT_EQ(loader.cursor(), (LoaderCursor{0, 0, f}));  // unchanged by a rejected restore
  RecordLoader drop(d, 4, 0, {.drop_last = true});
  EXPECT_EQ(testing::exit_code_of([&] { drop.restore({0, 8, f}); }), ExitCode::checkpoint);
  EXPECT_NO_THROW(drop.restore({2, 6, f}));
  EXPECT_EQ(testing::exit_code_of([&] {
              LoaderCursor::from_counters({{"data.epoch", 1}, {"data.fingerprint", 0}}, "data.", 0);
            }),
            ExitCode::checkpoint);
  EXPECT_EQ(testing::exit_code_of([&] {
              LoaderCursor::from_counters({{"epoch", 1}, {"position", 0}, {"fingerprint", 0}},
                                          "d.", 0);
            }),
            ExitCode::checkpoint);

  EXPECT_EQ(testing::exit_code_of([&] { RecordLoader(numbered(0), 4, 0); }), ExitCode::data);
  EXPECT_EQ(testing::exit_code_of([&] { RecordLoader(d, 0, 0); }), ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] { RecordLoader(d, 11, 0, {.drop_last = true}); }), ExitCode::data);
}

}  // namespace
}  // namespace forge
