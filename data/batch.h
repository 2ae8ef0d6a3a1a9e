// Padding variable-length token rows into dense batches. Every loader that batches sequences of
// different lengths (record datasets, BERT sentence pairs, SFT and preference rows) pads through
// here, so that the convention is one: rows are left-aligned, padding sits at the end, the mask is
// 1 on real tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace forge {

/// Longest row, or 0 for no rows.
int64_t longest_row(const std::vector<std::vector<int32_t>>& rows);

/// rows -> i64 [rows.size(), width]: row r holds rows[r] followed by `pad_value`. Throws
/// Error(data) when a row is longer than `width` (callers truncate first, deliberately).
Tensor pad_rows(const std::vector<std::vector<int32_t>>& rows, int64_t width, int64_t pad_value);

/// i64 [rows.size(), width] attention mask: 1 at the real tokens of each row, 0 on its padding.
Tensor padding_mask(const std::vector<std::vector<int32_t>>& rows, int64_t width);

/// Next-token inputs and targets of rows that score only what follows their prompt. W is the
/// longest row: ids i64 [R, W-1] (each row without its last token, padded with 0); targets i64
/// [R, W-1] with targets[r][j] = row[j+1] where prompt_len[r] <= j+1 < the row's length, else
/// LMWindows::kIgnoreTarget (-100, data/lm_data.h); mask i64 [R, W-1], 1 on real input tokens;
/// targets_per_row[r] = the scored positions of row r. `scored`, when not empty, holds one mask a
/// row (a chat row's assistant tokens): a target is kept only where scored[r][j+1] is also 1.
struct NextTokenRows {
  Tensor ids, targets, mask;
  std::vector<int64_t> targets_per_row;
};
/// One row's targets as next_token_rows scores them: row[j+1] where j+1 >= prompt_len and, when
/// `scored` is not empty (one flag a token), scored[j+1]; else LMWindows::kIgnoreTarget.
std::vector<int32_t> next_token_targets(std::span<const int32_t> row, int64_t prompt_len,
                                        std::span<const uint8_t> scored);
/// Rows need at least two tokens (callers refuse shorter ones when tokenizing).
NextTokenRows next_token_rows(const std::vector<std::span<const int32_t>>& rows,
                              const std::vector<int64_t>& prompt_len,
                              const std::vector<std::span<const uint8_t>>& scored = {});

}  // namespace forge
