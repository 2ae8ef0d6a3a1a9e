// Softmax and log-softmax kernels along the middle axis of a dense [outer, C, inner] buffer, so
// any dimension is handled without transposing (inner == 1, the last dimension, is the fast
// path). Backward reads only the forward output. kernels::ref holds the plain test oracles.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// y = softmax(x) (or log_softmax when `log`) along C of dense [outer, C, inner] buffers.
template <class T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t C, int64_t inner, bool log);
/// From the forward output y: softmax dx = y (dy - sum_C(dy y)); log_softmax
/// dx = dy - exp(y) sum_C(dy).
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t C, int64_t inner,
                      bool log);

namespace ref {
template <class T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t C, int64_t inner, bool log);
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t C, int64_t inner,
                      bool log);
}  // namespace ref

}  // namespace forge::kernels
