// Embedding kernels: a row gather forward and a scatter-add backward into a dense [V, C]
// gradient. The backward splits columns between threads and adds rows in id-position order, so
// its result is bitwise the same for any thread count (no atomics). kernels::ref holds the
// plain test oracles.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// out[i, :] = weight[ids[i], :] for n ids, each in [0, V) (the caller checks).
template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t C);
/// dweight [V, C] = 0, then dweight[ids[i], :] += dout[i, :] for i = 0..n-1 in order, skipping
/// ids equal to padding_idx (pass -1 for none).
template <class T>
void embedding_backward(const T* dout, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t C, int64_t padding_idx);

namespace ref {
template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t C);
template <class T>
void embedding_backward(const T* dout, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t C, int64_t padding_idx);
}  // namespace ref

}  // namespace forge::kernels
