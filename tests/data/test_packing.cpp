// SFT packing: first-fit rows, the packed batch's tensors (targets ignored at record ends and on
// padding, positions restarting, one segment per record and one for the padding), the loader's
// order (the padded loader's, every record once an epoch), its resumable cursor, and its errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "data/lm_data.h"
#include "data/packing.h"
#include "data/sft.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using V = std::vector<int64_t>;
constexpr int64_t kIgnore = LMWindows::kIgnoreTarget;

TEST(RowPacker, PlacesFirstFitAndRefusesWhatFitsNowhere) {
  RowPacker packer(2, 10);
  EXPECT_TRUE(packer.empty());
  EXPECT_TRUE(packer.place(7, 6));
  EXPECT_TRUE(packer.place(8, 5));   // row 0 has 4 left
  EXPECT_TRUE(packer.place(9, 4));   // fills row 0
  EXPECT_FALSE(packer.place(3, 6));  // row 1 has 5 left
  EXPECT_TRUE(packer.place(4, 5));
  EXPECT_EQ(packer.rows(), (std::vector<V>{{7, 9}, {8, 4}}));
  testing::expect_error(ExitCode::data, "record 5 takes 11 positions, rows hold 1 to 10",
                        [&] { packer.place(5, 11); });
  testing::expect_error(ExitCode::usage, "rows (0) and capacity (3) must be at least 1",
                        [] { RowPacker(0, 3); });
}

TEST(PackRecords, LaysRecordsEndToEndWithTheirOwnPositionsAndSegments) {
  const std::vector<int32_t> a_in = {1, 2, 3}, a_t = {int32_t(kIgnore), 3, 4}, b_in = {5, 6},
                             b_t = {6, 7}, c_in = {8}, c_t = {9};
  SFTBatch batch = pack_records({{{a_in, a_t}, {b_in, b_t}}, {{c_in, c_t}}});
  EXPECT_EQ(batch.ids.shape(), Shape({2, 5}));
  EXPECT_EQ(batch.ids.to_vector<int64_t>(), (V{1, 2, 3, 5, 6, 8, 0, 0, 0, 0}));
  EXPECT_EQ(batch.targets.to_vector<int64_t>(),
            (V{kIgnore, 3, 4, 6, 7, 9, kIgnore, kIgnore, kIgnore, kIgnore}));
  EXPECT_EQ(batch.positions.to_vector<int64_t>(), (V{0, 1, 2, 0, 1, 0, 0, 1, 2, 3}));
  EXPECT_EQ(batch.segments.to_vector<int64_t>(), (V{0, 0, 0, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(batch.mask.to_vector<int64_t>(), (V{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(batch.num_targets, 5);
  EXPECT_EQ(batch.num_tokens, 6);
}

// n records; record i is {i, ..., i} of 2 + (i * 7) % 9 tokens with a prompt of 1 + i % 2.
std::shared_ptr<const SFTDataset> records(int64_t n) {
  auto d = std::make_shared<SFTDataset>();
  for (int64_t i = 0; i < n; ++i) {
    d->tokens.emplace_back(size_t(2 + (i * 7) % 9), int32_t(i));
    d->prompt_len.push_back(1 + i % 2);
  }
  return d;
}

TEST(PackedSFTLoader, PacksEachRecordOnceAnEpochInThePaddedLoadersOrder) {
  auto data = records(23);
  PackedSFTLoader packed(data, 3, 12, 9);
  SFTLoader padded(data, 23, 9);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    // Each batch takes the next records of the padded loader's epoch order, all of them.
    const V order = padded.next().indices;
    size_t taken = 0;
    for (SFTBatch b = packed.next();; b = packed.next()) {
      EXPECT_LE(b.ids.size(0), 3);
      EXPECT_LE(b.ids.size(1), 12);
      // Each record's ids sit in one row under one segment, its targets scored past its prompt.
      const V ids = b.ids.to_vector<int64_t>(), targets = b.targets.to_vector<int64_t>();
      int64_t scored = 0;
      for (int64_t t : targets) scored += t != kIgnore;
      EXPECT_EQ(scored, b.num_targets);
      int64_t expected = 0;
      for (int64_t r : b.indices)
        expected += int64_t(data->tokens[size_t(r)].size()) - data->prompt_len[size_t(r)];
      EXPECT_EQ(b.num_targets, expected);
      const V segments = b.segments.to_vector<int64_t>();
      const size_t row_length = size_t(b.ids.size(1));
      for (int64_t r : b.indices) {
        if (r == 0) continue;  // record 0's id is also padding's
        std::vector<size_t> at;  // where record r's inputs (all of them r) sit
        for (size_t k = 0; k < ids.size(); ++k)
          if (ids[k] == r) at.push_back(k);
        ASSERT_EQ(at.size(), data->tokens[size_t(r)].size() - 1) << r;
        EXPECT_EQ(at.back() - at.front() + 1, at.size()) << r;
        EXPECT_EQ(at.front() / row_length, at.back() / row_length) << r;
        for (size_t k : at) EXPECT_EQ(segments[k], segments[at.front()]) << r;
      }
      ASSERT_LE(taken + b.indices.size(), order.size());
      V got = b.indices;
      V want(order.begin() + long(taken), order.begin() + long(taken + got.size()));
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << "epoch " << epoch << ", records from " << taken;
      taken += got.size();
      if (packed.cursor().position == 0) break;  // the epoch's last batch
    }
    EXPECT_EQ(taken, order.size());
    EXPECT_EQ(packed.cursor().epoch, epoch + 1);
  }
}

TEST(PackedSFTLoader, ResumesFromItsCursorAndSkipsAsItBatches) {
  auto data = records(23);
  PackedSFTLoader a(data, 2, 10, 4);
  std::vector<LoaderCursor> cursors;
  std::vector<V> batches;
  for (int i = 0; i < 12; ++i) {
    cursors.push_back(a.cursor());
    SFTBatch batch = a.next();
    batches.push_back(batch.ids.to_vector<int64_t>());
    V more = batch.positions.to_vector<int64_t>(), seg = batch.segments.to_vector<int64_t>();
    batches.back().insert(batches.back().end(), more.begin(), more.end());
    batches.back().insert(batches.back().end(), seg.begin(), seg.end());
  }
  EXPECT_GT(cursors[7].epoch, 0) << "the stream crosses an epoch";
  for (size_t i = 0; i < 12; i += 5) {
    PackedSFTLoader b(data, 2, 10, 4);
    b.restore(cursors[i]);
    SFTBatch got = b.next();
    V flat = got.ids.to_vector<int64_t>(), more = got.positions.to_vector<int64_t>(),
      seg = got.segments.to_vector<int64_t>();
    flat.insert(flat.end(), more.begin(), more.end());
    flat.insert(flat.end(), seg.begin(), seg.end());
    EXPECT_EQ(flat, batches[i]) << "batch " << i;
  }
  PackedSFTLoader b(data, 2, 10, 4);
  b.restore(cursors[2]);
  b.skip();
  EXPECT_EQ(b.cursor(), cursors[3]);
  LoaderCursor other = cursors[3];
  other.fingerprint ^= 1;
  testing::expect_error(ExitCode::checkpoint, "", [&] { b.restore(other); });
}

TEST(PackedSFTLoader, RefusesRecordsLongerThanARow) {
  auto data = records(5);  // record 1 has 9 tokens
  testing::expect_error(ExitCode::data,
                        "record 1 has 9 tokens, packed rows of context 7 hold 2 to 8",
                        [&] { PackedSFTLoader(data, 2, 7, 1); });
}

}  // namespace
}  // namespace forge
