// Byte tokens, the positional split, reproducible training windows and evaluation tiling.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "data/lm_data.h"

namespace forge {
namespace {

std::shared_ptr<const std::vector<int32_t>> iota_tokens(int n) {
  auto v = std::make_shared<std::vector<int32_t>>();
  for (int i = 0; i < n; ++i) v->push_back(i % 256);
  return v;
}

TEST(LMData, ReadsBytesAndSplitsTheTail) {
  auto path = std::filesystem::temp_directory_path() / "forge_lm_data_test.txt";
  std::ofstream(path, std::ios::binary) << "ab\xff\n";
  auto tokens = read_byte_tokens(path);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'a', 'b', 255, '\n'}));
  std::filesystem::remove(path);
  TokenSplit s = split_by_position({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0.2);
  EXPECT_EQ(*s.train, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*s.val, (std::vector<int32_t>{8, 9}));
  try {
    read_byte_tokens("/nonexistent/corpus.txt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos);
  }
}

TEST(LMData, TrainingBatchesArePureFunctionsOfSeedAndStep) {
  LMWindows w(iota_tokens(1000), 16);
  LMBatch a = w.sample(4, 7, 3), b = w.sample(4, 7, 3), c = w.sample(4, 7, 4);
  EXPECT_EQ(a.ids.to_vector<int64_t>(), b.ids.to_vector<int64_t>());
  EXPECT_NE(a.ids.to_vector<int64_t>(), c.ids.to_vector<int64_t>());
  EXPECT_NE(a.ids.to_vector<int64_t>(), w.sample(4, 7, 3, 1).ids.to_vector<int64_t>());
  // Targets are the inputs shifted by one.
  auto ids = a.ids.to_vector<int64_t>(), tg = a.targets.to_vector<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tg[i], (ids[i] + 1) % 256);
}

TEST(LMData, EvalWindowsScoreEveryTargetExactlyOnce) {
  const int n = 103, T = 10;
  LMWindows w(iota_tokens(n), T);
  EXPECT_EQ(w.num_eval_windows(), 11);  // 102 targets in windows of 10
  std::multiset<int64_t> scored;
  for (int64_t first = 0; first < w.num_eval_windows(); first += 4) {
    LMBatch b = w.eval_batch(first, 4);
    for (int64_t t : b.targets.to_vector<int64_t>())
      if (t != LMWindows::kIgnoreTarget) scored.insert(t);
  }
  EXPECT_EQ(scored.size(), size_t(n - 1));
  for (int i = 1; i < n; ++i) EXPECT_EQ(scored.count(i), 1u) << i;
}

TEST(LMData, SplitShorterThanAContextIsADataError) {
  try {
    LMWindows w(iota_tokens(8), 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
  }
}

}  // namespace
}  // namespace forge
