// Matrix products on oneDNN (f32) with a reference path for f64. Transposed operands (views from
// transpose()) are passed to the kernel as strides, never copied.
#pragma once

#include "core/tensor.h"

namespace forge {

/// a [..., M, K] @ b [..., K, N] -> [..., M, N]; batch dimensions broadcast. 1-D operands are
/// treated as a row (a) or column (b) vector and that dimension is dropped from the result.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x [..., K] · weight [N, K]^T + bias [N] -> [..., N]; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace forge
