// Padding: layout, mask and the refusal of rows longer than the batch.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/batch.h"

namespace forge {

TEST(Batch, PadsRowsAtTheEndAndMasksThePadding) {
  std::vector<std::vector<int32_t>> rows = {{5, 6, 7}, {}, {9}};
  ASSERT_EQ(longest_row(rows), 3);
  Tensor ids = pad_rows(rows, 4, -1), mask = padding_mask(rows, 4);
  ASSERT_EQ(ids.shape(), (Shape{3, 4}));
  std::vector<int64_t> want_ids = {5, 6, 7, -1, -1, -1, -1, -1, 9, -1, -1, -1};
  std::vector<int64_t> want_mask = {1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  EXPECT_EQ(ids.to_vector<int64_t>(), want_ids);
  EXPECT_EQ(mask.to_vector<int64_t>(), want_mask);
}

TEST(Batch, RefusesRowsLongerThanTheWidth) {
  std::vector<std::vector<int32_t>> rows = {{1, 2, 3}};
  EXPECT_THROW(pad_rows(rows, 2, 0), Error);
  EXPECT_THROW(padding_mask(rows, 2), Error);
}

}  // namespace forge
