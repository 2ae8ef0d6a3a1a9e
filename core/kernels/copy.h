// Strided copy with dtype conversion: the one kernel behind contiguous(), clone(), to() and
// copy_(). Iterates the destination in row-major order of `shape`.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace forge::kernels {

/// dst[i] = convert(src[i]) for every multi-index i of `shape`; strides in elements.
void copy_strided(const void* src, DType src_dtype, const int64_t* src_strides, void* dst,
                  DType dst_dtype, const int64_t* dst_strides, const int64_t* shape, int ndim);

namespace ref {
void copy_strided(const void* src, DType src_dtype, const int64_t* src_strides, void* dst,
                  DType dst_dtype, const int64_t* dst_strides, const int64_t* shape, int ndim);
}

/// Fills n elements of dtype with value.
void fill(void* dst, DType dtype, int64_t n, double value);

}  // namespace forge::kernels
