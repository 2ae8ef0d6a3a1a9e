// Padding variable-length token rows into dense batches. Every loader that batches sequences of
// different lengths (record datasets, BERT sentence pairs) pads through here, so that the
// convention is one: rows are left-aligned, padding sits at the end, the mask is 1 on real tokens.
#pragma once

#include <cstdint>
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

}  // namespace forge
