// Checks and index arithmetic shared by the op implementations in core/ops (not a public API).
#pragma once

#include <cstdint>

#include "core/kernels/index.h"
#include "core/tensor.h"

namespace forge::op_util {

/// Ops compute in f32 or f64; `what` names the operand in the message.
inline void check_float(const Tensor& t, const char* op, const char* what = "input") {
  FORGE_CHECK(t.defined(), op, ": ", what, " is undefined");
  FORGE_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, ": ", what,
              " must be f32 or f64, got ", dtype_name(t.dtype()));
}

/// A dimension index in [-ndim, ndim) made non-negative.
inline int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  FORGE_CHECK(d >= -ndim && d < ndim, op, ": dimension ", d, " out of range for a ", ndim,
              "-d tensor");
  return d < 0 ? d + ndim : d;
}

/// A dense tensor seen as [outer, n, inner] around dimension `dim`.
struct Fold {
  int64_t outer = 1, n = 1, inner = 1;
};
inline Fold fold_at(const Shape& shape, int64_t dim) {
  Fold f;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d)
    (d < dim ? f.outer : d == dim ? f.n : f.inner) *= shape[size_t(d)];
  return f;
}

/// Zeros of `shape` with dout scatter-added at `index` along the axis g describes: the backward of
/// every gather-like op (index_select, gather, max/min along a dim). Defined in layout_copy.cpp.
Tensor scatter_into_zeros(const Tensor& dout, const Tensor& index, const kernels::AxisIndex& g,
                          const Shape& shape);

}  // namespace forge::op_util
