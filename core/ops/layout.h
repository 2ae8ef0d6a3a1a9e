// Shape and indexing ops. reshape, permute, transpose, slice, expand, squeeze and unsqueeze
// return views sharing storage whenever the layout allows; the rest copy.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge {

/// One dimension may be -1 (inferred). A view when the strides allow it, else a copy.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// Removes `dim`, which must have size 1.
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
/// Elements start, start+step, ... < end along dim (negative start/end count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// Broadcast view to `shape` (stride 0 on stretched dimensions); -1 keeps a size.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
/// Consecutive pieces of `size` along dim (the last may be shorter); views.
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
/// x's slices at the i64 positions `index` (1-D) along dim; backward scatter-adds.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// torch.index_add: x with source's slices added at the i64 positions `index` (1-D, length m)
/// along dim; source has x's shape except m at dim. Repeated indices add up. Backward: dx = dout,
/// dsource = index_select(dout, dim, index).
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source);
/// out[i][j][k] = x[i][index[i][j][k]][k] for dim 1 (torch.gather); index is i64 with x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace forge
