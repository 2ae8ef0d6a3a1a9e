// Right-padding into i64 tensors (the dtype every index op and loss takes).
#include "data/batch.h"

#include <algorithm>

#include "core/error.h"
#include "data/lm_data.h"

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

std::vector<int32_t> next_token_targets(std::span<const int32_t> row, int64_t prompt_len,
                                        std::span<const uint8_t> scored) {
  std::vector<int32_t> target(row.begin() + 1, row.end());
  for (size_t j = 0; j < target.size(); ++j)
    if (int64_t(j) + 1 < prompt_len || (!scored.empty() && !scored[j + 1]))
      target[j] = int32_t(LMWindows::kIgnoreTarget);
  return target;
}

NextTokenRows next_token_rows(const std::vector<std::span<const int32_t>>& rows,
                              const std::vector<int64_t>& prompt_len,
                              const std::vector<std::span<const uint8_t>>& scored) {
  // [R, W-1]: inputs are a row without its last token, targets the row shifted by one.
  FORGE_CHECK(rows.size() == prompt_len.size(), "next_token_rows: ", rows.size(), " rows but ",
              prompt_len.size(), " prompt lengths");
  FORGE_CHECK(scored.empty() || scored.size() == rows.size(), "next_token_rows: ", rows.size(),
              " rows but ", scored.size(), " scored masks");
  std::vector<std::vector<int32_t>> inputs, targets;
  inputs.reserve(rows.size());
  targets.reserve(rows.size());
  NextTokenRows out;
  out.targets_per_row.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::span<const int32_t> row = rows[r];
    FORGE_CHECK(row.size() >= 2, "next_token_rows: row ", r, " has ", row.size(),
                " token(s), nothing to predict");
    FORGE_CHECK(scored.empty() || scored[r].size() == row.size(), "next_token_rows: row ", r,
                " has ", row.size(), " tokens but a scored mask of ", scored[r].size());
    inputs.emplace_back(row.begin(), row.end() - 1);
    const std::span<const uint8_t> flags = scored.empty() ? std::span<const uint8_t>() : scored[r];
    const std::vector<int32_t>& target =
        targets.emplace_back(next_token_targets(row, prompt_len[r], flags));
    out.targets_per_row.push_back(
        int64_t(std::count_if(target.begin(), target.end(),
                              [](int32_t t) { return t != int32_t(LMWindows::kIgnoreTarget); })));
  }
  const int64_t width = longest_row(inputs);
  out.ids = pad_rows(inputs, width, 0);
  out.targets = pad_rows(targets, width, LMWindows::kIgnoreTarget);
  out.mask = padding_mask(inputs, width);
  return out;
}

}  // namespace forge
