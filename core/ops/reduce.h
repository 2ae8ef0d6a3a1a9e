// Reductions over dimensions. Negative dims count from the end; keepdim leaves size-1 dimensions
// so the result broadcasts against the input.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge {

/// Sum of all elements, a 0-d tensor.
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Largest / smallest value along `dim`; the gradient goes to the first position holding it.
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x, int64_t dim, bool keepdim = false);
/// Over all elements (gradient split evenly among ties, as PyTorch does for full reductions).
Tensor max(const Tensor& x);
Tensor min(const Tensor& x);
/// Variance over `dims`, divided by n - 1 when unbiased.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased = true,
           bool keepdim = false);

/// Values and i64 indices of the k largest (or smallest) entries along `dim`, sorted; no gradient.
struct TopK {
  Tensor values;
  Tensor indices;
};
TopK topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
/// Index of the largest entry along `dim` (i64).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace forge
