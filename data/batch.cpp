// Right-padding into i64 tensors (the dtype every index op and loss takes).
#include "data/batch.h"

#include <algorithm>

#include "core/error.h"

namespace forge {

int64_t longest_row(const std::vector<std::vector<int32_t>>& rows) {
  size_t longest = 0;
  for (const auto& row : rows) longest = std::max(longest, row.size());
  return int64_t(longest);
}

namespace {
void check_width(const std::vector<std::vector<int32_t>>& rows, int64_t width) {
  for (size_t r = 0; r < rows.size(); ++r)
    if (int64_t(rows[r].size()) > width)
      throw Error(ExitCode::data, detail::concat("row ", r, " has ", rows[r].size(),
                                                 " tokens, more than the batch width ", width));
}
}  // namespace

Tensor pad_rows(const std::vector<std::vector<int32_t>>& rows, int64_t width, int64_t pad_value) {
  check_width(rows, width);
  Tensor out = empty({int64_t(rows.size()), width}, DType::i64);
  int64_t* p = out.data<int64_t>();
  for (const auto& row : rows) {
    int64_t* end = std::copy(row.begin(), row.end(), p);
    std::fill(end, p + width, pad_value);
    p += width;
  }
  return out;
}

Tensor padding_mask(const std::vector<std::vector<int32_t>>& rows, int64_t width) {
  check_width(rows, width);
  Tensor out = empty({int64_t(rows.size()), width}, DType::i64);
  int64_t* p = out.data<int64_t>();
  for (const auto& row : rows) {
    std::fill(p, p + int64_t(row.size()), int64_t(1));
    std::fill(p + int64_t(row.size()), p + width, int64_t(0));
    p += width;
  }
  return out;
}

}  // namespace forge
