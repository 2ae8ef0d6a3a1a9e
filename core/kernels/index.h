// Copying layout kernels: concatenation, and gather/scatter-add along one axis (behind
// index_select, gather and the backward of max/min along a dim). Buffers are dense; an axis op sees
// x as [outer, n, inner] and its output as [outer, m, inner]. Scatter-add is deterministic: each
// output element is summed by one thread in a fixed order. Every kernel has a plain reference in
// kernels::ref that the parity tests compare against.
#pragma once

#include <cstddef>
#include <cstdint>

namespace forge::kernels {

/// out row o = x_0 row o ++ x_1 row o ++ ...: input t is dense [outer, row_bytes[t]] bytes, so
/// any dtype and any cat dim (fold the dims after it into the row) use the same copy.
void cat_rows(const void* const* xs, const int64_t* row_bytes, int count, int64_t outer,
              void* out);

/// Geometry of an axis gather: x dense [outer, n, inner], out dense [outer, m, inner], and the
/// index of out[o, j, i] at index[o * index_strides[0] + j * index_strides[1] + i *
/// index_strides[2]] (gather: {m * inner, inner, 1}; index_select: {0, 1, 0}).
struct AxisIndex {
  int64_t outer, n, m, inner;
  int64_t index_strides[3];
};

/// Position of the first of `count` dense indices outside [0, limit), or -1 if all are valid.
int64_t first_out_of_range(const int64_t* index, int64_t count, int64_t limit);
/// out[o, j, i] = x[o, index(o, j, i), i]; indices must be valid. T is any element type.
template <class T>
void gather_axis(const T* x, const int64_t* index, const AxisIndex& g, T* out);
/// dx[o, index(o, j, i), i] += dout[o, j, i] (dx holds [outer, n, inner]; repeated indices add up).
template <class T>
void scatter_add_axis(const T* dout, const int64_t* index, const AxisIndex& g, T* dx);

namespace ref {
void cat_rows(const void* const* xs, const int64_t* row_bytes, int count, int64_t outer,
              void* out);
template <class T>
void gather_axis(const T* x, const int64_t* index, const AxisIndex& g, T* out);
template <class T>
void scatter_add_axis(const T* dout, const int64_t* index, const AxisIndex& g, T* dx);
}  // namespace ref

}  // namespace forge::kernels
